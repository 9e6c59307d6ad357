"""diloco_core: DiLoCo and Streaming DiLoCo in JAX (the trainer)."""

from diloco_core.model_config import ModelConfig
from diloco_core.model_config import PRESETS
from diloco_core.model_config import flops_per_token
from diloco_core.model_config import get_preset
from diloco_core.model_config import layer_param_count
from diloco_core.model_config import param_count
