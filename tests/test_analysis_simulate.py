"""The event simulator against closed forms, limits, monotonicity and the paper's table."""

import math
import time

import numpy as np
import pytest

from analysis import bandwidth as bw
from analysis import simulate as sim

ONE_B = sim.SIM_MODELS["1B"]  # 1e9 params, 24 layers, 0.1 s


def _bits(params, bits=16, replicas=2):
  return params * bits * 2 * (replicas - 1) / replicas


# ---------------------------------------------------------------- closed forms agree


@pytest.mark.parametrize("h", [1, 10, 100])
@pytest.mark.parametrize("gbps", [0.5, 10.0, 300.0])
@pytest.mark.parametrize("latency", [0.0, 0.05])
def test_diloco_equals_closed_form(h, gbps, latency):
  # H T / (H T + V / W + eps) with V = 1e9 * 16 bits * a(2) = 1.6e10 bits.
  u = sim.run_simulation("1B", "diloco", gbps, sync_every=h, latency=latency).utilization
  c = 1.6e10 / (gbps * 1e9) + latency
  assert u == pytest.approx(h * 0.1 / (h * 0.1 + c), rel=1e-9)
  assert u == pytest.approx(bw.utilization_no_overlap(gbps * 1e9 / 8, 2e9, 0.1, h, latency))


def test_one_blocking_transfer_per_step_is_t_over_t_plus_c():
  # DiLoCo with H = 1, 4 replicas, 8-bit: C = 1e9 * 8 * 1.5 / 2e9 = 6 s, T = 0.1 s.
  u = sim.run_simulation("1B", "diloco", 2.0, sync_every=1, replicas=4, bits=8).utilization
  assert u == pytest.approx(0.1 / (0.1 + 6.0), rel=1e-12)


def test_streaming_without_overlap_equals_closed_form():
  # P = 4 fragments (6 layers each) dividing H = 100: each sync blocks for V/P/W + eps.
  for gbps, eps in ((1.0, 0.0), (7.0, 0.02), (100.0, 0.3)):
    u = sim.run_simulation("1B", "streaming", gbps, fragment_layers=6, latency=eps).utilization
    assert u == pytest.approx(10.0 / (10.0 + 1.6e10 / (gbps * 1e9) + 4 * eps), rel=1e-9)
  # One fragment holding every layer is DiLoCo.
  for gbps in (0.3, 3.0, 30.0):
    a = sim.run_simulation("1B", "streaming", gbps, fragment_layers=24, overlap=2).utilization
    b = sim.run_simulation("1B", "diloco", gbps, overlap=2).utilization
    assert a == pytest.approx(b, rel=1e-12)


@pytest.mark.parametrize("gbps", [1.0, 20.0, 200.0, 2000.0, 1e5])
@pytest.mark.parametrize("latency", [0.0, 0.01])
def test_dp_equals_closed_form(gbps, latency):
  # Step = max(T + d, T/3 + 2T/(3L) + L d) + eps, d = V_layer / W: per-layer reductions
  # overlap the rest of the backward pass (FIFO), the next step waits for the last.
  t, layers = 0.1, 24
  d = _bits(1e9) / layers / (gbps * 1e9)
  step = max(t + d, t / 3 + 2 * t / (3 * layers) + layers * d) + latency
  u = sim.run_simulation("1B", "dp", gbps, latency=latency).utilization
  assert u == pytest.approx(t / step, rel=1e-9)


def test_hidden_bandwidth_is_where_overlap_reaches_one():
  # Streaming, P = 4 (Δh = 25), τ = 1: each 4e9-bit fragment may use one 0.1 s step.
  kw = dict(fragment_layers=6, overlap=1)
  w = bw.hidden_bandwidth(bw.payload_bytes(1e9 / 4, 16, 2), 0.1, overlap=1) * 8 / 1e9
  assert w == pytest.approx(40.0)
  assert sim.run_simulation("1B", "streaming", w, **kw).utilization == pytest.approx(1.0, abs=1e-12)
  assert sim.run_simulation("1B", "streaming", 0.99 * w, **kw).utilization < 1.0 - 1e-6
  # Exact bisection finds the same point for a target just below 1.
  assert sim.bandwidth_for_utilization(1 - 1e-9, "1B", "streaming", **kw) == pytest.approx(
      w, rel=1e-4)
  # τ = 3: three steps to hide behind, a third of the bandwidth.
  w3 = bw.hidden_bandwidth(bw.payload_bytes(1e9 / 4, 16, 2), 0.1, overlap=3) * 8 / 1e9
  assert sim.run_simulation("1B", "streaming", w3, fragment_layers=6, overlap=3).utilization == (
      pytest.approx(1.0, abs=1e-12))
  assert sim.run_simulation("1B", "streaming", 0.99 * w3, fragment_layers=6,
                      overlap=3).utilization < 1.0


def test_exact_bandwidth_matches_roofline_closed_form():
  for u in sim.PAPER_TARGETS:
    closed = bw.required_bandwidth(u, bw.payload_bytes(1e10, 16, 2), 0.8, 100) * 8 / 1e9
    assert sim.bandwidth_for_utilization(u, "10B", "diloco") == pytest.approx(closed, rel=1e-5)


# ---------------------------------------------------------------------------- limits


@pytest.mark.parametrize("method", ["dp", "diloco", "streaming"])
def test_infinite_bandwidth_and_single_replica_give_full_utilization(method):
  for name in sim.SIM_MODELS:
    assert sim.run_simulation(name, method, math.inf).utilization == pytest.approx(1.0, abs=1e-12)
    assert sim.run_simulation(name, method, 0.01, replicas=1).utilization == pytest.approx(
        1.0, abs=1e-12)


def test_latency_caps_utilization():
  # DP at infinite bandwidth still waits eps after its last layer: T / (T + eps).
  u = sim.run_simulation("1B", "dp", math.inf, latency=0.1).utilization
  assert u == pytest.approx(0.5)
  assert sim.bandwidth_for_utilization(0.6, "1B", "dp", latency=0.1) == math.inf


def test_steady_state_reached():
  for name in sim.SIM_MODELS:
    for _, method, tau, bits in sim.PAPER_ROWS:
      for gbps in (0.3, 3.0, 30.0, 300.0):
        a = sim.run_simulation(name, method, gbps, overlap=tau, bits=bits).utilization
        b = sim.run_simulation(name, method, gbps, overlap=tau, bits=bits, warmup_periods=5,
                         periods=8).utilization
        assert a == pytest.approx(b, rel=1e-9)


# ---------------------------------------------------------------------- monotonicity


@pytest.mark.parametrize("name", list(sim.SIM_MODELS))
def test_utilization_increases_with_bandwidth(name):
  grid = np.logspace(-2, 4, 60)
  for _, method, tau, bits in sim.PAPER_ROWS:
    us = np.array([sim.run_simulation(name, method, w, overlap=tau, bits=bits).utilization
                   for w in grid])
    assert np.all(np.diff(us) >= -1e-12), method
    assert us[0] < 0.5 and us[-1] > 0.95


def test_bandwidth_decreases_with_h_tau_and_bits():
  bw = sim.bandwidth_for_utilization
  by_h = [bw(0.9, "1B", "diloco", sync_every=h) for h in (10, 50, 100, 400)]
  assert all(a > b for a, b in zip(by_h, by_h[1:]))
  by_tau = [bw(0.95, "10B", "streaming", overlap=t) for t in (0, 1, 2, 5)]
  assert all(a > b for a, b in zip(by_tau, by_tau[1:]))
  by_bits = [bw(0.95, "100B", "streaming", overlap=1, bits=b) for b in (32, 16, 8, 4)]
  assert all(a > b for a, b in zip(by_bits, by_bits[1:]))
  # Lower bits scale the bandwidth exactly (payload is linear in bits, no latency).
  assert by_bits[1] / by_bits[3] == pytest.approx(4.0, rel=1e-5)
  by_target = bw(list(sim.PAPER_TARGETS), "100B", "dp")
  assert np.all(np.diff(by_target) > 0)


# ------------------------------------------------------------------- the paper table


def test_paper_table_shape_order_and_ordering():
  t0 = time.perf_counter()
  table = sim.paper_table()
  elapsed = time.perf_counter() - t0
  assert elapsed < 10.0
  assert table.shape == (15, 5)
  assert list(table.columns) == ["50%", "80%", "90%", "95%", "99%"]
  assert list(table.index.get_level_values("model").unique()) == ["1B", "10B", "100B"]
  labels = [r[0] for r in sim.PAPER_ROWS]
  for name in ("1B", "10B", "100B"):
    block = table.loc[name].loc[labels].to_numpy()
    assert np.all(np.diff(block, axis=1) >= 0)  # rows increase with the target
    assert np.all(block[0] == block.max(axis=0))  # DP needs the most
    assert np.all(block[-1] == block.min(axis=0))  # overlap + 4-bit the least
    assert np.all(block[3] <= block[2])  # overlap never hurts
    assert np.all(np.isin(block, sim.PAPER_GRID_GBPS))  # grid rounding


def test_grid_value_is_exact_value_rounded_up_to_the_grid():
  grid = sim.PAPER_GRID_GBPS
  for name in sim.SIM_MODELS:
    for _, method, tau, bits in sim.PAPER_ROWS:
      kw = dict(overlap=tau, bits=bits)
      exact = sim.bandwidth_for_utilization(list(sim.PAPER_TARGETS), name, method, **kw)
      rounded = sim.bandwidth_for_utilization(list(sim.PAPER_TARGETS), name, method,
                                              rounding="grid", **kw)
      for e, r in zip(exact, rounded):
        i = np.searchsorted(grid, r)
        assert grid[i] == r and r >= e * (1 - 1e-6)
        assert i == 0 or grid[i - 1] < e * (1 + 1e-6)


def test_exact_table_dp_row_by_hand():
  # 1B DP at 50%: step 0.2 s = T/3 + T/36 + 24 d  ->  24 d = 0.2 - 0.1/3 - 0.1/36.
  exact = sim.paper_table(rounding="exact", models=("1B",), targets=(0.5,))
  d_total = 0.2 - 0.1 / 3 - 0.1 / 36
  assert exact.loc[("1B", "DP"), "50%"] == pytest.approx(1.6e10 / d_total / 1e9, rel=1e-5)
  # DiLoCo at 50%: V / W = H T = 10 s -> 1.6 Gbit/s.
  assert exact.loc[("1B", "DiLoCo"), "50%"] == pytest.approx(1.6, rel=1e-5)


# ------------------------------------------------------------ result object, errors


def test_timeline_records_every_event():
  r = sim.run_simulation("1B", "dp", 50.0)
  n = len(r.step_start)
  assert n == 6  # (2 + 3) periods of one step, plus the step after the window
  tl = r.timeline()
  assert (tl["kind"] == "compute").sum() == n
  assert (tl["kind"] == "transfer").sum() == 24 * n
  full = r.timeline(layers=True)
  fwd = full[full["kind"] == "forward"]
  bwd = full[full["kind"] == "backward"]
  assert len(fwd) == len(bwd) == 24 * n
  np.testing.assert_allclose(fwd.groupby("step").apply(lambda g: (g.end - g.start).sum(),
                                                       include_groups=False), 0.1 / 3)
  np.testing.assert_allclose(bwd.groupby("step").apply(lambda g: (g.end - g.start).sum(),
                                                       include_groups=False), 0.2 / 3)
  idle = tl[tl["kind"] == "idle"]
  assert np.allclose((idle.end - idle.start).sum() + n * 0.1,
                     r.step_start[-1] + 0.1 - r.step_start[0])
  # Every transfer starts after it is ready and leaves the link in FIFO order.
  tr = r.transfers
  assert np.all(tr.start >= tr.ready) and np.all(np.diff(tr.end) > 0)
  s = sim.run_simulation("100B", "streaming", 5.0, overlap=1)
  assert len(s.transfers) == 36 * 5  # 36 fragments per period, 5 periods


def test_simulator_rejects_bad_input():
  with pytest.raises(ValueError, match=r"method must be one of \('dp', 'diloco', 'streaming'\)"):
    sim.run_simulation("1B", "fsdp", 1.0)
  with pytest.raises(ValueError, match="bandwidth_gbps must be > 0"):
    sim.run_simulation("1B", "dp", -1.0)
  with pytest.raises(ValueError, match=r"model must be one of \['1B', '10B', '100B'\]"):
    sim.run_simulation("2B", "dp", 1.0)
  with pytest.raises(ValueError, match=r"fragment_layers \(5\) must divide the number of layers"):
    sim.run_simulation("1B", "streaming", 1.0, fragment_layers=5)
  with pytest.raises(ValueError, match=r"overlap \(τ\) must be an integer with 0 <= τ < sync_every \(H=100\), got 100"):
    sim.run_simulation("1B", "streaming", 1.0, overlap=100)
  with pytest.raises(ValueError, match="sync_every must be an integer >= 1, got 0"):
    sim.run_simulation("1B", "diloco", 1.0, sync_every=0)
  with pytest.raises(ValueError, match="target must be strictly between 0 and 1"):
    sim.bandwidth_for_utilization(1.2, "1B", "dp")
  with pytest.raises(ValueError, match=r"rounding must be one of \('exact', 'grid'\)"):
    sim.bandwidth_for_utilization(0.5, "1B", "dp", rounding="up")
  with pytest.raises(ValueError, match="SimModel.layers must be an integer >= 1, got 0"):
    sim.SimModel(1e9, 0, 0.1)
