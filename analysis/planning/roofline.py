"""Roofline calculator for data parallelism, DiLoCo and Streaming DiLoCo.

Pure, vectorised (numpy broadcasting) functions in SI units: FLOPs, bytes, seconds,
bytes/s. Conventions follow "How to Scale Your Model" (jax-ml/scaling-book,
``roofline.md`` and ``training.md``):

* a bandwidth W is what one chip (or slice) can send; a ring all-reduce of V bytes
  over M members costs :math:`2(M-1)/M \\cdot V / W`
  (:func:`~analysis.planning.bandwidth.allreduce_factor`; ``replicas=None`` takes the many-member
  limit 2, as the book does);
* a step is *compute-bound* over a network when the time of the FLOPs the transfer is
  compared with exceeds the transfer time. For data parallelism that is the backward
  pass (``compute_fraction=2/3``, 4 of the 6 FLOPs per parameter and token), because
  gradients only exist during the backward pass and the next step waits for them;
* "critical batch": the batch (tokens) at which both times are equal. Above it the
  step is compute-bound.

Hardware and models are resolved objects here (:class:`~analysis.planning.hardware.HardwareSpec`,
:class:`~diloco_core.spec.model_config.ModelConfig`): the entry points (:func:`analysis.planning.plan.plan_run`,
``python -m analysis``, or your own code with :func:`~analysis.planning.hardware.get_hardware` and
:func:`~analysis.planning.models.get_model`) resolve catalog names once. Transfer times and payloads are
in :mod:`analysis.planning.bandwidth`, memory in :mod:`analysis.planning.memory`. The simulator
(:mod:`analysis.planning.simulate`) checks these closed forms event by event.
"""

from __future__ import annotations

import numpy as np

from analysis.planning import _checks
from analysis.planning.bandwidth import payload_bytes
from analysis.planning.hardware import check_hardware
from analysis.planning.models import check_model
from analysis.planning.models import model_stats
from diloco_core.spec.validity import check_choice
from diloco_core.spec.validity import check_int
from diloco_core.spec.validity import check_real
from diloco_core.spec.validity import check_schedule

#: The methods of the planning library: data parallelism, DiLoCo, Streaming DiLoCo.
METHODS = ("dp", "diloco", "streaming")


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
    >>> from analysis.planning.models import model_stats
    >>> round(t_math(model_stats("8B").flops_per_token * 2**20, 256 * 4.59e14), 3)
    0.517
  """
  return _checks.out(_checks.nonneg("flops", flops) / _checks.positive("flops_per_s", flops_per_s))


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
    >>> from analysis.planning.hardware import get_hardware
    >>> hw = get_hardware("h100")
    >>> round(critical_intensity(hw.peak_flops, hw.hbm_bandwidth))
    295
  """
  return _checks.out(_checks.positive("flops_per_s", flops_per_s) / _checks.positive(
      "bytes_per_s", bytes_per_s))


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
  model = check_model(model, optional=True)
  f = check_real("compute_fraction", compute_fraction, low=0.0, high=1.0, low_open=True,
                 high_open=False)
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
    hardware: a :class:`~analysis.planning.hardware.HardwareSpec`.
    axes: ICI axes devoted to data parallelism (the book: 3 axes triple W).
    model: a ModelConfig; None is the book's idealised dense model
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
    >>> from analysis.planning.hardware import get_hardware
    >>> v5p = get_hardware("v5p")
    >>> round(dp_critical_batch_per_chip(v5p))  # "How to Scale Your Model": 2,550
    2550
    >>> round(dp_critical_batch_per_chip(v5p, axes=3))  # all three axes: 850
    850
  """
  hw = check_hardware(hardware)
  axes = check_int("axes", axes)
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
    hardware: a HardwareSpec.
    model: a ModelConfig; None is the book's idealised dense model.
    seq_len: context length for the model's attention FLOPs.
    bits: bits per gradient value on the wire.
    replicas: slices M; None is the many-slice limit :math:`a = 2`.
    compute_fraction: share of the step's FLOPs the all-reduce hides behind.

  Returns:
    Tokens per slice.

  Examples:
    >>> from analysis.planning.hardware import get_hardware
    >>> v5p = get_hardware("v5p")
    >>> # v5p: 4.59e14 FLOP/s over 6.25e9 B/s of DCN per chip. The book rounds the pod
    >>> # totals (3.8e18 / 5e13) and quotes ~76,000; unrounded it is 73,440.
    >>> round(dp_critical_batch_per_slice(v5p))
    73440
    >>> round(dp_critical_batch_per_slice(v5p, replicas=2))  # two slices: a = 1
    36720
    >>> from analysis.planning.models import get_model
    >>> round(dp_critical_batch_per_slice(v5p, model=get_model("qwen3-30b-a3b")))  # MoE
    481975
  """
  hw = check_hardware(hardware)
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
    hardware: a HardwareSpec.
    sync_every: H, inner steps between two syncs (>= 1).
    model, seq_len, bits, replicas, compute_fraction: as
      :func:`dp_critical_batch_per_slice`.

  Returns:
    Tokens per slice.

  Examples:
    >>> from analysis.planning.hardware import get_hardware
    >>> v5p = get_hardware("v5p")
    >>> round(diloco_critical_batch_per_slice(v5p, 100))
    734
  """
  h = check_int("sync_every (H)", sync_every)
  return _checks.out(np.asarray(dp_critical_batch_per_slice(
      hardware, model=model, seq_len=seq_len, bits=bits, replicas=replicas,
      compute_fraction=compute_fraction)) / h)


def streaming_window_steps(sync_every, fragments, overlap=0, *, compute_fraction=2 / 3):
  """Backward passes of compute a Streaming DiLoCo fragment's bytes hide behind (roofline view).

  Outer gradients are reduced layer by layer while the *sending* step's backward pass
  runs (the Streaming DiLoCo paper's accounting, arXiv 2501.18512, Figure 3 and Table 4;
  :func:`~analysis.planning.bandwidth.hiding_window`), and a fragment sent during step :math:`t`
  is merged before step :math:`t+\\tau+1`: it hides behind that backward pass (a
  fraction :math:`c` of a step) and :math:`\\tau` whole steps. Counted in backward
  passes, the unit of :math:`B^*_\\text{DP}`, and capped like DiLoCo's average by the
  link carrying one fragment every :math:`\\Delta h = H/P` steps:

  .. math::
     w = \\min\\!\\left(1 + \\frac{\\tau}{c},\\; \\frac{H}{P}\\right)

  Args:
    sync_every: H.
    fragments: P, a divisor of H (``diloco_core.spec.validity.check_schedule``).
    overlap: τ (0 <= τ < H).
    compute_fraction: c, the share of a step the backward pass takes (2/3).

  Returns:
    The window in backward passes.

  Examples:
    >>> streaming_window_steps(100, 4, overlap=1), streaming_window_steps(100, 50, 5)
    (2.5, 2.0)
  """
  h, p, tau = check_schedule(sync_every, fragments, overlap)
  c = check_real("compute_fraction", compute_fraction, low=0.0, high=1.0, low_open=True,
                 high_open=False)
  return float(min(1.0 + tau / c, h / p))


def streaming_critical_batch_per_slice(hardware, sync_every, fragments, overlap=0, *,
                                       model=None, seq_len=None, bits=16, replicas=None,
                                       compute_fraction=2 / 3):
  """Per-slice batch above which Streaming DiLoCo's *peak* traffic is compute-bound.

  Streaming sends :math:`1/P` of the model at a time and each fragment hides behind
  :math:`w` backward passes (:func:`streaming_window_steps`): its own step's backward
  pass, as DP's gradients do, plus :math:`\\tau` steps.

  .. math::
     B^*_\\text{stream} = \\frac{B^*_\\text{DP, slice}}{P \\cdot w}
       = \\frac{B^*_\\text{DP, slice}}{\\min(P(1 + \\tau / c),\\, H)}

  With :math:`P = 1, \\tau = 0` this is the DP threshold (vanilla DiLoCo's peak is a
  whole model reduced during one backward pass); with :math:`P(1 + \\tau/c) \\ge H` it
  is DiLoCo's average (:func:`diloco_critical_batch_per_slice`).

  Args:
    hardware: a HardwareSpec.
    sync_every: H.
    fragments: P, a divisor of H; with a model, (P - 1) must divide its layers.
    overlap: τ, steps between sending a fragment and merging it.
    model, seq_len, bits, replicas, compute_fraction: as
      :func:`dp_critical_batch_per_slice`.

  Returns:
    Tokens per slice.

  Examples:
    >>> from analysis.planning.hardware import get_hardware
    >>> v5p = get_hardware("v5p")
    >>> round(streaming_critical_batch_per_slice(v5p, 96, fragments=8, overlap=1))
    3672
    >>> streaming_critical_batch_per_slice(v5p, 10, fragments=3)
    Traceback (most recent call last):
    ...
    ValueError: sync_every (H=10) must be a multiple of fragments (P=3): choose H in {9, 12, ...} or P among the divisors of 10 [1, 2, 5, 10].
  """
  cfg = check_model(model, optional=True)
  h, p, tau = check_schedule(sync_every, fragments, overlap,
                             num_layers=None if cfg is None else cfg.n_layers)
  dp = np.asarray(dp_critical_batch_per_slice(
      hardware, model=model, seq_len=seq_len, bits=bits, replicas=replicas,
      compute_fraction=compute_fraction))
  return _checks.out(dp / (p * streaming_window_steps(h, p, tau,
                                                      compute_fraction=compute_fraction)))


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
  and DiLoCo / Streaming (divided by :math:`H` / :math:`\\min(P(1 + \\tau/c), H)`).

  Args:
    global_batch_tokens: B, tokens per step over all slices (array-like).
    hardware: a HardwareSpec.
    method: "dp", "diloco" (uses ``sync_every``) or "streaming" (uses ``sync_every``,
      ``fragments``, ``overlap``).
    sync_every, fragments, overlap: H, P, τ.
    model, seq_len, bits, compute_fraction: as :func:`dp_critical_batch_per_slice`.

  Returns:
    The largest M (an int, or an integer array for array input).

  Examples:
    >>> from analysis.planning.hardware import get_hardware
    >>> v5p = get_hardware("v5p")
    >>> max_slices(4 * 2**20, v5p)  # 4M tokens, DP over DCN, bf16
    58
    >>> max_slices(4 * 2**20, v5p, bits=32)  # fp32 gradients: B* = 146,880
    29
    >>> max_slices(4 * 2**20, v5p, method="diloco", sync_every=100)
    5712
    >>> # The MaxText rule on the same 4M-token batch (seq_len 2048): a fraction of a slice.
    >>> round(4 * 2**20 / (146_000 * 2048), 4)
    0.014
  """
  check_choice("method", method, METHODS)
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
