"""A real quorum run's trace as a syncer tape (diloco_core.run.trace_tape): a synchronous round,
a dropped late contribution, the file round trip, and one-line refusals (Streaming, losses, a
tape for another run)."""

import pytest

from diloco_core.run.trace_tape import read_tape, tape_from_trace, write_tape
from diloco_core.spec.tape import Committed, Contribution, Dropped, Merged, Sent


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
    ([{"kind": "lost", "step": 4, "processes": [2]}], "a lost process (elastic)"),
    ([_settle(8, None)], "`sync_every`: the trace's sync #1 was sent at step 8, not 4"),
    ([_settle(4, [1.0, 1.0])], "`replicas`: the trace's sync of step 4 lists 2 replicas; the run has 3."),
])
def test_what_the_player_cannot_play_is_one_line(rows, message):
  with pytest.raises(ValueError) as e:
    tape_from_trace(rows, replicas=3, sync_every=4)
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
