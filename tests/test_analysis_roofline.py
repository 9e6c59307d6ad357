"""Closed forms of analysis.planning.hardware / models / roofline against hand-computed numbers."""

import dataclasses
import math

import numpy as np
import pytest

from analysis import bandwidth as bw
from analysis import hardware
from analysis import memory
from analysis import models
from analysis import roofline as rl
from diloco_core.spec.footprint import check_fits
from diloco_core.spec.footprint import replica_state_bytes
from diloco_core.spec.model_config import ModelConfig
from diloco_core.spec.model_config import param_count

TINY = ModelConfig(vocab_size=10, d_model=8, n_layers=2, n_heads=2, d_ff=16)  # N = 1480
HW = {name: hardware.get_hardware(name) for name in ("v5e", "v5p", "h100")}
V5P = HW["v5p"]


# ------------------------------------------------------------------------- catalogs


def test_every_hardware_entry_is_valid_and_resolvable():
  for key, spec in hardware.HARDWARE.items():
    assert hardware.get_hardware(key) is spec
    assert hardware.get_hardware(key.upper()) is spec
    assert spec.dcn_bandwidth == spec.dcn_bandwidth_per_host / spec.chips_per_host
  assert hardware.get_hardware("ironwood") is hardware.HARDWARE["tpu7x"]
  custom = dataclasses.replace(hardware.HARDWARE["v5p"], peak_flops=1.0)
  assert hardware.get_hardware(custom) is custom


def test_hardware_rejects_bad_values():
  with pytest.raises(ValueError, match=r"hardware must be one of \[.*'v5p'.*\], got 'v9'"):
    hardware.get_hardware("v9")
  with pytest.raises(ValueError, match="HardwareSpec.peak_flops must be a positive number"):
    dataclasses.replace(hardware.HARDWARE["v5p"], peak_flops=-1.0)
  with pytest.raises(ValueError, match="HardwareSpec.chips_per_host must be a positive integer"):
    dataclasses.replace(hardware.HARDWARE["v5p"], chips_per_host=0)


def test_open_model_counts_by_hand():
  # Llama-3-8B: 2 * 128256 * 4096 (embeddings, untied) + 32 * (attention 4096 * 48 * 128
  # + 32 * 128 * 4096, SwiGLU 3 * 4096 * 14336, norms 2 * 4096) + final norm 4096.
  layer = 4096 * 48 * 128 + 32 * 128 * 4096 + 3 * 4096 * 14336 + 2 * 4096
  assert layer == 218_112_000
  assert models.model_stats("8B").total_params == 2 * 128256 * 4096 + 32 * layer + 4096
  # Qwen3-30B-A3B: attention 2048 * 40 * 128 + 32 * 128 * 2048, 128 experts of
  # 3 * 2048 * 768, router 2048 * 128, norms; 8 experts active.
  attn, expert, router = 2048 * 40 * 128 + 32 * 128 * 2048, 3 * 2048 * 768, 2048 * 128
  emb = 2 * 151936 * 2048 + 2048
  s = models.model_stats("qwen3-30b-a3b")
  assert s.total_params == emb + 48 * (attn + 128 * expert + router + 4096) == 30_532_110_336
  assert s.active_params == emb + 48 * (attn + 8 * expert + router + 4096) == 3_353_020_416


def test_paper_sizes_land_near_their_names():
  for name in ("35M", "100M", "180M", "330M", "550M", "1.3B", "2.4B", "4B", "10B", "100B"):
    nominal = float(name[:-1]) * (1e6 if name.endswith("M") else 1e9)
    assert abs(param_count(models.MODELS[name]) / nominal - 1) < 0.035, name
  table = models.model_table()
  assert list(table.index) == list(models.MODELS)
  assert (table["active_params"] <= table["total_params"]).all()


def test_get_model_errors_and_aliases():
  assert models.get_model("70B") is models.MODELS["llama3-70b"]
  assert models.get_model("llama3-8B") is models.MODELS["llama3-8b"]
  with pytest.raises(ValueError, match=r"model must be one of \[.*'llama3-8b'.*\], got '9B'"):
    models.get_model("9B")
  with pytest.raises(ValueError, match="seq_len must be an integer >= 1, got 0"):
    models.model_stats("8B", 0)


def test_fragment_sizes_follow_spec():
  assert models.fragment_sizes(TINY, 1) == [1480]
  assert models.fragment_sizes(TINY, 2) == [168, 1312]
  assert models.fragment_sizes(TINY, 3) == [168, 656, 656]
  with pytest.raises(ValueError, match=r"fragments \(P=4\): P - 1 must divide the number of layers"
                                       r" \(L=32\); allowed P for this model: \[1, 2, 3, 5, 9, 17, 33\]"):
    models.fragment_sizes("8B", 4)


# --------------------------------------------------------------- primitive rooflines


def test_primitives_by_hand():
  assert rl.t_math(6e12, 2e12) == 3.0
  assert bw.t_comm(16e9, 1.25e9) == 12.8
  assert rl.arithmetic_intensity(100.0, 4.0) == 25.0
  assert rl.critical_intensity(1.97e14, 8.1e11) == pytest.approx(243.20987654, rel=1e-9)
  np.testing.assert_allclose(bw.allreduce_factor([1, 2, 4, 8]), [0.0, 1.0, 1.5, 1.75])
  assert bw.payload_bytes(1e9, 16, replicas=2) == 2e9
  assert bw.payload_bytes(1e9, 4, replicas=2) == 5e8
  assert bw.payload_bytes(1e9, 16) == 4e9  # many-replica limit a = 2
  np.testing.assert_allclose(bw.t_comm([1.0, 2.0], 2.0), [0.5, 1.0])  # vectorised


def test_primitives_reject_bad_input():
  with pytest.raises(ValueError, match="bytes_per_s must be > 0"):
    bw.t_comm(1.0, -5.0)
  with pytest.raises(ValueError, match="replicas must be a positive integer"):
    bw.allreduce_factor(1.5)
  with pytest.raises(ValueError, match="target must be strictly between 0 and 1"):
    bw.required_bandwidth(1.5, 1.0, 1.0)
  with pytest.raises(ValueError, match="target must be strictly between 0 and 1"):
    bw.required_bandwidth(0.0, 1.0, 1.0)


def test_primitives_take_resolved_hardware_and_models():
  # Names are resolved once, by the entry points; the closed forms refuse them.
  with pytest.raises(ValueError, match=r"hardware must be a HardwareSpec \(analysis.get_hardware"
                                       r" resolves a catalog name\), got 'v5p'."):
    rl.dp_critical_batch_per_slice("v5p")
  with pytest.raises(ValueError, match=r"model must be a ModelConfig \(analysis.get_model "
                                       r"resolves a catalog name\), got '8B'."):
    rl.dp_critical_batch_per_slice(V5P, model="8B")


# ------------------------------------------------------------- scaling-book numbers


def test_scaling_book_numbers():
  # v5e against HBM: 1.97e14 / 8.1e11 = 243 FLOPs/byte ("~240").
  hw = HW["v5e"]
  assert round(rl.critical_intensity(hw.peak_flops, hw.hbm_bandwidth)) == 243
  # DP over v5p ICI: C / W = 4.59e14 / (2 * 9e10) = 2,550 tokens per chip; 850 on 3 axes.
  assert rl.dp_critical_batch_per_chip(V5P) == pytest.approx(2550.0, rel=1e-12)
  assert rl.dp_critical_batch_per_chip(V5P, axes=3) == pytest.approx(850.0, rel=1e-12)
  # DP over DCN: 4.59e14 / 6.25e9 = 73,440 tokens per slice (book: 3.8e18 / 5e13 ~ 76,000).
  assert rl.dp_critical_batch_per_slice(V5P) == pytest.approx(73440.0, rel=1e-12)


def test_dp_critical_batch_knobs_by_hand():
  cb = rl.dp_critical_batch_per_slice
  assert cb(HW["v5e"]) == pytest.approx(1.97e14 / 3.125e9)  # 63,040
  assert cb(HW["h100"]) == pytest.approx(19780.0)  # 9.89e14 / 5e10
  assert cb(V5P, replicas=2) == pytest.approx(36720.0)  # a = 1 instead of 2
  assert cb(V5P, replicas=8) == pytest.approx(73440.0 * 7 / 8)
  assert cb(V5P, bits=32) == pytest.approx(146880.0)  # fp32 gradients
  assert cb(V5P, bits=4) == pytest.approx(18360.0)
  assert cb(V5P, compute_fraction=1.0) == pytest.approx(73440.0 * 2 / 3)
  # A model: N_total / (F_token / 6) = 1480 / (8928 / 6) for TINY at T = 4.
  assert cb(V5P, model=TINY, seq_len=4) == pytest.approx(73440.0 * 1480 / 1488)
  # MoE: more bytes per FLOP than the dense idealisation.
  assert cb(V5P, model=models.get_model("qwen3-30b-a3b")) > 6 * cb(V5P)
  with pytest.raises(ValueError, match=r"compute_fraction must be a finite number in \(0, 1\]"):
    cb(V5P, compute_fraction=0.0)


def test_diloco_and_streaming_critical_batches():
  assert rl.diloco_critical_batch_per_slice(V5P, 100) == pytest.approx(734.4)
  assert rl.diloco_critical_batch_per_slice(V5P, 1) == pytest.approx(73440.0)
  s = rl.streaming_critical_batch_per_slice
  # Each fragment hides behind its own step's backward pass (2/3 of a step) and tau
  # steps: 1 + tau / (2/3) backward passes, 2.5 for tau = 1; P = 8: 73440 / 20.
  assert s(V5P, 96, 8, overlap=1) == pytest.approx(73440.0 / 20)
  assert s(V5P, 100, 1, overlap=0) == pytest.approx(73440.0)  # vanilla DiLoCo's peak
  assert s(V5P, 100, 50, overlap=5) == pytest.approx(734.4)  # capped by H: DiLoCo's
  assert rl.streaming_window_steps(96, 8, 1) == 2.5
  assert rl.streaming_window_steps(96, 8, 1, compute_fraction=1.0) == 2.0
  assert rl.streaming_window_steps(100, 50, 5) == 2.0
  # Monotone: more overlap and more fragments lower the peak threshold; more H too.
  values = [s(V5P, 100, 4, overlap=t) for t in range(0, 30)]
  assert all(a >= b for a, b in zip(values, values[1:]))
  hs = [rl.diloco_critical_batch_per_slice(V5P, h) for h in (1, 10, 100, 1000)]
  assert all(a > b for a, b in zip(hs, hs[1:]))
  with pytest.raises(ValueError, match=r"sync_every \(H\) must be an integer >= 1, got 0"):
    rl.diloco_critical_batch_per_slice(V5P, 0)
  with pytest.raises(ValueError, match=r"sync_every \(H=100\) must be a multiple of fragments "
                                       r"\(P=200\)"):
    s(V5P, 100, 200)
  with pytest.raises(ValueError, match=r"overlap \(τ\) must be an integer with 0 <= τ < "
                                       r"sync_every \(H=100\), got 100"):
    s(V5P, 100, 4, overlap=100)


def test_schedule_rules_are_the_trainers():
  # H = 10, P = 3 is refused as the trainer refuses it (diloco_core.spec.validity), not rounded.
  msg = (r"sync_every \(H=10\) must be a multiple of fragments \(P=3\): choose H in \{9, 12, "
         r"\.\.\.\} or P among the divisors of 10 \[1, 2, 5, 10\]\.")
  with pytest.raises(ValueError, match=msg):
    rl.streaming_critical_batch_per_slice(V5P, 10, 3)
  with pytest.raises(ValueError, match=msg):
    rl.streaming_window_steps(10, 3)
  with pytest.raises(ValueError, match=msg):
    rl.max_slices(2**20, V5P, method="streaming", sync_every=10, fragments=3)
  with pytest.raises(ValueError, match=msg):
    memory.memory_per_replica(1000, method="streaming", sync_every=10, fragments=3)
  # (P - 1) | L when the model is known: TINY has L = 2, so P = 4 is refused.
  with pytest.raises(ValueError, match=r"fragments \(P=4\): P - 1 must divide the number of "
                                       r"layers \(L=2\); allowed P for this model: \[1, 2, 3\]"):
    rl.streaming_critical_batch_per_slice(V5P, 8, 4, model=TINY, seq_len=4)
  with pytest.raises(ValueError, match=r"allowed P for this model: \[1, 2, 3\]"):
    memory.memory_per_replica(TINY, method="streaming", sync_every=8, fragments=4)


def test_max_slices_exact_and_by_hand():
  gbs = 4 * 2**20
  assert rl.max_slices(gbs, V5P) == 58  # floor(1 + 4194304 / 73440)
  assert rl.max_slices(gbs, V5P, bits=32) == 29  # floor(1 + 4194304 / 146880)
  assert rl.max_slices(gbs, V5P, method="diloco", sync_every=100) == 5712
  assert rl.max_slices(gbs, V5P, method="streaming", sync_every=96, fragments=8,
                       overlap=1) == math.floor(1 + gbs / 3672)
  np.testing.assert_array_equal(rl.max_slices([73440, 73439], V5P), [2, 1])
  # The closed form is the exact solution of B/M >= B*(M) with a(M) = 2(M-1)/M.
  for g in (1e5, 1e6, 3.3e6, 1e8):
    m = rl.max_slices(g, V5P)
    ok = lambda k: g / k >= rl.dp_critical_batch_per_slice(V5P, replicas=k) - 1e-9
    assert ok(m) and not ok(m + 1)
  with pytest.raises(ValueError, match=r"method must be one of \('dp', 'diloco', 'streaming'\)"):
    rl.max_slices(gbs, V5P, method="fsdp")


# ------------------------------------------------------------ utilization, bandwidth


def test_required_bandwidth_blocking_by_hand():
  # One chunk released when the step ends (chunks=1): the blocking form.
  # V = 2e9 B, T = 0.1 s, H = 100, u = 0.95: W = 2e9 / (10 * 0.05 / 0.95) = 3.8e9 B/s.
  blocking = dict(chunks=1)
  assert bw.required_bandwidth(0.95, 2e9, 0.1, 100, **blocking) == pytest.approx(3.8e9)
  # With 0.5 s of latency per sync: 2e9 / (0.5263... - 0.5) = 7.6e10 B/s.
  assert bw.required_bandwidth(0.95, 2e9, 0.1, 100, latency=0.5, **blocking) == pytest.approx(
      7.6e10)
  assert bw.required_bandwidth(0.95, 2e9, 0.1, 100, latency=1.0, **blocking) == math.inf
  # Inverse of utilization_no_overlap.
  for u in (0.5, 0.8, 0.95):
    w = bw.required_bandwidth(u, 2e9, 0.1, 7, latency=0.01, **blocking)
    assert bw.utilization_no_overlap(w, 2e9, 0.1, 7, latency=0.01) == pytest.approx(u)
  # 0.99 would allow 0.7 * 0.01 / 0.99 = 0.00707 s of idle time: less than the latency.
  assert bw.required_bandwidth(0.99, 2e9, 0.1, 7, latency=0.01, **blocking) == math.inf
  np.testing.assert_allclose(bw.required_bandwidth([0.5, 0.9], 1e9, 1.0, **blocking),
                             [1e9, 9e9])


def test_required_bandwidth_overlapped_by_hand():
  # Released continuously over the backward pass (2/3 T): W = V / (sigma + 2T/3).
  # V = 2e9, T = 0.3, s = 1, u = 0.5: sigma = 0.3, W = 2e9 / 0.5 = 4e9 B/s.
  assert bw.required_bandwidth(0.5, 2e9, 0.3) == pytest.approx(4e9)
  # tau = 1 adds a step: 2e9 / (0.3 + 0.2 + 0.3) = 2.5e9.
  assert bw.required_bandwidth(0.5, 2e9, 0.3, overlap=1) == pytest.approx(2.5e9)
  # 4 chunks: the first leaves after a quarter of the backward pass, omega = (2/3)(3/4):
  # 2e9 / (0.3 + 0.15) = 4.444e9; the last chunk (5e8 B) alone needs 5e8 / 0.3.
  assert bw.required_bandwidth(0.5, 2e9, 0.3, chunks=4) == pytest.approx(2e9 / 0.45)
  # At a tight target the last chunk binds: u = 0.99, s = 1, 100 chunks, T = 1:
  # sigma = 1/99; V / (sigma + 0.66) vs (V/100) / sigma = V * 0.99.
  w = bw.required_bandwidth(0.99, 1.0, 1.0, chunks=100)
  assert w == pytest.approx(max(1 / (1 / 99 + 2 / 3 * 0.99), 0.01 * 99))
  # Inverse of utilization_overlapped, with latency, chunks and overlap.
  for u in (0.5, 0.8, 0.95):
    for kw in (dict(), dict(chunks=24), dict(chunks=3, overlap=1)):
      w = bw.required_bandwidth(u, 2e9, 0.1, 7, latency=0.01, **kw)
      assert bw.utilization_overlapped(w, 2e9, 0.1, 7, latency=0.01, **kw) == pytest.approx(u)
  # Hiding never hurts: overlapped <= blocking.
  assert bw.required_bandwidth(0.9, 2e9, 0.1, 10) < bw.required_bandwidth(0.9, 2e9, 0.1, 10,
                                                                          chunks=1)
  assert bw.hiding_window(0, chunks=1) == 0.0 and bw.hiding_window(2) == pytest.approx(8 / 3)
  with pytest.raises(ValueError,
                     match=r"forward_fraction \(φ\) must be a finite number in \[0, 1\]"):
    bw.hiding_window(forward_fraction=1.5)


def test_utilization_limits():
  # One blocking transfer per step: T / (T + C), C = 1e8 / 1e9 = 0.1 s.
  assert bw.utilization_no_overlap(1e9, 1e8, 0.3) == pytest.approx(0.75)
  assert bw.utilization_no_overlap(math.inf, 1e8, 0.3) == 1.0
  us = bw.utilization_no_overlap(np.logspace(6, 12, 20), 1e9, 0.1, 10)
  assert np.all(np.diff(us) > 0)


def test_hidden_bandwidth_by_hand():
  # Continuous release: V / ((tau + 2/3) T).
  assert bw.hidden_bandwidth(2.5e8, 0.1, overlap=1) == pytest.approx(2.5e8 / (5 / 3 * 0.1))
  assert bw.hidden_bandwidth(2.5e8, 0.1, overlap=2) == pytest.approx(2.5e8 / (8 / 3 * 0.1))
  assert bw.hidden_bandwidth(2.5e8, 0.1, overlap=0) == pytest.approx(2.5e8 / (2 / 3 * 0.1))
  # The link keeps up with one transfer every 2 steps: 2.5e8 / 0.2.
  assert bw.hidden_bandwidth(2.5e8, 0.1, overlap=5, steps_between_sends=2) == pytest.approx(
      1.25e9)
  # 3 chunks, tau = 1: omega = 1 + (2/3)(2/3); the last chunk needs (V/3) / T, less.
  assert bw.hidden_bandwidth(3e8, 0.1, overlap=1, chunks=3) == pytest.approx(3e8 / (13 / 9 * 0.1))
  # With chunks and tau = 0 the last chunk is released as its step ends: never hidden.
  assert bw.hidden_bandwidth(3e8, 0.1, overlap=0, chunks=3) == math.inf
  with pytest.raises(ValueError, match=r"overlap \(τ\) must be an integer >= 0, got -1"):
    bw.hidden_bandwidth(2.5e8, 0.1, overlap=-1)


def test_memory_per_replica_by_hand():
  m = memory.memory_per_replica(1_000_000, method="dp")
  assert (m.params, m.grads, m.optimizer, m.outer_params, m.in_flight) == (4e6, 4e6, 8e6, 0, 0)
  assert m.total == 16e6
  m = memory.memory_per_replica(1_000_000, method="diloco", sync_every=100)
  assert (m.outer_params, m.outer_momentum, m.in_flight, m.total) == (4e6, 4e6, 4e6, 28e6)
  # Streaming P = 10, H = 100 (Δh = 10): τ = 1 -> 1 fragment in flight, τ = 15 -> 2.
  kw = dict(method="streaming", sync_every=100, fragments=10)
  assert memory.memory_per_replica(1_000_000, overlap=1, **kw).in_flight == 4e5
  assert memory.memory_per_replica(1_000_000, overlap=15, **kw).in_flight == 8e5
  # Fragments of a ModelConfig (the semantics page, docs/semantics.md): [168, 656, 656]; H = 3 (Δh = 1), τ = 1 -> 2 in flight.
  m = memory.memory_per_replica(TINY, method="streaming", sync_every=3, fragments=3, overlap=1)
  assert m.in_flight == 2 * 656 * 4
  assert m.params == 1480 * 4
  bf16 = memory.memory_per_replica(1_000_000, method="dp", param_bytes=2, grad_bytes=2)
  assert bf16.total == 12e6  # the book's 10 bytes/param + bf16 gradients
  with pytest.raises(ValueError, match=r"model must be a ModelConfig \(analysis.get_model resolves "
                                       r"a catalog name\) or a positive parameter count, got -3"):
    memory.memory_per_replica(-3)
  with pytest.raises(ValueError, match=r"or a positive parameter count, got '8B'"):
    memory.memory_per_replica("8B")


@pytest.mark.parametrize("name, outer_state", [("nesterov", 4_000_000), ("sgd", 4_000_000), ("adam", 8_000_000)])
def test_outer_optimizer_state_by_hand(name, outer_state):
  """N = 10^6 fp32 params: Nesterov and SGD keep one momentum (4 MB), Adam m and v (8 MB)."""
  n = 10**6
  assert replica_state_bytes(n, outer=True, outer_optimizer=name) == dict(
      params=4_000_000, grads=4_000_000, optimizer=8_000_000, outer_params=4_000_000, outer_momentum=outer_state)
  assert replica_state_bytes(n, outer=False, outer_optimizer=name)["outer_momentum"] == 0  # DP: no outer step
  m = memory.memory_per_replica(n, method="diloco", sync_every=100, outer_optimizer=name)
  assert (m.outer_params, m.outer_momentum) == (4e6, outer_state)
  assert m.total == 4e6 + 4e6 + 8e6 + 4e6 + outer_state + 4e6  # + one fp32 full-model buffer in flight
  assert memory.memory_per_replica(n, method="dp", outer_optimizer=name).total == 16e6
  # The trainer's up-front check counts the same: 1 replica, no logits, exactly 24 MB available.
  fits = dict(replicas=1, outer=True, tokens=0, vocab=32, available=24e6, outer_optimizer=name)
  if name == "adam":  # 4 + 4 + 8 + 4 + 8 = 28 MB
    with pytest.raises(ValueError, match=r"the run needs at least 0.028 GB \(training state 0.028 GB"):
      check_fits(n, **fits)
  else:  # 4 + 4 + 8 + 4 + 4 = 24 MB
    check_fits(n, **fits)


def test_unknown_outer_optimizer_is_one_line():
  with pytest.raises(ValueError, match=r"^outer_optimizer must be one of \('nesterov', 'sgd', 'adam'\), got 'adamw'\.$"):
    memory.memory_per_replica(10**6, outer_optimizer="adamw")
