"""Bytes on the wire and the bandwidth they need: transfer time, all-reduce payloads, utilization.

Pure, vectorised (numpy broadcasting) functions in SI units (bytes, seconds, bytes/s), with
the conventions of :mod:`analysis.roofline`: a bandwidth W is what one member of the
all-reduce can send, and a ring all-reduce of V bytes over M members sends
:math:`2(M-1)/M \\cdot V` bytes per member (:func:`allreduce_factor`).
:func:`utilization_no_overlap` and :func:`required_bandwidth` are the closed forms of
blocking transfers, :func:`hidden_bandwidth` that of transfers overlapped with :math:`\\tau`
steps; the simulator (:mod:`analysis.simulate`) checks them event by event.
"""

from __future__ import annotations

import math

import numpy as np

from analysis import _checks
from diloco_core.validity import check_int


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

  Args:
    bandwidth: W, bytes/s (may be ``inf``).
    payload: V, bytes per sync (see :func:`payload_bytes`).
    step_time: T, seconds of compute per step.
    steps_per_sync: s (H for DiLoCo, H/P per fragment for Streaming without overlap).
    latency: ε, seconds added to every transfer.

  Returns:
    Compute time / wall time, in (0, 1].

  Examples:
    >>> round(utilization_no_overlap(1.25e9, 2e9, 0.1, steps_per_sync=100), 4)  # 10 s / 11.6 s
    0.8621
  """
  w = _checks.positive("bandwidth", bandwidth)
  v = _checks.nonneg("payload", payload)
  t = _checks.positive("step_time", step_time)
  s = _checks.positive("steps_per_sync", steps_per_sync)
  eps = _checks.nonneg("latency", latency)
  return _checks.out(s * t / (s * t + v / w + eps))


def required_bandwidth(target, payload, step_time, steps_per_sync=1, latency=0.0):
  """Bandwidth for a target utilization with blocking (non-overlapped) transfers.

  Inverts :func:`utilization_no_overlap`:

  .. math::
     W = \\frac{V}{s\\,T\\,(1-u)/u - \\varepsilon}

  and is ``inf`` when the latency alone already exceeds the allowed idle time.

  Args:
    target: u in (0, 1).
    payload: V, bytes per sync.
    step_time: T, seconds of compute per step.
    steps_per_sync: s.
    latency: ε, seconds per transfer.

  Returns:
    Bytes/s.

  Examples:
    >>> # 1B params, bf16, 2 datacenters (2 GB), DiLoCo H=100 at 0.1 s/step, 95%:
    >>> w = required_bandwidth(0.95, 2e9, 0.1, steps_per_sync=100)
    >>> round(w * 8 / 1e9, 2)  # Gbit/s
    30.4
  """
  u = _checks.fraction("target", target)
  v = _checks.nonneg("payload", payload)
  t = _checks.positive("step_time", step_time)
  s = _checks.positive("steps_per_sync", steps_per_sync)
  eps = _checks.nonneg("latency", latency)
  slack = s * t * (1.0 - u) / u - eps
  with np.errstate(divide="ignore"):
    w = np.where(slack > 0, v / np.where(slack > 0, slack, 1.0), np.inf)
  return _checks.out(w)


def hidden_bandwidth(payload, step_time, overlap, steps_between_sends=math.inf):
  """Bandwidth at which every overlapped transfer is hidden behind compute.

  Under the semantics page (docs/semantics.md) a fragment sent after step :math:`t` must have arrived before step
  :math:`t+\\tau+1` starts, so it may use the :math:`\\tau` steps in between; and the
  link must keep up with one transfer every :math:`s` steps:

  .. math::
     W = \\frac{V}{\\min(\\tau, s)\\,T}

  At or above it no step waits for the network (utilization 1 without latency; the
  simulator reproduces it). With :math:`\\tau = 0` nothing can be hidden.

  Args:
    payload: V, bytes of one transfer (a fragment, see :func:`payload_bytes`).
    step_time: T, seconds per step.
    overlap: τ >= 1.
    steps_between_sends: s, steps between two transfers (Δh = H/P for Streaming).

  Returns:
    Bytes/s.

  Examples:
    >>> # 1B params in 8 fragments, bf16, 2 datacenters, τ = 1, T = 0.1 s
    >>> w = hidden_bandwidth(payload_bytes(1e9 / 8, 16, replicas=2), 0.1, overlap=1)
    >>> w * 8 / 1e9  # Gbit/s
    20.0
  """
  tau = check_int("overlap (τ)", overlap)
  s = float(_checks.positive("steps_between_sends", steps_between_sends))
  return _checks.out(_checks.nonneg("payload", payload) / (
      min(tau, s) * _checks.positive("step_time", step_time)))
