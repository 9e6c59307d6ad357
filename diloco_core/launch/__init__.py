"""Several processes on one machine: the supervisor, a shaped link, faults, the coordination service;
and the commands for several hosts.

Layer 6. ``python -m diloco_core.launch`` runs :func:`~diloco_core.launch.supervisor.main`.

May import: spec, devices, store, runtime, run.

Modules: :mod:`~diloco_core.launch.supervisor` (start, watch and stop the processes),
:mod:`~diloco_core.launch.shaped_link` (a link of given bandwidth and latency),
:mod:`~diloco_core.launch.faults` (``--kill-at``), :mod:`~diloco_core.launch.coordination_service`
(the service in a process of its own), :mod:`~diloco_core.launch.path_probe` (the coordination
service's path and gloo's, timed), :mod:`~diloco_core.launch.cluster` (each host's command of a
multi-host run, and a SLURM batch script, checked by the trainer).
"""

from diloco_core.lazy import lazy_exports

#: Public names, with the module that defines them (loaded on first use).
_PUBLIC = {
    "main": "diloco_core.launch.supervisor",
}
__all__ = list(_PUBLIC)

__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())
