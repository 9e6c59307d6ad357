"""Elastic runs over real processes: a killed process is left out and the others finish; the
run equals its own trace replayed as a drop schedule, bit for bit; below ``--min-replicas`` the
run stops in one line. (The membership underneath, with a rejoin: test_membership.py.)"""

import json
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import pytest

from diloco_core.run.drops import rejoins_from_trace, schedule_from_trace
from diloco_core.runtime.elastic import HEARTBEAT_S
from tiny_run import ENV, metrics_rows, THREE, trace_rows as _trace, xla_flags

FLAGS = ["--model", "tiny", "--replicas", "3", "--sync-every", "4", "--steps", "16", "--batch-size", "2",
         "--seq-len", "8", "--eval-every", "8", "--log-every", "4", "--warmup-steps", "1", "--no-progress",
         "--algorithm", "streaming", "--fragments", "2", "--compression", "fp4", "--error-feedback",
         "--communication", "background"]
KILLED_AT = 6  # process 2 dies as it hands over the fragment sent at step 6


def _launch(*args, env=ENV):
  return subprocess.run([sys.executable, "-m", "diloco_core.launch", *args], env=env, capture_output=True,
                        text=True, timeout=400)


@pytest.mark.slow
def test_a_killed_process_is_left_out_and_the_run_equals_its_replay(tmp_path):
  """Process 2 of 3 is SIGKILLed at step 6: processes 0 and 1 finish the run (exit 0, the launcher
  says who was lost), its replica is left out of every sync from step 6 on (the trace says so),
  after a wait bounded by the heartbeat; its losses are null from its loss on. Replayed as a
  drop schedule (schedule_from_trace) in the in-step runtime on three devices, the run gives
  the same eval losses, survivors' losses and final params, bit for bit."""
  out, stamp = str(tmp_path / "elastic"), tmp_path / "killed_at"
  env = dict(ENV, KILL_RANK="2", KILL_AT_STEP=str(KILLED_AT), KILL_STAMP=str(stamp))
  r = _launch(*THREE, "--module", "kill_child", "--", *FLAGS, "--elastic", "--out", out, env=env)
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stderr.strip().splitlines()[-1] == ("launch: process 2 of 3 was lost (killed by SIGKILL); the others"
                                                " went on without it (--elastic).")
  trace = [_trace(out, rank) for rank in (0, 1)]
  settles = [[(x["sent_at"], x["present"]) for x in t if x["kind"] == "settle"] for t in trace]
  assert settles[0] == settles[1] == [(s, [1.0, 1.0, 1.0] if s < KILLED_AT else [1.0, 1.0, 0.0])
                                      for s in range(2, 17, 2)]
  lost = [x for x in trace[0] if x["kind"] == "lost"]
  assert [(x["step"], x["processes"]) for x in lost] == [(KILLED_AT, [2])]
  assert lost[0]["time"] - float(stamp.read_text()) < 3 * HEARTBEAT_S  # bounded (slack for a loaded machine)
  rows = metrics_rows(os.path.join(out, "metrics.jsonl"))
  assert [x["replica_loss"][2] is None for x in rows] == [False, True, True, True]
  for x in rows:  # the mean over the replicas present
    present = [v for v in x["replica_loss"] if v is not None]
    assert x["train_loss"] == pytest.approx(np.mean(present), rel=1e-6)

  assert schedule_from_trace(trace[0], replicas=3) == tuple((s, 2) for s in range(KILLED_AT, 17, 2))
  rows2 = _replay(out, tmp_path / "replay")
  assert [x["eval_loss"] for x in rows] == [x["eval_loss"] for x in rows2]
  assert [x["replica_loss"][:2] for x in rows] == [x["replica_loss"][:2] for x in rows2]
  assert [x["total_bytes_sent"] for x in rows] == pytest.approx([x["total_bytes_sent"] for x in rows2], rel=1e-12)
  assert rows[0] == {k: v for k, v in rows2[0].items() if k != "participants"}  # before the loss: everything


@pytest.mark.slow
def test_a_process_killed_mid_transfer_is_left_out_and_the_run_equals_its_replay(tmp_path):
  """Process 2 is SIGKILLed in the middle of sending its payload of the fragment sent at step 6
  over the data plane (chunks of 64 bytes, so the payload spans several; the kill lands after a
  chunk past the first went out: a receiver holds part of it): processes 0 and 1 leave it out of
  that sync and every later one, drop what arrived of it, and the run equals its own trace
  replayed in-step, bit for bit."""
  out, stamp = str(tmp_path / "elastic"), tmp_path / "killed_at"
  env = dict(ENV, KILL_RANK="2", KILL_AT_STEP=str(KILLED_AT), KILL_STAMP=str(stamp), KILL_MID_TRANSFER="1",
             DILOCO_PLANE_CHUNK_BYTES="64", PLANE_LEFTOVERS=str(tmp_path / "leftovers"))
  r = _launch(*THREE, "--module", "kill_child", "--", *FLAGS, "--elastic", "--out", out, env=env)
  assert r.returncode == 0, r.stderr[-3000:]
  killed = json.loads(stamp.read_text())
  assert killed["chunk"] == 64 and 0 < killed["offset"] < killed["total"] and killed["total"] > 2 * 64, killed
  trace = [_trace(out, rank) for rank in (0, 1)]
  settles = [[(x["sent_at"], x["present"]) for x in t if x["kind"] == "settle"] for t in trace]
  assert settles[0] == settles[1] == [(s, [1.0, 1.0, 1.0] if s < KILLED_AT else [1.0, 1.0, 0.0])
                                      for s in range(2, 17, 2)]
  assert "data plane" not in r.stderr  # what was part way across is dropped without a word: nothing hostile
  assert _leftovers(tmp_path) == {str(r): {"zmq_threads": 0, "plane_threads": 0} for r in range(2)}  # nothing outlives
  rows, rows2 = metrics_rows(os.path.join(out, "metrics.jsonl")), _replay(out, tmp_path / "replay")
  assert [x["eval_loss"] for x in rows] == [x["eval_loss"] for x in rows2]
  assert [x["replica_loss"][:2] for x in rows] == [x["replica_loss"][:2] for x in rows2]


@pytest.mark.slow
def test_with_reduce_scatter_a_process_killed_mid_sync_is_retried_without_and_the_run_equals_its_replay(tmp_path):
  """``--reduction reduce-scatter``: each sync is a reduce-scatter over its members on the data plane,
  so the three processes together receive 2 (K - 1) payloads per sync, not the all-gather's
  K (K - 1). Process 2 is SIGKILLed part way through sending its reduced chunk of the sync sent at
  step 6 (64-byte chunks): processes 0 and 1 have its rows but not its chunk, try again without
  it, and leave it out of that sync and every later one; the run equals its trace replayed in-step
  with the same reduction, bit for bit."""
  out, stamp = str(tmp_path / "elastic"), tmp_path / "killed_at"
  env = dict(ENV, KILL_RANK="2", KILL_AT_STEP=str(KILLED_AT), KILL_STAMP=str(stamp), KILL_MID_TRANSFER="1",
             KILL_PHASE="/ag", DILOCO_PLANE_CHUNK_BYTES="64", PLANE_LEFTOVERS=str(tmp_path / "leftovers"))
  flags = [*FLAGS, "--reduction", "reduce-scatter"]
  r = _launch(*THREE, "--module", "kill_child", "--", *flags, "--elastic", "--out", out, env=env)
  assert r.returncode == 0, r.stderr[-3000:]
  assert 0 < json.loads(stamp.read_text())["offset"]
  trace = [_trace(out, rank) for rank in range(3)]
  settles = [[(x["sent_at"], x["present"]) for x in t if x["kind"] == "settle"] for t in trace[:2]]
  assert settles[0] == settles[1] == [(s, [1.0, 1.0, 1.0] if s < KILLED_AT else [1.0, 1.0, 0.0])
                                      for s in range(2, 17, 2)]
  moved = {}  # per sync: (bytes each process handed on, bytes received by every process together)
  for t in trace:
    for x in (x for x in t if x["kind"] == "transfer" and x["what"].startswith("fragment")):
      handed, received = moved.get(x["what"], ((), 0))
      moved[x["what"]] = ((*handed, x["sent_bytes"]), received + x["received_bytes"])
  for what, (handed, received) in moved.items():
    k = len(handed) if int(what.split()[-1]) < KILLED_AT else 2
    if int(what.split()[-1]) != KILLED_AT:  # (the killed sync moved its first attempt too)
      assert len(set(handed)) == 1 and received == 2 * (k - 1) * handed[0], (what, handed, received)
  assert _leftovers(tmp_path) == {str(r): {"zmq_threads": 0, "plane_threads": 0} for r in range(2)}
  rows, rows2 = metrics_rows(os.path.join(out, "metrics.jsonl")), _replay(out, tmp_path / "replay", extra=flags)
  assert [x["eval_loss"] for x in rows] == [x["eval_loss"] for x in rows2]
  assert [x["replica_loss"][:2] for x in rows] == [x["replica_loss"][:2] for x in rows2]


def _leftovers(tmp_path) -> dict:
  """What each process's data plane left as it left (tests/plane_leftovers.py), by process."""
  folder = tmp_path / "leftovers"
  return {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))} if folder.is_dir() else {}


def _replay(out, replay, rank=0, extra=FLAGS) -> list[dict]:
  """The elastic run in ``out`` replayed from process ``rank``'s trace in the in-step runtime on three
  devices (its drops and rejoins; the run's flags ``extra``): checks the final params are equal bit for bit;
  the metrics rows."""
  trace = _trace(out, rank)
  drops = ",".join(f"{s}:{m}" for s, m in schedule_from_trace(trace, replicas=3))
  rejoins = ",".join(f"{s}:{m}:{src}" for s, m, src in rejoins_from_trace(trace))
  flags = [x for x in extra if x not in ("--communication", "background")]
  r = subprocess.run([sys.executable, "-m", "diloco_core.train", *flags, "--steps", _steps(out), "--mesh",
                      "diloco=3,data=1", "--drop-schedule", drops, *(["--rejoin-schedule", rejoins] if rejoins else []),
                      "--out", str(replay)], env=dict(ENV, XLA_FLAGS=xla_flags(3)), capture_output=True, text=True,
                     timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  from diloco_core.store.params_io import load_params
  a, b = (jax.tree.leaves(load_params(os.path.join(d, "final_params"))) for d in (out, replay))
  assert all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b, strict=True))
  return metrics_rows(os.path.join(replay, "metrics.jsonl"))


def _steps(out) -> str:
  return str(json.load(open(os.path.join(out, "summary.json")))["config"]["steps"])


@pytest.mark.slow
def test_a_replacement_rejoins_is_healed_and_the_run_equals_its_replay(tmp_path):
  """The launcher kills process 2 once it computed step 6 (--kill-at) and starts it again
  (--restart): the replacement takes part in the agreements with nothing while it compiles its
  programs, says it is ready, and process 0, the leader, waits for that at a log row
  (--heal-wait) and sends it the state after that row (global params and outer state, replica 0's inner
  optimizer state); it then counts in every sync and reports its losses. The checkpoints
  (process 0 writes them alone) fill its replica while it is out. Replayed in-step from
  process 0's trace (its drops and its rejoin), the run is the same bit for bit: every metric,
  the final params."""
  out = str(tmp_path / "elastic")
  r = _launch(*THREE, "--kill-at", "2:6", "--restart", "--", *FLAGS, "--steps", "24", "--elastic",
              "--heal-wait", "300", "--checkpoint-every", "8", "--keep-checkpoints", "3",
              "--out", out)  # (a short run: the others wait for it to compile)
  assert r.returncode == 0, r.stderr[-3000:]
  assert "launch: process 2 of 3 was lost (killed by SIGKILL); a replacement rejoined and finished" in r.stderr
  trace = _trace(out, 0)
  heals = [x for x in trace if x["kind"] == "heal"]
  assert len(heals) == 1 and heals[0]["replicas"] == [2] and heals[0]["source"] == 0
  healed = heals[0]["step"]
  assert healed % 4 == 0  # after a log row (--log-every 4)
  own = _trace(out, 2)  # the first incarnation's rows, then the replacement's (it appends)
  assert [x["kind"] for x in own if x["kind"] == "healed"] == ["healed"]  # the replacement's own record
  first_life = own[:next(i for i, x in enumerate(own) if x["kind"] == "healed")]
  warm = [x for x in own if x["kind"] == "warm-up"]  # it compiled before it was healed
  assert len(warm) == 1 and warm[0]["end"] <= heals[0]["time"]
  last_computed = max(x["step"] for x in first_life if x["kind"] == "compute")
  settles = {x["sent_at"]: x["present"] for x in trace if x["kind"] == "settle"}
  assert all(p == [1.0, 1.0, 1.0] for s, p in settles.items() if s > healed)  # (it may have missed no sync:
  # killed after a sync, its replacement may join at the next log row's agreement and be healed there)
  rows = metrics_rows(os.path.join(out, "metrics.jsonl"))
  if last_computed % 4:  # killed between log rows: its row was never sent (killed right after a
    # row's step, it may have sent that row, its replacement joining at the row's flags: no gap)
    gap = list(range(last_computed + 4 - last_computed % 4, healed + 1, 4))  # its rows until the heal
    assert gap and [x["step"] for x in rows if x["replica_loss"][2] is None] == gap
  assert all(x["replica_loss"][2] is not None for x in rows if x["step"] > healed)  # back
  for step in (8, 16, 24):  # checkpoints through the loss and the heal: replica 2 filled while it was out
    filled = json.load(open(os.path.join(out, "checkpoints", str(step), "meta", "metadata")))["filled"]
    assert filled == ([2] if last_computed < step <= healed else []) or step == last_computed, (step, filled)
  rows2 = _replay(out, tmp_path / "replay")
  for x, y in zip(rows, rows2, strict=True):
    assert x["eval_loss"] == y["eval_loss"] and x["bytes_sent"] == pytest.approx(y["bytes_sent"], rel=1e-12)
    assert all(a is None or a == b for a, b in zip(x["replica_loss"], y["replica_loss"])), (x, y)


@pytest.mark.slow
def test_below_min_replicas_the_run_stops_in_one_line_and_its_checkpoint_resumes_exactly(tmp_path):
  """Process 2 of 3 is lost at step 6 and the others go on (--min-replicas 2); process 1 is lost
  at step 12: one replica is left, and the run stops in one line naming the lost processes and
  the last intact checkpoint, step 8's, written with replica 2 missing (process 0 wrote it alone,
  replica 2's rows as its heal would set them; the meta item says so). --resume goes on from it
  with all three processes, and the run equals its trace replayed in-step (its drops up to step
  8, replica 2 rejoining there; the first life's syncs after step 8 undone), bit for bit."""
  out = str(tmp_path / "run")
  flags = [*FLAGS, "--steps", "24", "--elastic", "--min-replicas", "2", "--checkpoint-every", "8", "--out", out]
  r = _launch(*THREE, "--module", "kill_child", "--", *flags, env=dict(ENV, KILL_RANK="2,1", KILL_AT_STEP="6,12"))
  assert r.returncode == 128 + signal.SIGKILL, r.stderr[-3000:]
  errors = [line for line in r.stdout.splitlines() if line.startswith("error:")]  # process 0's output
  checkpoint = os.path.join(out, "checkpoints", "8")
  assert errors and errors[0] == (
      "error: process(es) [1, 2] lost: 1 replica(s) took part in the sync of fragment 1 sent at step 12, fewer"
      f" than --min-replicas (2); the run stopped after step 11: the last intact checkpoint is {checkpoint}:"
      " run again with --resume."), r.stdout[-3000:]
  meta = json.load(open(os.path.join(checkpoint, "meta", "metadata")))
  assert (meta["filled"], meta["source"]) == ([2], 0)

  r = _launch(*THREE, "--", *flags, "--resume")
  assert r.returncode == 0, r.stderr[-3000:]
  trace = _trace(out, 0)  # both lives (a resumed run appends)
  assert [x for x in trace if x["kind"] == "resumed"] == [{"kind": "resumed", "step": 8, "replicas": [2], "source": 0}]
  assert schedule_from_trace(trace, replicas=3) == ((6, 2), (8, 2))
  assert rejoins_from_trace(trace) == ((8, 2, 0),)
  rows = metrics_rows(os.path.join(out, "metrics.jsonl"))
  assert [(x["step"], x["replica_loss"][2] is None) for x in rows] == [(4, False), (8, True), (12, False),
                                                                        (16, False), (20, False), (24, False)]
  rows2 = _replay(out, tmp_path / "replay")
  for x, y in zip(rows, rows2, strict=True):
    assert x["eval_loss"] == y["eval_loss"] and x["bytes_sent"] == pytest.approx(y["bytes_sent"], rel=1e-12)
    assert all(a is None or a == b for a, b in zip(x["replica_loss"], y["replica_loss"])), (x, y)


@pytest.mark.slow
def test_losing_process_0_stops_the_run_in_one_line_and_it_resumes(tmp_path):
  """Process 0 hosts the coordination service: an elastic run cannot lose it. Killed at step 6,
  the others are stopped and the launcher's last line says why and names the last intact
  checkpoint; --resume goes on from it and ends where the run replayed in-step ends, bit for bit."""
  out = str(tmp_path / "elastic")
  flags = [*FLAGS, "--elastic", "--checkpoint-every", "4", "--out", out]
  r = _launch(*THREE, "--module", "kill_child", "--", *flags, env=dict(ENV, KILL_RANK="0", KILL_AT_STEP="6"))
  assert r.returncode == 137, r.stderr[-3000:]
  assert r.stderr.strip().splitlines()[-1] == (
      "launch: process 0 of 3 was lost (killed by SIGKILL); the others were stopped: process 0 hosts the"
      " coordination service, which an elastic run cannot lose (give it a process of its own with"
      " --own-coordinator) (the last intact checkpoint is"
      f" {os.path.join(out, 'checkpoints', '4')}: run the same command with --resume).")
  r = _launch(*THREE, "--", *flags, "--resume")
  assert r.returncode == 0, r.stderr[-3000:]
  rows = metrics_rows(os.path.join(out, "metrics.jsonl"))
  assert [x["step"] for x in rows] == [4, 8, 12, 16] and all(None not in x["replica_loss"] for x in rows)
  rows2 = _replay(out, tmp_path / "replay")  # no drops, no rejoin: the plain run
  assert [x["eval_loss"] for x in rows] == [x["eval_loss"] for x in rows2]
  assert [x["replica_loss"] for x in rows] == [x["replica_loss"] for x in rows2]


@pytest.mark.slow
def test_with_its_own_coordinator_process_0_may_be_lost(tmp_path):
  """--own-coordinator runs the coordination service in a process that trains nothing: process 0
  killed at step 6, processes 1 and 2 finish the run. Process 1, the lowest left, takes the
  run's files over: every metrics row, the checkpoints of steps 8 and 16 (replica 0 filled from
  replica 1, as its heal would be), the summary and the final params (written by a
  single-process helper: Orbax writes host arrays from process 0 only). Replayed in-step from
  process 1's trace, the run is the same bit for bit."""
  out = str(tmp_path / "elastic")
  flags = [*FLAGS, "--elastic", "--checkpoint-every", "8", "--out", out]
  r = _launch(*THREE, "--own-coordinator", "--module", "kill_child", "--", *flags,
              env=dict(ENV, KILL_RANK="0", KILL_AT_STEP=str(KILLED_AT)))
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stderr.strip().splitlines()[-1] == ("launch: process 0 of 3 was lost (killed by SIGKILL); the others"
                                                " went on without it (--elastic).")
  rows = metrics_rows(os.path.join(out, "metrics.jsonl"))
  assert [(x["step"], x["replica_loss"][0] is None) for x in rows] == [(4, False), (8, True), (12, True), (16, True)]
  for step in (8, 16):
    meta = json.load(open(os.path.join(out, "checkpoints", str(step), "meta", "metadata")))
    assert (meta["filled"], meta["source"]) == ([0], 1)
  summary = json.load(open(os.path.join(out, "summary.json")))
  assert summary["final_eval_loss"] == rows[-1]["eval_loss"]
  rows2 = _replay(out, tmp_path / "replay", rank=1)  # checks the final params too
  assert [x["eval_loss"] for x in rows] == [x["eval_loss"] for x in rows2]
  assert [x["replica_loss"][1:] for x in rows] == [x["replica_loss"][1:] for x in rows2]


@pytest.mark.slow
def test_losing_its_own_coordinator_stops_the_run_in_one_line_and_it_resumes(tmp_path):
  """The coordination service's own process killed at step 10 (--kill-at coordinator:10): the
  trainers stop, and the launcher's last line says so and names the last intact checkpoint;
  --resume (a new service) finishes the run from it."""
  out = str(tmp_path / "elastic")
  flags = [*FLAGS, "--elastic", "--checkpoint-every", "4", "--out", out]
  r = _launch(*THREE, "--own-coordinator", "--kill-at", "coordinator:10", "--", *flags)
  assert r.returncode == 128 + signal.SIGKILL, r.stderr[-3000:]
  from diloco_core.store.checkpoint import finalized_steps
  last = max(finalized_steps(out))
  assert last in (8, 12)  # the kill lands as step 10 is computed (maybe a step or two later)
  assert r.stderr.strip().splitlines()[-1] == (
      "launch: the coordination service's own process was lost (killed by SIGKILL); the trainers stopped"
      f" (the last intact checkpoint is {os.path.join(out, 'checkpoints', str(last))}: run the same command"
      " with --resume).")
  r = _launch(*THREE, "--own-coordinator", "--", *flags, "--resume")
  assert r.returncode == 0, r.stderr[-3000:]
  summary = json.load(open(os.path.join(out, "summary.json")))
  assert summary["resumed_from"] == os.path.join(out, "checkpoints", str(last))
  rows = metrics_rows(os.path.join(out, "metrics.jsonl"))
  assert [x["step"] for x in rows] == [4, 8, 12, 16] and all(None not in x["replica_loss"] for x in rows)


@pytest.mark.slow
@pytest.mark.parametrize("signum,own", [(signal.SIGTERM, False), (signal.SIGINT, True)],
                         ids=["SIGTERM", "SIGINT-own-coordinator"])
def test_a_stop_request_ends_an_elastic_run_cleanly_and_it_resumes_exactly(signum, own, tmp_path):
  """SIGTERM or Ctrl-C to the launcher of an elastic run (with --own-coordinator too): every
  process stops before one agreed step and exits 130 (for SIGTERM too); the launcher's last line
  says so and names no process as lost; no process aborts in JAX's clean-up, although process 1
  holds its clean-up back (slow_exit_child), and holds its exit back half a second after saying
  it leaves (less than LEFT_GRACE_S): process 0, which hosts the coordination service, leaves
  once the others said they leave and had the time to exit, and they leave without
  disconnecting from it. The stop line names the last checkpoint; --resume goes on from it to
  the end, and the run equals the same run replayed in-step, bit for bit (final params, every
  eval and replica loss)."""
  from diloco_core.store.checkpoint import finalized_steps
  out = str(tmp_path / "elastic")
  coordinator = ["--own-coordinator"] if own else []
  flags = [*FLAGS, "--steps", "48", "--elastic", "--checkpoint-every", "8", "--out", out]
  p = subprocess.Popen([sys.executable, "-m", "diloco_core.launch", *THREE, *coordinator, "--module",
                        "slow_exit_child", "--", *flags],
                       env=dict(ENV, SLOW_LEAVE_S="0.5", PLANE_LEFTOVERS=str(tmp_path / "leftovers")),
                       stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 240
  while not finalized_steps(out):
    assert p.poll() is None and time.monotonic() < deadline, p.communicate()
    time.sleep(0.1)
  p.send_signal(signum)
  stdout, stderr = p.communicate(timeout=120)
  assert p.returncode == 130, f"{stdout[-2000:]}\n{stderr[-3000:]}"  # a string: shown whole when it fails
  assert stderr.strip().splitlines()[-1] == "launch: stopped on request; every process ended (130, 130, 130)."
  for bad in ("Traceback", "Check failure", "Terminating process", "client.h", "was lost", "SIGABRT"):
    assert bad not in stdout + stderr, (bad, stdout[-2000:], stderr[-3000:])
  assert _leftovers(tmp_path) == {str(r): {"zmq_threads": 0, "plane_threads": 0} for r in range(3)}  # nothing outlives
  stopped = [line for line in stdout.splitlines() if line.startswith("interrupted at step ")]
  assert len(stopped) == 1, stdout[-2000:]
  step = int(stopped[0].split()[3].rstrip(";"))
  last = max(finalized_steps(out))
  assert step < 48 and stopped[0] == (f"interrupted at step {step}; resume with --resume (from"
                                      f" {os.path.join(out, 'checkpoints', str(last))}).")

  r = _launch(*THREE, *coordinator, "--", *flags, "--resume")
  assert r.returncode == 0, r.stderr[-3000:]
  assert json.load(open(os.path.join(out, "summary.json")))["resumed_from"] == os.path.join(out, "checkpoints", str(last))
  rows = metrics_rows(os.path.join(out, "metrics.jsonl"))
  assert [x["step"] for x in rows] == list(range(4, 49, 4))
  rows2 = _replay(out, tmp_path / "replay")  # no drops, no rejoin: the plain run; checks the final params
  assert [x["eval_loss"] for x in rows] == [x["eval_loss"] for x in rows2]
  assert [x["replica_loss"] for x in rows] == [x["replica_loss"] for x in rows2]


# ---- the coordination service's limit: what an elastic run puts there, and the refusal ----------
def _tiny_state(**changes):
  """(config, algorithm, state, N) of a tiny model built by the trainer's own code (one process)."""
  from diloco_core import TrainConfig
  from diloco_core.devices.backend import resolve_model_config
  from diloco_core.model.transformer import init_model, train_loss
  from diloco_core.run.programs import make_algorithm
  from diloco_core.spec.model_config import param_count
  cfg = TrainConfig(model="tiny", **changes)
  model = resolve_model_config(cfg.model_config(vocab_size=cfg.vocab_size or cfg.data.vocab_size))
  apply_fn, params = init_model(model, 0)
  algo = make_algorithm(cfg, lambda p, x: train_loss(apply_fn, p, x), params)
  return cfg, algo, algo.init(params), param_count(model)


def _real_values(algo, state) -> dict:
  """The bytes of the values the elastic runtime puts in the service for this state (one process)."""
  from diloco_core.runtime.elastic_runtime import pack_heal
  nbytes = lambda *trees: sum(np.asarray(x).nbytes for t in trees for x in jax.tree.leaves(t))
  first = jax.tree.map(lambda x: np.asarray(x)[0], state.opt_state)  # the source replica's row
  rows = [getattr(state, name) for name in algo.replica_fields]  # checkpoint_state's rows of every replica
  packed = pack_heal(jax.tree.map(np.asarray, state.global_params), jax.tree.map(np.asarray, state.outer_state),
                     first, 8, 5)
  return {"heal": nbytes(state.global_params, state.outer_state, first), "checkpoint": nbytes(*rows),
          "sync": algo.config.replicas * max(algo.fragment_bytes), "packed_heal": len(packed)}


@pytest.mark.parametrize("changes", [{}, {"outer_optimizer": "adam", "compression": "fp4", "error_feedback": True}],
                         ids=["nesterov", "adam-error-feedback"])
def test_the_elastic_values_are_the_bytes_the_runtime_puts_in_the_service(changes):
  """The formula (elastic_value_bytes) against the leaves of real states of two model sizes: per
  parameter it is exact (the difference between the sizes), and what it leaves out (step counts,
  participation rows, a heal's npz headers) is a few bytes whatever N, within the MiB the limit
  keeps below protobuf's."""
  from diloco_core.algorithm.config import DiLoCoConfig
  from diloco_core.spec.footprint import elastic_value_bytes
  outer = {k: changes[k] for k in ("outer_optimizer", "compression", "error_feedback") if k in changes}
  sizes = []
  for layers in (2, 4):
    cfg, algo, state, n = _tiny_state(n_layers=layers, algo=DiLoCoConfig(replicas=2, **outer))
    formula = elastic_value_bytes(n, replicas_per_process=2, outer_optimizer=cfg.algo.outer_optimizer,
                                  error_feedback=cfg.algo.error_feedback, checkpoints=True)
    sizes.append((n, formula, _real_values(algo, state)))
  (n1, f1, r1), (n2, f2, r2) = sizes
  assert n2 > n1
  for value in ("heal", "checkpoint"):
    assert r2[value] - r1[value] == f2[value] - f1[value], value  # bytes per parameter: exact
    assert 0 <= r1[value] - f1[value] == r2[value] - f2[value] < 64, value  # the counts: a few bytes
  assert 0 < r2["packed_heal"] - f2["heal"] < 2**20  # the npz headers: a few kB
  if cfg.algo.compression == "none":
    assert r2["sync"] == f2["sync"]  # float32, one fragment: the bound is the payload
  else:
    assert r2["sync"] < f2["sync"]


BIG = {"model": "base", "n_layers": 200, "communication": "background", "elastic": True}


def test_an_elastic_run_is_bounded_by_memory_only():
  """No payload crosses the coordination service, so no value limit refuses a large elastic run
  (170 M params: a heal of 2.73 GB, refused before the data plane): the process check passes it
  as without `elastic`, and a run beyond memory is refused by the memory check, in one line."""
  from diloco_core import TrainConfig
  from diloco_core.run.preflight import check_processes
  from diloco_core.spec.footprint import check_fits, elastic_value_bytes
  from diloco_core.spec.model_config import param_count
  big = TrainConfig(**BIG)
  assert elastic_value_bytes(param_count(big.model_config(vocab_size=32)), replicas_per_process=1)["heal"] > 2**31
  check_processes(big, processes=2)
  check_processes(TrainConfig(**{**BIG, "elastic": False}), processes=2)
  huge = TrainConfig(**{**BIG, "n_layers": 100000})
  check_processes(huge, processes=2)
  with pytest.raises(ValueError, match="the run needs at least"):  # the memory check is what refuses it
    check_fits(param_count(huge.model_config(vocab_size=32)), replicas=2, outer=True, tokens=2 * 16 * 64, vocab=32)
