"""A heterogeneous pool under the syncer rule (analysis.planning.pool, analysis.planning.pool_plan):
closed forms by hand in exact fractions, equivalences with the homogeneous simulator and goodput
model, monotonicity, the planner's rule, and one-line errors."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from analysis.planning import pool_plan
from analysis.planning.goodput import Failures, goodput
from analysis.planning.pool import pool_utilization, to_ticks
from analysis.planning.pool_plan import pool_failure_cost, pool_goodput, pool_goodput_curves, recommend_syncer
from analysis.planning.simulate import utilization
from diloco_core.spec.tape import Dropped

F = Fraction


# ---- closed forms by hand ------------------------------------------------------------------------

@pytest.mark.parametrize("m", [2, 3, 4, 5])
def test_synchronous_with_one_replica_twice_as_slow_by_hand(m):
  """A round is 2H s (the straggler's H steps of 2 s); the others compute H s of it: busy 1/2, the
  straggler 1; u = ((M - 1)/2 + 1) / M = (M + 1) / 2M; goodput = M H / (2H (M - 1/2)) = M / (2M - 1)."""
  h, rounds = 4, 5
  r = pool_utilization((1.0,) * (m - 1) + (0.5,), sync_every=h, steps=rounds * m * h)
  assert r.busy == (F(1, 2),) * (m - 1) + (F(1),)
  assert r.utilization == F(m + 1, 2 * m)
  assert r.goodput == r.throughput == F(m, 2 * m - 1)
  assert r.wall_s == rounds * 2 * h and r.rounds == rounds
  # the fast ones wait H s in each round but the last (after their last send: their tail)
  assert r.waiting == (F((rounds - 1) * h, rounds * 2 * h),) * (m - 1) + (F(0),)
  assert (r.merged, r.dropped, r.stale, r.kept) == (1, 0, 0, 1)


def test_dylu_keeps_the_same_pool_busy_by_hand():
  """H_m = floor(4 v_m / v_max) = (4, 4, 2): every period lasts 4 s, nobody waits."""
  r = pool_utilization((1.0, 1.0, 0.5), sync_every=4, dylu=True, steps=50)
  assert r.inner_steps == (4, 4, 2)
  assert r.busy == (F(1),) * 3 and r.waiting == (F(0),) * 3
  assert r.utilization == r.goodput == 1 and r.wall_s == 20


def test_dylu_with_a_floor_by_hand():
  """v = (1, 0.3), H = 4: H_m = (4, floor(1.2) = 1); the slow period is 10/3 s of the round's 4 s:
  busy (1, 5/6), u = 11/12; the tick is gcd(1, 10/3) = 1/3 s; 10 rounds of 5 steps in 40 s, against
  the ideal 1.3 steps per second: goodput 50 / 52."""
  r = pool_utilization((1.0, 0.3), sync_every=4, dylu=True, steps=50)
  assert r.tick_s == F(1, 3) and r.inner_steps == (4, 1)
  assert r.busy == (F(1), F(5, 6)) and r.utilization == F(11, 12)
  assert r.wall_s == 40 and r.goodput == F(25, 26)


def test_link_costs_each_round_both_ways_by_hand():
  """Equal speeds, H = 4 steps of 1 s, latency 1 s + transfer 0.5 s each way: 4 s of compute in a
  7 s round. A straggler (1, 0.5), H = 2, latency 1: rounds of 4 + 2 s; busy (2/6, 4/6)."""
  for m in (1, 2, 3):
    assert pool_utilization((1,) * m, sync_every=4, latency_s=1, transfer_s=0.5).utilization == F(4, 7)
  r = pool_utilization((1, 0.5), sync_every=2, latency_s=1)
  assert r.busy == (F(1, 3), F(2, 3)) and r.utilization == F(1, 2)


def test_a_quorum_of_one_waits_for_nobody():
  r = pool_utilization((1.0, 1.0, 0.5), sync_every=4, quorum=1)
  assert r.waiting == (F(0),) * 3
  assert pool_utilization((1.0, 1.0, 0.5), sync_every=4).waiting[0] > 0  # the synchronous pool does


def test_a_quorum_drops_or_carries_the_straggler_by_hand():
  """K = 1, no link: the fast ones commit every 4 s, so the straggler's contribution (base b, sent
  8 s later) always finds a newer version: dropped (late="drop"), or merged with staleness 1
  (late="carry"); either way its contributions are exactly the late ones."""
  drop = pool_utilization((1.0, 1.0, 0.5), sync_every=4, quorum=1)
  slow = drop.steps[2] // 4
  assert {e.replica for e in drop.tape if isinstance(e, Dropped)} == {2}
  assert drop.dropped == F(slow, drop.contributions) and drop.merged == 1 - drop.dropped
  assert drop.kept == F(drop.steps[0] + drop.steps[1], sum(drop.steps))
  assert drop.goodput == F(drop.steps[0] + drop.steps[1]) / (drop.wall_s * F(5, 2))
  carry = pool_utilization((1.0, 1.0, 0.5), sync_every=4, quorum=1, late="carry")
  assert carry.merged == 1 and carry.stale == F(carry.steps[2] // 4, carry.contributions)
  assert carry.goodput == carry.throughput > drop.goodput


def test_seconds_become_ticks_exactly():
  assert to_ticks(F(1), F(10, 3), F(0)) == (F(1, 3), (3, 10, 0))
  assert to_ticks(F(1, 2), F(3, 4), F(1, 6)) == (F(1, 12), (6, 9, 2))
  r = pool_utilization((1.0, 0.3), sync_every=10, latency_s=0.25)  # 0.3 is 3/10: steps of 10/3 s
  assert r.tick_s == F(1, 12)


# ---- equivalences --------------------------------------------------------------------------------

@pytest.mark.parametrize("m,h", [(1, 4), (2, 4), (4, 7)])
def test_equal_speeds_full_quorum_no_link_is_the_simulators_no_communication_case(m, h):
  r = pool_utilization((2.5,) * m, sync_every=h)
  assert r.utilization == r.goodput == 1 and r.busy == (F(1),) * m
  for quorum in (None, m):
    assert pool_utilization((2.5,) * m, sync_every=h, quorum=quorum).utilization == 1
  sim = utilization("1B", "diloco", math.inf, replicas=m, sync_every=h)
  assert sim == pytest.approx(float(r.utilization), abs=1e-12)


@pytest.mark.parametrize("elastic", [False, True])
def test_equal_speeds_match_the_goodput_model(elastic):
  """Equal speeds, K = M: p = r = H s, the others wait g: goodput("diloco", u, ...) of
  analysis.planning.goodput, with u the pool's utilization (here 4/7, the link's)."""
  f = Failures(rate_per_hour=0.5, restart_s=300, checkpoint_every_s=1800, rejoin_s=120, grace_s=10)
  r = pool_utilization((1, 1, 1), sync_every=20, latency_s=5, transfer_s=2.5)
  assert r.utilization == F(4, 7)
  expected = goodput("diloco", 4 / 7, f, replicas=3, step_s=1.0, sync_every=20, elastic=elastic)
  assert pool_goodput(r, f, elastic=elastic)["compute_kept"] == pytest.approx(expected, rel=1e-12)


def test_elastic_failures_cost_no_grace_to_a_quorum():
  f = Failures(rate_per_hour=1.0, rejoin_s=20.0, grace_s=5.0)
  full = pool_failure_cost(pool_utilization((1, 1, 1), sync_every=10, steps=300), f)
  assert full == {"work": 5.0, "rejoin": 20.0, "wait": 5.0, "grace": 10.0}
  assert pool_failure_cost(pool_utilization((1, 1, 1), sync_every=10, steps=300, quorum=2), f)["grace"] == 0.0


def test_goodput_reports_compute_kept_and_contributions_merged():
  drop = pool_utilization((1.0, 1.0, 0.5), sync_every=4, quorum=1)
  out = pool_goodput(drop, Failures(0.0))
  assert out == {"compute_kept": float(drop.goodput), "contributions_merged": float(drop.merged), "stale": 0.0}
  table = pool_goodput_curves({"K=1": drop}, [0.0, 1.0], Failures(0.0))
  assert list(table["elastic"]) == sorted(table["elastic"], reverse=True)
  assert table["elastic"].iloc[1] < out["compute_kept"]


# ---- monotonicity --------------------------------------------------------------------------------

def test_a_slower_straggler_never_raises_synchronous_utilization():
  last_u = last_g = 2
  for v in (1.0, 0.9, 0.75, 0.5, 0.3, 0.1):
    r = pool_utilization((1.0, 1.0, 1.0, v), sync_every=10, steps=400, latency_s=0.5)
    assert r.utilization <= last_u and r.goodput <= last_g
    last_u, last_g = r.utilization, r.goodput
  assert last_u < F(1, 2)


# ---- the planner ---------------------------------------------------------------------------------

def test_recommend_syncer_prefers_dylu_when_it_merges_everything_at_full_goodput():
  table, setting, reason = recommend_syncer((1.0, 1.0, 0.5), sync_every=4, steps=120)
  assert list(table.index) == ["synchronous", "synchronous + DyLU", "quorum K=2", "quorum K=1", "quorum K=2 + grace"]
  assert list(table.columns) == ["utilization", "goodput", "wall_s", "merged", "stale", "dropped", "runs_on"]
  assert table.loc["synchronous", "utilization"] == pytest.approx(2 / 3) and table.loc["synchronous", "wall_s"] == 80
  assert setting == "synchronous + DyLU" and "100.0%" in reason and "\n" not in reason
  # DyLU and the carried quorums run on the tape only: the reason names what runs on real processes
  assert table["runs_on"].tolist() == [pool_plan.ON_PROCESSES] + [pool_plan.ON_TAPE] * 4
  assert reason.endswith("On real processes: synchronous merges every contribution fresh at goodput 60.0%; no"
                         " quorum merging >= 75% of them beats it by x1.05."), reason
  dropped, _, _ = recommend_syncer((1.0, 1.0, 0.5), sync_every=4, steps=120, late="drop")
  assert dropped["runs_on"].tolist() == [pool_plan.ON_PROCESSES, pool_plan.ON_TAPE] + [pool_plan.ON_PROCESSES] * 3


def test_recommend_syncer_keeps_synchronous_among_equals():
  _, setting, _ = recommend_syncer((1, 1, 1), sync_every=4)
  assert setting == "synchronous"


def test_recommend_syncer_takes_a_quorum_only_when_it_gains_enough(monkeypatch):
  """(1, 1, 1, 0.3), H = 10, latency 1 s: DyLU's H_m = 3 leaves goodput 0.754, below 0.9; quorum K=3
  (carry) reaches 0.808, x1.07; with MIN_GAIN 1.10 the lossless DyLU stays."""
  table, setting, reason = recommend_syncer((1.0, 1.0, 1.0, 0.3), sync_every=10, latency_s=1)
  assert table.loc["synchronous + DyLU", "goodput"] < pool_plan.MIN_GOODPUT
  assert setting == "quorum K=3" and "x1.05" in reason
  monkeypatch.setattr(pool_plan, "MIN_GAIN", 1.10)
  _, setting, reason = recommend_syncer((1.0, 1.0, 1.0, 0.3), sync_every=10, latency_s=1)
  assert setting == "synchronous + DyLU" and "no quorum" in reason


def test_recommend_syncer_refuses_a_lossy_quorum_below_min_merged(monkeypatch):
  """(1, 1, 1, 0.1), late="drop": quorum K=3 drops 1/24 of the contributions and beats DyLU's
  goodput by x1.13: taken while it merges >= MIN_MERGED (0.75), refused at 0.97."""
  table, setting, _ = recommend_syncer((1.0, 1.0, 1.0, 0.1), sync_every=10, latency_s=1, late="drop")
  assert table.loc["quorum K=3", "merged"] == pytest.approx(23 / 24) and setting == "quorum K=3"
  monkeypatch.setattr(pool_plan, "MIN_MERGED", 0.97)
  _, setting, _ = recommend_syncer((1.0, 1.0, 1.0, 0.1), sync_every=10, latency_s=1, late="drop")
  assert setting == "synchronous + DyLU"


# ---- bad input: one line naming the option -----------------------------------------------------

@pytest.mark.parametrize("kwargs,match", [
    (dict(speeds=(1.0, 0.0)), r"speeds \(v_m\) of replica 1 must be a finite number > 0"),
    (dict(speeds=(1.0, -2)), r"speeds \(v_m\) of replica 1 must be a finite number > 0"),
    (dict(speeds=(1.0, math.nan)), r"speeds \(v_m\) of replica 1 must be a finite number > 0"),
    (dict(speeds=()), r"speeds must be a non-empty sequence"),
    (dict(quorum=4), r"quorum \(K=4\) must be at most the replicas \(M=3\): use K in 1..3"),
    (dict(quorum=0), r"quorum \(K\) must be an integer >= 1"),
    (dict(quorum=2, grace_s=-1), r"grace_s must be a finite number >= 0"),
    (dict(grace_s=2), r"quorum K = M = 3 leaves none: pass quorum in 1..2 or grace_s=0"),
    (dict(late="wait"), r"late must be one of \('drop', 'carry'\)"),
    (dict(dylu=1), r"dylu must be True or False"),
    (dict(latency_s=-0.1), r"latency_s must be a finite number >= 0"),
    (dict(sync_every=0), r"sync_every \(H\) must be an integer >= 1"),
])
def test_bad_input_is_one_line_naming_the_option(kwargs, match):
  args = dict(speeds=(1.0, 1.0, 0.5), sync_every=4) | kwargs
  with pytest.raises(ValueError, match=match) as err:
    pool_utilization(args.pop("speeds"), **args)
  assert "\n" not in str(err.value)


def test_recommend_syncer_bad_input():
  with pytest.raises(ValueError, match=r"late must be one of"):
    recommend_syncer((1, 1), sync_every=4, late="sometimes")
  with pytest.raises(ValueError, match=r"result must be a PoolResult"):
    pool_goodput(0.5, Failures(0.0))
