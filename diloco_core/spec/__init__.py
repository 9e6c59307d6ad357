"""The trainer's specification: option checks, model sizes, wire formats, the schedule.

Layer 0. Pure Python and numpy: nothing here imports JAX, so the planning library
(``analysis.planning``) can use it. It is the only part of the trainer the planning library imports.

May import: nothing of the trainer.

Modules: :mod:`~diloco_core.spec.validity` (the option checks and their one-line errors),
:mod:`~diloco_core.spec.fields` (config field metadata), :mod:`~diloco_core.spec.model_config`
(model shapes, presets, parameter and FLOP counts), :mod:`~diloco_core.spec.wire_formats` (the
formats' table: bits per element), :mod:`~diloco_core.spec.schedule` (which fragment is sent and
merged at a step), :mod:`~diloco_core.spec.mesh_shape` (the ``mesh`` option's axes and sizes), :mod:`~diloco_core.spec.fragment_layers` (layers dealt to fragments),
:mod:`~diloco_core.spec.footprint` (bytes a replica holds, and the values an elastic run puts in the
coordination service), :mod:`~diloco_core.spec.syncer` (the syncer rule of stragglers and asynchronous
replicas: its knobs and checks), :mod:`~diloco_core.spec.syncer_settings` (which setting is which
published algorithm), :mod:`~diloco_core.spec.quorum_close` (when a quorum round closes: one rule
for the tape and the real processes), :mod:`~diloco_core.spec.tape` (the rule played in simulated
time, as a tape of events).
"""

from diloco_core.lazy import lazy_exports

#: Public names, with the module that defines them (loaded on first use).
_PUBLIC = {
    "check_choice": "diloco_core.spec.validity",
    "check_int": "diloco_core.spec.validity",
    "check_real": "diloco_core.spec.validity",
    "check_bool": "diloco_core.spec.validity",
    "check_schedule": "diloco_core.spec.validity",
    "allowed_fragments": "diloco_core.spec.validity",
    "FieldSpec": "diloco_core.spec.fields",
    "field": "diloco_core.spec.fields",
    "non_result_fields": "diloco_core.spec.fields",
    "result_fields": "diloco_core.spec.fields",
    "ModelConfig": "diloco_core.spec.model_config",
    "PRESETS": "diloco_core.spec.model_config",
    "get_preset": "diloco_core.spec.model_config",
    "param_count": "diloco_core.spec.model_config",
    "layer_param_count": "diloco_core.spec.model_config",
    "flops_per_token": "diloco_core.spec.model_config",
    "FORMATS": "diloco_core.spec.wire_formats",
    "bits_per_element": "diloco_core.spec.wire_formats",
    "sent_fragment": "diloco_core.spec.schedule",
    "merged_fragment": "diloco_core.spec.schedule",
    "schedule_table": "diloco_core.spec.schedule",
    "deal_layers": "diloco_core.spec.fragment_layers",
    "replica_state_bytes": "diloco_core.spec.footprint",
    "device_bytes": "diloco_core.spec.footprint",
    "host_bytes": "diloco_core.spec.footprint",
    "check_fits": "diloco_core.spec.footprint",
    "elastic_value_bytes": "diloco_core.spec.footprint",
    "SyncerConfig": "diloco_core.spec.syncer",
    "APPLY_MODES": "diloco_core.spec.syncer",
    "LATE_POLICIES": "diloco_core.spec.syncer",
    "WEIGHTINGS": "diloco_core.spec.syncer",
    "STALENESS_EXPONENT": "diloco_core.spec.syncer",
    "dylu_inner_steps": "diloco_core.spec.syncer",
    "PROCESS_KNOBS": "diloco_core.spec.syncer",
    "tape_only_knobs": "diloco_core.spec.syncer",
    "exact_decimal": "diloco_core.spec.syncer",
    "round_weights": "diloco_core.spec.syncer",
    "SYNCER_SETTINGS": "diloco_core.spec.syncer_settings",
    "SyncerSetting": "diloco_core.spec.syncer_settings",
    "syncer_preset": "diloco_core.spec.syncer_settings",
    "close_time": "diloco_core.spec.quorum_close",
    "closed": "diloco_core.spec.quorum_close",
    "simulate_tape": "diloco_core.spec.tape",
    "Contribution": "diloco_core.spec.tape",
    "Sent": "diloco_core.spec.tape",
    "Dropped": "diloco_core.spec.tape",
    "Committed": "diloco_core.spec.tape",
    "Merged": "diloco_core.spec.tape",
    "Lost": "diloco_core.spec.tape",
    "Joined": "diloco_core.spec.tape",
}
__all__ = list(_PUBLIC)

__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())
