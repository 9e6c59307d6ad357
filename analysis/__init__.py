"""analysis: a roofline calculator and a compute-utilization simulator for DP and DiLoCo.

numpy / pandas code (no JAX calls): hardware and model catalogs (:mod:`analysis.hardware`,
:mod:`analysis.models`), closed forms for intensity and critical batches
(:mod:`analysis.roofline`), bytes and bandwidth (:mod:`analysis.bandwidth`) and memory
(:mod:`analysis.memory`), a discrete-event simulator of datacenters joined by a WAN link
(:mod:`analysis.simulate`) with the papers' own tables beside it (:mod:`analysis.paper_tables`),
and a planner that picks H, P and τ for a link
(:mod:`analysis.plan`). Catalog names are resolved once, by the entry points
(:func:`plan_run`, the command line, :func:`get_hardware` / :func:`get_model` in your code);
the closed forms take resolved objects. All of it imports with numpy, pandas and matplotlib
alone: no JAX, and no trainer.

Training sweeps need the trainer (JAX): :mod:`analysis.sweeps` (the runner and its cache),
:mod:`analysis.live` (a notebook's live sweep), :mod:`analysis.experiments` (the docs' named
sweeps) and :mod:`analysis.stored` (their stored results). Their names below load the
trainer on first use.
Command line: ``python -m analysis --help``.
"""


from analysis.bandwidth import allreduce_factor
from analysis.bandwidth import hidden_bandwidth
from analysis.bandwidth import hiding_window
from analysis.bandwidth import payload_bytes
from analysis.bandwidth import required_bandwidth
from analysis.bandwidth import streaming_required_bandwidth
from analysis.bandwidth import streaming_stall
from analysis.bandwidth import t_comm
from analysis.bandwidth import utilization_no_overlap
from analysis.bandwidth import utilization_overlapped
from analysis.hardware import HARDWARE
from analysis.hardware import HardwareSpec
from analysis.hardware import check_hardware
from analysis.hardware import get_hardware
from analysis.memory import ReplicaMemory
from analysis.memory import memory_per_replica
from analysis.models import MODELS
from analysis.models import MODEL_ALIASES
from analysis.models import ModelStats
from analysis.models import check_model
from analysis.models import fragment_sizes
from analysis.models import get_model
from analysis.models import model_stats
from analysis.models import model_table
from analysis.paper_tables import reference as paper_reference
from analysis.paper_tables import simulated as paper_simulated
from analysis.plan import Plan
from analysis.plan import plan_run
from analysis.roofline import arithmetic_intensity
from analysis.roofline import critical_batch
from analysis.roofline import critical_intensity
from analysis.roofline import diloco_critical_batch_per_slice
from analysis.roofline import dp_critical_batch_per_chip
from analysis.roofline import dp_critical_batch_per_slice
from analysis.roofline import max_slices
from analysis.roofline import streaming_critical_batch_per_slice
from analysis.roofline import streaming_window_steps
from analysis.roofline import t_math
from analysis.simulate import EAGER_ROWS
from analysis.simulate import METHODS
from analysis.simulate import PAPER_GRID_GBPS
from analysis.simulate import PAPER_ROWS
from analysis.simulate import PAPER_TARGETS
from analysis.simulate import SIM_MODELS
from analysis.simulate import SimModel
from analysis.simulate import SimResult
from analysis.simulate import bandwidth_for_utilization
from analysis.simulate import fragment_layers_of
from analysis.simulate import get_sim_model
from analysis.simulate import paper_table
from analysis.simulate import run_simulation
from analysis.simulate import throughput_bound
from analysis.simulate import utilization
from diloco_core.lazy import lazy_exports

#: Names of the experiments machinery (they need the trainer): loaded on first use.
_TRAINING = {"named_sweep": "analysis.experiments", "grid": "analysis.sweeps",
             "run_sweep": "analysis.sweeps", "sweep_curves": "analysis.sweeps"}
__getattr__, __dir__ = lazy_exports(__name__, _TRAINING, globals())
