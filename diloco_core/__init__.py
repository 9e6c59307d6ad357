"""diloco_core: DiLoCo and Streaming DiLoCo in JAX (the trainer).

The training function is ``diloco_core.train.train`` (not re-exported here: the name
``diloco_core.train`` is the module, which ``python -m diloco_core.train`` runs).

Under ``python -m diloco_core.train`` / ``compare`` / ``launch``, SIGINT and SIGTERM are recorded from here
on, before JAX is imported, and end the run at its next safe point (:mod:`diloco_core.interrupts`).
"""

from diloco_core import interrupts as _interrupts
from diloco_core.lazy import lazy_exports

if _interrupts.command_line_module() in ("diloco_core.train", "diloco_core.compare", "diloco_core.launch"):
  _interrupts.install()

#: Every public name, with the module that defines it. Loaded on first use (PEP 562), so that
#: ``import diloco_core.spec.validity`` (what the planning library needs) does not start JAX.
_PUBLIC = {
    "ModelConfig": "diloco_core.spec.model_config",
    "PRESETS": "diloco_core.spec.model_config",
    "flops_per_token": "diloco_core.spec.model_config",
    "get_preset": "diloco_core.spec.model_config",
    "layer_param_count": "diloco_core.spec.model_config",
    "param_count": "diloco_core.spec.model_config",
    "ALGORITHMS": "diloco_core.algorithm.config",
    "COMPRESSIONS": "diloco_core.algorithm.config",
    "DiLoCoConfig": "diloco_core.algorithm.config",
    "FRAGMENT_ORDERS": "diloco_core.algorithm.config",
    "FRAGMENT_PATTERNS": "diloco_core.algorithm.config",
    "OUTER_OPTIMIZERS": "diloco_core.algorithm.config",
    "INNER_OPTIMIZERS": "diloco_core.algorithm.optimizers",
    "inner_optimizer_factory": "diloco_core.algorithm.optimizers",
    "outer_optimizer_factory": "diloco_core.algorithm.optimizers",
    "DiLoCo": "diloco_core.algorithm.diloco",
    "DiLoCoState": "diloco_core.algorithm.state",
    "CONFIG_HYPERPARAMS": "diloco_core.algorithm.diloco",
    "default_outer_optimizer": "diloco_core.algorithm.diloco",
    "Algorithm": "diloco_core.algorithm.base",
    "AlgorithmBase": "diloco_core.algorithm.base",
    "loss_and_grad": "diloco_core.algorithm.base",
    "resolve_optimizer": "diloco_core.algorithm.hyperparams",
    "DataParallel": "diloco_core.algorithm.dp",
    "DPState": "diloco_core.algorithm.dp",
    "Fragments": "diloco_core.algorithm.fragments",
    "per_fragment_state": "diloco_core.algorithm.fragments",
    "configure_determinism": "diloco_core.devices.backend",
    "default_compute_dtype": "diloco_core.devices.backend",
    "default_demo_steps": "diloco_core.devices.backend",
    "resolve_model_config": "diloco_core.devices.backend",
    "Transformer": "diloco_core.model.transformer",
    "init_model": "diloco_core.model.transformer",
    "layer_mask": "diloco_core.model.transformer",
    "muon_dimensions": "diloco_core.model.transformer",
    "lm_loss": "diloco_core.model.transformer",
    "train_loss": "diloco_core.model.transformer",
    "merged_fragment": "diloco_core.spec.schedule",
    "schedule_table": "diloco_core.spec.schedule",
    "sent_fragment": "diloco_core.spec.schedule",
    "FORMATS": "diloco_core.wire.compression",
    "bits_per_element": "diloco_core.wire.compression",
    "error_feedback": "diloco_core.wire.compression",
    "quantize": "diloco_core.wire.compression",
    "quantize_tree": "diloco_core.wire.compression",
    "representable_values": "diloco_core.wire.compression",
    "wire_bits": "diloco_core.wire.compression",
    "WireLayout": "diloco_core.wire.packing",
    "WirePackingError": "diloco_core.wire.packing",
    "pack_payload": "diloco_core.wire.packing",
    "unpack_payload": "diloco_core.wire.packing",
    "ChunkPlan": "diloco_core.wire.reduce_scatter",
    "requantize_mean": "diloco_core.wire.reduce_scatter",
    "DataConfig": "diloco_core.data.sources",
    "MarkovSource": "diloco_core.data.sources",
    "make_dataset": "diloco_core.data.sources",
    "initialize_distributed": "diloco_core.devices.processes",
    "make_mesh": "diloco_core.devices.mesh",
    "parse_mesh": "diloco_core.devices.mesh",
    "export_params": "diloco_core.store.params_io",
    "load_params": "diloco_core.store.params_io",
    "non_result_fields": "diloco_core.spec.fields",
    "result_fields": "diloco_core.spec.fields",
    "TrainConfig": "diloco_core.run.config",
    "TrainResult": "diloco_core.run.loop",
    "clear_program_cache": "diloco_core.run.programs",
    "program_key": "diloco_core.run.programs",
}
__all__ = list(_PUBLIC)


__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())

