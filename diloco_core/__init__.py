"""diloco_core: DiLoCo and Streaming DiLoCo in JAX (the trainer)."""

from diloco_core.model_config import ModelConfig
from diloco_core.model_config import PRESETS
from diloco_core.model_config import flops_per_token
from diloco_core.model_config import get_preset
from diloco_core.model_config import layer_param_count
from diloco_core.model_config import param_count
from diloco_core.config import ALGORITHMS
from diloco_core.config import COMPRESSIONS
from diloco_core.config import DiLoCoConfig
from diloco_core.config import FRAGMENT_PATTERNS
from diloco_core.diloco import DiLoCo
from diloco_core.diloco import DiLoCoState
from diloco_core.dp import DataParallel
from diloco_core.dp import DPState
from diloco_core.fragments import Fragments
from diloco_core.model import Transformer
from diloco_core.model import init_model
from diloco_core.model import layer_mask
from diloco_core.model import lm_loss
from diloco_core.schedule import merged_fragment
from diloco_core.schedule import schedule_table
from diloco_core.schedule import sent_fragment
