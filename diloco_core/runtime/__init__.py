"""How syncs run: in the step, or in the background over a link, elastic or not.

Layer 4. :class:`~diloco_core.runtime.communication.Runtime` is the protocol the training loop
calls (its every method); the runtimes compose the algorithm's phases.

May import: spec, devices, wire, algorithm.

Modules: :mod:`~diloco_core.runtime.communication` (``Runtime``, ``InStep``),
:mod:`~diloco_core.runtime.option_checks` (the refusals of options alone, without JAX),
:mod:`~diloco_core.runtime.background` with :mod:`~diloco_core.runtime.background_programs` and
:mod:`~diloco_core.runtime.background_mesh`, :mod:`~diloco_core.runtime.link` (payloads between
processes), :mod:`~diloco_core.runtime.membership` (agreements over the coordination service) with
:mod:`~diloco_core.runtime.agreement` (what a barrier agrees on),
:mod:`~diloco_core.runtime.data_plane` with :mod:`~diloco_core.runtime.plane_frames` (an elastic
run's payloads peer to peer over ZeroMQ), :mod:`~diloco_core.runtime.plane_reduce` (an elastic
sync as a reduce-scatter over its members),
:mod:`~diloco_core.runtime.elastic` and :mod:`~diloco_core.runtime.elastic_runtime`,
:mod:`~diloco_core.runtime.quorum` (a K-of-M quorum deciding an elastic run's syncs in wall-clock time),
:mod:`~diloco_core.runtime.tape_player` (the real model trained as a syncer tape says) with
:mod:`~diloco_core.runtime.tape_runtime` (the runtime that plays it, one round per step), and
:mod:`~diloco_core.runtime.trace_tape` (a real elastic run's trace as a tape).
"""

from diloco_core.lazy import lazy_exports

#: Public names, with the module that defines them (loaded on first use).
_PUBLIC = {
    "Runtime": "diloco_core.runtime.communication",
    "InStep": "diloco_core.runtime.communication",
    "make_communication": "diloco_core.runtime.communication",
    "Background": "diloco_core.runtime.background",
    "ElasticRuntime": "diloco_core.runtime.elastic_runtime",
    "Membership": "diloco_core.runtime.membership",
    "Agreement": "diloco_core.runtime.agreement",
    "reduce_over_members": "diloco_core.runtime.plane_reduce",
    "DataPlane": "diloco_core.runtime.data_plane",
    "PlaneTimeout": "diloco_core.runtime.data_plane",
    "Link": "diloco_core.runtime.link",
    "LostProcessError": "diloco_core.runtime.link",
    "QuorumRule": "diloco_core.runtime.quorum",
    "decide": "diloco_core.runtime.quorum",
    "vote_exchange": "diloco_core.runtime.quorum",
    "TapePlay": "diloco_core.runtime.tape_player",
    "TapeResult": "diloco_core.runtime.tape_player",
    "TapeSetup": "diloco_core.runtime.tape_player",
    "play_tape": "diloco_core.runtime.tape_player",
    "speed_ticks": "diloco_core.runtime.tape_player",
    "tape_for": "diloco_core.runtime.tape_player",
    "TapeRuntime": "diloco_core.runtime.tape_runtime",
    "check_playable": "diloco_core.runtime.option_checks",
    "drops_of_tape": "diloco_core.runtime.trace_tape",
    "read_tape": "diloco_core.runtime.trace_tape",
    "record_tape": "diloco_core.runtime.trace_tape",
    "tape_from_trace": "diloco_core.runtime.trace_tape",
    "write_tape": "diloco_core.runtime.trace_tape",
}
__all__ = list(_PUBLIC)

__getattr__, __dir__ = lazy_exports(__name__, _PUBLIC, globals())
