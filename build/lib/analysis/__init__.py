"""analysis: a roofline calculator and a compute-utilization simulator for DP and DiLoCo.

numpy / pandas code (no JAX calls): hardware and model catalogs (:mod:`analysis.hardware`,
:mod:`analysis.models`), closed-form rooflines (:mod:`analysis.roofline`), a
discrete-event simulator of datacenters joined by a WAN link (:mod:`analysis.simulate`),
and a planner that picks H, P and τ for a link (:mod:`analysis.plan`).
Command line: ``python -m analysis --help``.
"""

from analysis.hardware import HARDWARE
from analysis.hardware import HardwareSpec
from analysis.hardware import get_hardware
from analysis.models import MODEL_ALIASES
from analysis.models import MODELS
from analysis.models import ModelStats
from analysis.models import fragment_sizes
from analysis.models import get_model
from analysis.models import model_stats
from analysis.models import model_table
from analysis.plan import Plan
from analysis.plan import plan_run
from analysis.roofline import ReplicaMemory
from analysis.roofline import allreduce_factor
from analysis.roofline import arithmetic_intensity
from analysis.roofline import critical_batch
from analysis.roofline import critical_intensity
from analysis.roofline import diloco_critical_batch_per_slice
from analysis.roofline import dp_critical_batch_per_chip
from analysis.roofline import dp_critical_batch_per_slice
from analysis.roofline import hidden_bandwidth
from analysis.roofline import max_slices
from analysis.roofline import memory_per_replica
from analysis.roofline import payload_bytes
from analysis.roofline import required_bandwidth
from analysis.roofline import streaming_critical_batch_per_slice
from analysis.roofline import streaming_window_steps
from analysis.roofline import t_comm
from analysis.roofline import t_math
from analysis.roofline import utilization_no_overlap
from analysis.simulate import METHODS
from analysis.simulate import PAPER_GRID_GBPS
from analysis.simulate import PAPER_ROWS
from analysis.simulate import PAPER_TARGETS
from analysis.simulate import SIM_MODELS
from analysis.simulate import SimModel
from analysis.simulate import SimResult
from analysis.simulate import bandwidth_for_utilization
from analysis.simulate import get_sim_model
from analysis.simulate import paper_table
from analysis.simulate import run_simulation
from analysis.simulate import utilization
from analysis.sweeps import grid
from analysis.sweeps import named_sweep
from analysis.sweeps import run_sweep
from analysis.sweeps import sweep_curves
