"""The algorithms: DiLoCo / Streaming DiLoCo and data-parallel, as pure JAX programs.

Layer 3. :class:`~diloco_core.algorithm.phases.Phases` is the contract with the runtimes: the
steps of a sync (send, settle, merge) that both the in-step and the background runtime compose.

May import: spec, devices, wire.

Modules: :mod:`~diloco_core.algorithm.config` (``DiLoCoConfig`` and its checks),
:mod:`~diloco_core.algorithm.base` (the ``Algorithm`` protocol), :mod:`~diloco_core.algorithm.state`,
:mod:`~diloco_core.algorithm.hyperparams`, :mod:`~diloco_core.algorithm.optimizers`,
:mod:`~diloco_core.algorithm.fragments`, :mod:`~diloco_core.algorithm.eager` with
:mod:`~diloco_core.algorithm.outer_phases` (the outer step before and after its average),
:mod:`~diloco_core.algorithm.phases`, :mod:`~diloco_core.algorithm.diloco`,
:mod:`~diloco_core.algorithm.dp`, :mod:`~diloco_core.algorithm.outer_apply` (a syncer round's outer
update: merged or sequential, (Delayed) Nesterov; not wired into the runtimes yet).
"""

from diloco_core.lazy import lazy_exports

#: Public names, with the module that defines them (loaded on first use).
_PUBLIC = {
    "DiLoCoConfig": "diloco_core.algorithm.config",
    "ALGORITHMS": "diloco_core.algorithm.config",
    "COMPRESSIONS": "diloco_core.algorithm.config",
    "OUTER_OPTIMIZERS": "diloco_core.algorithm.config",
    "FRAGMENT_ORDERS": "diloco_core.algorithm.config",
    "FRAGMENT_PATTERNS": "diloco_core.algorithm.config",
    "Algorithm": "diloco_core.algorithm.base",
    "AlgorithmBase": "diloco_core.algorithm.base",
    "loss_and_grad": "diloco_core.algorithm.base",
    "DiLoCoState": "diloco_core.algorithm.state",
    "INNER_OPTIMIZERS": "diloco_core.algorithm.optimizers",
    "inner_optimizer_factory": "diloco_core.algorithm.optimizers",
    "outer_optimizer_factory": "diloco_core.algorithm.optimizers",
    "resolve_optimizer": "diloco_core.algorithm.hyperparams",
    "Fragments": "diloco_core.algorithm.fragments",
    "per_fragment_state": "diloco_core.algorithm.fragments",
    "Phases": "diloco_core.algorithm.phases",
    "DiLoCo": "diloco_core.algorithm.diloco",
    "default_outer_optimizer": "diloco_core.algorithm.diloco",
    "CONFIG_HYPERPARAMS": "diloco_core.algorithm.diloco",
    "DataParallel": "diloco_core.algorithm.dp",
    "DPState": "diloco_core.algorithm.dp",
    "DelayedNesterovState": "diloco_core.algorithm.outer_apply",
    "delayed_nesterov_init": "diloco_core.algorithm.outer_apply",
    "delayed_nesterov_step": "diloco_core.algorithm.outer_apply",
    "optax_step": "diloco_core.algorithm.outer_apply",
    "weighted_mean": "diloco_core.algorithm.outer_apply",
    "radial_directional_mean": "diloco_core.algorithm.outer_apply",
    "apply_round": "diloco_core.algorithm.outer_apply",
}
__all__ = list(_PUBLIC)

__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())
