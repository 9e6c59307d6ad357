"""Goodput under failures (analysis.planning.goodput): closed forms by hand, a Monte Carlo of the
restarting job, limits and errors."""

import math

import numpy as np
import pytest

from analysis.planning.goodput import Failures, goodput, goodput_curves, kept_by_restarts, lost_to_elastic_failures


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
