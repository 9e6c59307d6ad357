"""Pick H (``sync_every``), P (``fragments``) and τ (``overlap``) for a run across slices.

:func:`plan_run` lists trainer configurations that are valid under SPEC.md (DP, DiLoCo
and Streaming DiLoCo for a ladder of :math:`H`), computes for each the cross-slice
bandwidth it needs and its memory with the closed forms of :mod:`analysis.roofline`,
and applies one documented selection rule against the bandwidth of the link. The result
is a :class:`Plan`; ``python -m analysis plan`` prints it and :meth:`Plan.command`
gives that command line.

Bandwidth per slice, with :math:`T` the step time, :math:`u` the target utilization,
:math:`V` the bytes a replica sends to all-reduce the whole model
(:func:`~analysis.roofline.payload_bytes`) and :math:`V_\\max` those of the largest
fragment (fragment 0 holds the embeddings, so fragments are not all the same size):

* DP, DiLoCo and Streaming with :math:`\\tau = 0` (blocking transfers): the bandwidth
  at which the transfers of one sync period leave a fraction :math:`u` of the wall time
  to compute, :math:`W = V / (H T (1-u)/u)` with :math:`H = 1` for DP
  (:func:`~analysis.roofline.required_bandwidth`; Streaming sends the same :math:`V`
  per :math:`H` steps as DiLoCo, in :math:`P` pieces);
* Streaming with :math:`\\tau \\ge 1`: the bandwidth at which every fragment arrives
  within its :math:`\\tau` steps of overlap, so that no step waits,
  :math:`W = V_\\max / (\\min(\\tau, H/P)\\, T)`
  (:func:`~analysis.roofline.hidden_bandwidth`).
"""

from __future__ import annotations

import dataclasses
import numbers

import pandas as pd

from analysis import _checks
from analysis import roofline as rl
from analysis.hardware import HardwareSpec
from analysis.hardware import get_hardware
from analysis.models import fragment_sizes
from analysis.models import get_model
from analysis.models import model_stats
from diloco_core.model_config import ModelConfig

GBIT = 1e9 / 8  # bytes/s in one Gbit/s
SYNC_EVERY_LADDER = (10, 20, 50, 100, 200, 500, 1000)  # H candidates, besides L + 1
OVERLAPS = (0, 1, 5)  # τ candidates for Streaming


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
  """Inputs, derived sizes, the candidates table and the suggestion of :func:`plan_run`.

  ``table`` is indexed by label ("DP", "DiLoCo H=…", "Streaming H=… P=… tau=…") with
  columns ``method``, ``H``, ``P``, ``tau``, ``Gbit/s per slice`` (needed for the
  target), ``GB per sync`` (largest transfer: the whole model for DP and DiLoCo, the
  largest fragment for Streaming), ``memory GB/replica``, ``memory GB/chip``,
  ``fits DCN`` and ``fits link``.
  """

  model: str | ModelConfig  # as given: a catalog name or a ModelConfig
  hardware: str | HardwareSpec  # as given: a catalog name or a HardwareSpec
  slices: int  # M, one replica per slice
  chips_per_slice: int
  seq_len: int
  global_batch_tokens: int  # tokens per step over all slices
  mfu: float
  target: float  # compute utilization planned for
  link_gbps: float  # the cross-slice link to plan for, Gbit/s per slice
  bits: float  # bits per value on the wire
  sync_every: tuple[int, ...] | None  # H candidates asked for (None: L + 1 and the ladder)
  overlaps: tuple[int, ...]  # τ candidates for Streaming
  step_time: float  # seconds per inner step
  tokens_per_slice: float
  params: int  # total parameters (communicated and stored)
  active_params: int  # parameters a token touches (compute)
  layers: int  # L
  dcn_gbps: float  # the slice's share of the in-pod DCN, Gbit/s
  dp_critical_tokens: float  # rl.dp_critical_batch_per_slice, tokens per slice
  table: pd.DataFrame
  choice: str | None  # label of the suggested row, None when nothing fits
  reason: str  # one sentence saying why

  def command(self) -> list[str]:
    """The ``python -m analysis plan ...`` argv that reproduces this plan.

    Raises:
      ValueError: the model or hardware is not a catalog name.
    """
    for name in ("model", "hardware"):
      if not isinstance(getattr(self, name), str):
        raise ValueError(f"Plan.command() needs a catalog name for {name}, got "
                         f"{type(getattr(self, name)).__name__}.")
    argv = ["python", "-m", "analysis", "plan", "--model", self.model, "--hardware",
            self.hardware, "--slices", str(self.slices), "--chips-per-slice",
            str(self.chips_per_slice), "--seq-len", str(self.seq_len), "--global-batch-tokens",
            str(self.global_batch_tokens), "--mfu", str(self.mfu), "--target", str(self.target),
            "--link-gbps", str(self.link_gbps), "--bits", str(self.bits)]
    if self.sync_every is not None:
      argv += ["--sync-every", *map(str, self.sync_every)]
    if self.overlaps != OVERLAPS:
      argv += ["--overlaps", *map(str, self.overlaps)]
    return argv


def _number(name, value, check):
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise ValueError(f"{name} must be a number, got {value!r}.")
  return float(check(name, value))


def _ints(name, values, check) -> tuple[int, ...]:
  if isinstance(values, str):
    raise ValueError(f"{name} must be an integer or a sequence of integers, got {values!r}.")
  values = (values,) if isinstance(values, numbers.Integral) else values
  try:
    values = tuple(values)
  except TypeError:
    raise ValueError(
        f"{name} must be an integer or a sequence of integers, got {values!r}.") from None
  if not values:
    raise ValueError(f"{name} must not be empty.")
  return tuple(sorted({check(name, v) for v in values}))


def largest_fragments(sync_every: int, layers: int) -> int:
  """Largest P valid with H: :math:`H \\bmod P = 0` and :math:`P = 1` or :math:`(P-1) \\mid L`.

  Args:
    sync_every: H.
    layers: L.

  Returns:
    P (1 when no P > 1 is valid).

  Examples:
    >>> largest_fragments(37, 36), largest_fragments(100, 36), largest_fragments(10, 48)
    (37, 10, 5)
  """
  return max(p for p in range(1, sync_every + 1)
             if sync_every % p == 0 and (p == 1 or layers % (p - 1) == 0))


def plan_run(model, hardware, *, slices, chips_per_slice, seq_len, global_batch_tokens,
             link_gbps, mfu=0.5, target=0.95, bits=16, sync_every=None,
             overlaps=OVERLAPS) -> Plan:
  """Candidates (H, P, τ) for M slices, their bandwidth and memory, and a suggestion.

  The step time of one slice of :math:`n` chips on :math:`B/M` tokens is

  .. math::
     T = \\frac{F_\\text{token}\\, B / M}{n\\, C\\, \\text{MFU}}

  Candidates: DP; for every :math:`H` (``sync_every``, default :math:`L + 1` and
  ``SYNC_EVERY_LADDER``), DiLoCo (:math:`P = 1, \\tau = 0`) and Streaming with the largest
  :math:`P` SPEC.md allows (:func:`largest_fragments`; for :math:`H = L + 1` that is
  MaxText's :math:`H = P = L + 1`, one layer per fragment) and each τ of ``overlaps``
  with :math:`\\tau < H`. At fixed :math:`H` and τ the largest :math:`P` needs the least
  bandwidth: :math:`V / (\\min(P\\tau, H)\\,T)` for τ ≥ 1 with fragments of equal size, the
  same for every :math:`P` when τ = 0, and it sends the smallest transfers. Bandwidths
  follow the module docstring.

  Selection rule, with :math:`W_c` the bandwidth candidate :math:`c` needs and
  :math:`W` the link:

  1. if :math:`W_\\text{DP} \\le W`, choose DP (no reason to trade quality);
  2. else, among the DiLoCo/Streaming candidates with :math:`W_c \\le W`, choose the
     smallest :math:`H` (the most frequent sync the link carries; the tuning guide's H × M
     sweep measures the loss against :math:`H`: this is a starting point to tune from, not a
     measured optimum), then the smallest τ (a merge τ steps late brings staler global
     parameters), then the largest :math:`P` (the lowest peak bandwidth):
     :math:`\\arg\\min_{c:\\,W_c \\le W}\\,(H_c, \\tau_c, -P_c)`;
  3. if none fits, no choice; the reason names the least bandwidth any candidate needs.

  Memory and HBM are reported, not used by the rule.

  Args:
    model: a catalog name (:mod:`analysis.models`) or a ModelConfig.
    hardware: a catalog name (:mod:`analysis.hardware`) or a HardwareSpec.
    slices: M, slices joined by the link, one replica each.
    chips_per_slice: n, chips in one slice.
    seq_len: context length for the attention FLOPs.
    global_batch_tokens: B, tokens per step over all slices.
    link_gbps: W, the cross-slice link per slice, Gbit/s.
    mfu: model FLOPs utilization of the inner step, in (0, 1].
    target: utilization the blocking candidates are planned for, in (0, 1).
    bits: bits per value on the wire (16: bf16).
    sync_every: H candidates (an int or a sequence); None for :math:`L + 1` and the ladder.
    overlaps: τ candidates for Streaming (an int or a sequence of integers >= 0).

  Returns:
    A :class:`Plan`.

  Raises:
    ValueError: one line naming the bad option and what it accepts.

  Examples:
    >>> p = plan_run("qwen3-8b", "v5p", slices=2, chips_per_slice=64, seq_len=4096,
    ...              global_batch_tokens=2**21, link_gbps=100)
    >>> round(p.step_time, 3), round(float(p.table.loc["DP", "Gbit/s per slice"]), 1)
    (3.759, 662.4)
    >>> p.choice
    'Streaming H=10 P=10 tau=0'
    >>> p.reason  # doctest: +NORMALIZE_WHITESPACE
    'DP needs 662.4 Gbit/s per slice, more than the 100 Gbit/s link; Streaming H=10 P=10
    tau=0 needs 66.24 Gbit/s and has the smallest H that fits (then the smallest tau, then
    the largest P).'
    >>> plan_run("qwen3-8b", "v5p", slices=2, chips_per_slice=64, seq_len=4096,
    ...          global_batch_tokens=2**21, link_gbps=1000).choice
    'DP'
  """
  cfg = get_model(model)
  hw = get_hardware(hardware)
  m = _checks.positive_int("slices", slices)
  n = _checks.positive_int("chips_per_slice", chips_per_slice)
  seq = _checks.positive_int("seq_len", seq_len)
  gbt = _checks.positive_int("global_batch_tokens", global_batch_tokens)
  link = _number("link_gbps", link_gbps, _checks.positive)
  mfu_f = _number("mfu", mfu, _checks.positive)
  if mfu_f > 1:
    raise ValueError(f"mfu must be in (0, 1], got {mfu!r}.")
  u = _number("target", target, _checks.fraction)
  b = _number("bits", bits, _checks.positive)
  hs = None if sync_every is None else _ints("sync_every", sync_every, _checks.positive_int)
  taus = _ints("overlaps", overlaps, _checks.nonneg_int)

  stats = model_stats(cfg, seq)
  L = cfg.n_layers
  tokens_slice = gbt / m
  step = rl.t_math(stats.flops_per_token * tokens_slice, n * hw.peak_flops * mfu_f)
  payload = rl.payload_bytes(stats.total_params, b, m)  # whole model, per replica
  dcn_gbps = hw.dcn_bandwidth * n / GBIT

  candidates = [("DP", "dp", 1, 1, 0)]
  for h in (sorted({L + 1, *SYNC_EVERY_LADDER}) if hs is None else hs):
    candidates.append((f"DiLoCo H={h}", "diloco", h, 1, 0))
    p = largest_fragments(h, L)
    if p > 1:
      candidates += [(f"Streaming H={h} P={p} tau={t}", "streaming", h, p, t)
                     for t in taus if t < h]
  rows = {}
  for label, method, h, p, tau in candidates:
    largest = rl.payload_bytes(max(fragment_sizes(cfg, p)), b, m)
    if tau == 0:  # blocking: the average over a period of H steps
      w = rl.required_bandwidth(u, payload, step, h)
    else:
      w = rl.hidden_bandwidth(largest, step, tau, h / p)
    mem = rl.memory_per_replica(cfg, method=method, sync_every=h, fragments=p, overlap=tau).total
    rows[label] = {"method": method, "H": h, "P": p, "tau": tau, "Gbit/s per slice": w / GBIT,
                   "GB per sync": largest / 1e9, "memory GB/replica": mem / 1e9,
                   "memory GB/chip": mem / n / 1e9, "fits DCN": w / GBIT <= dcn_gbps,
                   "fits link": w / GBIT <= link}
  table = pd.DataFrame.from_dict(rows, orient="index").rename_axis("label")
  choice, reason = _select(table, link)
  return Plan(model=model, hardware=hardware, slices=m, chips_per_slice=n, seq_len=seq,
              global_batch_tokens=gbt, mfu=float(mfu), target=float(target),
              link_gbps=float(link_gbps), bits=bits, sync_every=hs, overlaps=taus,
              step_time=step, tokens_per_slice=tokens_slice, params=stats.total_params,
              active_params=stats.active_params, layers=L, dcn_gbps=dcn_gbps,
              dp_critical_tokens=rl.dp_critical_batch_per_slice(
                  hw, model=cfg, seq_len=seq, bits=b, replicas=m),
              table=table, choice=choice, reason=reason)


def _select(table: pd.DataFrame, link: float) -> tuple[str | None, str]:
  """The selection rule of :func:`plan_run`: (label or None, one sentence)."""
  gbps = table["Gbit/s per slice"]
  dp = gbps["DP"]
  if table.loc["DP", "fits link"]:
    return "DP", (f"DP needs {dp:,.4g} Gbit/s per slice, within the {link:,.4g} Gbit/s link, "
                  f"so there is no reason to trade quality for bandwidth.")
  others = table[table["method"] != "dp"]
  fits = others[others["fits link"]]
  if fits.empty:
    least = others["Gbit/s per slice"].idxmin()
    return None, (f"No candidate fits the {link:,.4g} Gbit/s link: DP needs {dp:,.4g} Gbit/s "
                  f"per slice and the least demanding, {least}, needs "
                  f"{gbps[least]:,.4g} Gbit/s.")
  order = fits.assign(neg_p=-fits["P"]).sort_values(["H", "tau", "neg_p"], kind="stable")
  best = order.index[0]
  return best, (f"DP needs {dp:,.4g} Gbit/s per slice, more than the {link:,.4g} Gbit/s link; "
                f"{best} needs {gbps[best]:,.4g} Gbit/s and has the smallest H that fits "
                f"(then the smallest tau, then the largest P).")
