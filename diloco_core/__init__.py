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
#: ``import diloco_core.validity`` (what the planning library needs) does not start JAX.
_PUBLIC = {
    "ModelConfig": "diloco_core.model_config",
    "PRESETS": "diloco_core.model_config",
    "flops_per_token": "diloco_core.model_config",
    "get_preset": "diloco_core.model_config",
    "layer_param_count": "diloco_core.model_config",
    "param_count": "diloco_core.model_config",
    "ALGORITHMS": "diloco_core.config",
    "COMPRESSIONS": "diloco_core.config",
    "DiLoCoConfig": "diloco_core.config",
    "FRAGMENT_ORDERS": "diloco_core.config",
    "FRAGMENT_PATTERNS": "diloco_core.config",
    "OUTER_OPTIMIZERS": "diloco_core.config",
    "INNER_OPTIMIZERS": "diloco_core.optimizers",
    "inner_optimizer_factory": "diloco_core.optimizers",
    "outer_optimizer_factory": "diloco_core.optimizers",
    "DiLoCo": "diloco_core.diloco",
    "DiLoCoState": "diloco_core.state",
    "CONFIG_HYPERPARAMS": "diloco_core.diloco",
    "default_outer_optimizer": "diloco_core.diloco",
    "Algorithm": "diloco_core.algorithm",
    "AlgorithmBase": "diloco_core.algorithm",
    "loss_and_grad": "diloco_core.algorithm",
    "resolve_optimizer": "diloco_core.hyperparams",
    "DataParallel": "diloco_core.dp",
    "DPState": "diloco_core.dp",
    "Fragments": "diloco_core.fragments",
    "per_fragment_state": "diloco_core.fragments",
    "configure_determinism": "diloco_core.backend",
    "default_compute_dtype": "diloco_core.backend",
    "default_demo_steps": "diloco_core.backend",
    "resolve_model_config": "diloco_core.backend",
    "Transformer": "diloco_core.model",
    "init_model": "diloco_core.model",
    "layer_mask": "diloco_core.model",
    "muon_dimensions": "diloco_core.model",
    "lm_loss": "diloco_core.model",
    "train_loss": "diloco_core.model",
    "merged_fragment": "diloco_core.schedule",
    "schedule_table": "diloco_core.schedule",
    "sent_fragment": "diloco_core.schedule",
    "FORMATS": "diloco_core.compression",
    "bits_per_element": "diloco_core.compression",
    "error_feedback": "diloco_core.compression",
    "quantize": "diloco_core.compression",
    "quantize_tree": "diloco_core.compression",
    "representable_values": "diloco_core.compression",
    "wire_bits": "diloco_core.compression",
    "WireLayout": "diloco_core.wire_packing",
    "WirePackingError": "diloco_core.wire_packing",
    "pack_payload": "diloco_core.wire_packing",
    "unpack_payload": "diloco_core.wire_packing",
    "ChunkPlan": "diloco_core.reduce_scatter",
    "requantize_mean": "diloco_core.reduce_scatter",
    "DataConfig": "diloco_core.data",
    "MarkovSource": "diloco_core.data",
    "make_dataset": "diloco_core.data",
    "initialize_distributed": "diloco_core.processes",
    "make_mesh": "diloco_core.mesh",
    "parse_mesh": "diloco_core.mesh",
    "export_params": "diloco_core.params_io",
    "load_params": "diloco_core.params_io",
    "non_result_fields": "diloco_core.fields",
    "result_fields": "diloco_core.fields",
    "TrainConfig": "diloco_core.run_config",
    "TrainResult": "diloco_core.loop",
    "clear_program_cache": "diloco_core.programs",
    "program_key": "diloco_core.programs",
}
__all__ = list(_PUBLIC)


__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())

