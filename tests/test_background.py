"""``communication="background"``: the same numbers as the in-step SPMD run, resumes, errors.

One process here (its replicas batched on one device, the link gathering nothing); the
two-process runs over the launcher are in test_launch.py.
"""

import functools
import json
import math
import os
import shutil

import jax
import numpy as np
import pytest

from diloco_core import DiLoCoConfig, TrainConfig
from diloco_core.runtime.background import TOLERANCE, TRACE_FILE, Background
from diloco_core.run.loop import train
from tiny_run import metrics_rows, tiny

CASES = {  # DiLoCo (4-bit payloads, error feedback), Streaming, eager: M = 2, and M = 4 (M > 2)
    "diloco": dict(compression="e3m0", error_feedback=True, eval_replicas=True),
    "streaming": dict(algo="streaming", fragments=3, sync_every=6, overlap=2, alpha=0.5, steps=12,
                      checkpoint_every=4, log_every=4),  # its checkpoints feed the resume test
    "eager": dict(outer_overlap="eager", replicas=4),
    "diloco-m4": dict(compression="e3m0", replicas=4),  # within TOLERANCE (see background.py)
    # simulated drops: a sync nobody takes part in (step 4), one replica missing (8), residuals kept
    # (8 steps: the inner program of "diloco", which takes no mask)
    "diloco-drops": dict(compression="e3m0", error_feedback=True, drop_schedule=((4, 0), (4, 1), (8, 1))),
    # Streaming with τ = 2: a replica healed at the merge two steps after its missed sync
    "streaming-drops": dict(algo="streaming", fragments=3, sync_every=6, overlap=2, alpha=0.5, steps=12,
                            drop_schedule=((2, 0), (4, 1), (6, 0), (6, 1), (10, 1))),
}


def _leaves(state):
  return [np.asarray(x) for x in jax.tree.leaves(jax.device_get(state))]


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
  out = {}
  for name, kw in CASES.items():
    kw = dict(kw)
    algo = kw.pop("algo", "diloco")
    runs = {}
    for comm in ("in-step", "background"):
      d = tmp_path_factory.mktemp(f"{name}-{comm}")
      runs[comm] = (train(tiny(algo, communication=comm, out=str(d), **kw)), d)
    out[name] = runs
  return out


def _same(x, y, exact: bool):
  if exact:
    np.testing.assert_array_equal(x, y)
  else:  # M > 2 with a compressed format: the in-step quantizer fused into its mean (background.py)
    np.testing.assert_allclose(x, y, rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize("name", sorted(CASES))
def test_background_equals_in_step(pairs, name):
  """Bit for bit (metrics, every leaf of the final state, the summary), except with M > 2 and
  a compressed format: within TOLERANCE."""
  (a, da), (b, db) = pairs[name]["in-step"], pairs[name]["background"]
  algo = a.summary["config"]["algo"]
  same = functools.partial(_same, exact=algo["replicas"] == 2 or algo["compression"] == "none")
  ra, rb = metrics_rows(da / "metrics.jsonl"), metrics_rows(db / "metrics.jsonl")
  assert [{k: v for k, v in r.items() if "loss" not in k} for r in ra] == \
         [{k: v for k, v in r.items() if "loss" not in k} for r in rb]  # steps, tokens, bytes
  for key in ("train_loss", "replica_loss", "eval_loss"):
    same(*(np.array([np.nan if r[key] is None else r[key] for r in rows], float) for rows in (ra, rb)))
  for x, y in zip(_leaves(a.state), _leaves(b.state)):
    same(x, y)
  sa, sb = (json.load(open(d / "summary.json")) for d in (da, db))
  same(sa["final_eval_loss"], sb["final_eval_loss"])
  if sa["final_replica_eval_losses"] is not None:  # eval_replicas: the replicas gathered at the end
    same(np.array(sa["final_replica_eval_losses"]), np.array(sb["final_replica_eval_losses"]))
  assert (sa["total_bytes_per_replica"], sa["peak_bytes_per_step"]) == (sb["total_bytes_per_replica"],
                                                                         sb["peak_bytes_per_step"])


def test_every_step_and_transfer_is_recorded(pairs):
  _, d = pairs["streaming"]["background"]
  rows = [json.loads(line) for line in open(d / TRACE_FILE.format(rank=0))]
  compute = [r for r in rows if r["kind"] == "compute"]
  assert [r["step"] for r in compute] == list(range(1, 13))
  assert all(r["end"] >= r["start"] for r in compute)
  transfers = [r for r in rows if r["kind"] == "transfer"]
  assert [r["what"] for r in transfers] == [f"fragment {p} @ step {t}" for t, p in
                                            zip(range(2, 13, 2), [0, 1, 2, 0, 1, 2])]
  settles = [(r["fragment"], r["sent_at"], r["step"]) for r in rows if r["kind"] == "settle"]
  # τ = 2: each sync settles at its merge two steps on, or at an eval row (every 4) before it
  assert settles == [(p, t, min(t + 2, -(-t // 4) * 4)) for t, p in zip(range(2, 13, 2), [0, 1, 2, 0, 1, 2])]


def test_the_trace_says_who_took_part_in_each_sync(pairs):
  _, d = pairs["streaming-drops"]["background"]
  rows = [json.loads(line) for line in open(d / TRACE_FILE.format(rank=0))]
  assert [(r["step"], r["fragment"]) for r in rows if r["kind"] == "skip"] == [(6, 2)]
  took_part = {r["sent_at"]: r["present"] for r in rows if r["kind"] == "settle"}
  assert took_part == {2: [0.0, 1.0], 4: [1.0, 0.0], 8: [1.0, 1.0], 10: [1.0, 0.0], 12: [1.0, 1.0]}


def test_random_drops_recorded_in_the_trace_replay_as_a_schedule_in_step(tmp_path):
  """drop_prob in the background runtime; its trace, as a drop_schedule, replayed in-step: the
  same metrics and final state, bit for bit (what an elastic run's record must allow)."""
  from diloco_core.run.drops import schedule_from_trace
  kw = dict(CASES["streaming"], log_every=2)  # the shape of CASES' streaming runs: their programs, compiled once
  kw.pop("checkpoint_every")
  algo = kw.pop("algo")
  live = train(tiny(algo, communication="background", drop_prob=0.4, seed=3, out=str(tmp_path / "bg"), **kw))
  rows = [json.loads(line) for line in open(tmp_path / "bg" / TRACE_FILE.format(rank=0))]
  schedule = schedule_from_trace(rows, replicas=2)
  assert 0 < len(schedule) < 12  # some of the 6 syncs x 2 replicas were missed, not all
  replay = train(tiny(algo, communication="in-step", drop_schedule=schedule, seed=3, out=str(tmp_path / "in"), **kw))
  assert metrics_rows(tmp_path / "bg" / "metrics.jsonl") == metrics_rows(tmp_path / "in" / "metrics.jsonl")
  for x, y in zip(_leaves(live.state), _leaves(replay.state)):
    np.testing.assert_array_equal(x, y)


def test_resume_with_a_fragment_in_flight_is_exact_and_interchangeable(pairs, tmp_path):
  """The checkpoint of step 4 is taken while fragment 1 (sent at 4, merged at 6) is in flight;
  resumed from it in either mode, the run ends where the uninterrupted one does."""
  kw = dict(CASES["streaming"])
  kw.pop("algo")
  for first, then in (("background", "background"), ("background", "in-step"), ("in-step", "background")):
    out = tmp_path / f"{first}-{then}"
    shutil.copytree(pairs["streaming"][first][1], out)
    for step in ("8", "12"):  # back to the checkpoint of step 4
      shutil.rmtree(out / "checkpoints" / step)
    resumed = train(tiny("streaming", communication=then, out=str(out), resume=True, **kw))
    assert resumed.summary["resumed_from"].endswith(os.path.join("checkpoints", "4"))
    for x, y in zip(_leaves(pairs["streaming"][then][0].state), _leaves(resumed.state)):
      np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("change, message", [
    (dict(algo=DiLoCoConfig(algorithm="dp")), "needs algorithm diloco or streaming"),
    (dict(drop_prob=0.5, algo=DiLoCoConfig(reduction="reduce-scatter")),
     "simulates replica drops with `reduction` all-gather only"),
    (dict(communication="mpmd"), "`communication` must be one of ('in-step', 'background')"),
])
def test_bad_background_options_one_line(change, message):
  cfg = dict(communication="background")
  cfg.update(change)
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")) as e:
    TrainConfig(**cfg).validate()  # the options alone: no process or device is asked
  assert "\n" not in str(e.value)


COLLECTIVES = ("all-reduce", "all-gather", "collective-permute", "all-to-all", "reduce-scatter")


def test_the_phases_hold_no_collective():
  """Two replicas on a mesh of two devices: the inner step, the payload, settle and merge
  programs are compiled over the run's mesh, as the in-step program is, but hold no collective,
  so a process runs its part of each without waiting for the others (only the link moves data)."""
  from diloco_core.runtime.communication import make_communication
  from diloco_core.model.transformer import init_model, train_loss
  from diloco_core.run.programs import make_algorithm
  from diloco_core.devices.backend import resolve_model_config
  cfg = tiny(communication="background", mesh="diloco=2,data=1", sync_every=1)
  model_cfg = resolve_model_config(cfg.model_config(vocab_size=16))
  apply_fn, params = init_model(model_cfg, 0)
  algo = make_algorithm(cfg, lambda p, x: train_loss(apply_fn, p, x), params)
  comm = make_communication(cfg, algo, params)
  bg = comm  # the Background runtime itself
  assert bg.mesh.shape == {"diloco": 2, "data": 1}
  state = comm.init(params)
  batch = comm.place_batch(np.zeros((2, 2, 9), np.int32))
  state, _ = comm.step(state, batch, 1)  # sends (H = 1): builds inner, send, settle, merge
  mask = np.array([1.0, 0.0], np.float32)
  state, _ = comm.step(state, batch, 2, mask)  # a replica dropped: the masked send and settle
  state, _ = comm.step(state, batch, 3, 0 * mask)  # nobody: the skip
  hp = bg.placed_hyperparams(False)
  payload = sum(int(np.prod(x.shape[1:])) for x in jax.tree.leaves(state.params))
  gathered = bg.payload_leaves(state, 0, np.zeros((2, payload), np.float32))
  texts = {"inner": bg.compiled_text("inner", "", state, batch, hp),
           "send": bg.compiled_text("send", "all", state, None, hp, None, np.int32(0)),
           "send-masked": bg.compiled_text("send-masked", "all", state, None, hp, bg.place_rows(mask), np.int32(0)),
           "skip": bg.compiled_text("skip", "", state, np.int32(0)),
           "settle": bg.compiled_text("settle", "all", state, gathered, None, hp, None),
           "settle-masked": bg.compiled_text("settle-masked", "all", state, gathered, None, hp,
                                             bg.place_replicated(mask)),
           "merge": bg.compiled_text("merge", "all", state, None, np.int32(0), hp)}
  for name, text in texts.items():
    assert not [c for c in COLLECTIVES if c in text], name
  # the search finds one where there is one: the in-step program of the same run all-reduces
  in_step = algo.lower(algo.init(params), algo.place_batch(np.zeros((2, 2, 9), np.int32))).compile().as_text()
  assert "all-reduce" in in_step
  comm.close()


WIRES = {  # the wire formats, packed on the link: dense, in blocks, top-k (float32: CASES above)
    "bf16": dict(compression="bf16"), "fp8-blocks": dict(compression="fp8", compression_block=16),
    "fp4": dict(compression="fp4", error_feedback=True), "e3m0-topk": dict(compression="e3m0", topk=3, topk_chunk=8),
    "bf16-topk": dict(compression="bf16", topk=5, topk_chunk=16),
    # the reduction that scales: the link averages and re-quantizes (diloco_core.wire.reduce_scatter)
    "fp4-reduce-scatter": dict(compression="fp4", error_feedback=True, reduction="reduce-scatter"),
    "none-reduce-scatter": dict(reduction="reduce-scatter"),
}
#: In-step within TOLERANCE, not bit for bit, with or without packing (background.TOLERANCE says
#: why); float32 payloads with reduce-scatter too, and there no background run is the reference.
NOT_EXACT = {"fp8-blocks", "e3m0-topk", "bf16-topk", "none-reduce-scatter"}


@pytest.fixture(scope="module")
def wires(tmp_path_factory):
  """Per format: the in-step run, the background run, and where in-step is not bit for bit
  (:data:`NOT_EXACT`) the background run with its payloads crossing as float32 (``_layout``
  None): the reference for the packing alone."""
  out = {}
  with pytest.MonkeyPatch.context() as mp:
    for name, kw in WIRES.items():
      runs = {}
      unpacked = name in NOT_EXACT and kw.get("reduction") != "reduce-scatter"
      for comm in ("in-step", "background", "unpacked")[:3 if unpacked else 2]:
        if comm == "unpacked":
          mp.setattr(Background, "_layout", lambda self, state, p: None)
        d = tmp_path_factory.mktemp(f"wire-{name}-{comm}")
        runs[comm] = (train(tiny("streaming", fragments=3, sync_every=3, steps=6, log_every=1, eval_every=6,
                                 communication=comm.replace("unpacked", "background"), out=str(d), **kw)), d)
      mp.undo()
      out[name] = runs
  return out


@pytest.mark.parametrize("name", sorted(WIRES))
def test_each_wire_format_crosses_packed_bit_for_bit_and_measures_what_is_counted(wires, name):
  """Packing changes no number: the background run equals in-step bit for bit, or where in-step
  is only within TOLERANCE (fp8, top-k), the same background run with float32 payloads. The bytes the link carried are those the metrics
  count: per sync, each replica's counted bytes rounded up to a whole byte (a packed row pads
  its last byte)."""
  runs = wires[name]
  (a, da), (b, db) = runs["in-step"], runs["background"]
  reference = runs.get("unpacked", runs["in-step"])[0]
  if name != "none-reduce-scatter":
    for x, y in zip(_leaves(reference.state), _leaves(b.state)):
      np.testing.assert_array_equal(x, y)
  for x, y in zip(_leaves(a.state), _leaves(b.state)):
    np.testing.assert_allclose(x, y, rtol=TOLERANCE, atol=TOLERANCE)
  rows = metrics_rows(db / "metrics.jsonl")
  assert [r["total_bytes_sent"] for r in rows] == [r["total_bytes_sent"] for r in metrics_rows(da / "metrics.jsonl")]
  counted = np.diff([0.0] + [r["total_bytes_sent"] for r in rows])  # per step, per replica
  trace = [json.loads(line) for line in open(db / TRACE_FILE.format(rank=0))]
  transfers = {int(r["what"].split("@ step ")[1]): r for r in trace if r["kind"] == "transfer"}
  assert sorted(transfers) == [t for t, c in enumerate(counted, 1) if c > 0] == [1, 2, 3, 4, 5, 6]
  # one process, two replicas: the all-gather hands the link both rows; the reduce-scatter the
  # one row of the reduced chunk it owns (here the whole fragment)
  rows_handed = 1 if WIRES[name].get("reduction") == "reduce-scatter" else 2
  for t, r in transfers.items():
    assert r["sent_bytes"] == rows_handed * math.ceil(counted[t - 1]), (t, r)
    assert r["received_bytes"] == r["padding_bytes"] == 0, (t, r)
