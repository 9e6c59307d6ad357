"""Pick H (``sync_every``), P (``fragments``) and τ (``overlap``) for a run across slices.

:func:`plan_run` lists trainer configurations that are valid under the schedule rules of
``diloco_core.spec.validity`` (the semantics page, docs/semantics.md): DP, DiLoCo
and Streaming DiLoCo for a ladder of :math:`H`. It computes for each the cross-slice
bandwidth it needs and its memory with the closed forms of :mod:`analysis.planning.bandwidth` and
:mod:`analysis.planning.memory` (:func:`~analysis.planning.candidates.candidate_table`, which ``python -m analysis roofline`` uses too),
and applies one documented selection rule against the bandwidth of the link (:func:`plan_run`:
DP if it fits, else the smallest :math:`H` that fits but not below a quality floor,
:data:`MIN_SYNC_EVERY`). The result is a :class:`Plan`; ``python -m analysis plan`` prints it and :meth:`Plan.command`
gives that command line.

Bandwidth per slice, with :math:`T` the step time, :math:`u` the target utilization,
:math:`V` the bytes a replica sends to all-reduce the whole model
(:func:`~analysis.planning.bandwidth.payload_bytes`) and :math:`V_\\max` those of the largest
fragment (fragment 0 holds the embeddings, so fragments are not all the same size).
Every payload is reduced layer by layer while the backward pass of the step that sends
it runs, as in the Streaming DiLoCo paper's simulation (:func:`~analysis.planning.candidates.candidate_bandwidth`):

* DP, DiLoCo and Streaming with :math:`\\tau = 0`: the bandwidth at which the waits of
  one sync period leave a fraction :math:`u` of the wall time to compute. DP and DiLoCo
  send :math:`V` in :math:`L` chunks every :math:`1` or :math:`H` steps
  (:func:`~analysis.planning.bandwidth.required_bandwidth`); Streaming sends its :math:`P - 1`
  strided layer fragments and fragment 0 (the embeddings and head, taken as released
  when its step ends) one every :math:`H/P` steps
  (:func:`~analysis.planning.bandwidth.streaming_required_bandwidth`);
* with :math:`\\tau \\ge 1`: the bandwidth at which every fragment arrives within the
  rest of its step's backward pass and its :math:`\\tau` steps of overlap, so that no
  step waits (:func:`~analysis.planning.bandwidth.hidden_bandwidth`);
* DiLoCo with eager updates (``outer_overlap="eager"``, label "DiLoCo H=… eager", with
  ``plan_run(..., eager=True)``): the
  sync may arrive until the next one is sent, H steps later: the same rule with
  :math:`\\tau = H - 1`. At one H, the selection takes it after the other candidates
  (it trades some quality for bandwidth, like :math:`\\tau`).

These are the simulator's accounting (:mod:`analysis.planning.simulate` checks them).
"""

from __future__ import annotations

import dataclasses
import numbers

import pandas as pd

from analysis.planning.candidates import GBIT
from analysis.planning.candidates import OVERLAPS
from analysis.planning.candidates import SYNC_EVERY_LADDER
from analysis.planning.candidates import check_overlaps
from analysis.planning.candidates import candidate_bandwidth
from analysis.planning.candidates import candidate_table
from analysis.planning.candidates import candidates
from analysis.planning.candidates import label
from analysis.planning.candidates import largest_fragments
from analysis.planning.hardware import HardwareSpec
from analysis.planning.hardware import get_hardware
from analysis.planning.models import ModelStats
from analysis.planning.models import get_model
from analysis.planning.models import model_stats
from analysis.planning.roofline import dp_critical_batch_per_slice
from analysis.planning.roofline import t_math
from diloco_core.spec.wire_formats import DEFAULT_CHUNK
from diloco_core.spec.wire_formats import FORMATS
from diloco_core.spec.wire_formats import bits_per_element
from diloco_core.spec.wire_formats import check_topk
from diloco_core.spec.wire_formats import topk_bits_per_element
from diloco_core.spec.model_config import ModelConfig
from diloco_core.spec.validity import check_bool
from diloco_core.spec.validity import check_int
from diloco_core.spec.validity import check_real

#: The quality floor of the selection rule (``min_sync_every``, ``--min-sync-every``): no H below it
#: is suggested while a candidate at or above it fits. It is :func:`quality_floor` of the H that
#: the tuning guide's H × M sweep (stored experiment ``h_m``, one outer learning rate for every H)
#: found best at every M: syncing more often than that cost loss there. A test checks it against
#: the stored sweep. A run that retunes η for each H (the claims page tests the claim, from
#: MaxText's guide and the scaling-law paper arXiv 2503.09799, that the best η grows with H) may
#: pass 1 to plan down to the smallest H the link carries.
MIN_SYNC_EVERY = 20


@dataclasses.dataclass(frozen=True, eq=False)
class Plan:
  """Inputs, derived sizes, the candidates table and the suggestion of :func:`plan_run`.

  ``table`` is indexed by label ("DP", "DiLoCo H=…", "Streaming H=… P=… tau=…") with
  columns ``method``, ``H``, ``P``, ``tau``, ``outer overlap``, ``Gbit/s per slice`` (needed
  under the row's ``criterion``: the target utilization, or no step waiting, see
  :func:`~analysis.planning.candidates.criterion`), ``GB per sync`` (largest transfer: the whole model for DP and DiLoCo, the
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
  bits: float  # bits per value on the wire (top-k: of each kept value)
  sync_every: tuple[int, ...] | None  # H candidates asked for (None: L + 1 and the ladder)
  overlaps: tuple[int, ...]  # τ candidates for Streaming
  step_time: float  # seconds per inner step
  tokens_per_slice: float
  params: int  # total parameters (communicated and stored)
  active_params: int  # parameters a token touches (compute)
  layers: int  # L
  dcn_gbps: float  # the slice's share of the in-pod DCN, Gbit/s
  hardware_name: str  # the chip's display name (HardwareSpec.name)
  dp_critical_tokens: float  # roofline.dp_critical_batch_per_slice, tokens per slice
  table: pd.DataFrame
  choice: str | None  # label of the suggested row, None when nothing fits
  reason: str  # one sentence saying why
  eager: bool = False  # eager-update candidates ("DiLoCo H=… eager") were considered
  topk: int | None = None  # DiLoCo/Streaming send top-k sparse pseudo-gradients (None: dense)
  topk_chunk: int = DEFAULT_CHUNK  # elements per top-k chunk
  min_sync_every: int = MIN_SYNC_EVERY  # the quality floor of the selection rule
  h_bound: int | None = None  # the smallest H of a DiLoCo/Streaming candidate that fits (None: none)

  def train_args(self, label: str | None = None) -> list[str]:
    """The trainer options (``python -m diloco_core.train``) of the suggested candidate (or of
    the table's row ``label``).

    The algorithm, :math:`M` (one replica per slice), and for DiLoCo and Streaming
    :math:`H`, :math:`P`, :math:`\\tau`, the outer-overlap mode and the wire format of
    ``bits`` (16: ``bf16``). The model, data and batch options are the user's: the same
    schedule runs on the built-in presets at CPU scale as on the planned model.

    Raises:
      ValueError: nothing was suggested (no candidate fits the link), or ``bits`` is not
        the width of one of the trainer's wire formats.

    Examples:
      >>> p = plan_run("qwen3-8b", "v5p", slices=2, chips_per_slice=64, seq_len=4096,
      ...              global_batch_tokens=2**21, link_gbps=20)
      >>> " ".join(p.train_args())
      '--algorithm streaming --replicas 2 --sync-every 20 --fragments 10 --overlap 0 --compression bf16'
      >>> " ".join(p.train_args("DiLoCo H=20"))
      '--algorithm diloco --replicas 2 --sync-every 20 --compression bf16'
    """
    if label is None and self.choice is None:
      raise ValueError(f"the plan suggests nothing to train: {self.reason}")
    if label is not None and label not in self.table.index:
      raise ValueError(f"label {label!r} is not a candidate of this plan; its rows: {list(self.table.index)}.")
    row = self.table.loc[self.choice if label is None else label]
    argv = ["--algorithm", str(row["method"]), "--replicas", str(self.slices)]
    if row["method"] == "dp":
      return argv
    wire = wire_format(self.bits)
    argv += ["--sync-every", str(int(row["H"]))]
    if row["method"] == "streaming":
      argv += ["--fragments", str(int(row["P"])), "--overlap", str(int(row["tau"]))]
    if row["outer overlap"] != "none":
      argv += ["--outer-overlap", str(row["outer overlap"])]
    argv += ["--compression", wire]
    if self.topk is not None:
      argv += ["--topk", str(self.topk), "--topk-chunk", str(self.topk_chunk), "--error-feedback"]
    return argv

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
    if self.eager:
      argv += ["--eager"]
    if self.topk is not None:
      argv += ["--topk", str(self.topk), "--topk-chunk", str(self.topk_chunk)]
    if self.min_sync_every != MIN_SYNC_EVERY:
      argv += ["--min-sync-every", str(self.min_sync_every)]
    return argv


def wire_format(bits: float) -> str:
  """The trainer's wire format (``--compression``) that sends ``bits`` per value; else one line.

  Examples:
    >>> wire_format(16), wire_format(4)
    ('bf16', 'fp4')
  """
  wire = [f for f in FORMATS if bits_per_element(f) == bits]
  if not wire:
    raise ValueError(f"bits={bits:g} is not the width of a trainer wire format; the"
                     f" trainer sends {sorted({bits_per_element(f) for f in FORMATS})} bits.")
  return wire[0]


def _ints(name, values, *, low) -> tuple[int, ...]:
  """An int or a non-empty sequence of ints >= ``low``, as a sorted tuple without repeats."""
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
  return tuple(sorted({check_int(name, v, low=low) for v in values}))


def check_global_batch(global_batch_tokens, seq_len) -> int:
  """The global batch in tokens as an int if it holds at least one sequence; else one line.

  Examples:
    >>> check_global_batch(1, 4096)
    Traceback (most recent call last):
    ...
    ValueError: global_batch_tokens (1) must be at least seq_len (4096): a step trains on whole sequences.
  """
  gbt = check_int("global_batch_tokens", global_batch_tokens)
  if gbt < seq_len:
    raise ValueError(f"global_batch_tokens ({gbt}) must be at least seq_len ({seq_len}): a step trains"
                     " on whole sequences.")
  return gbt


def plan_run(model, hardware, *, slices, chips_per_slice, seq_len, global_batch_tokens,
             link_gbps, mfu=0.5, target=0.95, bits=16, sync_every=None,
             overlaps=OVERLAPS, eager: bool = False, topk: int | None = None,
             topk_chunk: int = DEFAULT_CHUNK, min_sync_every: int = MIN_SYNC_EVERY) -> Plan:
  """Candidates (H, P, τ) for M slices, their bandwidth and memory, and a suggestion.

  The step time of one slice of :math:`n` chips on :math:`B/M` tokens is

  .. math::
     T = \\frac{F_\\text{token}\\, B / M}{n\\, C\\, \\text{MFU}}

  Candidates: DP; for every :math:`H` (``sync_every``, default :math:`L + 1` and
  ``SYNC_EVERY_LADDER``), DiLoCo (:math:`P = 1, \\tau = 0`) and Streaming with the largest
  :math:`P` the schedule rules allow (:func:`~analysis.planning.candidates.largest_fragments`; for :math:`H = L + 1` that is
  MaxText's :math:`H = P = L + 1`, one layer per fragment) and each τ of ``overlaps``
  with :math:`\\tau < H`. At fixed :math:`H` and τ the largest :math:`P` needs the least
  bandwidth (each fragment is smaller and hides behind its own step's backward pass, for
  τ = 0 too) and sends the smallest transfers. Bandwidths follow the module docstring.

  Selection rule, with :math:`W_c` the bandwidth candidate :math:`c` needs and
  :math:`W` the link:

  1. if :math:`W_\\text{DP} \\le W`, choose DP (no reason to trade quality);
  2. else, among the DiLoCo/Streaming candidates with :math:`W_c \\le W` and
     :math:`H_c \\ge H_\\text{floor}` (``min_sync_every``), choose the smallest :math:`H`,
     then the smallest τ (a merge τ steps late brings staler global parameters), then the
     largest :math:`P` (the lowest peak bandwidth):
     :math:`\\arg\\min_{c:\\,W_c \\le W,\\,H_c \\ge H_\\text{floor}}\\,(H_c, \\tau_c, -P_c)`
     (:func:`selection_order`). The smallest :math:`H` that fits, :attr:`Plan.h_bound`, is a
     bound set by the link, not a target: in the tuning guide's H × M sweep, at one outer
     learning rate, syncing more often than the floor (:data:`MIN_SYNC_EVERY`) cost loss.
     When only candidates below the floor fit, the largest of their :math:`H` (the nearest
     to the floor);
  3. if none fits, no choice; the reason names the least bandwidth any candidate needs.

  Memory and HBM are reported, not used by the rule. Catalog names are resolved once, here,
  and the options are checked where they enter, here (``diloco_core.spec.validity``).

  Args:
    model: a catalog name (:mod:`analysis.planning.models`) or a ModelConfig.
    hardware: a catalog name (:mod:`analysis.planning.hardware`) or a HardwareSpec.
    slices: M, slices joined by the link, one replica each.
    chips_per_slice: n, chips in one slice.
    seq_len: context length for the attention FLOPs.
    global_batch_tokens: B, tokens per step over all slices.
    link_gbps: W, the cross-slice link per slice, Gbit/s.
    mfu: model FLOPs utilization of the inner step, in (0, 1].
    target: utilization the τ = 0 candidates are planned for, in (0, 1).
    bits: bits per value on the wire (16: bf16).
    sync_every: H candidates (an int or a sequence); None for :math:`L + 1` and the ladder.
    overlaps: τ candidates for Streaming (an int or a sequence of integers >= 0).
    eager: also consider DiLoCo with eager updates at each H ("DiLoCo H=… eager"; the
      semantics page, docs/semantics.md), after the other candidates of the same H.
    topk: None (dense), or DiLoCo/Streaming send the ``topk`` largest entries of each chunk
      of ``topk_chunk`` (SparseLoCo, :mod:`diloco_core.wire.sparse`), each value in ``bits`` (a
      trainer wire format's width): their payload is then
      :func:`diloco_core.spec.wire_formats.topk_bits_per_element` per parameter, indices included, while
      DP's gradients stay dense at ``bits``. The payload is treated like a dense one of that
      size (an all-reduce); a sparse all-gather, as SparseLoCo runs, moves more as M grows.
    topk_chunk: elements per top-k chunk.
    min_sync_every: :math:`H_\\text{floor}`, the quality floor of the selection rule (an integer
      >= 1; 1: the smallest H that fits, the bound).

  Returns:
    A :class:`Plan`.

  Raises:
    ValueError: one line naming the bad option and what it accepts.

  Examples:
    >>> p = plan_run("qwen3-8b", "v5p", slices=2, chips_per_slice=64, seq_len=4096,
    ...              global_batch_tokens=2**21, link_gbps=20)
    >>> round(p.step_time, 3), round(float(p.table.loc["DP", "Gbit/s per slice"]), 1)
    (3.759, 49.7)
    >>> p.choice, p.h_bound
    ('Streaming H=20 P=10 tau=0', 10)
    >>> p.reason  # doctest: +NORMALIZE_WHITESPACE
    'DP needs 49.75 Gbit/s per slice, more than the 20 Gbit/s link; Streaming H=20 P=10
    tau=0 needs 7.686 Gbit/s and has the smallest H that fits at or above the quality floor
    (H >= 20), then the smallest tau, then the largest P. The link carries H down to 10
    (Streaming H=10 P=10 tau=0, 13.46 Gbit/s), a bound rather than a target: at one outer
    learning rate, syncing more often than the floor cost loss in the tuning sweep (a floor
    of 1 plans to the bound; then retune the outer learning rate for it).'
    >>> plan_run("qwen3-8b", "v5p", slices=2, chips_per_slice=64, seq_len=4096,
    ...          global_batch_tokens=2**21, link_gbps=20, min_sync_every=1).choice
    'Streaming H=10 P=10 tau=0'
    >>> plan_run("qwen3-8b", "v5p", slices=2, chips_per_slice=64, seq_len=4096,
    ...          global_batch_tokens=2**21, link_gbps=100).choice
    'DP'
  """
  cfg, hw = get_model(model), get_hardware(hardware)
  m = check_int("slices", slices)
  n = check_int("chips_per_slice", chips_per_slice)
  seq = check_int("seq_len", seq_len)
  gbt = check_global_batch(global_batch_tokens, seq)
  link = check_real("link_gbps", link_gbps, low=0.0, low_open=True)
  mfu_f = check_real("mfu", mfu, low=0.0, high=1.0, low_open=True, high_open=False)
  u = check_real("target", target, low=0.0, high=1.0, low_open=True)
  b = check_real("bits", bits, low=0.0, low_open=True)
  wire_bits = b
  if topk is not None:
    check_topk(topk, topk_chunk)
    wire_bits = topk_bits_per_element(k=topk, chunk=topk_chunk, name=wire_format(b))
  hs = None if sync_every is None else _ints("sync_every", sync_every, low=1)
  floor = check_int("min_sync_every", min_sync_every, low=1)
  taus = _ints("overlaps", overlaps, low=0)
  check_overlaps(taus, cfg.n_layers, hs)

  stats = model_stats(cfg, seq)
  tokens_slice = gbt / m
  step = step_time(stats, hw, tokens_slice, n, mfu_f)
  cands = candidates(cfg.n_layers, hs, taus, check_bool("eager", eager))
  table = candidate_table(cfg, hw, cands, slices=m,
                          chips_per_slice=n, step_time=step, target=u, bits=wire_bits, dp_bits=b)
  table["fits link"] = table["Gbit/s per slice"] <= link
  choice, reason = _select(table, link, floor)
  fitting = table[(table["method"] != "dp") & table["fits link"]]
  h_bound = int(fitting["H"].min()) if not fitting.empty else None
  return Plan(model=model, hardware=hardware, slices=m, chips_per_slice=n, seq_len=seq,
              global_batch_tokens=gbt, mfu=float(mfu), target=float(target),
              link_gbps=float(link_gbps), bits=bits, sync_every=hs, overlaps=taus,
              step_time=step, tokens_per_slice=tokens_slice, params=stats.total_params,
              active_params=stats.active_params, layers=cfg.n_layers,
              dcn_gbps=hw.dcn_bandwidth * n / GBIT, hardware_name=hw.name,
              dp_critical_tokens=dp_critical_batch_per_slice(
                  hw, model=cfg, seq_len=seq, bits=b, replicas=m),
              table=table, choice=choice, reason=reason, eager=eager, topk=topk,
              topk_chunk=topk_chunk, min_sync_every=floor, h_bound=h_bound)


def step_time(stats: ModelStats, hardware: HardwareSpec, tokens_per_slice: float,
              chips_per_slice: int, mfu: float) -> float:
  """Seconds of one inner step of a slice: :math:`T = F_\\text{token} (B/M) / (n C\\,\\text{MFU})`.

  Examples:
    >>> from analysis.planning.hardware import get_hardware
    >>> from analysis.planning.models import model_stats
    >>> round(step_time(model_stats("8B"), get_hardware("v5p"), 2**20, 256, 1.0), 3)
    0.517
  """
  return t_math(stats.flops_per_token * tokens_per_slice,
                chips_per_slice * hardware.peak_flops * mfu)


def quality_floor(best_sync_every: int, ladder=SYNC_EVERY_LADDER) -> int:
  """The default quality floor for a measured best H: the largest rung of the H ladder not above
  it (1 when every rung is above it), so that the floor never rules out the H measured best.

  Examples:
    >>> quality_floor(24), quality_floor(100), quality_floor(6)
    (20, 100, 1)
  """
  return max((h for h in ladder if h <= best_sync_every), default=1)


def selection_order(rows: pd.DataFrame, min_sync_every: int = MIN_SYNC_EVERY) -> pd.DataFrame:
  """DiLoCo/Streaming rows of :attr:`Plan.table` (those that fit) in the order of the selection
  rule of :func:`plan_run`; the first is the suggestion.

  Rows with :math:`H \\ge` ``min_sync_every`` come first, by the smallest H; then those below it,
  by the largest H. Within one H: eager updates last, then the smallest τ, then the largest P.

  Examples:
    >>> rows = pd.DataFrame({"H": [10, 10, 20, 50], "P": [1, 5, 1, 5], "tau": [0, 0, 0, 1],
    ...                      "outer overlap": "none"}, index=["a", "b", "c", "d"])
    >>> list(selection_order(rows).index), list(selection_order(rows, 1).index)
    (['c', 'd', 'b', 'a'], ['b', 'a', 'c', 'd'])
  """
  below = rows["H"] < min_sync_every
  return rows.assign(below=below, h_key=rows["H"].where(~below, -rows["H"]), neg_p=-rows["P"],
                     eager=rows["outer overlap"] != "none").sort_values(
      ["below", "h_key", "eager", "tau", "neg_p"], kind="stable").drop(
      columns=["below", "h_key", "neg_p", "eager"])


def _select(table: pd.DataFrame, link: float, floor: int) -> tuple[str | None, str]:
  """The selection rule of :func:`plan_run`: (label or None, why)."""
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
  best = selection_order(fits, floor).index[0]
  bound = selection_order(fits, 1).index[0]
  head = (f"DP needs {dp:,.4g} Gbit/s per slice, more than the {link:,.4g} Gbit/s link; "
          f"{best} needs {gbps[best]:,.4g} Gbit/s and has ")
  tail = "then the smallest tau, then the largest P"
  if table.loc[best, "H"] < floor:
    return best, head + (f"the largest H that fits, below the quality floor (H >= {floor}): no candidate"
                         f" at or above it fits; {tail}.")
  if table.loc[bound, "H"] >= floor:
    return best, head + f"the smallest H that fits ({tail})."
  return best, head + (
      f"the smallest H that fits at or above the quality floor (H >= {floor}), {tail}. The link carries"
      f" H down to {table.loc[bound, 'H']} ({bound}, {gbps[bound]:,.4g} Gbit/s), a bound rather than"
      " a target: at one outer learning rate, syncing more often than the floor cost loss in the tuning"
      " sweep (a floor of 1 plans to the bound; then retune the outer learning rate for it).")
