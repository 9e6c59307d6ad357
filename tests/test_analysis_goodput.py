"""Goodput under failures (analysis.planning.goodput): closed forms by hand, a Monte Carlo of the
restarting job, limits and errors."""

import math

import numpy as np
import pytest

from analysis.lab.elastic_measured import failure_cost, measure_failure
from analysis.planning.goodput import (Failures, elastic_failure_cost, goodput, goodput_curves, kept_by_restarts,
                                      lost_to_elastic_failures)


def test_no_failures_keeps_the_utilization():
  for method in ("dp", "diloco", "streaming"):
    for elastic in (False, True):
      assert goodput(method, 0.8, Failures(0.0), replicas=4, step_s=1.0, sync_every=10, fragments=2,
                     elastic=elastic) == 0.8


def test_restarts_closed_form_by_hand():
  """ΛC = 1, R = 0: C / E = 1 / (e - 1); with R: a factor e^{-ΛR} more."""
  f = Failures(rate_per_hour=0.25, restart_s=0.0, checkpoint_every_s=3600.0)
  assert kept_by_restarts(f, replicas=4) == pytest.approx(1 / (math.e - 1), rel=1e-12)
  f = Failures(rate_per_hour=0.25, restart_s=1800.0, checkpoint_every_s=3600.0)  # ΛR = 0.5
  assert kept_by_restarts(f, replicas=4) == pytest.approx(math.exp(-0.5) / (math.e - 1), rel=1e-12)


def test_restarts_first_order():
  """Small rates: 1 - Λ (C/2 + R), the error of second order."""
  f = Failures(rate_per_hour=1e-4, restart_s=600.0, checkpoint_every_s=3600.0)
  lam = 8 * 1e-4 / 3600
  assert 1 - kept_by_restarts(f, replicas=8) == pytest.approx(lam * (1800 + 600), rel=1e-3)


def test_restarts_match_a_monte_carlo_of_the_job():
  """Exponential failures of rate Λ, a segment of C seconds of progress redone after each
  failure, R seconds of restart (which a failure may interrupt too): the mean time per segment
  of 20,000 simulated segments is E within 2%."""
  rng = np.random.default_rng(0)
  lam, C, R = 1 / 4000.0, 2000.0, 500.0
  total = 0.0
  for _ in range(20_000):
    while True:
      x = rng.exponential(1 / lam)
      if x >= C:
        total += C
        break
      total += x
      while True:  # the restart, itself interrupted by failures
        y = rng.exponential(1 / lam)
        if y >= R:
          total += R
          break
        total += y
  f = Failures(rate_per_hour=lam * 3600 / 2, restart_s=R, checkpoint_every_s=C)  # two replicas: Λ = 2λ
  expected = C / kept_by_restarts(f, replicas=2)
  assert total / 20_000 == pytest.approx(expected, rel=0.02)


def test_elastic_loss_by_hand():
  """One failure per replica every 1000 s (λ = 3.6 / h), steps of 2 s of wall time, H = 50, P = 5,
  J = 100 s, g = 10 s, M = 4: w = H s / 2 = 50 s, v = H s / 2 = 50 s (DiLoCo) or 10 s (Streaming),
  s / 2 = 1 s each for DP; plus (M - 1) g = 30 s."""
  f = Failures(rate_per_hour=3.6, rejoin_s=100.0, grace_s=10.0)
  kw = dict(replicas=4, step_wall_s=2.0, sync_every=50, fragments=5)
  assert lost_to_elastic_failures("diloco", f, **kw) == pytest.approx((50 + 100 + 50 + 30) / 1000)
  assert lost_to_elastic_failures("streaming", f, **kw) == pytest.approx((50 + 100 + 10 + 30) / 1000)
  assert lost_to_elastic_failures("dp", f, **kw) == pytest.approx((1 + 100 + 1 + 30) / 1000)
  # goodput: u (1 - f) with s = T / u
  assert goodput("diloco", 0.5, f, replicas=4, step_s=1.0, sync_every=50, elastic=True) == pytest.approx(
      0.5 * (1 - 0.23))
  assert lost_to_elastic_failures("diloco", Failures(rate_per_hour=3600.0), **kw) == 1.0  # capped


def test_elastic_beats_stopping_with_many_islands_and_stopping_worsens_with_more():
  f = Failures(rate_per_hour=0.1)
  stop = [goodput("diloco", 0.9, f, replicas=m, step_s=0.1, sync_every=100) for m in (2, 4, 8, 16)]
  assert stop == sorted(stop, reverse=True)
  assert goodput("diloco", 0.9, f, replicas=8, step_s=0.1, sync_every=100, elastic=True) > stop[2]


def test_curves_table():
  runs = {"a": dict(method="diloco", utilization=0.9, sync_every=100), "b": dict(method="dp", utilization=0.5)}
  t = goodput_curves(runs, [0.0, 0.1], Failures(0.0), replicas=4, step_s=0.1)
  assert list(t.columns) == ["rate_per_hour", "run", "stop_and_restart", "elastic"]
  assert t["run"].tolist() == ["a", "b", "a", "b"]
  assert t.iloc[:2]["elastic"].tolist() == [0.9, 0.5]
  assert t.iloc[2]["stop_and_restart"] == goodput("diloco", 0.9, Failures(0.1), replicas=4, step_s=0.1, sync_every=100)


@pytest.mark.parametrize("call, message", [
    (lambda: Failures(rate_per_hour=-1.0), "rate_per_hour must be"),
    (lambda: Failures(rate_per_hour=0.1, checkpoint_every_s=0.0), "checkpoint_every_s must be"),
    (lambda: goodput("diloco", 0.9, Failures(0.1), replicas=1, step_s=1.0, elastic=True),
     "elastic needs replicas (M) >= 2 (a live replica to heal from), got 1."),
    (lambda: goodput("ddp", 0.9, Failures(0.1), replicas=2, step_s=1.0), "method must be one of"),
    (lambda: goodput("dp", 1.5, Failures(0.1), replicas=2, step_s=1.0), "utilization must be"),
])
def test_errors_are_one_line(call, message):
  with pytest.raises(ValueError) as e:
    call()
  assert message in str(e.value) and "\n" not in str(e.value)


def test_one_failure_costs_the_sum_of_its_parts():
  """elastic_failure_cost's parts are what lost_to_elastic_failures adds up, per failure."""
  f = Failures(rate_per_hour=1.8, rejoin_s=40.0, grace_s=7.0)
  parts = elastic_failure_cost("streaming", f, replicas=5, step_wall_s=0.25, sync_every=16, fragments=4)
  assert parts == {"work": 2.0, "rejoin": 40.0, "wait": 0.5, "grace": 28.0}  # 16·0.25/2, 16·0.25/8, 4·7
  assert lost_to_elastic_failures("streaming", f, replicas=5, step_wall_s=0.25, sync_every=16, fragments=4) == \
      pytest.approx(1.8 / 3600 * 70.5)


def _trace(kill_step: int, heal_at: float):
  """Two processes, steps of 10 s (start 10 t); process 1 stops after ``kill_step``."""
  step = lambda t: {"kind": "compute", "step": t, "start": 10.0 * t, "end": 10.0 * t + 9}
  leader = [*(step(t) for t in range(1, 9)),
            {"kind": "settle", "sent_at": 2, "time": 30.5, "present": [1.0, 1.0]},
            {"kind": "settle", "sent_at": 4, "time": 50.5, "present": [1.0, 1.0]},
            {"kind": "wait", "step": 6, "start": 69.0, "end": 71.0},
            {"kind": "lost", "step": 6, "processes": [1], "time": 71.0},
            {"kind": "settle", "sent_at": 6, "time": 71.5, "present": [1.0, 0.0]},
            {"kind": "joined", "step": 7, "processes": [1], "time": 78.0},
            {"kind": "wait", "step": 8, "for": "heal", "start": heal_at - 2.0, "end": heal_at - 0.5},
            {"kind": "heal", "step": 8, "processes": [1], "time": heal_at},
            {"kind": "wait", "step": 9, "start": heal_at + 1, "end": heal_at + 3.5},
            {"kind": "settle", "sent_at": 10, "time": heal_at + 4, "present": [1.0, 1.0]}]
  return {0: leader, 1: [*(step(t) for t in range(1, kill_step + 1)), {"kind": "healed", "step": 8}]}


def test_a_measured_failure_beside_the_model():
  """A hand-made trace: killed after step 5 (its last counted send at step 4, ended at 49 s),
  joined at 78 s, healed at 89 s; the others waited 2 s at the sync without it and 1.5 s + 2.5 s
  while it compiled (before the heal, at the log row, and after it)."""
  m = measure_failure(_trace(5, 89.0), 1, first_step=1)
  assert (m["last_step"], m["sent_step"], m["lost_step"], m["healed_step"]) == (5, 4, 6, 8)
  assert (m["kill_time"], m["sent_time"], m["join_time"], m["heal_time"]) == (49.0, 39.0, 68.0, 79.0)
  assert (m["wait_s"], m["heal_wait_s"], m["join_wait_s"], m["step_s"]) == (2.0, 1.5, 2.5, 10.0)
  table = failure_cost(m, replicas=2, sync_every=4, fragments=2, heartbeat_s=10.0).set_index("part")
  assert table["run_s"].to_dict() == {"work": 10.0, "rejoin": 19.0, "wait": 11.0, "grace": 2.0, "compile": 4.0,
                                      "total": 46.0}
  assert table["model_s"].to_dict() == {"work": 20.0, "rejoin": 19.0, "wait": 10.0, "grace": 10.0, "compile": 0.0,
                                        "total": 59.0}


def test_a_trace_without_the_loss_or_the_heal_says_so():
  t = _trace(5, 89.0)
  no_heal = {0: [r for r in t[0] if r["kind"] != "heal"], 1: t[1]}
  with pytest.raises(RuntimeError, match="process 1's replacement was not healed"):
    measure_failure(no_heal, 1, first_step=1)
  with pytest.raises(RuntimeError, match="process 0 was not lost"):
    measure_failure(t, 0, first_step=1)
