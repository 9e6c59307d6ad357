"""Event simulation of compute utilization for DP, DiLoCo and Streaming DiLoCo.

The accounting is the one of the Streaming DiLoCo paper's compute-utilization
simulation (Douillard et al. 2025, arXiv 2501.18512: Figure 3 draws its schedule,
Figure 4 and Table 4 give its results, Figure 7 compares the fragment patterns) and of
its first author's public calculator (arthurdouillard.com/diloco): "the reduction of
gradients or outer gradients is overlapped over the backward pass computation".

M datacenters (replicas) run the same schedule and are joined by one WAN link of
bandwidth W (Gbit/s, 1e9 bits/s) and latency ε (seconds). The replicas are symmetric,
so one replica and the link are simulated:

* **compute**: an inner step takes T seconds, a forward pass (``forward_fraction`` φ,
  1/3) then a backward pass (2/3), each split evenly over the L layers (forward 0..L-1,
  backward L-1..0). Compute only waits on the network at step starts.
* **release**: a payload (DP's gradients, DiLoCo's outer gradients, a Streaming
  fragment's outer gradients) is cut by layer. Layers form buckets of ``bucket_layers``
  consecutive layers in backward order; the payload's share of a bucket is released
  when the backward pass of the bucket's last layer *in the sending step* finishes. So
  the first chunks leave after φT + b (b = (1-φ)T/L) and the last when the step ends.
* **link**: chunks are served first-in first-out. A chunk of V bits occupies the link
  for V / W seconds and arrives ε later (latency is pipelined).
* **payload**: values × bits of the wire format × the all-reduce factor
  :math:`2(M-1)/M` (:func:`analysis.planning.bandwidth.allreduce_factor`); M = 1 sends nothing.
* **deadline**: a payload sent during step t must have arrived before step t + τ + 1
  starts (τ = 0 for DP). DP sends every layer every step; DiLoCo every layer after
  every H-th step; Streaming DiLoCo fragment p (0-based) after the steps t with
  :math:`t \\bmod H = \\lfloor (p+1) H / P \\rfloor \\bmod H` (one fragment every H/P
  steps when P divides H, as in the semantics page (docs/semantics.md); ⌊H/P⌋ or
  ⌈H/P⌉ apart otherwise, as in the paper's setting H = 100, P = 8, 16, 36).
* **fragments**: P = L / ``fragment_layers`` fragments of layers only (the paper's
  setting: every parameter is in a layer, no embeddings fragment); layers are dealt as
  the trainer deals them (:class:`diloco_core.algorithm.fragments.Fragments`): ``"strided"``
  (default, layer i in fragment i mod P) or ``"sequential"`` (contiguous blocks). Spacing the syncs
  unevenly and having no embeddings fragment are documented exceptions to the schedule
  rules of ``diloco_core.spec.validity`` (H mod P = 0, (P − 1) | L), which the simulator does
  not apply.

So a Streaming fragment hides behind the rest of its own step's backward pass plus τ
steps, P times per period; DiLoCo hides once per period; DP hides behind the backward
pass only, every step. Utilization is compute time ÷ wall time over ``periods`` whole
sync periods (H steps; one step for DP) after ``warmup_periods`` periods, from the start
of the first measured step to the start of the step after the window. The schedule
repeats every period, so the run reaches a periodic steady state (tested). With outer overlap
a payload may arrive a whole period late, and a link slower than the payload rate fills its
queue for more periods than a short window shows, so every utilization is also capped by the
link's throughput, :func:`throughput_bound` (tested: 3 periods after 2 then read what 10
after 10 do).

The event loop (:mod:`analysis.planning.sim_events`) visits only the steps that send or wait,
and serves a step's chunks in one vectorized pass (a FIFO queue's finish time is a
cumulative maximum); every bandwidth of a grid is simulated at once.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from analysis.planning import _checks
from analysis.planning.models import get_model
from analysis.planning.roofline import METHODS
from analysis.planning.sim_events import fragment_layers_of  # noqa: F401 (public)
from analysis.planning.sim_events import run_events
from analysis.planning.sim_events import schedule
from diloco_core.spec.model_config import ModelConfig
from diloco_core.spec.model_config import param_count
from diloco_core.spec.validity import check_choice
from diloco_core.spec.validity import check_int

#: The Streaming DiLoCo paper's simulation grid: 50 log-spaced points, 0.1 .. 1000 Gbit/s.
PAPER_GRID_GBPS = np.logspace(-1, 3, 50)
PAPER_TARGETS = (0.5, 0.8, 0.9, 0.95, 0.99)
#: How :func:`bandwidth_for_utilization` reads the needed bandwidth (see there).
ROUNDINGS = ("exact", "grid", "paper")


@dataclasses.dataclass(frozen=True)
class SimModel:
  """A model as the simulator sees it: size, depth and compute time per step."""

  params: float  # N, parameters (all communicated, spread evenly over the layers)
  layers: int  # L, layers (the unit of gradient release and of fragments)
  step_time: float  # T, seconds of compute per inner step (forward + backward)

  def __post_init__(self):
    _checks.positive("SimModel.params", self.params)
    check_int("SimModel.layers", self.layers)
    _checks.positive("SimModel.step_time", self.step_time)

  @classmethod
  def from_config(cls, model: str | ModelConfig, step_time: float) -> "SimModel":
    """A catalog model (:mod:`analysis.planning.models`) with a given step time."""
    cfg = get_model(model)
    return cls(params=float(param_count(cfg)), layers=cfg.n_layers, step_time=step_time)


# The Streaming DiLoCo paper's simulation models (its Table 4): 1B / 10B / 100B
# parameters, 24 / 48 / 108 layers, 0.1 / 0.8 / 4.9 s per step.
SIM_MODELS: dict[str, SimModel] = {
    "1B": SimModel(params=1e9, layers=24, step_time=0.1),
    "10B": SimModel(params=10e9, layers=48, step_time=0.8),
    "100B": SimModel(params=100e9, layers=108, step_time=4.9),
}

#: Rows of the paper's table: (label, method, overlap, bits).
PAPER_ROWS = (
    ("DP", "dp", 0, 16),
    ("DiLoCo", "diloco", 0, 16),
    ("Streaming", "streaming", 0, 16),
    ("Streaming + overlap", "streaming", 1, 16),
    ("Streaming + overlap + 4-bit", "streaming", 1, 4),
)
# Extra rows (``paper_table(eager=True)``): (label, method, overlap, bits, outer_overlap),
# the eager-updates paper's methods (arXiv 2502.12996: Algorithm 3; its Figure 3 simulates
# their compute utilization).
EAGER_ROWS = (
    ("DiLoCo + eager", "diloco", 0, 16, "eager"),
    ("Streaming + eager", "streaming", 0, 16, "eager"),
)


def get_sim_model(model: str | SimModel) -> SimModel:
  """Returns ``SIM_MODELS`` [``model``] (case-insensitive), or ``model`` itself."""
  if isinstance(model, SimModel):
    return model
  by_lower = {k.lower(): k for k in SIM_MODELS}
  if str(model).lower() not in by_lower:
    raise ValueError(f"model must be one of {list(SIM_MODELS)} or a SimModel, got {model!r}.")
  return SIM_MODELS[by_lower[str(model).lower()]]


@dataclasses.dataclass(frozen=True, eq=False)
class SimResult:
  """Outcome of :func:`run_simulation`: utilization and the full wall-clock record."""

  utilization: float  # compute time / wall time over the measured window
  compute_time: float  # seconds of compute in the window
  wall_time: float  # seconds of wall clock in the window
  window: tuple[int, int]  # first and last measured step (1-based, inclusive)
  step_start: np.ndarray  # start time of steps 1..n (index 0 is step 1)
  step_end: np.ndarray  # end time of the same steps
  transfers: pd.DataFrame  # one row per chunk: step, fragment, ready, start, end, arrival,
  #                          bits, needed_by
  step_time: float  # T
  layers: int  # L
  forward_fraction: float  # share of T spent in the forward pass

  def timeline(self, layers: bool = False) -> pd.DataFrame:
    """Every event as a row (kind, step, layer, start, end), sorted by start time.

    Kinds: "compute" (one per step, or "forward"/"backward" per layer with
    ``layers=True``), "idle" (a step waiting on the network), "transfer" (a chunk, from
    the moment it starts to use the link to its arrival).
    """
    steps = np.arange(1, len(self.step_start) + 1)
    frames = []
    if layers:
      t, n = self.step_time, self.layers
      fwd, bwd = self.forward_fraction * t / n, (1 - self.forward_fraction) * t / n
      j = np.arange(n)
      s = self.step_start[:, None]
      for kind, start, dur, layer in (("forward", s + j * fwd, fwd, j),
                                      ("backward", s + self.forward_fraction * t + j * bwd, bwd,
                                       n - 1 - j)):
        frames.append(pd.DataFrame(dict(kind=kind, step=np.repeat(steps, n),
                                        layer=np.tile(layer, len(steps)),
                                        start=start.ravel(), end=start.ravel() + dur)))
    else:
      frames.append(pd.DataFrame(dict(kind="compute", step=steps, layer=-1,
                                      start=self.step_start, end=self.step_end)))
    idle = self.step_start[1:] - self.step_end[:-1] > 0
    frames.append(pd.DataFrame(dict(kind="idle", step=steps[1:][idle], layer=-1,
                                    start=self.step_end[:-1][idle],
                                    end=self.step_start[1:][idle])))
    frames.append(pd.DataFrame(dict(kind="transfer", step=self.transfers["step"], layer=-1,
                                    start=self.transfers["start"],
                                    end=self.transfers["arrival"])))
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(["start", "kind"], kind="stable").reset_index(drop=True)


def _prepare(model, method, *, replicas=2, sync_every=100, fragment_layers=3,
             fragment_pattern="strided", overlap=0, bits=16, latency=0.0, bucket_layers=1,
             forward_fraction=1 / 3, warmup_periods=2, periods=3, outer_overlap="none"):
  """Checks the options once; returns (model, period, plan, eps, phi, first, n_steps)."""
  m = get_sim_model(model)
  check_choice("method", method, METHODS)
  replicas = check_int("replicas", replicas)
  bits = float(_checks.positive("bits", bits))
  eps = float(_checks.nonneg("latency", latency))
  phi = float(_checks.fraction("forward_fraction", forward_fraction))
  warm = check_int("warmup_periods", warmup_periods, low=0)
  meas = check_int("periods", periods)
  period, plan = schedule(method, m, replicas=replicas, sync_every=sync_every,
                           fragment_layers=fragment_layers, fragment_pattern=fragment_pattern,
                           overlap=overlap, bits=bits, bucket_layers=bucket_layers,
                           forward_fraction=phi, outer_overlap=outer_overlap)
  if replicas == 1:
    plan = {}  # nobody to talk to
  return m, period, plan, eps, phi, warm * period + 1, (warm + meas) * period + 1


def throughput_bound(period: int, plan: dict, step_time: float, w_bps):
  r"""The utilization a link of ``w_bps`` bit/s allows in steady state, whatever the deadlines.

  .. math::
     u \le \frac{H\,T\,W}{V_\text{period}}

  (:math:`V_\text{period}`: the bits every send of one period puts on the link). A finite
  window can miss it: with outer overlap a payload may arrive a whole period late, so a link
  slower than this fills its queue period after period and stalls only once the queue
  outgrows the slack, after more periods than are simulated. Utilizations here are capped by it.

  Examples:
    >>> throughput_bound(100, {}, 0.1, 1e9)  # nothing to send
    inf
  """
  bits = sum(float(np.sum(send.sizes)) for send in plan.values())
  return np.inf if bits == 0 else period * step_time * np.asarray(w_bps, dtype=float) / bits


def _utilizations(model, method, bandwidth_gbps, **kwargs) -> np.ndarray:
  """Utilization at each bandwidth of an array (one vectorized simulation)."""
  w = _checks.positive("bandwidth_gbps", bandwidth_gbps).ravel() * 1e9
  m, period, plan, eps, _, first, n_steps = _prepare(model, method, **kwargs)
  starts, _ = run_events(period, plan, m.step_time, w, eps, n_steps, first)
  u = (n_steps - first) * m.step_time / (starts[n_steps] - starts[first])
  return np.minimum(u, throughput_bound(period, plan, m.step_time, w))


def run_simulation(model: str | SimModel, method: str, bandwidth_gbps: float, *,
                   replicas: int = 2, sync_every: int = 100, fragment_layers: int = 3,
                   fragment_pattern: str = "strided", overlap: int = 0, bits: float = 16,
                   latency: float = 0.0, bucket_layers: int = 1,
                   forward_fraction: float = 1 / 3, warmup_periods: int = 2,
                   periods: int = 3, outer_overlap: str = "none") -> SimResult:
  """Simulates training and measures compute utilization at one link bandwidth.

  .. math::
     u = \\frac{\\text{compute time}}{\\text{wall time}}
       = \\frac{n_\\text{steps}\\,T}{t_\\text{start}(\\text{step after window})
         - t_\\text{start}(\\text{first step of window})}

  See the module docstring for the event model. Closed forms it reproduces (tested):
  with per-layer chunks of :math:`d = V / (L W)` seconds and :math:`b = (1-φ)T/L`, a
  payload sent in one step leaves the link :math:`\\max(T + d,\\ φT + b + L d)` after
  the step starts, so DP's step is that plus ε and DiLoCo (τ = 0) stalls
  :math:`\\max(d,\\ Ld - (1-φ)T + b) + ε` once per period.

  Args:
    model: a ``SIM_MODELS`` name ("1B", "10B", "100B") or a :class:`SimModel`.
    method: "dp", "diloco" or "streaming".
    bandwidth_gbps: W, link bandwidth in Gbit/s (may be ``inf``).
    replicas: M, datacenters.
    sync_every: H, inner steps between two syncs of the same parameters.
    fragment_layers: layers per Streaming fragment (must divide L); P = L / this.
    fragment_pattern: "strided" or "sequential" (``diloco_core.spec.validity.FRAGMENT_PATTERNS``).
    overlap: τ, steps a (fragment) sync may take before it is merged (0 <= τ < H).
    bits: bits per value on the wire (16 bf16, 4 for fp4/e3m0).
    latency: ε, seconds each chunk adds after leaving the link.
    bucket_layers: layers per gradient bucket (must divide L); 1 releases every layer.
    forward_fraction: φ, share of a step spent in the forward pass.
    warmup_periods: sync periods simulated before measuring.
    periods: sync periods measured.
    outer_overlap: "none", "delayed" or "eager" (needs τ = 0): a (fragment) sync may
      take until the next send of the same fragment, H steps later (semantics page,
      docs/semantics.md); "delayed" and "eager" communicate alike.

  Returns:
    A :class:`SimResult` (utilization, step and transfer times, ``timeline()``).

  Examples:
    >>> # 1.6e10 bits at 10 Gbit/s: 1.6 s, of which all but the first 1/24 of the
    >>> # 0.2/3 s backward pass hides: stall 1.6 - 0.2/3 * 23/24 s per H T = 10 s.
    >>> r = run_simulation("1B", "diloco", 10.0)
    >>> round(r.utilization, 6), round(10 / (10 + 1.6 - 0.2 / 3 * 23 / 24), 6)
    (0.866843, 0.866843)
    >>> round(run_simulation("1B", "streaming", 200.0, overlap=1).utilization, 9)
    1.0

    Eager: the same 1.6 s transfer has the whole period (H T = 10 s) to arrive:

    >>> run_simulation("1B", "diloco", 10.0, outer_overlap="eager").utilization
    1.0
  """
  m, period, plan, eps, phi, first, n_steps = _prepare(
      model, method, replicas=replicas, sync_every=sync_every, fragment_layers=fragment_layers,
      fragment_pattern=fragment_pattern, overlap=overlap, bits=bits, latency=latency,
      bucket_layers=bucket_layers, forward_fraction=forward_fraction,
      warmup_periods=warmup_periods, periods=periods, outer_overlap=outer_overlap)
  w = float(_checks.positive("bandwidth_gbps", bandwidth_gbps)) * 1e9
  t = m.step_time
  at, rec = run_events(period, plan, t, [w], eps, n_steps, first, record=True)
  known = np.array(sorted(at))
  idx = np.searchsorted(known, np.arange(1, n_steps + 1), side="right") - 1
  starts = np.array([at[k][0] for k in known])[idx] + (np.arange(1, n_steps + 1) - known[idx]) * t
  compute = (n_steps - first) * t
  wall = starts[n_steps - 1] - starts[first - 1]
  transfers = pd.DataFrame(rec, columns=["step", "fragment", "ready", "start", "end", "arrival",
                                         "bits", "needed_by"])
  u = min(float(compute / wall), float(throughput_bound(period, plan, t, w)))
  return SimResult(utilization=u, compute_time=float(compute),
                   wall_time=float(wall), window=(first, n_steps - 1), step_start=starts,
                   step_end=starts + t, transfers=transfers, step_time=t, layers=m.layers,
                   forward_fraction=phi)


def utilization(model, method, bandwidth_gbps, **kwargs):
  """Compute utilization at one bandwidth, or at each of an array of them (vectorized).

  Examples:
    >>> round(utilization("1B", "dp", 1000.0), 4)
    0.9934
    >>> utilization("1B", "diloco", [1.0, 1e3]).round(4)
    array([0.3856, 0.9999])
  """
  u = _utilizations(model, method, bandwidth_gbps, **kwargs)
  return float(u[0]) if np.ndim(bandwidth_gbps) == 0 else u.reshape(np.shape(bandwidth_gbps))


def bandwidth_for_utilization(target, model, method, *, rounding="exact", grid=None,
                              rtol=1e-6, **kwargs):
  """Smallest link bandwidth (Gbit/s) at which the simulated utilization reaches ``target``.

  .. math::
     W^*(u) = \\min\\{W : u_\\text{sim}(W) \\ge u\\}

  Three readings (``rounding``):

  * ``"exact"`` bisects :math:`\\log W` to a relative precision ``rtol`` (every target at
    once): the bandwidth needed.
  * ``"grid"``: the lowest point of ``grid`` (default: the paper's 50 log-spaced points
    from 0.1 to 1000 Gbit/s) that reaches the target, i.e. :math:`W^*` rounded *up* to the
    grid: a bandwidth that is enough (at most one grid step, ×1.21, above :math:`W^*`).
  * ``"paper"``: the grid point just *below* that one, the largest one that does not yet
    reach the target (:math:`W^*` rounded *down*; the lowest grid point when the first
    already reaches it): a lower bound, at most one step below :math:`W^*`. The paper does
    not say how it reads its grid; this is the reading that reproduces its Table 4 (see
    :mod:`analysis.planning.paper_tables` and the roofline page, which count the equal cells).

  Unreachable targets give ``inf`` (``"grid"`` / ``"paper"``: not reached within the grid;
  ``"exact"``: not even at 1e9 Gbit/s, e.g. when the latency alone costs more than the
  allowed idle time).

  Args:
    target: u in (0, 1), or a sequence of them.
    model: a SIM_MODELS name or a SimModel.
    method: "dp", "diloco" or "streaming".
    rounding: one of :data:`ROUNDINGS`: "exact", "grid" or "paper".
    grid: increasing bandwidths (Gbit/s) for ``rounding="grid"`` / ``"paper"``.
    rtol: relative precision of the exact value.
    **kwargs: the other arguments of :func:`run_simulation` (replicas, sync_every, ...).

  Returns:
    Gbit/s: a float for a scalar target, an array otherwise.

  Examples:
    >>> # DiLoCo, 1B, 16-bit, M=2, H=100: V / W = 10 s * 0.05/0.95 + 0.2/3 * 23/24
    >>> round(bandwidth_for_utilization(0.95, "1B", "diloco"), 3)
    27.109
    >>> round(bandwidth_for_utilization(0.95, "1B", "diloco", rounding="grid"), 3)
    28.118
    >>> round(bandwidth_for_utilization(0.95, "1B", "diloco", rounding="paper"), 3)  # the paper: 23.3
    23.3
  """
  check_choice("rounding", rounding, ROUNDINGS)
  targets = _checks.fraction("target", target)
  flat = targets.ravel()
  util = lambda w: _utilizations(model, method, w, **kwargs)  # noqa: E731
  if rounding in ("grid", "paper"):
    g = PAPER_GRID_GBPS if grid is None else _checks.positive("grid", grid).ravel()
    if np.any(np.diff(g) <= 0):
      raise ValueError("grid must be strictly increasing.")
    reached = util(g)[None, :] >= flat[:, None]
    first = np.argmax(reached, axis=1)
    if rounding == "paper":
      first = np.maximum(first - 1, 0)
    res = np.where(reached.any(axis=1), g[first], np.inf)
  else:
    _checks.positive("rtol", rtol)
    res = _bisect(util, flat, rtol)
  res = np.asarray(res, dtype=float).reshape(targets.shape)
  return float(res) if res.ndim == 0 else res


def _bisect(util, targets, rtol, lo=1e-6, hi=1e9):
  """Bisection of log W for every target at once (utilization is monotone in W)."""
  bounds = util(np.array([lo, hi]))
  llo, lhi = np.full(targets.shape, np.log(lo)), np.full(targets.shape, np.log(hi))
  while np.any(lhi - llo > np.log1p(rtol)):
    mid = 0.5 * (llo + lhi)
    ok = util(np.exp(mid)) >= targets
    lhi, llo = np.where(ok, mid, lhi), np.where(ok, llo, mid)
  return np.where(bounds[1] < targets, np.inf, np.where(bounds[0] >= targets, lo, np.exp(lhi)))


def paper_table(*, rounding="grid", models=("1B", "10B", "100B"), targets=PAPER_TARGETS,
                replicas=2, sync_every=100, fragment_layers=3, latency=0.0, eager=False,
                **kwargs) -> pd.DataFrame:
  """The Streaming DiLoCo paper's simulation table: bandwidth for each utilization target.

  Rows: model × {DP, DiLoCo, Streaming, Streaming + overlap (τ = 1), Streaming + overlap
  + 4-bit}; columns: targets. The paper's settings (its Table 4 and its caption): M = 2,
  H = 100, fragments of 3 layers, 16-bit payloads (4-bit in the last row), the models of
  ``SIM_MODELS``, gradients and outer gradients reduced layer by layer during the
  sending step's backward pass.

  Args:
    rounding: "grid" (the first point of the paper's 50-point log grid that reaches the
      target), "paper" (the point below it: the reading that reproduces the paper's table)
      or "exact" (see :func:`bandwidth_for_utilization`).
    models: names of ``SIM_MODELS`` (or SimModels).
    targets: utilization targets (columns).
    replicas, sync_every, fragment_layers, latency: simulation settings.
    eager: also the rows of ``EAGER_ROWS`` (whole outer step overlapped, after the
      eager-updates paper, arXiv 2502.12996), after each model's five rows.
    **kwargs: other options of :func:`run_simulation` (fragment_pattern, bucket_layers, ...).

  Returns:
    A DataFrame of Gbit/s, indexed by (model, method), one column per target.

  Examples:
    >>> t = paper_table(models=("1B",), targets=(0.5,))
    >>> t.shape
    (5, 1)
    >>> paper_table(models=("1B",), targets=(0.5,), eager=True).shape
    (7, 1)
  """
  rows, index = [], []
  for name in models:
    sim_model = get_sim_model(name)
    label_model = name if isinstance(name, str) else "custom"
    extra = EAGER_ROWS if eager else ()
    for label, method, overlap, bits, mode in [(*r, "none") for r in PAPER_ROWS] + list(extra):
      rows.append(np.atleast_1d(bandwidth_for_utilization(
          list(targets), sim_model, method, rounding=rounding, replicas=replicas,
          sync_every=sync_every, fragment_layers=fragment_layers, overlap=overlap, bits=bits,
          latency=latency, outer_overlap=mode, **kwargs)))
      index.append((label_model, label))
  cols = [f"{u:.0%}" for u in targets]
  return pd.DataFrame(np.vstack(rows), index=pd.MultiIndex.from_tuples(
      index, names=["model", "method"]), columns=cols)
