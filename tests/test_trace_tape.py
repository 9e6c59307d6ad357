"""A real quorum run's trace as a syncer tape (diloco_core.runtime.trace_tape): a synchronous round,
a dropped late contribution, the file round trip, the tape's drops (what ``--tape`` replays
in-step), and one-line refusals (Streaming, losses, a tape for another run, a replay the trainer
cannot make)."""

import pytest

from diloco_core.algorithm.config import DiLoCoConfig
from diloco_core.run.config import TrainConfig
from diloco_core.run.syncer_options import SyncerOptions, tape_drops
from diloco_core.runtime.trace_tape import drops_of_tape, read_tape, tape_from_trace, write_tape
from diloco_core.spec.tape import Committed, Contribution, Dropped, Lost, Merged, Sent


def _settle(step, present, fragment=0, sent_at=None):
  return {"kind": "settle", "step": step, "fragment": fragment, "sent_at": step if sent_at is None else sent_at,
          "time": 0.0, "present": present}


def test_a_synchronous_round_is_every_replica_sent_committed_and_merged():
  tape = tape_from_trace([{"kind": "compute", "step": 1}, _settle(4, None)], replicas=2, sync_every=4)
  assert tape == (Sent(4, 0, 4, 0), Sent(4, 1, 4, 0),
                  Committed(4, 1, (Contribution(0, 4, 0, 4), Contribution(1, 4, 0, 4))),
                  Merged(4, 0, 4, 1, False), Merged(4, 1, 4, 1, False))


def test_a_late_contribution_is_dropped_and_its_replica_healed():
  tape = tape_from_trace([_settle(4, [1.0, 1.0, 0.0]), _settle(8, [1.0, 0.0, 1.0])], replicas=3, sync_every=4)
  assert [e for e in tape if isinstance(e, Dropped)] == [Dropped(4, 2, 4, 0, 1), Dropped(8, 1, 8, 1, 1)]
  assert [[c.replica for c in e.members] for e in tape if isinstance(e, Committed)] == [[0, 1], [0, 2]]
  assert [(e.replica, e.heal) for e in tape if isinstance(e, Merged) and e.version == 2] == [(0, False), (1, True), (2, False)]
  assert [(e.tick, e.KIND, e.replica) for e in tape] == sorted((e.tick, e.KIND, e.replica) for e in tape)


@pytest.mark.parametrize("rows,message", [
    ([_settle(4, None, fragment=1)], "`fragments`: the trace syncs fragment 1 (Streaming)"),
    ([_settle(5, None, sent_at=4)], "`overlap`: the trace merges at step 5 a sync sent at step 4"),
    ([{"kind": "heal", "step": 4, "replicas": [2], "source": 0}], "a healed replacement (elastic)"),
    ([{"kind": "resumed", "step": 4}], "a resumed run"),
    ([{"kind": "lost", "step": 4, "processes": [2]}], "names processes: pass `processes`"),
    ([{"kind": "lost", "step": 2, "processes": [2]}, _settle(4, None)],
     "replica 2 is a member of the round of step 4 after its loss at step 2"),
    ([_settle(8, None)], "`sync_every`: the trace's sync #1 was sent at step 8, not 4"),
    ([_settle(4, [1.0, 1.0])], "`replicas`: the trace's sync of step 4 lists 2 replicas; the run has 3."),
])
def test_what_the_player_cannot_play_is_one_line(rows, message):
  with pytest.raises(ValueError) as e:
    tape_from_trace(rows, replicas=3, sync_every=4, processes=None if "pass `processes`" in message else 3)
  assert message in str(e.value) and "\n" not in str(e.value)


def test_the_file_round_trips_and_refuses_another_run(tmp_path):
  tape = tape_from_trace([_settle(4, [1.0, 0.0, 1.0]), _settle(8, None)], replicas=3, sync_every=4)
  path = str(tmp_path / "tape.json")
  write_tape(path, tape, replicas=3, sync_every=4)
  assert read_tape(path, 3, 4, steps=9) == tape
  for args, message in [((2, 4), "was recorded with replicas=3, sync_every=4; this run has replicas=2"),
                        ((3, 4, 16), "has 2 syncs; this run of steps=16 makes 4"),
                        ((3, 4), "no file")]:
    with pytest.raises(ValueError, match="`tape`") as e:
      read_tape(path if message != "no file" else path + ".missing", *args)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_tapes_drops_are_its_dropped_contributions_and_give_the_tape_back():
  rows = [_settle(4, [1.0, 1.0, 0.0]), _settle(8, None), _settle(12, [0.0, 1.0, 0.0])]
  tape = tape_from_trace(rows, replicas=3, sync_every=4)
  assert drops_of_tape(tape, 3, 4) == ((4, 2), (12, 0), (12, 2))
  assert drops_of_tape(tape_from_trace([_settle(4, None)], 3, 4), 3, 4) == ()
  swapped = list(tape)
  swapped[0], swapped[1] = swapped[1], swapped[0]  # not the lock step's order
  for bad, message in [(swapped, "its event 1 is Sent(tick=4, replica=1"),
                       (tape[:-1], "the lock step of its 3 rounds has"),
                       # a dropped contribution that its round still counts
                       ([*tape[:3], Dropped(4, 1, 4, 0, 1), *tape[3:]], "its event 4 is Dropped(tick=4, replica=1"),
                       # a lost replica that still sends
                       ([Lost(2, 0, 0), *tape], "replica 0 is a member of the round of step 4 after its loss at step 2")]:
    with pytest.raises(ValueError) as e:
      drops_of_tape(bad, 3, 4)
    assert str(e.value).startswith("`tape`: ") and message in str(e.value) and "\n" not in str(e.value)


def test_a_lost_process_is_its_replicas_lost_silent_after_and_dropped_from_its_rounds():
  """Process 1 of 2 (replicas 2 and 3 of 4) is lost at step 6: Lost at tick 6 (its sends so far: 4
  local steps), no Sent, Dropped or Merged of theirs after, and the drops of every later round."""
  rows = [_settle(4, None), {"kind": "lost", "step": 6, "processes": [1], "at": "x"},
          _settle(8, [1.0, 1.0, 0.0, 0.0]), _settle(12, [1.0, 0.0, 0.0, 0.0])]
  tape = tape_from_trace(rows, replicas=4, sync_every=4, processes=2)
  assert [e for e in tape if isinstance(e, Lost)] == [Lost(6, 2, 4), Lost(6, 3, 4)]
  assert not any(e.replica in (2, 3) for e in tape if e.tick > 6)
  assert [e for e in tape if isinstance(e, Dropped)] == [Dropped(12, 1, 12, 2, 1)]  # the late one, not the lost
  assert drops_of_tape(tape, 4, 4) == ((8, 2), (8, 3), (12, 1), (12, 2), (12, 3))
  assert [(e.tick, e.KIND, e.replica) for e in tape] == sorted((e.tick, e.KIND, e.replica) for e in tape)


def test_a_replica_lost_at_a_round_it_is_a_member_of_is_lost_after_that_round():
  """Process 1 of 3 contributed to the round of step 8, then was lost; the others learned of it at
  the log row of step 8 (a ``lost`` row at step 8): replica 1 is a member of round 8 and ``Lost``
  at tick 9 (its sends so far: 8 local steps), silent after; the tape's drops give it back."""
  rows = [_settle(4, [1.0, 1.0, 0.0]), _settle(8, [1.0, 1.0, 0.0]), {"kind": "lost", "step": 8, "processes": [1]},
          _settle(12, [1.0, 0.0, 1.0]), _settle(16, [1.0, 0.0, 1.0])]
  tape = tape_from_trace(rows, replicas=3, sync_every=4, processes=3)
  assert [e for e in tape if isinstance(e, Lost)] == [Lost(9, 1, 8)]
  assert [[c.replica for c in e.members] for e in tape if isinstance(e, Committed)] == [[0, 1], [0, 1], [0, 2], [0, 2]]
  assert not any(e.replica == 1 for e in tape if e.tick > 9)
  assert drops_of_tape(tape, 3, 4) == ((4, 2), (8, 2), (12, 1), (16, 1))
  # lost at 8 and a member of a later round: still refused (a lost replica never comes back)
  with pytest.raises(ValueError, match="replica 1 is a member of the round of step 12 after its loss at step 9"):
    tape_from_trace([*rows[:3], _settle(12, None)], replicas=3, sync_every=4, processes=3)


_GOOD = {"replicas": 3, "sync_every": 4, "events": [
    {"event": "Sent", "tick": 4, "replica": 0, "step": 4, "base": 0},
    {"event": "Committed", "tick": 4, "version": 1, "members": [[0, 4, 0, 4]]},
    {"event": "Merged", "tick": 4, "replica": 0, "step": 4, "version": 1, "heal": False}]}


def _edit(path, change):
  import copy
  import json
  data = copy.deepcopy(_GOOD)
  change(data)
  with open(path, "w") as f:
    json.dump(data, f)
  return path


@pytest.mark.parametrize("change,message", [
    (lambda d: d.pop("replicas"), "field 'replicas' must be an integer, got missing."),
    (lambda d: d.update(replicas="3"), "field 'replicas' must be an integer, got '3' (str)."),
    (lambda d: d.update(sync_every=4.0), "field 'sync_every' must be an integer, got 4.0 (float)."),
    (lambda d: d.update(replicas=True), "field 'replicas' must be an integer, got True (bool)."),
    (lambda d: d.pop("events"), "field 'events' must be a list, got nothing."),
    (lambda d: d.update(events={"a": 1}), "field 'events' must be a list, got {'a': 1}."),
    (lambda d: d["events"].append(3), "event 4 must be an object, got 3."),
    (lambda d: d["events"][0].update(event="Arrived"), "event 1 field 'event' must be one of ['Committed', 'Dropped',"),
    (lambda d: d["events"][0].pop("event"), "event 1 field 'event' must be one of"),
    (lambda d: d["events"][0].pop("base"), "event 1 (Sent) field 'base' must be an integer, got missing."),
    (lambda d: d["events"][0].update(tick="4"), "event 1 (Sent) field 'tick' must be an integer, got '4' (str)."),
    (lambda d: d["events"][0].update(late=1), "event 1 (Sent) has field(s) ['late'] it does not take"),
    (lambda d: d["events"][1].update(members=[[0, 4, 0]]), "event 2 (Committed) field 'members' must be a list of"),
    (lambda d: d["events"][1].update(members=[[0, 4, 0, "4"]]),
     "event 2 (Committed) member field 'inner_steps' must be an integer, got '4' (str)."),
    (lambda d: d["events"][2].update(heal=0), "event 3 (Merged) field 'heal' must be true or false, got 0 (int)."),
])
def test_every_malformed_field_of_a_tape_file_is_one_line_naming_it(tmp_path, change, message):
  path = _edit(str(tmp_path / "tape.json"), change)
  with pytest.raises(ValueError) as e:
    read_tape(path, 3, 4)
  assert str(e.value).startswith(f"`tape`: {path!r} is not a tape file: ") and message in str(e.value), str(e.value)
  assert "\n" not in str(e.value)


def test_a_good_tape_file_reads_and_a_mismatch_shows_types_only_when_values_print_alike(tmp_path):
  from diloco_core.runtime.trace_tape import _differ
  path = _edit(str(tmp_path / "tape.json"), lambda d: None)
  assert len(read_tape(path, 3, 4)) == 3
  with pytest.raises(ValueError, match=r"recorded with replicas=3, sync_every=4; this run has replicas=2, sync_every=4\."):
    read_tape(path, 2, 4)

  class Three(int):  # a value that prints as 3 and is not the recorded 3
    def __repr__(self):
      return "3"

    def __eq__(self, other):
      return False

    __hash__ = int.__hash__

  assert _differ(3, Three(3)) == "3 (int)" and _differ(Three(3), 3) == "3 (Three)" and _differ(3, 2) == "3"


def _recorded(tmp_path):
  path = str(tmp_path / "tape.json")
  write_tape(path, tape_from_trace([_settle(4, [1.0, 0.0, 1.0]), _settle(8, None)], 3, 4), replicas=3, sync_every=4)
  return path


def _run(path, syncer=None, **kw):
  algo = DiLoCoConfig(**{"replicas": 3, "sync_every": 4, **kw.pop("algo", {})})
  return TrainConfig(algo=algo, model="tiny", steps=8, syncer=syncer or SyncerOptions(tape=path), **kw)


def test_a_recorded_tape_validates_as_its_drops_on_any_mesh(tmp_path):
  path = _recorded(tmp_path)
  run = _run(path, mesh="diloco=3,data=1")
  run.validate()
  assert tape_drops(run) == ((4, 1),)
  assert not run.syncer.plays_tape(run)  # the trainer itself replays it, in lock step
  _run(path, drop_schedule=((4, 1),)).validate()  # its own drops, spelled out: the same run


@pytest.mark.parametrize("kw,message", [
    ({"algo": {"fragments": 2, "algorithm": "streaming"}}, "`fragments`=2 with `tape`: a recorded tape is replayed in-step"),
    ({"algo": {"overlap": 1}}, "`overlap`=1 with `tape`"),
    ({"communication": "background", "elastic": True}, "`tape`='"),  # (check_on_processes: not a process knob)
    ({"drop_prob": 0.1}, "`drop_prob`=0.1 with `tape`"),
    ({"drop_schedule": ((8, 0),)}, "`drop_schedule`=((8, 0),) with `tape`: the replay's drops are the tape's, ((4, 1),);"),
    ({"algo": {"outer_overlap": "eager"}}, "`tape` replays as drop_schedule=((4, 1),): drop_schedule / drop_prob are not"),
    ({"syncer": "quorum"}, "`quorum`=2 with `tape`: a recorded tape already says who synced when"),
])
def test_a_replay_the_trainer_cannot_make_is_one_line(tmp_path, kw, message):
  path = _recorded(tmp_path)
  if kw.get("syncer") == "quorum":
    kw = {"syncer": SyncerOptions(tape=path, quorum=2)}
  with pytest.raises(ValueError) as e:
    _run(path, **kw).validate()
  assert message in str(e.value) and "\n" not in str(e.value)
