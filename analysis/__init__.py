"""analysis: the planning library, and the experiments machinery behind the docs.

Two halves, in two sub-packages:

* :mod:`analysis.planning`, the **planning library** (numpy / pandas only, no JAX, no
  trainer): hardware and model catalogs, closed forms for intensity, critical batches,
  bandwidth and memory, a discrete-event simulator of datacenters joined by a WAN link with the
  papers' own tables beside it, and a planner that picks H, P and τ for a link. Its public names
  are re-exported here. Catalog names are resolved once, by the entry points (:func:`plan_run`,
  the command line, :func:`get_hardware` / :func:`get_model` in your code); the closed forms take
  resolved objects.
* :mod:`analysis.lab`, the **experiments machinery** (it trains, so it needs JAX): sweeps and
  their cache, the docs' named experiments, live sweeps, stored experiments and their re-check,
  the papers' claims. Its names (``grid``, ``run_sweep``, ...) load on first use: the trainer's
  configs (no JAX), and JAX once a run trains.

:mod:`analysis.plots` draws for both. Every module is also reachable by its short name
(``from analysis import roofline, stored``). Command line: ``python -m analysis --help``.
"""


from analysis.planning.bandwidth import allreduce_factor
from analysis.planning.bandwidth import hidden_bandwidth
from analysis.planning.bandwidth import hiding_window
from analysis.planning.bandwidth import payload_bytes
from analysis.planning.bandwidth import required_bandwidth
from analysis.planning.bandwidth import streaming_required_bandwidth
from analysis.planning.bandwidth import streaming_stall
from analysis.planning.bandwidth import t_comm
from analysis.planning.bandwidth import utilization_no_overlap
from analysis.planning.bandwidth import utilization_overlapped
from analysis.planning.goodput import Failures
from analysis.planning.goodput import elastic_failure_cost
from analysis.planning.goodput import goodput_curves
from analysis.planning.hardware import HARDWARE
from analysis.planning.hardware import HardwareSpec
from analysis.planning.hardware import check_hardware
from analysis.planning.hardware import get_hardware
from analysis.planning.memory import ReplicaMemory
from analysis.planning.memory import memory_per_replica
from analysis.planning.models import MODELS
from analysis.planning.models import MODEL_ALIASES
from analysis.planning.models import ModelStats
from analysis.planning.models import check_model
from analysis.planning.models import fragment_sizes
from analysis.planning.models import get_model
from analysis.planning.models import model_stats
from analysis.planning.models import model_table
from analysis.planning.paper_tables import reference as paper_reference
from analysis.planning.paper_tables import simulated as paper_simulated
from analysis.planning.op_cost import elementwise_cost
from analysis.planning.op_cost import matmul_cost
from analysis.planning.plan import Plan
from analysis.planning.plan import plan_run
from analysis.planning.pool import PoolResult
from analysis.planning.pool import pool_utilization
from analysis.planning.pool_plan import pool_goodput
from analysis.planning.pool_plan import pool_goodput_curves
from analysis.planning.pool_plan import recommend_syncer
from analysis.planning.published_goodput import comparison as published_goodput_comparison
from analysis.planning.roofline import arithmetic_intensity
from analysis.planning.roofline import critical_batch
from analysis.planning.roofline import critical_intensity
from analysis.planning.roofline import diloco_critical_batch_per_slice
from analysis.planning.roofline import dp_critical_batch_per_chip
from analysis.planning.roofline import dp_critical_batch_per_slice
from analysis.planning.roofline import max_slices
from analysis.planning.roofline import streaming_critical_batch_per_slice
from analysis.planning.roofline import streaming_window_steps
from analysis.planning.roofline import t_math
from analysis.planning.simulate import EAGER_ROWS
from analysis.planning.simulate import METHODS
from analysis.planning.simulate import PAPER_GRID_GBPS
from analysis.planning.simulate import PAPER_ROWS
from analysis.planning.simulate import PAPER_TARGETS
from analysis.planning.simulate import SIM_MODELS
from analysis.planning.simulate import SimModel
from analysis.planning.simulate import SimResult
from analysis.planning.simulate import bandwidth_for_utilization
from analysis.planning.simulate import fragment_layers_of
from analysis.planning.simulate import get_sim_model
from analysis.planning.simulate import paper_table
from analysis.planning.simulate import run_simulation
from analysis.planning.simulate import throughput_bound
from analysis.planning.simulate import utilization
from diloco_core.lazy import lazy_exports

#: Names of the experiments machinery (they need the trainer): loaded on first use.
_TRAINING = {"named_sweep": "analysis.lab.experiments", "grid": "analysis.lab.sweeps",
             "run_sweep": "analysis.lab.sweeps", "sweep_curves": "analysis.lab.sweeps"}
#: Every module of the two halves by its short name (``from analysis import roofline, stored``).
_MODULES = {**{m: f"analysis.planning.{m}" for m in (
    "hardware", "models", "roofline", "op_cost", "bandwidth", "memory", "simulate", "sim_events",
    "paper_tables", "plan", "candidates", "maxtext", "goodput", "pool", "pool_plan", "published_goodput")}, **{m: f"analysis.lab.{m}" for m in (
    "sweeps", "sweep_cache", "experiments", "live", "stored", "storing", "recheck", "recheck_build", "realizations",
    "cpu_kind", "claims", "arm_frames", "delay_stability", "overlap_eta", "headline", "measured",
    "straggler_arms", "stragglers",
    "wire_measured", "elastic_measured", "accelerator", "roofline_measured",
    "main_job_measured", "notebooks_measured", "overlap_measured")}}
__getattr__, __dir__ = lazy_exports(__name__, _TRAINING, globals(), modules=_MODULES)
