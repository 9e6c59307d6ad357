"""The event simulator against hand-derived closed forms, limits, monotonicity and the
properties of the Streaming DiLoCo paper's table (outer gradients reduced layer by layer
during the sending step's backward pass)."""

import math
import time

import numpy as np
import pytest

from analysis import bandwidth as bw
from analysis import simulate as sim
from diloco_core import Fragments

ONE_B = sim.SIM_MODELS["1B"]  # 1e9 params, 24 layers, 0.1 s
PHI = 1 / 3  # forward share of a step


def _bits(params, bits=16, replicas=2):
  return params * bits * 2 * (replicas - 1) / replicas


def _leave(t, layers, d):
  """Seconds from a step's start until a payload of every layer (per-layer chunks of d
  seconds, released as the backward pass finishes each layer) has left the link."""
  b = (1 - PHI) * t / layers
  return max(t + d, PHI * t + b + layers * d)


def _fragment_leave(t, layers, p, k, d, pattern="strided"):
  """The same for Streaming fragment k of P (n = L/P layers, chunks of d seconds).

  Strided: layers k, k+P, ...: chunks released at φT + (P-k)b, then every Pb, the last
  at T - kb. Sequential: layers kn .. kn+n-1, released b apart, the last at T - knb.
  FIFO from a free link: the payload leaves at max over chunks j of r_j + (n-j+1) d,
  linear in j, so at one of the two ends.
  """
  b, n = (1 - PHI) * t / layers, layers // p
  if pattern == "strided":
    return max(t - k * b + d, PHI * t + (p - k) * b + n * d)
  return max(t - k * n * b + d, t - (k * n + n - 1) * b + n * d)


# ---------------------------------------------------------------- closed forms agree


@pytest.mark.parametrize("h", [1, 10, 100])
@pytest.mark.parametrize("gbps", [0.5, 10.0, 300.0, 5000.0])
@pytest.mark.parametrize("latency", [0.0, 0.05])
def test_diloco_equals_closed_form(h, gbps, latency):
  # One sync per period, sent layer by layer during the sync step's backward pass:
  # stall = leave - T + eps, u = H T / (H T + stall). V = 1.6e10 bits, d = V / (L W).
  d = 1.6e10 / 24 / (gbps * 1e9)
  stall = _leave(0.1, 24, d) - 0.1 + latency
  u = sim.run_simulation("1B", "diloco", gbps, sync_every=h, latency=latency).utilization
  assert u == pytest.approx(h * 0.1 / (h * 0.1 + stall), rel=1e-9)


@pytest.mark.parametrize("gbps", [1.0, 20.0, 200.0, 2000.0, 1e5])
@pytest.mark.parametrize("latency", [0.0, 0.01])
def test_dp_equals_closed_form_and_diloco_with_h_1(gbps, latency):
  # Step = max(T + d, T/3 + 2T/(3L) + L d) + eps: the same accounting as DiLoCo's.
  d = _bits(1e9) / 24 / (gbps * 1e9)
  u = sim.run_simulation("1B", "dp", gbps, latency=latency).utilization
  assert u == pytest.approx(0.1 / (_leave(0.1, 24, d) + latency), rel=1e-9)
  assert u == pytest.approx(sim.utilization("1B", "diloco", gbps, sync_every=1,
                                            latency=latency), rel=1e-12)


def test_one_transfer_per_step_by_hand():
  # DiLoCo with H = 1, 4 replicas, 8-bit: V = 1e9 * 8 * 1.5 = 1.2e10 bits at 2 Gbit/s is
  # 6 s, 0.25 s per layer (> b): the link is busy from T/3 + T/36 to 6 s later.
  u = sim.run_simulation("1B", "diloco", 2.0, sync_every=1, replicas=4, bits=8).utilization
  assert u == pytest.approx(0.1 / (0.1 / 3 + 0.1 / 36 + 6.0), rel=1e-12)


@pytest.mark.parametrize("pattern", ["strided", "sequential"])
@pytest.mark.parametrize("tau", [0, 1, 3])
@pytest.mark.parametrize("gbps, eps", [(1.0, 0.0), (7.0, 0.02), (100.0, 0.3), (900.0, 0.0)])
def test_streaming_equals_closed_form(pattern, tau, gbps, eps):
  # P = 4 fragments of 6 layers, H = 100 (25 steps apart, more than tau + 1): fragments
  # never share the link, so each stalls max(0, leave_k + eps - (tau + 1) T) on its own.
  d = _bits(1e9) / 24 / (gbps * 1e9)
  stall = sum(max(0.0, _fragment_leave(0.1, 24, 4, k, d, pattern) + eps - (tau + 1) * 0.1)
              for k in range(4))
  u = sim.utilization("1B", "streaming", gbps, fragment_layers=6, overlap=tau, latency=eps,
                      fragment_pattern=pattern)
  assert u == pytest.approx(10.0 / (10.0 + stall), rel=1e-9)


def test_one_fragment_is_diloco_and_whole_step_buckets_are_blocking():
  for gbps in (0.3, 3.0, 30.0):
    a = sim.run_simulation("1B", "streaming", gbps, fragment_layers=24, overlap=2).utilization
    b = sim.run_simulation("1B", "diloco", gbps, overlap=2).utilization
    assert a == pytest.approx(b, rel=1e-12)
  # One bucket of every layer releases everything when the step ends: the blocking
  # accounting V / W + eps, under which Streaming without overlap costs what DiLoCo does.
  for gbps, eps in ((1.0, 0.0), (7.0, 0.02)):
    kw = dict(bucket_layers=24, latency=eps)
    blocking = 10.0 / (10.0 + 1.6e10 / (gbps * 1e9) + eps)
    assert sim.utilization("1B", "diloco", gbps, **kw) == pytest.approx(blocking, rel=1e-9)
    frag = sim.utilization("1B", "streaming", gbps, fragment_layers=6, **kw)
    assert frag == pytest.approx(10.0 / (10.0 + 1.6e10 / (gbps * 1e9) + 4 * eps), rel=1e-9)
  # Buckets of 3 layers release later than single layers, never earlier.
  g = sim.PAPER_GRID_GBPS
  assert np.all(sim.utilization("1B", "streaming", g, bucket_layers=3)
                <= sim.utilization("1B", "streaming", g) + 1e-12)


def test_hidden_bandwidth_is_where_utilization_reaches_one():
  # Streaming strided, P = 8 (3 layers), tau = 1: fragment 0 leaves at
  # max(T + d, T/3 + 8b + 3d), which must be <= 2T; the second term binds: d* below.
  t, b = 0.1, 0.2 / 3 / 24
  d_star = min(t, (2 * t - t / 3 - 8 * b) / 3)
  w = _bits(1e9) / 24 / d_star / 1e9
  assert sim.utilization("1B", "streaming", w, overlap=1) == pytest.approx(1.0, abs=1e-12)
  assert sim.utilization("1B", "streaming", 0.99 * w, overlap=1) < 1.0 - 1e-6
  assert sim.bandwidth_for_utilization(1 - 1e-9, "1B", "streaming", overlap=1) == pytest.approx(
      w, rel=1e-4)
  # With tau = 0 the last layer's chunk always waits: utilization < 1 at any finite W.
  assert sim.utilization("1B", "streaming", 1e6) < 1.0


def test_exact_table_by_hand():
  exact = sim.paper_table(rounding="exact", models=("1B",), targets=(0.5,))
  # DP at 50%: step 0.2 s = T/3 + T/36 + 24 d.
  d_total = 0.2 - 0.1 / 3 - 0.1 / 36
  assert exact.loc[("1B", "DP"), "50%"] == pytest.approx(1.6e10 / d_total / 1e9, rel=1e-5)
  # DiLoCo at 50%: stall = H T = 10 s = V / W - (2T/3)(23/24).
  w = 1.6e10 / (10.0 + 0.2 / 3 * 23 / 24) / 1e9
  assert exact.loc[("1B", "DiLoCo"), "50%"] == pytest.approx(w, rel=1e-5)


# ------------------------------------------------- the closed forms of analysis.planning.roofline

GBIT = 1e9 / 8  # bytes/s per Gbit/s


@pytest.mark.parametrize("name", list(sim.SIM_MODELS))
def test_closed_form_is_exact_for_one_payload_per_period(name):
  # DP (s = 1) and DiLoCo (s = H, any tau) with one chunk per layer: equal at every
  # bandwidth, with latency too; and the required bandwidth equals the bisection.
  m = sim.SIM_MODELS[name]
  v = bw.payload_bytes(m.params, 16, replicas=2)
  g = np.logspace(-1, 4, 30)
  for method, h, tau, eps in (("dp", 1, 0, 0.0), ("dp", 1, 0, 0.01), ("diloco", 100, 0, 0.0),
                              ("diloco", 100, 0, 0.2), ("diloco", 100, 3, 0.0)):
    kw = dict(overlap=tau, chunks=m.layers)
    closed = bw.utilization_overlapped(g * GBIT, v, m.step_time, h, eps, **kw)
    simulated = sim.utilization(name, method, g, latency=eps, **(
        dict(overlap=tau) if method == "diloco" else {}))
    np.testing.assert_allclose(simulated, closed, rtol=1e-9)
    if tau == 0:
      targets = np.array(sim.PAPER_TARGETS)
      np.testing.assert_allclose(
          sim.bandwidth_for_utilization(targets, name, method, latency=eps),
          bw.required_bandwidth(targets, v, m.step_time, h, eps, **kw) / GBIT, rtol=1e-5)


@pytest.mark.parametrize("name", list(sim.SIM_MODELS))
@pytest.mark.parametrize("tau", [1, 2, 3])
def test_hidden_bandwidth_is_exact_at_utilization_one(name, tau):
  # DiLoCo: one payload of L chunks. Streaming: strided fragments of 3 layers, exact when
  # tau + 1 <= floor(H / P) (no two fragments on the link at once), a lower bound else.
  m = sim.SIM_MODELS[name]
  v, p = bw.payload_bytes(m.params, 16, replicas=2), m.layers // 3
  w = bw.hidden_bandwidth(v, m.step_time, tau, chunks=m.layers) / GBIT
  assert sim.utilization(name, "diloco", w, overlap=tau) == pytest.approx(1.0, abs=1e-12)
  assert sim.utilization(name, "diloco", 0.999 * w, overlap=tau) < 1.0
  ws = bw.hidden_bandwidth(v / p, m.step_time, tau, 100 / p, chunks=3) / GBIT
  if tau + 1 <= 100 // p:
    assert sim.utilization(name, "streaming", ws, overlap=tau) == pytest.approx(1.0, abs=1e-12)
  assert sim.utilization(name, "streaming", 0.999 * ws, overlap=tau) < 1.0


@pytest.mark.parametrize("name", list(sim.SIM_MODELS))
@pytest.mark.parametrize("tau", [0, 1])
def test_streaming_bounded_by_closed_forms(name, tau):
  # Per fragment (V/P every H/P steps): continuous release bounds the simulated
  # utilization from above, the fragment holding layer 0 (L/P chunks) from below.
  m = sim.SIM_MODELS[name]
  p = m.layers // 3
  v = bw.payload_bytes(m.params, 16, replicas=2) / p
  g = sim.PAPER_GRID_GBPS
  kw = dict(overlap=tau)
  u = sim.utilization(name, "streaming", g, **kw)
  upper = bw.utilization_overlapped(g * GBIT, v, m.step_time, 100 / p, **kw)
  lower = bw.utilization_overlapped(g * GBIT, v, m.step_time, 100 / p, chunks=3, **kw)
  assert np.all(lower <= u + 1e-12) and np.all(u <= upper + 1e-12)
  assert np.any(lower < u - 1e-4) and np.any(u < upper - 1e-4)  # strict somewhere
  targets = np.array(sim.PAPER_TARGETS)
  exact = sim.bandwidth_for_utilization(targets, name, "streaming", **kw)
  lo = bw.required_bandwidth(targets, v, m.step_time, 100 / p, **kw) / GBIT
  hi = bw.required_bandwidth(targets, v, m.step_time, 100 / p, chunks=3, **kw) / GBIT
  assert np.all(lo <= exact * (1 + 1e-5)) and np.all(exact <= hi * (1 + 1e-5))


# ---------------------------------------------------------------------------- limits


@pytest.mark.parametrize("method", ["dp", "diloco", "streaming"])
def test_infinite_bandwidth_and_single_replica_give_full_utilization(method):
  for name in sim.SIM_MODELS:
    assert sim.run_simulation(name, method, math.inf).utilization == pytest.approx(1.0, abs=1e-12)
    assert sim.run_simulation(name, method, 0.01, replicas=1).utilization == pytest.approx(
        1.0, abs=1e-12)


@pytest.mark.parametrize("name", list(sim.SIM_MODELS))
def test_utilization_limits_in_bandwidth(name):
  # -> 1 as W -> inf and -> 0 as W -> 0, for every row of the paper's table.
  for _, method, tau, bits in sim.PAPER_ROWS:
    hi, lo = sim.utilization(name, method, [1e7, 1e-7], overlap=tau, bits=bits)
    assert hi > 1 - 1e-6 and lo < 1e-6


def test_latency_caps_utilization():
  # DP at infinite bandwidth still waits eps after its last layer: T / (T + eps).
  u = sim.run_simulation("1B", "dp", math.inf, latency=0.1).utilization
  assert u == pytest.approx(0.5)
  assert sim.bandwidth_for_utilization(0.6, "1B", "dp", latency=0.1) == math.inf


def test_steady_state_reached():
  for name in sim.SIM_MODELS:
    for _, method, tau, bits in sim.PAPER_ROWS:
      g = np.array([0.3, 3.0, 30.0, 300.0])
      a = sim.utilization(name, method, g, overlap=tau, bits=bits)
      b = sim.utilization(name, method, g, overlap=tau, bits=bits, warmup_periods=5, periods=8)
      np.testing.assert_allclose(a, b, rtol=1e-9)


def test_vectorized_utilization_equals_one_run_at_a_time():
  g = np.array([0.5, 5.0, 50.0])
  for _, method, tau, bits in sim.PAPER_ROWS:
    kw = dict(overlap=tau, bits=bits, latency=0.01)
    one = [sim.run_simulation("10B", method, w, **kw).utilization for w in g]
    np.testing.assert_allclose(sim.utilization("10B", method, g, **kw), one, rtol=1e-12)


# ---------------------------------------------------------------------- monotonicity


@pytest.mark.parametrize("name", list(sim.SIM_MODELS))
def test_utilization_increases_with_bandwidth(name):
  grid = np.logspace(-2, 4, 200)
  for _, method, tau, bits in sim.PAPER_ROWS:
    us = sim.utilization(name, method, grid, overlap=tau, bits=bits)
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


def test_strided_never_below_sequential():
  # The paper's Figure 7: the strided pattern utilizes compute at least as well.
  g = sim.PAPER_GRID_GBPS
  for name in sim.SIM_MODELS:
    for tau in (0, 1):
      strided = sim.utilization(name, "streaming", g, overlap=tau)
      seq = sim.utilization(name, "streaming", g, overlap=tau, fragment_pattern="sequential")
      assert np.all(strided >= seq - 1e-12) and np.any(strided > seq + 1e-3)


def test_fragments_follow_the_trainer():
  for pattern in ("strided", "sequential"):
    frags = sim.fragment_layers_of(24, 3, pattern)
    trainer = Fragments([False, True], [(5,), (24, 2)], fragments=9, pattern=pattern)
    assert frags == [trainer.layers_of(p) for p in range(1, 9)]
    assert sorted(sum(frags, [])) == list(range(24))
  assert sim.fragment_layers_of(6, 3) == [[0, 2, 4], [1, 3, 5]]


# ------------------------------------------------------------------- the paper table


@pytest.mark.parametrize("name", list(sim.SIM_MODELS))
def test_paper_properties_at_99_percent(name):
  bw = lambda method, **kw: sim.bandwidth_for_utilization(0.99, name, method, **kw)  # noqa: E731
  diloco, dp = bw("diloco"), bw("dp")
  s0, s1, s1_4 = bw("streaming"), bw("streaming", overlap=1), bw("streaming", overlap=1, bits=4)
  assert s0 <= diloco / 2  # streaming hides each fragment behind its own backward pass
  assert s1 < s0  # overlap adds a whole step to the window
  assert s1_4 <= s1 / 3  # 4-bit payloads
  assert dp > diloco
  targets = list(sim.PAPER_TARGETS)
  assert np.all(sim.bandwidth_for_utilization(targets, name, "dp")
                > sim.bandwidth_for_utilization(targets, name, "diloco"))


def test_paper_table_shape_order_speed_and_ordering():
  t0 = time.perf_counter()
  table = sim.paper_table()  # 3 models x 5 rows x 50 grid points = 750 simulations
  elapsed = time.perf_counter() - t0
  assert elapsed < 2.0
  assert table.shape == (15, 5)
  assert list(table.columns) == ["50%", "80%", "90%", "95%", "99%"]
  assert list(table.index.get_level_values("model").unique()) == ["1B", "10B", "100B"]
  labels = [r[0] for r in sim.PAPER_ROWS]
  for name in ("1B", "10B", "100B"):
    block = table.loc[name].loc[labels].to_numpy()
    assert np.all(np.diff(block, axis=1) >= 0)  # rows increase with the target
    assert np.all(block[0] == block.max(axis=0))  # DP needs the most
    assert np.all(block[-1] == block.min(axis=0))  # overlap + 4-bit the least
    assert np.all(block[3] <= block[2]) and np.all(block[2] <= block[1])
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
  # Every chunk starts after it is ready, leaves the link in FIFO order, and is ready
  # when its layer's backward pass ends.
  tr = r.transfers
  assert np.all(tr.start >= tr.ready) and np.all(np.diff(tr.end) > 0)
  ends = np.sort(bwd["end"].to_numpy())
  assert np.allclose(np.sort(tr.ready.to_numpy()), ends)
  s = sim.run_simulation("100B", "streaming", 5.0, overlap=1)
  assert len(s.transfers) == 36 * 3 * 5  # 36 fragments of 3 layers per period, 5 periods
  assert sorted(s.transfers["fragment"].unique()) == list(range(36))
  # Each arrives before the step it is needed by starts.
  start_of = dict(zip(range(1, len(s.step_start) + 1), s.step_start))
  due = s.transfers[s.transfers.needed_by <= len(s.step_start)]
  assert np.all(due.arrival <= due.needed_by.map(start_of) + 1e-9)


def test_simulator_rejects_bad_input():
  with pytest.raises(ValueError, match=r"method must be one of \('dp', 'diloco', 'streaming'\)"):
    sim.run_simulation("1B", "fsdp", 1.0)
  with pytest.raises(ValueError, match="bandwidth_gbps must be > 0"):
    sim.run_simulation("1B", "dp", -1.0)
  with pytest.raises(ValueError, match=r"model must be one of \['1B', '10B', '100B'\]"):
    sim.run_simulation("2B", "dp", 1.0)
  with pytest.raises(ValueError, match=r"fragment_layers \(5\) must divide the number of layers"):
    sim.run_simulation("1B", "streaming", 1.0, fragment_layers=5)
  with pytest.raises(ValueError, match=r"fragment_pattern must be one of \('strided', 'seq"):
    sim.run_simulation("1B", "streaming", 1.0, fragment_pattern="random")
  with pytest.raises(ValueError, match=r"bucket_layers \(5\) must divide the number of layers"):
    sim.run_simulation("1B", "dp", 1.0, bucket_layers=5)
  with pytest.raises(ValueError, match=r"overlap \(τ\) must be an integer with 0 <= τ < "
                                       r"sync_every \(H=100\), got 100"):
    sim.run_simulation("1B", "streaming", 1.0, overlap=100)
  with pytest.raises(ValueError, match="sync_every must be an integer >= 1, got 0"):
    sim.run_simulation("1B", "diloco", 1.0, sync_every=0)
  with pytest.raises(ValueError, match="target must be strictly between 0 and 1"):
    sim.bandwidth_for_utilization(1.2, "1B", "dp")
  with pytest.raises(ValueError, match=r"rounding must be one of \('exact', 'grid', 'paper'\)"):
    sim.bandwidth_for_utilization(0.5, "1B", "dp", rounding="up")
  with pytest.raises(ValueError, match="SimModel.layers must be an integer >= 1, got 0"):
    sim.SimModel(1e9, 0, 0.1)


def test_plot_hiding_marks_where_each_payload_is_needed():
  from analysis import plots
  runs = {"DiLoCo": sim.run_simulation("1B", "diloco", 20.0),
          "Streaming, τ=1": sim.run_simulation("1B", "streaming", 20.0, overlap=1)}
  fig = plots.plot_hiding(runs)
  assert [ax.get_title(loc="left") for ax in fig.axes] == list(runs)
  needed = [next(l for l in ax.get_lines() if l.get_linestyle() == "--").get_xdata()[0]
            for ax in fig.axes]
  # DiLoCo: the next step starts when the payload has left, T/3 + T/36 + 24 d after the
  # sync step starts (d = 1.6e10 / 24 / 2e10 s); tau = 1 and nothing waits: 2 T.
  assert needed[0] == pytest.approx(0.1 / 3 + 0.1 / 36 + 0.8)
  assert needed[1] == pytest.approx(0.2)


# ------------------------------------------------------------ whole outer step overlapped (eager)

@pytest.mark.parametrize("method, kw", [("diloco", {}), ("streaming", {"fragment_layers": 3})])
@pytest.mark.parametrize("name", ["1B", "10B"])
def test_eager_needs_less_bandwidth_than_none_at_every_target(method, kw, name):
  targets = list(sim.PAPER_TARGETS)
  none = sim.bandwidth_for_utilization(targets, name, method, **kw)
  for mode in ("eager", "delayed"):  # the two communicate alike
    eager = sim.bandwidth_for_utilization(targets, name, method, outer_overlap=mode, **kw)
    assert np.all(eager < none)
  # Never less than the link must carry in steady state: u V over one period (H T).
  v = sim.get_sim_model(name).params * 16 * 2 * (2 - 1) / 2
  assert np.all(eager >= np.array(targets) * v / (100 * sim.get_sim_model(name).step_time) / 1e9 * (1 - 1e-6))


@pytest.mark.parametrize("method", ["diloco", "streaming"])
def test_eager_utilization_is_monotone_in_bandwidth(method):
  w = np.geomspace(0.05, 100, 60)
  u = sim.utilization("1B", method, w, outer_overlap="eager")
  assert np.all(np.diff(u) >= -1e-12) and u[-1] == pytest.approx(1.0) and u[0] < 0.5


def test_a_link_slower_than_the_payload_rate_is_throughput_bound_by_hand():
  # 1.6e10 bits per period of 100 x 0.1 s: at 1 Gbit/s a period's payload takes 16 s on the
  # link, however late it may arrive (bound: u <= 10 / 16). In steady state the step t + H
  # waits for it, and the link then idles until the next payload's first chunk is released:
  # the forward pass (T/3) and the last layer's backward ((2T/3) / 24).
  period, plan = sim.schedule("diloco", sim.get_sim_model("1B"), replicas=2, sync_every=100, fragment_layers=3,
                              fragment_pattern="strided", overlap=0, bits=16, bucket_layers=1,
                              forward_fraction=1 / 3, outer_overlap="eager")
  bound = sim.throughput_bound(period, plan, 0.1, 1e9)
  assert bound == pytest.approx(10 / 16, rel=1e-12)
  steady = 10 / (16 + 0.1 / 3 + 0.2 / 3 / 24)
  assert sim.utilization("1B", "diloco", 1.0, outer_overlap="eager") == pytest.approx(steady, rel=1e-12)
  assert sim.run_simulation("1B", "diloco", 1.0, outer_overlap="eager").utilization == pytest.approx(steady, rel=1e-12)
  assert sim.throughput_bound(100, {}, 0.1, 1e9) == np.inf


@pytest.mark.parametrize("name, h", [("1B", 30), ("10B", 30), ("1B", 100), ("100B", 100)])
def test_eager_steady_state_reached(name, h):
  """A window of 3 periods after 2 reads what 10 after 10 read (the throughput bound)."""
  g = np.geomspace(0.1, 10, 25)
  kw = dict(bits=4, outer_overlap="eager", sync_every=h)
  a = sim.utilization(name, "streaming", g, **kw)
  b = sim.utilization(name, "streaming", g, warmup_periods=10, periods=10, **kw)
  np.testing.assert_allclose(a, b, rtol=1e-9)


def test_eager_transfer_may_take_the_whole_period_by_hand():
  # 1.6e10 bits: at 1.6e10 / 9.9 s they leave the link before step t + H starts (no wait);
  # with τ = 0 the same link stalls every period.
  w = 1.6e10 / 9.9 / 1e9
  assert sim.run_simulation("1B", "diloco", w, outer_overlap="eager").utilization == 1.0
  assert sim.run_simulation("1B", "diloco", w).utilization < 0.6
  r = sim.run_simulation("1B", "diloco", w, outer_overlap="eager")
  assert set(r.transfers["needed_by"] - r.transfers["step"]) == {100}


def test_paper_table_eager_rows_keep_the_five_rows():
  plain = sim.paper_table(models=("1B",), targets=(0.5, 0.95))
  both = sim.paper_table(models=("1B",), targets=(0.5, 0.95), eager=True)
  assert both.shape == (7, 2) and both.iloc[:5].equals(plain)
  assert list(both.index.get_level_values("method")[5:]) == [r[0] for r in sim.EAGER_ROWS]
  assert np.all(both.loc[("1B", "DiLoCo + eager")] < both.loc[("1B", "DiLoCo")])


@pytest.mark.parametrize("kw, match", [
    (dict(method="dp", outer_overlap="eager"), r"outer_overlap='eager' applies to 'diloco' and 'streaming', not 'dp'"),
    (dict(method="diloco", outer_overlap="eager", overlap=1), r"needs overlap \(τ\) = 0, got τ=1"),
    (dict(method="diloco", outer_overlap="later"), r"outer_overlap must be one of"),
])
def test_eager_bad_options(kw, match):
  with pytest.raises(ValueError, match=match):
    sim.run_simulation("1B", bandwidth_gbps=10.0, **kw)


# ---- the papers' own tables beside ours (analysis.planning.paper_tables) ---------------------------------
def test_paper_tables_hold_the_published_cells_and_their_identities():
  from analysis import paper_tables as pt
  t4, t5 = pt.reference(4), pt.reference(5)
  assert t4.shape == (15, 5) and t5.shape == (18, 5) and t4.notna().all().all() and t5.notna().all().all()
  assert t4.loc[("1B", "DP")].tolist() == [86.8, 152.6, 184.2, 222.3, 569.0]  # as printed
  assert t4.loc[("100B", "Streaming + overlap + 4-bit")].tolist() == [0.5, 0.9, 1.1, 1.1, 1.4]
  # Table 5 repeats Table 4's DP and Streaming rows, and its 1-inner-step H = 100 row is Table 4's FP4 row.
  for model in ("1B", "10B", "100B"):
    for ours in ("DP", "Streaming"):
      assert t5.loc[(model, ours)].tolist() == t4.loc[(model, ours)].tolist()
    assert (t5.loc[(model, "Streaming + overlap + 4-bit, H = 100")].tolist()
            == t4.loc[(model, "Streaming + overlap + 4-bit")].tolist())
  # Every printed value is a grid point printed with one decimal (to within 0.055 of it, well
  # inside half a grid step: the nearest point is unambiguous).
  for t in (t4, t5):
    v = t.to_numpy()
    g = sim.PAPER_GRID_GBPS[pt.grid_index(v)]
    assert np.all(np.abs(g - v) <= 0.055) and np.all(np.abs(np.log(g / v)) < 0.5 * np.log(1.207))
  with pytest.raises(ValueError, match=r"^table must be one of \[4, 5\], got 6.$"):
    pt.reference(6)


def test_every_table_5_cell_more_than_one_step_away_is_one_the_roofline_page_explains():
  """The page's three explanations cover every cell of Table 5 that differs by more than one
  grid step: the paper below the link's throughput floor even one step up (eager rows), the
  1-inner-step rows at H = 30, and the 1B eager row at H = 30 (the paper above the floor)."""
  from analysis import paper_tables as pt
  ref, ours = pt.reference(5), pt.simulated(5, "paper")
  steps, floor = pt.grid_steps(ours, ref), pt.throughput_floor(5)
  up = sim.PAPER_GRID_GBPS[1] / sim.PAPER_GRID_GBPS[0]
  seen = set()
  for (model, method, col), d in steps.stack().items():
    if np.isnan(d) or abs(d) <= 1:  # NaN: a row this simulator cannot express (named on the page)
      continue
    paper, need = ref.loc[(model, method), col], floor.loc[(model, method), col]
    if paper * up < need:
      seen.add("below the floor")
    elif method == "Streaming + overlap + 4-bit, H = 30":
      seen.add("1-inner-step, H = 30")
    else:
      assert (model, method) == ("1B", "Streaming + eager + 4-bit, H = 30"), (model, method, col, d)
      assert paper > need  # the paper above the floor
      seen.add("1B eager, H = 30")
  assert seen == {"below the floor", "1-inner-step, H = 30", "1B eager, H = 30"}, seen


def test_the_papers_reading_of_its_grid_reproduces_table_4():
  from analysis import paper_tables as pt
  ref = pt.reference(4)
  paper, grid = pt.simulated(4, "paper"), pt.simulated(4, "grid")
  s = pt.summary(pt.grid_steps(paper, ref))
  assert s["cells"] == 75 and s["equal"] >= 60 and s["within_one"] == 75, s
  assert pt.summary(pt.grid_steps(grid, ref))["equal"] < 20  # today's reading: one step above
  # "paper" is exactly one grid point below "grid" (or the lowest point), and brackets the exact value.
  gi, pi = pt.grid_index(grid.to_numpy()), pt.grid_index(paper.to_numpy())
  assert np.all(pi == np.maximum(gi - 1, 0))
  exact = pt.simulated(4, "exact").to_numpy()
  assert np.all(paper.to_numpy() <= exact) and np.all(exact <= grid.to_numpy())


def test_table_5_rows_and_the_throughput_floor_by_hand():
  from analysis import paper_tables as pt
  skip = pt.unexpressible(5)
  assert sorted(skip) == [("100B", "Streaming + eager + 4-bit, H = 30"), ("100B", "Streaming + overlap + 4-bit, H = 30")]
  ours = pt.simulated(5, "paper")
  assert ours.loc[list(skip)].isna().all().all() and ours.drop(list(skip)).notna().all().all()
  s = pt.summary(pt.grid_steps(ours, pt.reference(5)))
  assert s["cells"] + s["unexpressible"] == 90 and s["unexpressible"] == 10
  floor = pt.throughput_floor(5)
  # 1B, 4-bit, M = 2 (factor 1), H = 100, T = 0.1 s: 4e9 bits per 10 s of compute, at u = 0.99.
  assert floor.loc[("1B", "Streaming + eager + 4-bit, H = 100"), "99%"] == pytest.approx(4e9 * 0.99 / 10 / 1e9)
  assert floor.loc[("1B", "DP")].isna().all()


def test_side_by_side_colors_cells_by_their_grid_steps():
  import pandas as pd
  from analysis.plots import STEP_COLORS, side_by_side
  idx = pd.MultiIndex.from_tuples([("1B", "DP")], names=["model", "method"])
  frame = lambda v: pd.DataFrame([v], index=idx, columns=["50%", "80%", "90%", "95%"])
  html = side_by_side(frame([1.4, 1.4, 1.4, 1.4]), frame([1.4, 1.7, 3.0, np.nan]),
                      frame([0, 1, 4, np.nan]), "c").to_html()
  for key, text in (("equal", "1.4 / 1.4 (0)"), ("one", "1.4 / 1.7 (+1)"), ("worse", "1.4 / 3 (+4)"),
                    ("none", "1.4 / n/a")):
    assert text in html and STEP_COLORS[key] in html


def test_parity_with_the_public_calculator_where_the_models_coincide():
  """The first author's calculator (its own JavaScript run under Node when the fixture was
  written, tests/fixtures/calculator_parity.js) against ours set to its choices: 128 equal
  buckets over the backward pass (a SimModel of 128 "layers"), strided fragments, its ring
  factor 2(1 - 1/M) (the same as ours). Within 1% (the rest: its 2,000 simulated steps from a
  cold start against our steady state)."""
  import json
  import os
  path = os.path.join(os.path.dirname(__file__), "fixtures", "calculator_parity.json")
  fixture = json.load(open(path))
  assert len(fixture["commit"]) == 40 and fixture["constants"]["K_buckets"] == 128
  from analysis.planning.paper_tables import calculator_settings
  for run in fixture["runs"]:
    m, kw = calculator_settings(run, fixture["constants"])
    ours = 100 * sim.utilization(m, run["method"], fixture["bandwidths_gbps"], **kw)
    np.testing.assert_allclose(ours, run["utilization_percent"], rtol=0.01, err_msg=run["name"])


def test_h30_search_tries_the_stated_setting_and_finds_none_within_one_step():
  from analysis import paper_tables as pt
  df = pt.h30_search(5)
  stated = df[df["stated"]]
  assert len(stated) == 2 and (stated["cells within one step"] < 5).all()
  assert len(df) == 2 * len(pt.H30_BITS) * len(pt.H30_OVERLAPS)
