"""What a run writes and reads: checkpoints, exported params, the output folder, disk space.

Layer 2.

May import: devices.

Modules: :mod:`~diloco_core.store.checkpoint` (Orbax checkpoints and resume),
:mod:`~diloco_core.store.params_io` (final params), :mod:`~diloco_core.store.tree_io` (tree
fingerprints, Orbax messages), :mod:`~diloco_core.store.solo_write` (a single-process writer),
:mod:`~diloco_core.store.out_dir`, :mod:`~diloco_core.store.run_files`,
:mod:`~diloco_core.store.disk_space`.
"""

from diloco_core.lazy import lazy_exports

#: Public names, with the module that defines them (loaded on first use).
_PUBLIC = {
    "CheckpointWriter": "diloco_core.store.checkpoint",
    "restore_latest": "diloco_core.store.checkpoint",
    "export_params": "diloco_core.store.params_io",
    "load_params": "diloco_core.store.params_io",
    "check_space": "diloco_core.store.disk_space",
}
__all__ = list(_PUBLIC)

__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())
