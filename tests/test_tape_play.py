"""The trainer plays a syncer tape (issue 52; diloco_core.runtime.tape_player): the synchronous tape is
the in-step trainer bit for bit, a slow replica's rounds follow the tape, a carried contribution
keeps its old base, bad options are one line, and default knobs leave train() as it was."""

from __future__ import annotations

import dataclasses
import json

import jax
import numpy as np
import pytest

from diloco_core.algorithm.phases import inner_update
from diloco_core.algorithm.hyperparams import resolve_optimizer
from diloco_core.run.cli import build_parser, config_from_args, to_flags
from diloco_core.run.loop import train
from diloco_core.run.syncer_options import SyncerOptions
from diloco_core.run.run_setup import build_model
from diloco_core.run.tape_run import make_setup
from diloco_core.runtime.tape_player import play_tape, speed_ticks, tape_for
from diloco_core.spec.syncer import SyncerConfig
from diloco_core.spec.tape import Committed
from tiny_run import tiny


def _same(a, b) -> bool:
  return all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_a_synchronous_tape_is_the_in_step_trainer_bit_for_bit():
  """M = 3, H = 4, 8 steps: the same final global params, every version's eval loss, every
  replica's loss at every step and the same bytes per replica as train() (in-step runtime)."""
  cfg = tiny(replicas=3, log_every=1)
  ref = train(cfg)
  got = play_tape(cfg, SyncerConfig(), tape_for(cfg, SyncerConfig(), (1.0, 1.0, 1.0)), make_setup(cfg))
  assert _same(got.params, ref.params)
  assert got.eval_loss == ref.summary["final_eval_loss"]
  assert [x for _, x in got.version_eval_losses] == ref.metrics["eval_loss"].dropna().tolist()
  losses = {(m, s): x for m, s, x in got.step_losses}
  rows = ref.metrics[ref.metrics["step"] > 0]
  assert [[losses[m, t] for m in range(3)] for t in rows["step"]] == rows["replica_loss"].tolist()
  assert (got.local_steps, got.rounds, got.members) == (24, 2, [[0, 1, 2]] * 2)
  assert got.bytes_sent / 3 == ref.summary["total_bytes_per_replica"] > 0


def test_one_replica_with_outer_lr_1_and_no_momentum_is_plain_training():
  """M = 1, η = 1, μ = 0: θ_g = θ_g - (θ_g - θ_1) after each round is plain training's θ to
  rounding only: θ_g - (θ_g - θ) is not always θ in float32, and the player's vmap of one replica
  rounds its reductions unlike a plain step (measured on this run: params within 1.2e-7, losses
  within 8.9e-8 relative; tolerances atol 1e-6 and rtol 1e-5)."""
  cfg = tiny(replicas=1, outer_lr=1.0, outer_momentum=0.0)
  got = play_tape(cfg, SyncerConfig(), tape_for(cfg, SyncerConfig(), (1.0,)), make_setup(cfg))
  data, _, params, loss_fn = build_model(cfg)
  algo = make_setup(cfg).algo
  hp = algo.typed_hyperparams()
  step = jax.jit(lambda p, o, b: inner_update(loss_fn, resolve_optimizer(algo.inner_optimizer, hp), p, o, b)[:3])
  p, o = params, resolve_optimizer(algo.inner_optimizer, hp).init(params)
  plain = []
  for t in range(cfg.steps):
    p, o, loss = step(p, o, data.train_batch(t)[0])
    plain.append(float(loss))
  for a, b in zip(jax.tree.leaves(got.params), jax.tree.leaves(p)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=0, atol=1e-6)
  assert not _same(got.params, params)  # it trained
  np.testing.assert_allclose([x for *_, x in got.step_losses], plain, rtol=1e-5)
  assert got.local_steps == cfg.steps and got.rounds == cfg.steps // cfg.algo.sync_every


def test_a_twice_slower_replica_with_quorum_1_follows_the_tape():
  cfg = tiny(replicas=2, steps=8, sync_every=2)
  syncer = SyncerConfig(quorum=1, late="carry")
  tape = tape_for(cfg, syncer, (1.0, 0.5))
  got = play_tape(cfg, syncer, tape, make_setup(cfg))
  commits = [e for e in tape if isinstance(e, Committed)]
  assert got.members == [[c.replica for c in e.members] for e in commits] and got.rounds == len(commits)
  assert got.local_steps == 2 * cfg.steps == len(got.step_losses)
  steps = {m: [s for r, s, _ in got.step_losses if r == m] for m in (0, 1)}
  assert steps[0] == list(range(1, len(steps[0]) + 1)) and steps[1] == list(range(1, len(steps[1]) + 1))
  assert len(steps[0]) > len(steps[1]) > 0  # the fast replica ran more of the equal total
  assert any(len(m) == 1 for m in got.members) and any(len(m) == 2 for m in got.members)
  assert got.contributions == sum(len(m) for m in got.members) and got.bytes_sent == got.contributions * got.payload_bytes


def test_a_carried_contribution_keeps_its_old_base():
  """Speeds (1, 1/2), H = 2, K = 1, carry, 3 steps each: round 1 is replica 0 alone (base 0);
  replica 1 sends after its 2nd step, based on version 0, and joins round 2 with staleness 1.
  Its pseudo-gradient is θ_g^(0) - θ_1: exactly the one it sends in a synchronous first round
  (same θ_1: same start, same batches), not θ_g^(1) - θ_1."""
  cfg = tiny(replicas=2, steps=3, sync_every=2)
  carry, seen = SyncerConfig(quorum=1, late="carry"), []
  play_tape(cfg, carry, tape_for(cfg, carry, (1.0, 0.5)), make_setup(cfg), observe=lambda e, grads, base: seen.append((e, grads, base)))
  assert [[(c.replica, c.base) for c in e.members] for e, _, _ in seen] == [[(0, 0)], [(0, 1), (1, 0)]]
  sync = []
  play_tape(cfg, SyncerConfig(), tape_for(cfg, SyncerConfig(), (1.0, 1.0)), make_setup(cfg), observe=lambda e, g, b: sync.append((g, b)))
  carried, fresh = seen[1][1][1], sync[0][0][1]
  assert _same(carried, fresh)
  v0, v1 = sync[0][1], seen[1][2]
  as_if_fresh = jax.tree.map(lambda d, a, b: d + (b - a), fresh, v0, v1)  # θ_g^(1) - θ_1
  assert not _same(carried, as_if_fresh)
  drop = SyncerConfig(quorum=1)  # late="drop": it never enters a round
  dropped = []
  play_tape(cfg, drop, tape_for(cfg, drop, (1.0, 0.5)), make_setup(cfg), observe=lambda e, g, b: dropped.append(e))
  assert [[c.replica for c in e.members] for e in dropped] == [[0], [0]]


def _cli_error(argv) -> str:
  try:
    config_from_args(build_parser().parse_args(["--model", "tiny", *argv])).validate()
  except ValueError as e:
    return to_flags(str(e))
  raise AssertionError(f"{argv} was accepted")


@pytest.mark.parametrize("argv, message", [
    (["--replicas", "2", "--quorum", "3"], "--quorum (K=3) must be at most replicas (M=2)"),
    (["--replicas", "3", "--quorum", "2", "--grace", "-1"], "--grace (G) must be an integer >= 0"),
    (["--replicas", "2", "--speeds", "1,0"], "--speeds (v_m) of replica 1 must be"),
    (["--replicas", "2", "--speeds", "1,1,1"], "--speeds must be one speed per replica (M=2)"),
    (["--replicas", "2", "--speeds", "1,x"], "--speeds must be comma-separated floats"),
    (["--replicas", "2", "--quorum", "1", "--outer-buffer", "0"], "--outer-buffer (N) must be an integer >= 1"),
    (["--replicas", "2", "--outer-apply", "sequential", "--reduction", "reduce-scatter",
      "--communication", "background"], "--outer-apply='sequential' is not built on real processes"),
    (["--replicas", "3", "--communication", "background", "--elastic", "--quorum", "2", "--reduction",
      "reduce-scatter"], "--quorum on real processes decides who counts from the payloads that arrived whole;"
     " --reduction reduce-scatter commits each sync at a barrier of every live process"),
    (["--algorithm", "streaming", "--fragments", "2", "--quorum", "1"], "--fragments=2 is not supported by the tape player yet"),
    (["--overlap", "1", "--quorum", "1"], "--overlap=1 is not supported by the tape player yet"),
    (["--outer-overlap", "eager", "--quorum", "1"], "--outer-overlap='eager' is not supported"),
    (["--compression", "bf16", "--quorum", "1"], "--compression='bf16' is not supported by the tape player yet"),
    (["--late", "late", "--quorum", "1"], "late must be one of ('drop', 'carry')"),
    (["--dylu"], "--dylu takes the inner steps from the replicas' speeds: pass --speeds"),
])
def test_bad_syncer_options_are_one_line_naming_the_option(argv, message):
  text = _cli_error(argv)
  assert message in text and "\n" not in text, text


def test_speed_ticks_never_round():
  assert speed_ticks((1.0, 0.75)) == (3, 4) and speed_ticks((1, 1, 0.5), scale=2) == (2, 2, 4)
  with pytest.raises(ValueError, match="not whole"):
    speed_ticks((1.0, 0.75), scale=2)
  with pytest.raises(ValueError, match="speeds must be one positive speed per replica"):
    tape_for(tiny(replicas=2), SyncerConfig(), (1.0,))


def test_default_knobs_keep_trains_path_and_a_non_default_syncer_plays_the_tape(tmp_path):
  """Explicit default syncer options: train()'s own loop (a state, the same rows). quorum = M
  (not a default, but a synchronous rule): the tape, with the same final params, and its files."""
  cfg = tiny(replicas=2)
  a = train(cfg)
  b = train(dataclasses.replace(cfg, syncer=SyncerOptions(late="drop", quorum=None, apply="merged")))
  assert a.state is not None and b.state is not None and _same(a.params, b.params)
  assert a.metrics.drop(columns="wall_time_s").equals(b.metrics.drop(columns="wall_time_s"))
  out = tmp_path / "tape"
  c = train(dataclasses.replace(cfg, syncer=SyncerOptions(quorum=2), out=str(out)))
  assert c.state is None and _same(c.params, a.params)
  assert c.summary["final_eval_loss"] == a.summary["final_eval_loss"]
  assert c.summary["total_bytes_per_replica"] == a.summary["total_bytes_per_replica"]
  rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
  assert [r["step"] for r in rows] == [1, 2] and [r["members"] for r in rows] == [[0, 1]] * 2
  assert rows[-1]["local_steps"] == 16 and rows[-1]["eval_loss"] == a.summary["final_eval_loss"]
  assert json.load(open(out / "summary.json"))["tape"]["rounds"] == 2 and (out / "final_params").is_dir()


def test_each_row_of_a_tape_run_carries_its_commit_tick(tmp_path):
  """A synchronous round on replicas of speeds (1, 0.5) with H = 2 waits for the slow replica:
  2 steps of 2 ticks, so round v commits at tick 4 v; the file's rows and the summary say so."""
  cfg = dataclasses.replace(tiny(replicas=2, steps=8, sync_every=2), out=str(tmp_path / "run"))
  run = train(dataclasses.replace(cfg, syncer=SyncerOptions(speeds=(1.0, 0.5))))
  rows = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
  tape = json.load(open(tmp_path / "run" / "summary.json"))["tape"]
  assert tape["step_ticks"] == [1, 2] and tape["ticks"] == rows[-1]["tick"] == 4 * tape["rounds"]
  assert [r["tick"] for r in rows] == [4 * r["step"] for r in rows] and run.metrics["tick"].iloc[0] == 0


def test_a_tape_run_is_set_up_as_every_run_and_stepped_round_by_round(monkeypatch):
  """train() with a non-default syncer: the one set-up makes its runtime, a TapeRuntime whose
  steps are the tape's committed rounds (1, 2, ... in turn), and the run is play_tape's of the
  same tape bit for bit; a stop request between two rounds ends it with one line."""
  from diloco_core.interrupts import Interrupted
  from diloco_core.run import loop
  from diloco_core.runtime.tape_runtime import TapeRuntime
  cfg = dataclasses.replace(tiny(replicas=2, steps=8, sync_every=2),
                            syncer=SyncerOptions(quorum=1, late="carry", speeds=(1.0, 0.5)))
  made, steps, set_up, step = [], [], loop.set_up, TapeRuntime.step

  def spy_set_up(c):
    run, state = set_up(c)
    made.append(run.comm)
    return run, state

  def spy_step(self, state, batch, t, present=None, last=False):
    steps.append(t)
    return step(self, state, batch, t, present, last)

  monkeypatch.setattr(loop, "set_up", spy_set_up)
  monkeypatch.setattr(TapeRuntime, "step", spy_step)
  got = train(cfg)
  assert isinstance(made[0], TapeRuntime) and not made[0].lock_step
  assert steps == list(range(1, made[0].last_step(cfg) + 1)) and len(steps) == got.summary["tape"]["rounds"] > 2
  syncer = cfg.syncer.syncer_config(2)
  ref = play_tape(cfg, syncer, tape_for(cfg, syncer, (1.0, 0.5)), make_setup(cfg))
  assert _same(got.params, ref.params) and got.summary["final_eval_loss"] == ref.eval_loss
  assert [r["members"] for r in got.rows[1:]] == ref.members
  assert [r["eval_loss"] for r in got.rows] == [x for _, x in ref.version_eval_losses]

  def stop_at_2(self, state, batch, t, present=None, last=False):
    if t == 2:
      raise KeyboardInterrupt
    return step(self, state, batch, t, present, last)

  monkeypatch.setattr(TapeRuntime, "step", stop_at_2)
  with pytest.raises(Interrupted, match=r"^interrupted at step 1; nothing was saved \(no `out`\)\.$"):
    train(cfg)
