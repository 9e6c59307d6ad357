"""Devices and processes: the backend's defaults, the replica mesh, joining processes.

Layer 1.

May import: spec.

Modules: :mod:`~diloco_core.devices.backend` (defaults per platform, determinism),
:mod:`~diloco_core.devices.mesh` (the ``(diloco, data, model)`` mesh and placement),
:mod:`~diloco_core.devices.processes` (``jax.distributed`` set-up, agreed stops, lost peers),
:mod:`~diloco_core.devices.process_options` (the process options and waits, without JAX),
:mod:`~diloco_core.devices.compile_cache` (every process writes the persistent compilation cache).
"""

from diloco_core.lazy import lazy_exports

#: Public names, with the module that defines them (loaded on first use).
_PUBLIC = {
    "configure_determinism": "diloco_core.devices.backend",
    "default_compute_dtype": "diloco_core.devices.backend",
    "default_demo_steps": "diloco_core.devices.backend",
    "resolve_model_config": "diloco_core.devices.backend",
    "make_mesh": "diloco_core.devices.mesh",
    "parse_mesh": "diloco_core.spec.mesh_shape",
    "initialize_distributed": "diloco_core.devices.processes",
    "cache_every_process": "diloco_core.devices.compile_cache",
}
__all__ = list(_PUBLIC)

__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())
