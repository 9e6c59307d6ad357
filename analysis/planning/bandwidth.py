"""Bytes on the wire and the bandwidth they need: transfer time, all-reduce payloads, utilization.

Pure, vectorised (numpy broadcasting) functions in SI units (bytes, seconds, bytes/s), with
the conventions of :mod:`analysis.planning.roofline`: a bandwidth W is what one member of the
all-reduce can send, and a ring all-reduce of V bytes over M members sends
:math:`2(M-1)/M \\cdot V` bytes per member (:func:`allreduce_factor`).
:func:`hiding_window`, :func:`utilization_overlapped`, :func:`required_bandwidth` and
:func:`hidden_bandwidth` are the closed forms of a payload reduced layer by layer during
the backward pass of the step that sends it, as in the Streaming DiLoCo paper's
compute-utilization simulation (arXiv 2501.18512, Figure 3, Figure 4, Table 4);
:func:`streaming_stall` and :func:`streaming_required_bandwidth` add up Streaming DiLoCo's
fragments exactly; :func:`utilization_no_overlap` is the blocking reference. The simulator
(:mod:`analysis.planning.simulate`) checks them event by event.
"""

from __future__ import annotations

import math

import numpy as np

from analysis.planning import _checks
from diloco_core.spec.validity import FRAGMENT_PATTERNS
from diloco_core.spec.validity import check_choice
from diloco_core.spec.validity import check_int
from diloco_core.spec.validity import check_overlap
from diloco_core.spec.validity import check_real


def t_comm(num_bytes, bytes_per_s):
  """Time to move bytes over a link: :math:`T_\\text{comm} = V / W`.

  .. math::
     T_\\text{comm} = \\frac{V}{W}

  Args:
    num_bytes: V, bytes to move (array-like).
    bytes_per_s: W, bandwidth of the link.

  Returns:
    Seconds.

  Examples:
    >>> t_comm(16e9, 1.25e9)  # 8B bf16 parameters over a 10 Gbit/s link
    12.8
  """
  return _checks.out(_checks.nonneg("num_bytes", num_bytes) / _checks.positive(
      "bytes_per_s", bytes_per_s))


def allreduce_factor(replicas):
  """Bytes each member sends per byte all-reduced in a ring: :math:`2(M-1)/M`.

  .. math::
     a(M) = \\frac{2\\,(M - 1)}{M}

  Args:
    replicas: M, members of the all-reduce (array-like of integers >= 1).

  Returns:
    The factor (0 for M = 1, 1 for M = 2, tending to 2).

  Examples:
    >>> allreduce_factor(2), allreduce_factor(8)
    (1.0, 1.75)
  """
  m = _checks.positive_integers("replicas", replicas)
  return _checks.out(2.0 * (m - 1.0) / m)


def payload_bytes(num_params, bits=16, replicas=None):
  """Bytes each member sends to all-reduce ``num_params`` values of ``bits`` bits.

  .. math::
     V = N \\cdot \\frac{b}{8} \\cdot a(M)

  Args:
    num_params: N, values all-reduced.
    bits: b, bits per value on the wire (16 for bf16, 4 for fp4, ...).
    replicas: M; None takes the many-member limit :math:`a = 2`.

  Returns:
    Bytes sent per member (and received, by symmetry).

  Examples:
    >>> payload_bytes(1e9, bits=16, replicas=2)  # 1B params, two datacenters
    2000000000.0
  """
  factor = 2.0 if replicas is None else allreduce_factor(replicas)
  return _checks.out(_checks.nonneg("num_params", num_params) * _checks.positive("bits", bits)
                     / 8.0 * factor)



def utilization_no_overlap(bandwidth, payload, step_time, steps_per_sync=1, latency=0.0):
  """Compute utilization when a blocking transfer follows every ``steps_per_sync`` steps.

  .. math::
     u = \\frac{s\\,T}{s\\,T + V / W + \\varepsilon}

  The payload is released only when its step ends and nothing hides it: the
  accounting of :func:`utilization_overlapped` with ``chunks=1`` and ``overlap=0``
  (and of the simulator with ``bucket_layers`` = L). It is the pessimistic reference
  the overlapped forms improve on.

  Args:
    bandwidth: W, bytes/s (may be ``inf``).
    payload: V, bytes per sync (see :func:`payload_bytes`).
    step_time: T, seconds of compute per step.
    steps_per_sync: s (H for DiLoCo, H/P per fragment for Streaming).
    latency: ε, seconds added to every transfer.

  Returns:
    Compute time / wall time, in (0, 1].

  Examples:
    >>> round(utilization_no_overlap(1.25e9, 2e9, 0.1, steps_per_sync=100), 4)  # 10 s / 11.6 s
    0.8621
  """
  return utilization_overlapped(bandwidth, payload, step_time, steps_per_sync, latency,
                                chunks=1)


def hiding_window(overlap=0, chunks=None, forward_fraction=1 / 3):
  """Steps of compute a payload reduced during its sending step's backward pass hides behind.

  In the Streaming DiLoCo paper's accounting (arXiv 2501.18512, Figure 3; its first
  author's calculator: "the reduction of gradients or outer gradients is overlapped
  over the backward pass computation"), a payload sent during step :math:`t` is cut
  into :math:`\\ell` equal chunks (one per layer, or per bucket of layers), released as
  the backward pass finishes each of them, and must have arrived before step
  :math:`t + \\tau + 1` starts. The backward pass takes :math:`(1-\\varphi)T` and the
  first chunk is released after :math:`1/\\ell` of it, so the payload can use

  .. math::
     \\omega = \\tau + (1 - \\varphi)\\left(1 - \\frac{1}{\\ell}\\right)

  steps of compute; ``chunks=None`` is the limit :math:`\\ell \\to \\infty` (release
  spread evenly over the backward pass, :math:`\\omega = \\tau + 1 - \\varphi`) and
  ``chunks=1`` a payload released when its step ends (:math:`\\omega = \\tau`).

  Args:
    overlap: τ >= 0, steps between the sending step and the step that needs the payload.
    chunks: ℓ, equal chunks the payload is released in (None: continuously).
    forward_fraction: φ in [0, 1], the share of a step before the backward pass.

  Returns:
    ω, in steps.

  Examples:
    >>> hiding_window(), hiding_window(1, chunks=24)  # DP's 2/3; Streaming τ=1, 24 layers
    (0.6666666666666667, 1.6388888888888888)
  """
  tau = check_int("overlap (τ)", overlap, low=0)
  phi = check_real("forward_fraction (φ)", forward_fraction, low=0.0, high=1.0, high_open=False)
  tail = 1.0 if chunks is None else 1.0 - 1.0 / check_int("chunks (ℓ)", chunks)
  return tau + (1.0 - phi) * tail


def utilization_overlapped(bandwidth, payload, step_time, steps_per_sync=1, latency=0.0, *,
                           overlap=0, chunks=None, forward_fraction=1 / 3):
  """Compute utilization when one payload per ``steps_per_sync`` steps hides behind compute.

  One payload of :math:`V` bytes per :math:`s` steps, released in :math:`\\ell` chunks
  of :math:`d = V/(\\ell W)` seconds during its sending step's backward pass
  (:func:`hiding_window`). On a FIFO link it leaves :math:`\\max(T + d,\\ \\varphi T +
  T_b/\\ell + \\ell d)` after the step starts (:math:`T_b = (1-\\varphi)T`), so the step
  that needs it waits

  .. math::
     \\delta = \\max\\!\\left(0,\\ \\frac{V}{W} + \\varepsilon - \\omega T,\\
       \\frac{V}{\\ell W} + \\varepsilon - \\tau T\\right), \\qquad
     u = \\frac{sT}{sT + \\delta}

  (the last term vanishes for ``chunks=None``). This is exact for DP (:math:`s = 1`)
  and DiLoCo (:math:`s = H`) with :math:`\\ell = L` (the simulator,
  :mod:`analysis.planning.simulate`, agrees to rounding). For Streaming DiLoCo with the strided
  pattern call it per fragment (:math:`V/P`, :math:`s = H/P`): ``chunks=None`` bounds
  the utilization from above and ``chunks`` :math:`= L/P` from below (the fragment that
  holds layer 0 is the last to be released; the others leave earlier).

  Args:
    bandwidth: W, bytes/s (may be ``inf``).
    payload: V, bytes per transfer.
    step_time: T, seconds of compute per step.
    steps_per_sync: s, steps per transfer.
    latency: ε, seconds each chunk adds after leaving the link.
    overlap: τ, steps the transfer may take past its sending step.
    chunks: ℓ, chunks the payload is released in (None: continuously).
    forward_fraction: φ, share of a step before the backward pass.

  Returns:
    Compute time / wall time, in (0, 1].

  Examples:
    >>> # 1B, bf16, M = 2 (2e9 B), DiLoCo H = 100 at 10 Gbit/s: 1.6 s on the link, of
    >>> # which (2/3)(23/24) 0.1 s hides behind the sync step's backward pass.
    >>> round(utilization_overlapped(1.25e9, 2e9, 0.1, 100, chunks=24), 6)
    0.866843
  """
  w = _checks.positive("bandwidth", bandwidth)
  v = _checks.nonneg("payload", payload)
  t = _checks.positive("step_time", step_time)
  s = _checks.positive("steps_per_sync", steps_per_sync)
  eps = _checks.nonneg("latency", latency)
  stall = np.maximum(0.0, v / w + eps - hiding_window(overlap, chunks, forward_fraction) * t)
  if chunks is not None:
    stall = np.maximum(stall, v / (chunks * w) + eps - overlap * t)
  return _checks.out(s * t / (s * t + stall))


def _per_slack(volume, slack):
  """volume / slack where the slack is positive, inf elsewhere."""
  with np.errstate(divide="ignore", invalid="ignore"):
    return np.where(slack > 0, volume / np.where(slack > 0, slack, 1.0), np.inf)


def required_bandwidth(target, payload, step_time, steps_per_sync=1, latency=0.0, *,
                       overlap=0, chunks=None, forward_fraction=1 / 3):
  """Bandwidth for a target utilization, the payload hiding behind its sending step's backward pass.

  Inverts :func:`utilization_overlapped`: with the idle time a period may hold,
  :math:`\\sigma = sT(1-u)/u`,

  .. math::
     W = \\max\\!\\left(\\frac{V}{\\sigma + \\omega T - \\varepsilon},\\
       \\frac{V/\\ell}{\\sigma + \\tau T - \\varepsilon}\\right)

  (:func:`hiding_window` :math:`\\omega`; ``inf`` when a denominator is not positive,
  e.g. when the latency alone exceeds the allowed idle time). ``chunks=1`` gives the
  blocking form :math:`V / (\\sigma - \\varepsilon)` of :func:`utilization_no_overlap`.

  Args:
    target: u in (0, 1).
    payload: V, bytes per transfer.
    step_time: T, seconds of compute per step.
    steps_per_sync: s, steps per transfer.
    latency: ε, seconds per chunk.
    overlap: τ, steps the transfer may take past its sending step.
    chunks: ℓ, chunks the payload is released in (None: continuously).
    forward_fraction: φ, share of a step before the backward pass.

  Returns:
    Bytes/s.

  Examples:
    >>> # 1B params, bf16, 2 datacenters (2 GB), DiLoCo H=100 at 0.1 s/step, 24 layers, 95%:
    >>> w = required_bandwidth(0.95, 2e9, 0.1, steps_per_sync=100, chunks=24)
    >>> round(w * 8 / 1e9, 2)  # Gbit/s
    27.11
    >>> round(required_bandwidth(0.95, 2e9, 0.1, steps_per_sync=100, chunks=1) * 8 / 1e9, 2)
    30.4
  """
  u = _checks.fraction("target", target)
  v = _checks.nonneg("payload", payload)
  t = _checks.positive("step_time", step_time)
  s = _checks.positive("steps_per_sync", steps_per_sync)
  eps = _checks.nonneg("latency", latency)
  sigma = s * t * (1.0 - u) / u
  w = _per_slack(v, sigma + hiding_window(overlap, chunks, forward_fraction) * t - eps)
  if chunks is not None:
    w = np.maximum(w, _per_slack(v / chunks, sigma + overlap * t - eps))
  return _checks.out(w)


def hidden_bandwidth(payload, step_time, overlap, steps_between_sends=math.inf, *, chunks=None,
                     forward_fraction=1 / 3):
  """Bandwidth at which every transfer is hidden behind compute (no step waits).

  A payload sent during step :math:`t` may use the rest of that step's backward pass
  and the :math:`\\tau` steps before step :math:`t+\\tau+1` (:func:`hiding_window`
  :math:`\\omega`); its last chunk, released when the step ends, only the :math:`\\tau`
  steps; and the link must keep up with one transfer every :math:`s` steps:

  .. math::
     W = \\max\\!\\left(\\frac{V}{\\omega T},\\ \\frac{V/\\ell}{\\tau T},\\
       \\frac{V}{sT}\\right)

  Without latency, utilization is 1 at and above it. It is exact (the simulator agrees)
  for one payload per period (DiLoCo, :math:`\\ell = L`) and for Streaming's strided
  fragments (:math:`V/P`, :math:`\\ell = L/P`, :math:`s = H/P`) when :math:`\\tau + 1
  \\le \\lfloor H/P \\rfloor`, so that two fragments never share the link; otherwise it
  is a lower bound. With :math:`\\tau = 0` and chunks, the last chunk always waits:
  ``inf``.

  Args:
    payload: V, bytes of one transfer (a fragment, see :func:`payload_bytes`).
    step_time: T, seconds per step.
    overlap: τ >= 0.
    steps_between_sends: s, steps between two transfers (Δh = H/P for Streaming).
    chunks: ℓ, chunks the payload is released in (None: continuously).
    forward_fraction: φ, share of a step before the backward pass.

  Returns:
    Bytes/s.

  Examples:
    >>> # 1B params in 8 fragments of 3 layers, bf16, 2 datacenters, τ = 1, T = 0.1 s:
    >>> # the fragment holding layer 0 leaves T/3 + 8 T_b/24 + 3 d after its step starts.
    >>> w = hidden_bandwidth(payload_bytes(1e9 / 8, 16, replicas=2), 0.1, overlap=1,
    ...                      steps_between_sends=12.5, chunks=3)
    >>> round(w * 8 / 1e9, 4)  # Gbit/s
    13.8462
  """
  tau = check_int("overlap (τ)", overlap, low=0)
  v = _checks.nonneg("payload", payload)
  t = _checks.positive("step_time", step_time)
  s = float(_checks.positive("steps_between_sends", steps_between_sends))
  w = np.maximum(_per_slack(v, hiding_window(tau, chunks, forward_fraction) * t), v / (s * t))
  if chunks is not None:
    w = np.maximum(w, _per_slack(v / chunks, np.asarray(tau * t)))
  return _checks.out(w)


def streaming_stall(bandwidth, payload, step_time, sync_every, fragments, layers, overlap=0,
                    latency=0.0, *, pattern="strided", first_payload=0.0, forward_fraction=1 / 3):
  """Seconds the steps of one Streaming DiLoCo period wait for the network.

  The :math:`P` layer fragments (:math:`n = L/P` layers each, :math:`V/P` bytes, dealt
  as the trainer deals them) are each reduced during the backward pass of their sending
  step, one chunk of :math:`d = V/(LW)` seconds per layer. With :math:`b = (1-\\varphi)
  T/L`, fragment :math:`k` (0-based) leaves the FIFO link

  .. math::
     F_k = \\begin{cases}
       \\max(T - kb + d,\\ \\varphi T + (P-k)\\,b + n d)
         & \\text{strided (layers } k, k+P, \\dots) \\\\
       \\max(T - knb + d,\\ T - (kn+n-1)\\,b + n d) & \\text{sequential}
     \\end{cases}

  after its step starts, and the step that needs it waits
  :math:`\\delta_k = \\max(0, F_k + \\varepsilon - (\\tau+1)T)`. A non-layer fragment of
  ``first_payload`` bytes (the trainer's fragment 0: embeddings, head) is taken as
  released when its step ends: :math:`\\delta_0 = \\max(0, V_0/W + \\varepsilon - \\tau T)`.
  The period waits :math:`\\sum \\delta`. This is the simulator's accounting
  (:mod:`analysis.planning.simulate`), exact when :math:`\\tau + 1 \\le \\lfloor H/P \\rfloor`
  (two fragments never share the link).

  Args:
    bandwidth: W, bytes/s.
    payload: V, bytes of all the layer fragments together.
    step_time: T.
    sync_every: H (a period; only checked against P and τ).
    fragments: P, layer fragments (P | L).
    layers: L.
    overlap: τ.
    latency: ε, seconds per chunk.
    pattern: "strided" or "sequential".
    first_payload: V_0, bytes of a non-layer fragment (0: none, the paper's setting).
    forward_fraction: φ.

  Returns:
    Seconds per period.

  Examples:
    >>> # 1B, 8 fragments of 3 layers, 16 Gbit per period at 20 Gbit/s, tau = 0.
    >>> round(float(streaming_stall(2.5e9, 2e9, 0.1, 100, 8, 24)), 6)
    0.366667
  """
  w = _checks.positive("bandwidth", bandwidth)
  t = float(_checks.positive("step_time", step_time))
  h = check_int("sync_every (H)", sync_every)
  p = check_int("fragments (P)", fragments, high=h + 1)
  tau = check_overlap(overlap, h)
  n_layers = check_int("layers (L)", layers)
  if n_layers % p:
    raise ValueError(f"fragments ({p}) must divide layers ({n_layers}).")
  check_choice("pattern", pattern, FRAGMENT_PATTERNS)
  eps = _checks.nonneg("latency", latency)
  phi = float(forward_fraction)
  n, b = n_layers // p, (1.0 - phi) * t / n_layers
  d = _checks.nonneg("payload", payload) / (n_layers * w)
  k = np.arange(p).reshape((p,) + (1,) * np.ndim(d))
  if pattern == "strided":
    leave = np.maximum(t - k * b + d, phi * t + (p - k) * b + n * d)
  else:
    leave = np.maximum(t - k * n * b + d, t - (k * n + n - 1) * b + n * d)
  stall = np.maximum(0.0, leave + eps - (tau + 1) * t).sum(axis=0)
  stall = stall + np.maximum(0.0, _checks.nonneg("first_payload", first_payload) / w + eps
                             - tau * t)
  return _checks.out(stall)


def streaming_required_bandwidth(target, payload, step_time, sync_every, fragments, layers,
                                 overlap=0, latency=0.0, **kwargs):
  """Bandwidth at which Streaming DiLoCo's waits leave a fraction ``target`` to compute.

  Solves :math:`\\sum \\delta(W) = HT(1-u)/u` (:func:`streaming_stall`, decreasing in
  :math:`W`) by bisection of :math:`\\log W` to 1e-9; ``inf`` when even an infinite
  bandwidth waits too long (latency).

  Args:
    target: u in (0, 1).
    payload, step_time, sync_every, fragments, layers, overlap, latency: as
      :func:`streaming_stall`.
    **kwargs: ``pattern``, ``first_payload``, ``forward_fraction``.

  Returns:
    Bytes/s.

  Examples:
    >>> w = streaming_required_bandwidth(0.99, 2e9, 0.1, 100, 8, 24)  # the paper's 1B
    >>> round(w * 8 / 1e9, 2)  # Gbit/s
    29.94
  """
  u = float(_checks.fraction("target", target))
  sigma = sync_every * float(_checks.positive("step_time", step_time)) * (1.0 - u) / u
  def stall(w):
    return streaming_stall(w, payload, step_time, sync_every, fragments, layers, overlap,
                           latency, **kwargs)
  if stall(math.inf) > sigma:
    return math.inf
  lo, hi = 1.0, 1e18
  while math.log(hi / lo) > 1e-9:
    mid = math.sqrt(lo * hi)
    lo, hi = (lo, mid) if stall(mid) <= sigma else (mid, hi)
  return hi
