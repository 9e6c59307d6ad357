"""One training run: its config, the loop, the command line, metrics and the main job.

Layer 5.

May import: spec, devices, data, model, store, algorithm, runtime.

Modules: :mod:`~diloco_core.run.config` (``TrainConfig``), :mod:`~diloco_core.run.preflight`
(the disk and device checks), :mod:`~diloco_core.run.loop`
(``train``), :mod:`~diloco_core.run.run_setup` (a run set up before its first step), :mod:`~diloco_core.run.programs` (the program cache), :mod:`~diloco_core.run.drops`,
:mod:`~diloco_core.run.divergence`, :mod:`~diloco_core.run.metrics_log`,
:mod:`~diloco_core.run.main_job` (DP vs DiLoCo vs Streaming), :mod:`~diloco_core.run.cli`,
:mod:`~diloco_core.run.flags` (the flags and the launch check, without JAX),
:mod:`~diloco_core.run.syncer_options` (the syncer's flags) and :mod:`~diloco_core.run.tape_run`
(``train`` from a syncer tape: its rounds stepped, its files written). The tape player, its
runtime and a real run's trace as a tape are runtimes' modules
(:mod:`~diloco_core.runtime.tape_player`, :mod:`~diloco_core.runtime.tape_runtime`,
:mod:`~diloco_core.runtime.trace_tape`); their public names are re-exported here as before.
"""

from diloco_core.lazy import lazy_exports

#: Public names, with the module that defines them (loaded on first use).
_PUBLIC = {
    "TrainConfig": "diloco_core.run.config",
    "TrainResult": "diloco_core.run.loop",
    "train": "diloco_core.run.loop",
    "clear_program_cache": "diloco_core.run.programs",
    "program_key": "diloco_core.run.programs",
    "compare": "diloco_core.run.main_job",
    "SyncerOptions": "diloco_core.run.syncer_options",
    "check_playable": "diloco_core.runtime.option_checks",
    "syncer_flags": "diloco_core.run.syncer_options",
    "tape_drops": "diloco_core.run.syncer_options",
    "TapeResult": "diloco_core.runtime.tape_player",
    "play_tape": "diloco_core.runtime.tape_player",
    "speed_ticks": "diloco_core.runtime.tape_player",
    "tape_for": "diloco_core.runtime.tape_player",
    "make_setup": "diloco_core.run.tape_run",
    "play_rounds": "diloco_core.run.tape_run",
    "drops_of_tape": "diloco_core.runtime.trace_tape",
    "read_tape": "diloco_core.runtime.trace_tape",
    "record_tape": "diloco_core.runtime.trace_tape",
    "tape_from_trace": "diloco_core.runtime.trace_tape",
    "write_tape": "diloco_core.runtime.trace_tape",
}
__all__ = list(_PUBLIC)

__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())
