"""Roofline calculator for data parallelism, DiLoCo and Streaming DiLoCo.

Pure, vectorised (numpy broadcasting) functions in SI units: FLOPs, bytes, seconds,
bytes/s. Conventions follow "How to Scale Your Model" (jax-ml/scaling-book,
``roofline.md`` and ``training.md``):

* a bandwidth W is what one chip (or slice) can send; a ring all-reduce of V bytes
  over M members costs :math:`2(M-1)/M \\cdot V / W` (:func:`allreduce_factor`;
  ``replicas=None`` takes the many-member limit 2, as the book does);
* a step is *compute-bound* over a network when the time of the FLOPs the transfer is
  compared with exceeds the transfer time. For data parallelism that is the backward
  pass (``compute_fraction=2/3``, 4 of the 6 FLOPs per parameter and token), because
  gradients only exist during the backward pass and the next step waits for them;
* "critical batch": the batch (tokens) at which both times are equal. Above it the
  step is compute-bound.

The simulator (:mod:`analysis.simulate`) checks these closed forms event by event.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from analysis import _checks
from analysis.hardware import HardwareSpec
from analysis.hardware import get_hardware
from analysis.models import fragment_sizes
from analysis.models import get_model
from analysis.models import model_stats
from diloco_core.model_config import ModelConfig

_METHODS = ("dp", "diloco", "streaming")


# ---------------------------------------------------------------- the roofline itself


def t_math(flops, flops_per_s):
  """Time to do the arithmetic at peak: :math:`T_\\text{math} = F / C`.

  .. math::
     T_\\text{math} = \\frac{F}{C}

  Args:
    flops: FLOPs to perform (array-like).
    flops_per_s: C, FLOP/s of the chip(s) doing them.

  Returns:
    Seconds.

  Examples:
    >>> # one step of Llama-3-8B on 1M tokens, on a 256-chip v5p slice at peak
    >>> from analysis.models import model_stats
    >>> round(t_math(model_stats("8B").flops_per_token * 2**20, 256 * 4.59e14), 3)
    0.517
  """
  return _checks.out(_checks.nonneg("flops", flops) / _checks.positive("flops_per_s", flops_per_s))


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


def arithmetic_intensity(flops, num_bytes):
  """FLOPs per byte moved: :math:`I = F / V`.

  .. math::
     I = \\frac{F}{V}

  Args:
    flops: F, FLOPs of the operation.
    num_bytes: V, bytes it moves (over HBM, ICI, DCN, ...).

  Returns:
    FLOPs per byte.

  Examples:
    >>> # bf16 matmul [B, D] x [D, F] with B=256, D=F=8192: 2BDF / 2(BD + DF + BF)
    >>> B, D, F = 256, 8192, 8192
    >>> round(arithmetic_intensity(2 * B * D * F, 2 * (B * D + D * F + B * F)), 1)
    240.9
  """
  return _checks.out(_checks.nonneg("flops", flops) / _checks.positive("num_bytes", num_bytes))


def critical_intensity(flops_per_s, bytes_per_s):
  """The hardware's critical intensity :math:`C / W`: compute-bound above it.

  An operation whose :func:`arithmetic_intensity` exceeds :math:`C/W` takes
  :math:`T_\\text{math} \\ge T_\\text{comm}`.

  .. math::
     I^* = \\frac{C}{W}

  Args:
    flops_per_s: C, peak FLOP/s.
    bytes_per_s: W, bandwidth of the memory or network.

  Returns:
    FLOPs per byte.

  Examples:
    >>> round(critical_intensity(1.97e14, 8.1e11))  # TPU v5e against HBM: ~240
    243
    >>> from analysis.hardware import get_hardware
    >>> hw = get_hardware("h100")
    >>> round(critical_intensity(hw.peak_flops, hw.hbm_bandwidth))
    295
  """
  return _checks.out(_checks.positive("flops_per_s", flops_per_s) / _checks.positive(
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
  m = _checks.positive("replicas", replicas)
  if np.any(m != np.round(m)):
    raise ValueError(f"replicas must be a positive integer, got {replicas!r}.")
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


def critical_batch(payload, flops_per_token, flops_per_s, bytes_per_s):
  """Tokens at which :math:`T_\\text{math} = T_\\text{comm}` for one transfer.

  .. math::
     B^* = \\frac{V \\cdot C}{F_\\text{token} \\cdot W}

  Args:
    payload: V, bytes the transfer sends.
    flops_per_token: FLOPs per token the transfer is compared with.
    flops_per_s: C of the chips sharing the batch.
    bytes_per_s: W of the same chips.

  Returns:
    Tokens; above this batch the computation is the longer of the two.

  Examples:
    >>> # DP on v5p ICI: 2 bytes x 2 (all-reduce) per parameter vs 4 backward FLOPs
    >>> round(critical_batch(4.0, 4.0, 4.59e14, 1.8e11))
    2550
  """
  return _checks.out(
      _checks.nonneg("payload", payload) * _checks.positive("flops_per_s", flops_per_s)
      / (_checks.positive("flops_per_token", flops_per_token)
         * _checks.positive("bytes_per_s", bytes_per_s)))


# --------------------------------------------------- data parallelism, DiLoCo, Streaming


def _bytes_per_flop_ratio(model, seq_len) -> float:
  """Communicated parameters per "compute parameter" (F_token / 6); 1 for the book's model."""
  if model is None:
    return 1.0
  s = model_stats(model, seq_len)
  return s.total_params / (s.flops_per_token / 6.0)


def _dp_critical(peak, bandwidth, *, model, seq_len, bits, replicas, compute_fraction):
  f = float(compute_fraction)
  if not 0 < f <= 1:
    raise ValueError(f"compute_fraction must be in (0, 1], got {compute_fraction!r}.")
  payload = payload_bytes(_bytes_per_flop_ratio(model, seq_len), bits, replicas)
  return critical_batch(payload, 6.0 * f, peak, bandwidth)


def dp_critical_batch_per_chip(hardware, *, axes=1, model=None, seq_len=None, bits=16,
                               replicas=None, compute_fraction=2 / 3):
  """Per-chip batch above which data parallelism over the intra-slice network is compute-bound.

  Each chip all-reduces the full gradient (:math:`N` values of :math:`b` bits) over
  ``axes`` ICI axes while its backward pass runs (:math:`4 N_\\text{active}` FLOPs per
  token, ``compute_fraction`` of the :math:`6 N` of a step):

  .. math::
     B^*_\\text{chip} = \\frac{a(M)\\,(b/8)\\,N}{6 f\\,N_\\text{active}}
       \\cdot \\frac{C}{n_\\text{axes} W_\\text{ICI}}
     \\quad\\xrightarrow{\\;a=2,\\,b=16,\\,f=2/3\\;}\\quad \\frac{C}{W_\\text{ICI}}

  Args:
    hardware: a :class:`~analysis.hardware.HardwareSpec` or catalog name.
    axes: ICI axes devoted to data parallelism (the book: 3 axes triple W).
    model: a ModelConfig or catalog name; None is the book's idealised dense model
      (attention FLOPs ignored, :math:`N = N_\\text{active}`). An MoE raises the
      threshold by :math:`N_\\text{total}/N_\\text{active}`.
    seq_len: context length for the model's attention FLOPs.
    bits: bits per gradient value on the wire.
    replicas: chips in the all-reduce; None is the many-chip limit :math:`a = 2`.
    compute_fraction: share of the step's FLOPs the all-reduce hides behind (2/3: the
      backward pass; 1: the whole step).

  Returns:
    Tokens per chip.

  Examples:
    >>> round(dp_critical_batch_per_chip("v5p"))  # "How to Scale Your Model": 2,550
    2550
    >>> round(dp_critical_batch_per_chip("v5p", axes=3))  # all three axes: 850
    850
  """
  hw = get_hardware(hardware)
  axes = _checks.positive_int("axes", axes)
  return _dp_critical(hw.peak_flops, axes * hw.ici_bandwidth, model=model, seq_len=seq_len,
                      bits=bits, replicas=replicas, compute_fraction=compute_fraction)


def dp_critical_batch_per_slice(hardware, *, model=None, seq_len=None, bits=16,
                                replicas=None, compute_fraction=2 / 3):
  """Per-slice batch above which data parallelism across slices (DCN) is compute-bound.

  A slice of :math:`n` chips computes at :math:`nC` and sends over :math:`n` chips'
  share of DCN, :math:`n W_\\text{DCN}`, so :math:`n` cancels: the threshold is the
  same for a 4-chip slice and a full pod.

  .. math::
     B^*_\\text{slice} = \\frac{a(M)\\,(b/8)\\,N}{6 f\\,N_\\text{active}}
       \\cdot \\frac{C}{W_\\text{DCN,chip}}
     \\quad\\xrightarrow{\\;a=2,\\,b=16,\\,f=2/3\\;}\\quad \\frac{C}{W_\\text{DCN,chip}}

  Args:
    hardware: a HardwareSpec or catalog name.
    model: a ModelConfig or catalog name; None is the book's idealised dense model.
    seq_len: context length for the model's attention FLOPs.
    bits: bits per gradient value on the wire.
    replicas: slices M; None is the many-slice limit :math:`a = 2`.
    compute_fraction: share of the step's FLOPs the all-reduce hides behind.

  Returns:
    Tokens per slice.

  Examples:
    >>> # v5p: 4.59e14 FLOP/s over 6.25e9 B/s of DCN per chip. The book rounds the pod
    >>> # totals (3.8e18 / 5e13) and quotes ~76,000; unrounded it is 73,440.
    >>> round(dp_critical_batch_per_slice("v5p"))
    73440
    >>> round(dp_critical_batch_per_slice("v5p", replicas=2))  # two slices: a = 1
    36720
    >>> round(dp_critical_batch_per_slice("v5p", model="qwen3-30b-a3b"))  # MoE
    481975
  """
  hw = get_hardware(hardware)
  return _dp_critical(hw.peak_flops, hw.dcn_bandwidth, model=model, seq_len=seq_len,
                      bits=bits, replicas=replicas, compute_fraction=compute_fraction)


def diloco_critical_batch_per_slice(hardware, sync_every, *, model=None, seq_len=None,
                                    bits=16, replicas=None, compute_fraction=2 / 3):
  """Per-slice batch above which DiLoCo's cross-slice sync is compute-bound on average.

  The same all-reduce as data parallelism, paid once every :math:`H` steps: the
  intensity is multiplied by :math:`H`, the threshold divided by it.

  .. math::
     B^*_\\text{DiLoCo} = \\frac{B^*_\\text{DP, slice}}{H}

  Args:
    hardware: a HardwareSpec or catalog name.
    sync_every: H, inner steps between two syncs (>= 1).
    model, seq_len, bits, replicas, compute_fraction: as
      :func:`dp_critical_batch_per_slice`.

  Returns:
    Tokens per slice.

  Examples:
    >>> round(diloco_critical_batch_per_slice("v5p", 100))
    734
  """
  h = _checks.positive_int("sync_every", sync_every)
  return _checks.out(np.asarray(dp_critical_batch_per_slice(
      hardware, model=model, seq_len=seq_len, bits=bits, replicas=replicas,
      compute_fraction=compute_fraction)) / h)


def _check_streaming(sync_every, fragments, overlap):
  h = _checks.positive_int("sync_every", sync_every)
  p = _checks.positive_int("fragments", fragments)
  tau = _checks.nonneg_int("overlap", overlap)
  if p > h:
    raise ValueError(f"fragments ({p}) must be <= sync_every ({h}).")
  if tau >= h:
    raise ValueError(f"overlap must be < sync_every ({h}), got {tau}.")
  return h, p, tau


def streaming_window_steps(sync_every, fragments, overlap=0):
  """Steps of compute a Streaming DiLoCo fragment's bytes are spread over (roofline view).

  A fragment sent at step :math:`t` is merged after step :math:`t+\\tau`: its bytes
  share the link with the compute of :math:`\\tau + 1` steps (the sending step and the
  :math:`\\tau` it overlaps). The link also carries one fragment every
  :math:`\\Delta h = H/P` steps, so the window cannot exceed that on average:

  .. math::
     w = \\min(\\tau + 1,\\; H / P)

  Only the :math:`\\tau` later steps can *hide* the transfer, since SPEC.md sends a
  fragment after the sending step's update (see :func:`hidden_bandwidth` and the
  simulator).

  Args:
    sync_every: H.
    fragments: P (<= H).
    overlap: τ (0 <= τ < H).

  Returns:
    The window in steps.

  Examples:
    >>> streaming_window_steps(100, 4, overlap=1), streaming_window_steps(100, 50, 5)
    (2.0, 2.0)
  """
  h, p, tau = _check_streaming(sync_every, fragments, overlap)
  return float(min(tau + 1, h / p))


def streaming_critical_batch_per_slice(hardware, sync_every, fragments, overlap=0, *,
                                       model=None, seq_len=None, bits=16, replicas=None,
                                       compute_fraction=2 / 3):
  """Per-slice batch above which Streaming DiLoCo's *peak* traffic is compute-bound.

  Streaming sends :math:`1/P` of the model at a time (the peak bytes per step are
  divided by :math:`P`) and each transfer may take :math:`w` step times
  (:func:`streaming_window_steps`):

  .. math::
     B^*_\\text{stream} = \\frac{B^*_\\text{DP, slice}}{P \\cdot w}
       = \\frac{B^*_\\text{DP, slice}}{\\min(P(\\tau+1),\\, H)}

  With :math:`P(\\tau+1) \\ge H` this is DiLoCo's average threshold; with
  :math:`P = 1, \\tau = 0` it is the DP one, since vanilla DiLoCo's peak is a whole
  model in one step (its *average* is :func:`diloco_critical_batch_per_slice`).

  Args:
    hardware: a HardwareSpec or catalog name.
    sync_every: H.
    fragments: P (<= H).
    overlap: τ, steps between sending a fragment and merging it.
    model, seq_len, bits, replicas, compute_fraction: as
      :func:`dp_critical_batch_per_slice`.

  Returns:
    Tokens per slice.

  Examples:
    >>> round(streaming_critical_batch_per_slice("v5p", 100, fragments=8, overlap=1))
    4590
  """
  h, p, tau = _check_streaming(sync_every, fragments, overlap)
  dp = np.asarray(dp_critical_batch_per_slice(
      hardware, model=model, seq_len=seq_len, bits=bits, replicas=replicas,
      compute_fraction=compute_fraction))
  return _checks.out(dp / (p * streaming_window_steps(h, p, tau)))


def max_slices(global_batch_tokens, hardware, *, method="dp", sync_every=1, fragments=1,
               overlap=0, model=None, seq_len=None, bits=16, compute_fraction=2 / 3):
  """Largest number of slices M whose cross-slice traffic stays compute-bound.

  With M slices each slice gets :math:`B/M` tokens and the all-reduce factor is
  :math:`2(M-1)/M`, so the condition :math:`B/M \\ge B^*_\\infty (M-1)/M` (with
  :math:`B^*_\\infty` the threshold at :math:`a = 2`) solves exactly:

  .. math::
     M_\\max = \\left\\lfloor 1 + \\frac{B_\\text{global}}{B^*_\\infty} \\right\\rfloor,
     \\qquad B^*_\\infty \\xrightarrow{\\text{DP, bf16}} \\frac{C}{W_\\text{DCN,chip}}

  **The MaxText "146,000" rule.** An early MaxText doc gives
  "Max DCN slices = GBS / (146,000 × seq_len)". The right expression is
  :math:`1 + B_\\text{tokens} / B^*_\\infty` (or
  :math:`1 + B_\\text{sequences} \\cdot T / B^*_\\infty`): the sequence length multiplies
  a batch counted in sequences, it does not divide it. The constant is
  :math:`B^*_\\infty` in tokens: 146,000 is numerically the v5p value for fp32
  gradients (:math:`2 \\cdot 4 \\cdot C / (4 W) = 2 \\cdot 4.59\\text{e}14 /
  6.25\\text{e}9 = 146{,}880`). It fails whenever anything in :math:`B^*` changes: the
  chip (v5e 63,040, v6e 73,440, H100 19,780 tokens for bf16), the wire format
  (bf16 halves it, 4 bits divides it by 8), MoE (times
  :math:`N_\\text{total}/N_\\text{active}`), long contexts (attention FLOPs lower it),
  an MFU below 1 (lower it by the MFU), a few slices (the exact :math:`+1` above),
  and DiLoCo / Streaming (divided by :math:`H` / :math:`\\min(P(\\tau+1), H)`).

  Args:
    global_batch_tokens: B, tokens per step over all slices (array-like).
    hardware: a HardwareSpec or catalog name.
    method: "dp", "diloco" (uses ``sync_every``) or "streaming" (uses ``sync_every``,
      ``fragments``, ``overlap``).
    sync_every, fragments, overlap: H, P, τ.
    model, seq_len, bits, compute_fraction: as :func:`dp_critical_batch_per_slice`.

  Returns:
    The largest M (an int, or an integer array for array input).

  Examples:
    >>> max_slices(4 * 2**20, "v5p")  # 4M tokens, DP over DCN, bf16
    58
    >>> max_slices(4 * 2**20, "v5p", bits=32)  # fp32 gradients: B* = 146,880
    29
    >>> max_slices(4 * 2**20, "v5p", method="diloco", sync_every=100)
    5712
    >>> # The MaxText rule on the same 4M-token batch (seq_len 2048): a fraction of a slice.
    >>> round(4 * 2**20 / (146_000 * 2048), 4)
    0.014
  """
  _checks.choice("method", method, _METHODS)
  kw = dict(model=model, seq_len=seq_len, bits=bits, replicas=None,
            compute_fraction=compute_fraction)
  if method == "dp":
    b_star = dp_critical_batch_per_slice(hardware, **kw)
  elif method == "diloco":
    b_star = diloco_critical_batch_per_slice(hardware, sync_every, **kw)
  else:
    b_star = streaming_critical_batch_per_slice(hardware, sync_every, fragments, overlap, **kw)
  gbs = _checks.positive("global_batch_tokens", global_batch_tokens)
  m = np.floor(1.0 + gbs / np.asarray(b_star)).astype(np.int64)
  return int(m) if m.ndim == 0 else m


# ------------------------------------------------------------ utilization and bandwidth


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

  Under SPEC.md a fragment sent after step :math:`t` must have arrived before step
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
  tau = _checks.positive_int("overlap", overlap)
  s = float(_checks.positive("steps_between_sends", steps_between_sends))
  return _checks.out(_checks.nonneg("payload", payload) / (
      min(tau, s) * _checks.positive("step_time", step_time)))


# ------------------------------------------------------------------------------- memory


@dataclasses.dataclass(frozen=True)
class ReplicaMemory:
  """Bytes one replica (one slice, summed over its chips) holds during training."""

  params: float  # local parameters θ_m
  grads: float  # one gradient buffer
  optimizer: float  # inner AdamW first and second moments
  outer_params: float  # global parameters θ_g (DiLoCo / Streaming only)
  outer_momentum: float  # outer Nesterov momentum v (DiLoCo / Streaming only)
  in_flight: float  # pseudo-gradient buffers of fragments sent and not yet merged

  @property
  def total(self) -> float:
    return (self.params + self.grads + self.optimizer + self.outer_params
            + self.outer_momentum + self.in_flight)


def memory_per_replica(model, *, method="diloco", sync_every=1, fragments=1, overlap=0,
                       param_bytes=4, grad_bytes=4, optimizer_bytes=8, outer_bytes=4,
                       buffer_bytes=4) -> ReplicaMemory:
  """Memory per replica for DP, DiLoCo or Streaming DiLoCo (activations excluded).

  .. math::
     M = N(b_\\theta + b_g + b_\\text{Adam})
       + [\\text{DiLoCo}]\\,2 N b_\\text{outer}
       + n_\\text{flight}\\,\\max_p |\\text{fragment}_p|\\, b_\\text{buf},
     \\quad n_\\text{flight} = \\min\\!\\left(P, \\left\\lceil
       \\frac{\\tau+1}{H/P} \\right\\rceil\\right)

  :math:`n_\\text{flight}` counts the fragments sent in any :math:`\\tau + 1`
  consecutive steps (an upper bound on those held at once); fragment sizes follow
  SPEC.md (:func:`~analysis.models.fragment_sizes`) for a ModelConfig and are equal
  for a bare parameter count. The outer state is held once per replica.

  Args:
    model: a ModelConfig, catalog name, or a parameter count.
    method: "dp", "diloco" or "streaming" ("diloco" is streaming with P = 1).
    sync_every, fragments, overlap: H, P, τ (ignored for "dp").
    param_bytes: bytes per local parameter (4: fp32 master weights).
    grad_bytes: bytes per gradient value.
    optimizer_bytes: bytes of inner optimizer state per parameter (8: Adam m, v in fp32).
    outer_bytes: bytes per value of θ_g and of the outer momentum.
    buffer_bytes: bytes per value of an in-flight pseudo-gradient (fp32 accumulation).

  Returns:
    A :class:`ReplicaMemory` in bytes.

  Examples:
    >>> m = memory_per_replica(1_000_000, method="diloco", sync_every=100)
    >>> m.total / 1e6  # 4 + 4 + 8 + 4 + 4 bytes/param, + one fp32 full-model buffer
    28.0
    >>> m = memory_per_replica(1_000_000, method="streaming", sync_every=100, fragments=10,
    ...                        overlap=1)
    >>> m.in_flight  # one fragment of 100,000 values in flight at a time
    400000.0
  """
  _checks.choice("method", method, _METHODS)
  if isinstance(model, (str, ModelConfig)):
    cfg = get_model(model)
    sizes_model = cfg
  else:
    sizes_model = None
    if not isinstance(model, (int, np.integer)) or isinstance(model, bool) or model < 1:
      raise ValueError(f"model must be a ModelConfig, a catalog name or a positive parameter "
                       f"count, got {model!r}.")
  n_total = float(sum(fragment_sizes(sizes_model, 1))) if sizes_model else float(model)
  byte_args = dict(param_bytes=param_bytes, grad_bytes=grad_bytes,
                   optimizer_bytes=optimizer_bytes, outer_bytes=outer_bytes,
                   buffer_bytes=buffer_bytes)
  for name, value in byte_args.items():
    _checks.nonneg(name, value)
  local = dict(params=n_total * param_bytes, grads=n_total * grad_bytes,
               optimizer=n_total * optimizer_bytes)
  if method == "dp":
    return ReplicaMemory(**local, outer_params=0.0, outer_momentum=0.0, in_flight=0.0)
  if method == "diloco":
    fragments = 1
  h, p, tau = _check_streaming(sync_every, fragments, overlap)
  sizes = fragment_sizes(sizes_model, p) if sizes_model else [n_total / p] * p
  n_flight = min(p, math.ceil((tau + 1) / (h / p)))
  return ReplicaMemory(**local, outer_params=n_total * outer_bytes,
                       outer_momentum=n_total * outer_bytes,
                       in_flight=float(n_flight * max(sizes) * buffer_bytes))
