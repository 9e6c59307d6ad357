"""diloco_core: DiLoCo and Streaming DiLoCo in JAX (the trainer).

The training function is ``diloco_core.train.train`` (not re-exported here: the name
``diloco_core.train`` is the module, which ``python -m diloco_core.train`` runs).

Under ``python -m diloco_core.train`` / ``compare`` / ``launch``, SIGINT and SIGTERM are recorded from here
on, before JAX is imported, and end the run at its next safe point (:mod:`diloco_core.interrupts`).
"""

from diloco_core import interrupts as _interrupts

if _interrupts.command_line_module() in ("diloco_core.train", "diloco_core.compare", "diloco_core.launch"):
  _interrupts.install()

from diloco_core.model_config import ModelConfig
from diloco_core.model_config import PRESETS
from diloco_core.model_config import flops_per_token
from diloco_core.model_config import get_preset
from diloco_core.model_config import layer_param_count
from diloco_core.model_config import param_count
from diloco_core.config import ALGORITHMS
from diloco_core.config import COMPRESSIONS
from diloco_core.config import DiLoCoConfig
from diloco_core.config import FRAGMENT_ORDERS
from diloco_core.config import FRAGMENT_PATTERNS
from diloco_core.config import OUTER_OPTIMIZERS
from diloco_core.optimizers import INNER_OPTIMIZERS
from diloco_core.optimizers import inner_optimizer_factory
from diloco_core.optimizers import outer_optimizer_factory
from diloco_core.diloco import DiLoCo
from diloco_core.state import DiLoCoState
from diloco_core.diloco import CONFIG_HYPERPARAMS
from diloco_core.diloco import default_outer_optimizer
from diloco_core.algorithm import Algorithm
from diloco_core.algorithm import AlgorithmBase
from diloco_core.algorithm import loss_and_grad
from diloco_core.hyperparams import resolve_optimizer
from diloco_core.dp import DataParallel
from diloco_core.dp import DPState
from diloco_core.fragments import Fragments
from diloco_core.fragments import per_fragment_state
from diloco_core.backend import configure_determinism
from diloco_core.backend import default_compute_dtype
from diloco_core.backend import default_demo_steps
from diloco_core.backend import resolve_model_config
from diloco_core.model import Transformer
from diloco_core.model import init_model
from diloco_core.model import layer_mask
from diloco_core.model import muon_dimensions
from diloco_core.model import lm_loss
from diloco_core.model import train_loss
from diloco_core.schedule import merged_fragment
from diloco_core.schedule import schedule_table
from diloco_core.schedule import sent_fragment
from diloco_core.compression import FORMATS
from diloco_core.compression import bits_per_element
from diloco_core.compression import error_feedback
from diloco_core.compression import quantize
from diloco_core.compression import quantize_tree
from diloco_core.compression import representable_values
from diloco_core.compression import wire_bits
from diloco_core.data import DataConfig
from diloco_core.data import MarkovSource
from diloco_core.data import make_dataset
from diloco_core.mesh import initialize_distributed
from diloco_core.mesh import make_mesh
from diloco_core.mesh import parse_mesh
from diloco_core.params_io import export_params
from diloco_core.params_io import load_params
from diloco_core.fields import non_result_fields
from diloco_core.fields import result_fields
from diloco_core.run_config import TrainConfig
from diloco_core.loop import TrainResult
from diloco_core.programs import clear_program_cache
from diloco_core.programs import program_key
