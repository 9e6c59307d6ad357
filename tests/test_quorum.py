"""Stragglers on real processes: a K-of-M quorum decides each sync of an elastic run in wall-clock
time (diloco_core.runtime.quorum), a late process is left out of it and healed, and the run equals
the tape it recorded replayed in-step (``--tape``: its drops) on a mesh, bit for bit; a grace longer than the delay
waits for it (every process counts, the plain run's numbers); one-line errors for the rest."""

import os
import subprocess
import sys
import threading
import time
from types import SimpleNamespace

import jax
import numpy as np
import pytest

from diloco_core.algorithm.config import DiLoCoConfig
from diloco_core.run.config import TrainConfig
from diloco_core.run.drops import schedule_from_trace
from diloco_core.run.syncer_options import SyncerOptions, parse_step_delay
from diloco_core.runtime.quorum import QuorumRule, vote_exchange
from tiny_run import ENV, metrics_rows, THREE, trace_rows as _trace, xla_flags

FLAGS = ["--model", "tiny", "--replicas", "3", "--sync-every", "4", "--steps", "16", "--batch-size", "2",
         "--seq-len", "8", "--eval-every", "8", "--log-every", "8", "--warmup-steps", "1", "--no-progress",
         "--algorithm", "diloco", "--communication", "background"]
DELAY = 0.75  # process 2 sleeps this long after each inner step: 3 s late at each sync (H = 4)
SYNCS = (4, 8, 12, 16)


def _launch(*args):
  return subprocess.run([sys.executable, "-m", "diloco_core.launch", *THREE, "--", *FLAGS, "--elastic",
                         "--step-delay", f"2:{DELAY}", *args], env=ENV, capture_output=True, text=True, timeout=500)


def _replay(out, replay) -> list[dict]:
  """The run in ``out`` replayed in-step on three devices from the tape it recorded (``--tape``: its
  rounds' drops, which are process 0's trace's): checks the final params are equal bit for bit;
  the metrics rows."""
  from diloco_core.runtime.trace_tape import drops_of_tape, read_tape
  tape = os.path.join(out, "tape.json")
  assert drops_of_tape(read_tape(tape, 3, 4), 3, 4) == schedule_from_trace(_trace(out, 0), replicas=3)
  flags = [x for x in FLAGS if x not in ("--communication", "background")]
  r = subprocess.run([sys.executable, "-m", "diloco_core.train", *flags, "--mesh", "diloco=3,data=1",
                      "--tape", tape, "--out", str(replay)],
                     env=dict(ENV, XLA_FLAGS=xla_flags(3)), capture_output=True, text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  from diloco_core.store.params_io import load_params
  a, b = (jax.tree.leaves(load_params(os.path.join(d, "final_params"))) for d in (out, replay))
  assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b, strict=True))
  return metrics_rows(os.path.join(replay, "metrics.jsonl"))


def _same_numbers(out, replay):
  rows, rows2 = metrics_rows(os.path.join(out, "metrics.jsonl")), _replay(out, replay)
  assert [x["eval_loss"] for x in rows] == [x["eval_loss"] for x in rows2]
  assert [x["replica_loss"] for x in rows] == [x["replica_loss"] for x in rows2]


def _straggled(out):
  """Process 2's compute rows record the delay, and last at least that long."""
  compute = [x for x in _trace(out, 2) if x["kind"] == "compute"]
  assert len(compute) == 16 and all(x["delay"] == DELAY and x["end"] - x["start"] >= DELAY for x in compute)
  assert all("delay" not in x for x in _trace(out, 0) if x["kind"] == "compute")


@pytest.mark.slow
def test_a_late_process_is_dropped_by_the_quorum_and_the_run_equals_its_replay(tmp_path):
  """K = 2 of 3, no grace, process 2 slowed by 0.75 s a step: each sync is decided by the first two
  (process 2 arrives after the decision is written, reads it and heals); every process records
  the same decisions, each written before process 2 arrived (so no sync waited for it; the log
  rows, barriers over every process, still do); replayed in-step as a drop schedule, bit for bit."""
  out = str(tmp_path / "quorum")
  r = _launch("--quorum", "2", "--out", out)
  assert r.returncode == 0, r.stderr[-3000:]
  _straggled(out)
  traces = [_trace(out, rank) for rank in range(3)]
  settles = [[(x["sent_at"], x["present"]) for x in t if x["kind"] == "settle"] for t in traces]
  assert settles[0] == settles[1] == settles[2]
  assert [s for s, _ in settles[0]] == list(SYNCS)
  late = {s for s, present in settles[0] if present == [1.0, 1.0, 0.0]}
  assert late >= set(SYNCS[1:]), settles[0]  # the first sync: as the start-up skew has it
  assert all(present in ([1.0, 1.0, 0.0], [1.0, 1.0, 1.0]) for _, present in settles[0])
  votes = [{x["at"]: x for x in t if x["kind"] == "quorum"} for t in traces]
  for s in sorted(late):
    key = f"fragment 0 @ step {s}"
    decider = [v[key] for v in votes if v[key]["decided"]]
    assert len(decider) == 1 and decider[0]["members"] == [0, 1]  # one decision, written once
    assert votes[2][key]["start"] >= decider[0]["end"] - 0.05  # it arrived after the decision
  assert schedule_from_trace(traces[0], replicas=3) == tuple((s, 2) for s in sorted(late))
  _same_numbers(out, tmp_path / "replay")  # its tape.json, replayed on a mesh of three devices
  _player_plays(out, traces[0])


def _player_plays(out, trace):
  """The tape player (diloco_core.runtime.tape_player: one device, the M replicas in one vmap, the
  program of simulated tapes) plays the recorded tape: the members of its rounds are the
  trace's, and the params equal the in-step run of its drops on one device bit for bit
  (``present_mean``'s masked mean over M and the player's mean over the members give the same
  bits here); against the real run (one replica per process, as the mesh replay) the
  one-device programs round 1 ulp differently (measured: final params 1.2e-7 apart, eval losses
  2.4e-7): the tolerance of test_mesh.py's one device against a mesh, not bit for bit."""
  from diloco_core.run.cli import build_parser, config_from_args
  from diloco_core.run.loop import train
  from diloco_core.run.tape_run import make_setup
  from diloco_core.runtime.tape_player import play_tape
  from diloco_core.runtime.trace_tape import read_tape
  from diloco_core.spec.syncer import SyncerConfig
  from diloco_core.spec.tape import Committed
  from diloco_core.store.params_io import load_params
  path = os.path.join(out, "tape.json")
  tape = read_tape(path, 3, 4, 16)
  assert [[c.replica for c in e.members] for e in tape if isinstance(e, Committed)] == [
      [m for m, on in enumerate(x["present"] or [1.0] * 3) if on > 0] for x in trace if x["kind"] == "settle"]
  flags = [x for x in FLAGS if x not in ("--communication", "background")]
  cfg = config_from_args(build_parser().parse_args([*flags, "--tape", path]))
  played = play_tape(cfg, SyncerConfig(), tape, make_setup(cfg))
  in_step = train(cfg)  # one device, the tape's drops
  for a, b in zip(jax.tree.leaves(played.params), jax.tree.leaves(in_step.params), strict=True):
    assert np.array_equal(np.asarray(a), np.asarray(b))
  for a, b in zip(jax.tree.leaves(played.params), jax.tree.leaves(load_params(os.path.join(out, "final_params"))),
                  strict=True):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=2e-5, atol=2e-6)
  real = {x["step"]: x["eval_loss"] for x in metrics_rows(os.path.join(out, "metrics.jsonl")) if x.get("eval_loss") is not None}
  played_evals = {4 * v: x for v, x in played.version_eval_losses}
  assert real and set(real) <= set(played_evals)
  np.testing.assert_allclose([played_evals[s] for s in sorted(real)], [real[s] for s in sorted(real)], rtol=2e-5, atol=2e-6)


@pytest.mark.slow
def test_a_grace_longer_than_the_delay_waits_for_the_straggler(tmp_path):
  """K = 2 with a grace of 60 s: each sync stays open until process 2 arrives (it closes as soon as
  every live process has), so every process counts in every sync: the plain run's numbers, bit
  for bit (the in-step run without drops), though process 2 was 0.75 s a step slower."""
  out = str(tmp_path / "grace")
  r = _launch("--quorum", "2", "--grace-s", "60", "--out", out)
  assert r.returncode == 0, r.stderr[-3000:]
  _straggled(out)
  trace = _trace(out, 0)
  assert [x["present"] for x in trace if x["kind"] == "settle"] == [[1.0, 1.0, 1.0]] * len(SYNCS)
  votes = [x for x in trace if x["kind"] == "quorum"]
  assert [x["members"] for x in votes] == [[0, 1, 2]] * len(SYNCS) and not any(x["late"] for x in votes)
  assert max(x["end"] - x["start"] for x in votes) > DELAY  # the grace held a sync open for process 2
  assert schedule_from_trace(trace, replicas=3) == ()
  _same_numbers(out, tmp_path / "plain")


@pytest.mark.slow
def test_a_lost_process_is_one_more_event_on_the_tape_and_its_replay_is_bit_for_bit(tmp_path):
  """K = 2 of 3, process 2 SIGKILLed as it hands over the sync of step 8 (no delay): the run goes on
  with processes 0 and 1; its tape has replica 2 Lost and silent after, every later round of
  replicas 0 and 1; replayed from the tape (``--tape``: its drops) on three devices, the final
  params, the eval losses and the survivors' losses are the run's, bit for bit (the lost
  replica's own losses are null in the run, computed in the replay)."""
  out = str(tmp_path / "lost")
  r = subprocess.run([sys.executable, "-m", "diloco_core.launch", *THREE, "--module", "kill_child", "--", *FLAGS,
                      "--elastic", "--quorum", "2", "--out", out],
                     env=dict(ENV, KILL_RANK="2", KILL_AT_STEP="8"), capture_output=True, text=True, timeout=500)
  assert r.returncode == 0, r.stderr[-3000:]
  from diloco_core.runtime.trace_tape import drops_of_tape, read_tape
  from diloco_core.spec.tape import Committed, Lost
  tape = read_tape(os.path.join(out, "tape.json"), 3, 4, 16)
  [lost] = [e for e in tape if isinstance(e, Lost)]
  assert lost.replica == 2 and lost.tick >= 8, lost
  assert [[c.replica for c in e.members] for e in tape if isinstance(e, Committed)][2:] == [[0, 1], [0, 1]]
  assert not any(e.replica == 2 for e in tape if e.tick > lost.tick)
  assert drops_of_tape(tape, 3, 4) == schedule_from_trace(_trace(out, 0), replicas=3)
  rows, rows2 = metrics_rows(os.path.join(out, "metrics.jsonl")), _replay(out, tmp_path / "replay")
  assert [x["eval_loss"] for x in rows] == [x["eval_loss"] for x in rows2]
  assert [x["replica_loss"][:2] for x in rows] == [x["replica_loss"][:2] for x in rows2]
  assert rows[-1]["replica_loss"][2] is None


@pytest.mark.slow
def test_a_fast_process_lost_after_its_vote_leaves_a_tape_that_replays_bit_for_bit(tmp_path):
  """K = 2 of 3, process 2 slowed: process 1 (fast) is SIGKILLed right after its vote on the sync
  of step 8 returned, a member of that round (with process 0; process 2 late and healed); the
  others learn of the loss at the log row of step 8. The tape records replica 1 ``Lost`` after
  the round it last contributed to (tick 9), a member of round 8 and silent after; replayed
  from the tape on three devices, the final params, the eval losses and the survivors' losses
  are the run's, bit for bit."""
  out = str(tmp_path / "lost-fast")
  r = subprocess.run([sys.executable, "-m", "diloco_core.launch", *THREE, "--module", "kill_child", "--", *FLAGS,
                      "--elastic", "--quorum", "2", "--step-delay", f"2:{DELAY}", "--out", out],
                     env=dict(ENV, KILL_RANK="1", KILL_AT_STEP="8", KILL_AFTER_VOTE="1"),
                     capture_output=True, text=True, timeout=500)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "no tape.json recorded" not in r.stderr, r.stderr[-3000:]
  from diloco_core.runtime.trace_tape import read_tape
  from diloco_core.spec.tape import Committed, Lost
  lost_rows = [x for x in _trace(out, 0) if x["kind"] == "lost"]
  assert [x["processes"] for x in lost_rows] == [[1]] and lost_rows[0]["step"] == 8, lost_rows  # noticed at 8
  tape = read_tape(os.path.join(out, "tape.json"), 3, 4, 16)
  assert [e for e in tape if isinstance(e, Lost)] == [Lost(9, 1, 8)]
  assert [[c.replica for c in e.members] for e in tape if isinstance(e, Committed)] == [[0, 1], [0, 1], [0, 2], [0, 2]]
  assert not any(e.replica == 1 for e in tape if e.tick > 9)
  rows, rows2 = metrics_rows(os.path.join(out, "metrics.jsonl")), _replay(out, tmp_path / "replay")
  assert [x["eval_loss"] for x in rows] == [x["eval_loss"] for x in rows2]
  assert [x["replica_loss"][::2] for x in rows] == [x["replica_loss"][::2] for x in rows2]


class _Service:
  """An in-memory key-value store with the coordination service client's calls a vote makes."""

  def __init__(self):
    self.kv, self.lock = {}, threading.Lock()

  def key_value_set(self, key, value, allow_overwrite=False):
    with self.lock:
      if key in self.kv and not allow_overwrite:
        raise RuntimeError(f"ALREADY_EXISTS: {key}")
      self.kv[key] = value.encode() if isinstance(value, str) else value

  key_value_set_bytes = key_value_set

  def key_value_try_get_bytes(self, key):
    with self.lock:
      if key not in self.kv:
        raise RuntimeError("NOT_FOUND")
      return self.kv[key]

  def key_value_dir_get(self, directory):
    with self.lock:
      return [(k, v) for k, v in self.kv.items() if k.startswith(directory + "/")]

  def blocking_key_value_get_bytes(self, key, timeout_ms):
    return self.blocking_get(self.kv, key, timeout_ms / 1000)

  def blocking_get(self, store, key, timeout_s=10.0):
    deadline = time.time() + timeout_s
    while time.time() < deadline:
      with self.lock:
        if key in store:
          return store[key]
      time.sleep(0.001)
    raise RuntimeError("DEADLINE_EXCEEDED")


@pytest.mark.parametrize("grace_s,members", [(0.0, (0, 1)), (5.0, (0, 1, 2))])
def test_a_vote_is_decided_once_and_read_by_the_late_process(grace_s, members):
  """Three threads vote (process 2 arrives 0.3 s late): one decision, the same for all; without a
  grace the late one is left out and gets no payload but its own's absence; with one it counts."""
  service, freed, out, sent = _Service(), [], {}, {}

  def vote(rank, delay):
    time.sleep(delay)
    membership = SimpleNamespace(client=service, rank=rank, prefix="p", live={0: 1, 1: 1, 2: 1},
                                 payload_timeout_s=10.0, free_later=lambda *k: freed.extend(k),
                                 send=lambda key, payload, to: sent.update({(key, rank): payload}),  # the data plane
                                 take=lambda key, r: service.blocking_get(sent, (key, r)), finish=lambda key: None)
    out[rank] = vote_exchange(membership, "sync-4", bytes([rank]), QuorumRule(2, grace_s))

  threads = [threading.Thread(target=vote, args=(r, 0.3 if r == 2 else 0.0)) for r in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert {out[r][0].members for r in range(3)} == {members}
  assert sum(out[r][1]["decided"] for r in range(3)) == 1
  assert all(out[r][0].payloads == {m: bytes([m]) for m in members} for r in members)
  assert out[2][1]["late"] == [r for r in range(3) if r not in members]
  assert "p/sync-4/decision" in freed


def _cfg(**kw):
  syncer = SyncerOptions(**{k: kw.pop(k) for k in list(kw) if k in SyncerOptions.__dataclass_fields__})
  return TrainConfig(algo=DiLoCoConfig(replicas=3), model="tiny", syncer=syncer, **kw)


BG = {"communication": "background", "elastic": True}


@pytest.mark.parametrize("kw,message", [
    ({**BG, "quorum": 2, "late": "carry"}, "`late`='carry' is not built on real processes"),
    ({**BG, "quorum": 2, "apply": "sequential"}, "`apply`='sequential' is not built on real processes"),
    ({**BG, "quorum": 2, "grace": 3}, "`grace`=3 is not built on real processes"),
    ({**BG, "quorum": 4}, "`quorum` (K) must be an integer in [1, replicas=3], got 4."),
    ({"communication": "background", "quorum": 2}, "`quorum` on real processes leaves a late process out"),
    ({**BG, "grace_s": 1.0}, "`grace_s` keeps a quorum's sync open: pass `quorum` K < replicas=3"),
    ({**BG, "quorum": 2, "grace_s": -1.0}, "`grace_s`"),
    ({**BG, "step_delay": ((3, 0.5),)}, "`step_delay` names process 3"),
    ({**BG, "step_delay": ((0, 0.1), (0, 0.2))}, "`step_delay` names process 0 twice"),
    ({**BG, "step_delay": ((0, 1e300),)}, "`step_delay` of process 0 must be a finite number in [0, "),
    ({**BG, "quorum": 2, "min_replicas": 3}, "`quorum` K=2 closes a sync with 2 replica(s), fewer than `min_replicas`=3"),
    ({"grace_s": 1.0}, "`grace_s` acts on real processes: use `communication` background"),
    ({"step_delay": ((1, 0.5),)}, "`step_delay` acts on real processes: use `communication` background"),
])
def test_bad_real_process_options_are_one_line_errors(kw, message):
  with pytest.raises(ValueError) as e:
    _cfg(**kw).validate()
  assert message in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("processes", [1, 2])
def test_a_step_delay_for_a_process_the_run_does_not_have_is_refused(processes):
  """One background process with two replicas (the trainer alone), or two processes of four:
  a delay for process ``processes`` would never act."""
  from diloco_core.run.preflight import check_processes
  run = TrainConfig(algo=DiLoCoConfig(replicas=4), model="tiny", communication="background",
                    syncer=SyncerOptions(step_delay=((processes, 0.5),)))
  run.validate()  # the options alone are fine: the process count decides
  with pytest.raises(ValueError) as e:
    check_processes(run, processes=processes)
  assert str(e.value) == (f"`step_delay` names process {processes}, but the run has {processes} process(es) (0 to"
                          f" {processes - 1}): name one of them, or start more processes.")
  check_processes(run, processes=2 * processes)  # then it names one of them


def test_the_allowed_combination_validates_and_the_flag_parses():
  _cfg(**BG, quorum=2, grace_s=1.5, step_delay=((2, 0.5),)).validate()
  _cfg(communication="background", step_delay=((1, 0.25),)).validate()  # a straggler alone: no quorum
  assert not _cfg(**BG, quorum=2).syncer.plays_tape(_cfg(**BG, quorum=2))
  with pytest.raises(ValueError, match="PROCESS:SECONDS"):
    parse_step_delay("2=0.5")
