"""Live sweeps (analysis.lab.live): the plan and its estimate are stated first, MAX_RUNS caps a call."""

from __future__ import annotations

import pytest

from analysis import live, sweep_cache, sweeps
from tiny_run import tiny


def configs():
  # two programs (M = 2 and M = 3 are shapes; test_tape_play compiles both), three runs (H is an
  # input of the program)
  return [tiny(replicas=2, sync_every=2), tiny(replicas=2, sync_every=4), tiny(replicas=3)]


def test_the_plan_counts_cached_runs_and_estimates_from_the_probe(tmp_path):
  cfgs = configs()
  sweeps.run_sweep(cfgs[:1], cache=tmp_path, progress=False)  # one run already cached
  plan = live.plan_live(cfgs, cache=tmp_path)
  assert (plan.runs, plan.cached, plan.to_train, plan.programs) == (3, 1, 2, 2)
  assert plan.flops == live.run_flops(cfgs[1]) + live.run_flops(cfgs[2])
  # 8 steps at M = 2 (the probed run's step) and 8 at M = 3 (1.5 times its FLOPs); 3 evaluations each
  assert (plan.steps, plan.evals) == (8 * 1 + 8 * 1.5, 2 * (8 // 4 + 1))
  p = plan.probe
  assert p.compile_s > 0 and p.step_s > 0 and p.eval_s >= 0
  assert p.step_flops == live.step_flops(cfgs[1])
  assert plan.estimate_s == pytest.approx(2 * p.compile_s + 20 * p.step_s + 6 * p.eval_s, rel=1e-12)
  assert "3 runs: 1 cached, 2 to train (2 programs)" in plan.text() and "estimated" in plan.text()
  capped = live.plan_live(cfgs, cache=tmp_path, max_runs=1, measure=False)
  assert (capped.to_train, capped.programs, capped.probe, capped.estimate_s) == (1, 1, None, None)
  assert "no estimate" in capped.text()


def test_run_flops_by_hand():
  cfg = tiny(replicas=2, steps=8, batch_size=2, seq_len=8)
  per_token = live.flops_per_token(cfg.model_config(), 8)
  assert live.run_flops(cfg) == 8 * 2 * 2 * 8 * per_token


def test_max_runs_trains_that_many_then_says_how_many_remain(tmp_path, capsys):
  cfgs = configs()
  with pytest.raises(live.LiveLimitReached, match=r"trained 1 of the 3 runs left .* 2 remain: run the cell again"):
    live.live_sweep(cfgs, cache=tmp_path, max_runs=1, measure=False, progress=False, desc="t")
  assert sum(sweep_cache.is_cached(c, tmp_path) for c in cfgs) == 1
  assert "t: 3 runs: 0 cached, 1 to train (1 program)" in capsys.readouterr().out
  df = live.live_sweep(cfgs, cache=tmp_path, measure=False, progress=False, desc="t")  # goes on
  out = capsys.readouterr().out
  assert "t: 3 runs: 1 cached, 2 to train" in out and "t: trained 2 runs in" in out
  assert len(df) == 3 and df["cached"].sum() == 1
  assert [r.sync_every for r in df.itertuples()] == [2, 4, 4]  # in the order given


@pytest.mark.parametrize("bad", [-1, 1.5, "3", True])
def test_a_bad_max_runs_is_refused_before_anything_trains(tmp_path, bad):
  with pytest.raises(ValueError, match=r"max_runs \(MAX_RUNS\)"):
    live.live_sweep(configs(), cache=tmp_path, max_runs=bad, measure=False)
  assert not tmp_path.exists() or not any(tmp_path.iterdir())


def test_durations_read_as_people_say_them():
  assert [live.duration(s) for s in (5, 99, 100, 5999, 6000)] == ["5 s", "99 s", "1.7 min", "100.0 min", "1.7 h"]
