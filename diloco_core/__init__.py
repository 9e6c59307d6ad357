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

#: Every public name, with the sub-package that re-exports it (whose table names the defining
#: module: each path is written once). Loaded on first use (PEP 562), so that
#: ``import diloco_core.spec.validity`` (what the planning library needs) does not start JAX.
_PUBLIC = {
    "ModelConfig": "diloco_core.spec",
    "PRESETS": "diloco_core.spec",
    "flops_per_token": "diloco_core.spec",
    "get_preset": "diloco_core.spec",
    "layer_param_count": "diloco_core.spec",
    "param_count": "diloco_core.spec",
    "ALGORITHMS": "diloco_core.algorithm",
    "COMPRESSIONS": "diloco_core.algorithm",
    "DiLoCoConfig": "diloco_core.algorithm",
    "FRAGMENT_ORDERS": "diloco_core.algorithm",
    "FRAGMENT_PATTERNS": "diloco_core.algorithm",
    "OUTER_OPTIMIZERS": "diloco_core.algorithm",
    "INNER_OPTIMIZERS": "diloco_core.algorithm",
    "inner_optimizer_factory": "diloco_core.algorithm",
    "outer_optimizer_factory": "diloco_core.algorithm",
    "DiLoCo": "diloco_core.algorithm",
    "DiLoCoState": "diloco_core.algorithm",
    "CONFIG_HYPERPARAMS": "diloco_core.algorithm",
    "default_outer_optimizer": "diloco_core.algorithm",
    "Algorithm": "diloco_core.algorithm",
    "AlgorithmBase": "diloco_core.algorithm",
    "loss_and_grad": "diloco_core.algorithm",
    "resolve_optimizer": "diloco_core.algorithm",
    "DataParallel": "diloco_core.algorithm",
    "DPState": "diloco_core.algorithm",
    "Fragments": "diloco_core.algorithm",
    "per_fragment_state": "diloco_core.algorithm",
    "configure_determinism": "diloco_core.devices",
    "default_compute_dtype": "diloco_core.devices",
    "default_demo_steps": "diloco_core.devices",
    "resolve_model_config": "diloco_core.devices",
    "Transformer": "diloco_core.model",
    "init_model": "diloco_core.model",
    "layer_mask": "diloco_core.model",
    "muon_dimensions": "diloco_core.model",
    "lm_loss": "diloco_core.model",
    "train_loss": "diloco_core.model",
    "merged_fragment": "diloco_core.spec",
    "schedule_table": "diloco_core.spec",
    "sent_fragment": "diloco_core.spec",
    "FORMATS": "diloco_core.spec",
    "bits_per_element": "diloco_core.spec",
    "error_feedback": "diloco_core.wire",
    "quantize": "diloco_core.wire",
    "quantize_tree": "diloco_core.wire",
    "representable_values": "diloco_core.wire",
    "wire_bits": "diloco_core.wire",
    "WireLayout": "diloco_core.wire",
    "WirePackingError": "diloco_core.wire",
    "pack_payload": "diloco_core.wire",
    "unpack_payload": "diloco_core.wire",
    "ChunkPlan": "diloco_core.wire",
    "requantize_mean": "diloco_core.wire",
    "DataConfig": "diloco_core.data",
    "MarkovSource": "diloco_core.data",
    "make_dataset": "diloco_core.data",
    "initialize_distributed": "diloco_core.devices",
    "make_mesh": "diloco_core.devices",
    "parse_mesh": "diloco_core.devices",
    "export_params": "diloco_core.store",
    "load_params": "diloco_core.store",
    "non_result_fields": "diloco_core.spec",
    "result_fields": "diloco_core.spec",
    "TrainConfig": "diloco_core.run",
    "TrainResult": "diloco_core.run",
    "clear_program_cache": "diloco_core.run",
    "program_key": "diloco_core.run",
}
__all__ = list(_PUBLIC)


__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())

