"""Discrete-event simulation of compute utilization for DP, DiLoCo and Streaming DiLoCo.

M datacenters (replicas) run the same schedule and are joined by one WAN link of
bandwidth W (Gbit/s, 1e9 bits/s) and latency ε (seconds). Because the replicas are
symmetric, one replica and the link are simulated:

* **compute**: each inner step takes T seconds, a forward pass (``forward_fraction``,
  1/3) then a backward pass (2/3), each split evenly over the L layers (forward layer
  0..L-1, backward layer L-1..0). No compute event waits on the network inside a
  step; the only blocking dependencies are at step starts.
* **link**: transfers are served first-in first-out. A transfer of V bits occupies the
  link for V / W seconds (serialization) and arrives ε later; the next transfer may
  start serializing as soon as the previous one has left (latency is pipelined).
* **payload**: values × bits of the wire format × the all-reduce factor
  :math:`2(M-1)/M` (:func:`analysis.roofline.allreduce_factor`); M = 1 sends nothing.
* **DP**: each layer's gradients are reduced as soon as that layer's backward pass
  finishes (overlapping the rest of the backward pass); step t+1 starts when every
  reduction of step t has arrived.
* **DiLoCo**: after every H-th step the whole model is all-reduced; with overlap τ = 0
  step t+1 waits for it (with τ > 0, step t+τ+1 does).
* **Streaming DiLoCo**: the L layers form P = L / ``fragment_layers`` fragments. Fragment
  p (0-based) is sent after the steps t with :math:`t \\bmod H = \\lfloor (p+1) H / P
  \\rfloor \\bmod H` and must have arrived before step :math:`t + \\tau + 1` starts.
  When P divides H this is SPEC.md's schedule (one fragment every Δh = H/P steps); the
  paper's setting (H = 100 with 8, 16 or 36 fragments) needs the general form, which
  spaces the syncs ⌊H/P⌋ or ⌈H/P⌉ steps apart.
* A DiLoCo or Streaming transfer becomes ready at the end of its sending step (SPEC.md
  computes the pseudo-gradient after that step's inner update), so with overlap τ it
  can hide behind the τ steps before its merge (:func:`analysis.roofline.hidden_bandwidth`).

Utilization is compute time ÷ wall time over ``periods`` whole sync periods (H steps;
one step for DP) after ``warmup_periods`` periods, measured from the start of the
first measured step to the start of the step after the window, so that the waits the
window's transfers cause are counted. The schedule repeats every period, so the run
reaches a periodic steady state; the tests check that longer runs give the same values.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pandas as pd

from analysis import _checks
from analysis.models import get_model
from diloco_core.model_config import ModelConfig
from diloco_core.model_config import param_count

METHODS = ("dp", "diloco", "streaming")
# The Streaming DiLoCo paper's simulation grid: 50 log-spaced points, 0.1 .. 1000 Gbit/s.
PAPER_GRID_GBPS = np.logspace(-1, 3, 50)
PAPER_TARGETS = (0.5, 0.8, 0.9, 0.95, 0.99)


@dataclasses.dataclass(frozen=True)
class SimModel:
  """A model as the simulator sees it: size, depth and compute time per step."""

  params: float  # N, parameters (all communicated)
  layers: int  # L, layers (the unit of DP's per-layer reductions and of fragments)
  step_time: float  # T, seconds of compute per inner step (forward + backward)

  def __post_init__(self):
    _checks.positive("SimModel.params", self.params)
    _checks.positive_int("SimModel.layers", self.layers)
    _checks.positive("SimModel.step_time", self.step_time)

  @classmethod
  def from_config(cls, model: str | ModelConfig, step_time: float) -> "SimModel":
    """A catalog model (:mod:`analysis.models`) with a given step time."""
    cfg = get_model(model)
    return cls(params=float(param_count(cfg)), layers=cfg.n_layers, step_time=step_time)


# The Streaming DiLoCo paper's simulation models: 1B / 10B / 100B parameters, 24 / 48 /
# 108 layers, 0.1 / 0.8 / 4.9 s per step.
SIM_MODELS: dict[str, SimModel] = {
    "1B": SimModel(params=1e9, layers=24, step_time=0.1),
    "10B": SimModel(params=10e9, layers=48, step_time=0.8),
    "100B": SimModel(params=100e9, layers=108, step_time=4.9),
}

# Rows of the paper's table: (label, method, overlap, bits).
PAPER_ROWS = (
    ("DP", "dp", 0, 16),
    ("DiLoCo", "diloco", 0, 16),
    ("Streaming", "streaming", 0, 16),
    ("Streaming + overlap", "streaming", 1, 16),
    ("Streaming + overlap + 4-bit", "streaming", 1, 4),
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
  transfers: pd.DataFrame  # one row per transfer: step, ready, start, end, arrival, bits, needed_by
  step_time: float  # T
  layers: int  # L
  forward_fraction: float  # share of T spent in the forward pass

  def timeline(self, layers: bool = False) -> pd.DataFrame:
    """Every event as a row (kind, step, layer, start, end), sorted by start time.

    Kinds: "compute" (one per step, or "forward"/"backward" per layer with
    ``layers=True``), "idle" (a step waiting on the network), "transfer" (from the
    moment it starts to use the link to its arrival).
    """
    steps = np.arange(1, len(self.step_start) + 1)
    frames = []
    if layers:
      t, n = self.step_time, self.layers
      fwd, bwd = self.forward_fraction * t / n, (1 - self.forward_fraction) * t / n
      j = np.arange(n)
      s = self.step_start[:, None]
      fwd_start = s + j * fwd
      bwd_start = s + self.forward_fraction * t + j * bwd
      for kind, start, dur, layer in (("forward", fwd_start, fwd, j), ("backward", bwd_start,
                                                                        bwd, n - 1 - j)):
        frames.append(pd.DataFrame(dict(kind=kind, step=np.repeat(steps, n),
                                        layer=np.tile(layer, len(steps)),
                                        start=start.ravel(), end=start.ravel() + dur)))
    else:
      frames.append(pd.DataFrame(dict(kind="compute", step=steps, layer=-1,
                                      start=self.step_start, end=self.step_end)))
    gap = self.step_start[1:] - self.step_end[:-1]
    idle = gap > 0
    frames.append(pd.DataFrame(dict(kind="idle", step=steps[1:][idle], layer=-1,
                                    start=self.step_end[:-1][idle],
                                    end=self.step_start[1:][idle])))
    frames.append(pd.DataFrame(dict(kind="transfer", step=self.transfers["step"], layer=-1,
                                    start=self.transfers["start"],
                                    end=self.transfers["arrival"])))
    out = pd.concat(frames, ignore_index=True)
    return out.sort_values(["start", "kind"], kind="stable").reset_index(drop=True)


def _fragments(layers: int, fragment_layers: int) -> int:
  fl = _checks.positive_int("fragment_layers", fragment_layers)
  if layers % fl:
    raise ValueError(f"fragment_layers ({fl}) must divide the number of layers ({layers}).")
  return layers // fl


def _schedule(method, model, *, replicas, sync_every, fragment_layers, overlap, bits,
              forward_fraction):
  """(period, {step mod period: [(offset_s, bits, delay)]}): what each step sends.

  ``offset_s`` is when, within the step, the transfer becomes ready; ``delay`` is how
  many steps later it must have arrived (step t's transfer blocks step t + delay).
  """
  factor = 2.0 * (replicas - 1) / replicas
  t, n = model.step_time, model.layers
  if method == "dp":
    per_layer = model.params / n * bits * factor
    bwd = (1.0 - forward_fraction) * t / n
    offsets = forward_fraction * t + bwd * np.arange(1, n + 1)  # backward of L-1, ..., 0
    return 1, {0: [(float(o), per_layer, 1) for o in offsets]}
  h = _checks.positive_int("sync_every", sync_every)
  tau = _checks.nonneg_int("overlap", overlap)
  if tau >= h:
    raise ValueError(f"overlap must be < sync_every ({h}), got {tau}.")
  p = 1 if method == "diloco" else _fragments(n, fragment_layers)
  if p > h:
    raise ValueError(f"fragments ({p} = layers / fragment_layers) must be <= sync_every ({h}).")
  size = model.params / p * bits * factor
  plan: dict[int, list] = {}
  for frag in range(p):
    plan.setdefault(((frag + 1) * h // p) % h, []).append((t, size, tau + 1))
  return h, plan


def run_simulation(model: str | SimModel, method: str, bandwidth_gbps: float, *,
                   replicas: int = 2, sync_every: int = 100, fragment_layers: int = 3,
                   overlap: int = 0, bits: float = 16, latency: float = 0.0,
                   forward_fraction: float = 1 / 3, warmup_periods: int = 2,
                   periods: int = 3) -> SimResult:
  """Simulates training and measures compute utilization at one link bandwidth.

  .. math::
     u = \\frac{\\text{compute time}}{\\text{wall time}}
       = \\frac{n_\\text{steps}\\,T}{t_\\text{start}(\\text{step after window})
         - t_\\text{start}(\\text{first step of window})}

  See the module docstring for the event model. Closed forms it reproduces (tested):
  DiLoCo without overlap gives :math:`HT / (HT + V/W + \\varepsilon)`; DP gives a step
  of :math:`\\max(T + d,\\ T/3 + 2T/(3L) + L d) + \\varepsilon` with
  :math:`d = V_\\text{layer}/W`.

  Args:
    model: a ``SIM_MODELS`` name ("1B", "10B", "100B") or a :class:`SimModel`.
    method: "dp", "diloco" or "streaming".
    bandwidth_gbps: W, link bandwidth in Gbit/s (may be ``inf``).
    replicas: M, datacenters.
    sync_every: H, inner steps between two syncs of the same parameters.
    fragment_layers: layers per Streaming fragment (must divide L); P = L / this.
    overlap: τ, steps a (fragment) sync may take before it is merged (0 <= τ < H).
    bits: bits per value on the wire (16 bf16, 4 for fp4/e3m0).
    latency: ε, seconds each transfer adds after leaving the link.
    forward_fraction: share of a step spent in the forward pass.
    warmup_periods: sync periods simulated before measuring.
    periods: sync periods measured.

  Returns:
    A :class:`SimResult` (utilization, step and transfer times, ``timeline()``).

  Examples:
    >>> r = run_simulation("1B", "diloco", 10.0)  # 16e9 bits per sync at 10 Gbit/s: 1.6 s
    >>> round(r.utilization, 6), round(10 / 11.6, 6)  # H T = 10 s of compute
    (0.862069, 0.862069)
    >>> # 8 fragments of 2e9 bits, τ = 1: each transfer may hide behind one 0.1 s step
    >>> round(run_simulation("1B", "streaming", 20.0, overlap=1).utilization, 9)  # 0.1 s each
    1.0
    >>> round(run_simulation("1B", "streaming", 10.0, overlap=1).utilization, 6)  # 0.1 s stall
    0.925926
  """
  m = get_sim_model(model)
  _checks.choice("method", method, METHODS)
  w = float(_checks.positive("bandwidth_gbps", bandwidth_gbps)) * 1e9  # bits/s
  replicas = _checks.positive_int("replicas", replicas)
  bits = float(_checks.positive("bits", bits))
  eps = float(_checks.nonneg("latency", latency))
  phi = float(_checks.fraction("forward_fraction", forward_fraction))
  warm = _checks.nonneg_int("warmup_periods", warmup_periods)
  meas = _checks.positive_int("periods", periods)
  period, plan = _schedule(method, m, replicas=replicas, sync_every=sync_every,
                           fragment_layers=fragment_layers, overlap=overlap, bits=bits,
                           forward_fraction=phi)
  if replicas == 1:
    plan = {}  # nobody to talk to
  n_steps = (warm + meas) * period + 1
  t = m.step_time

  # ---- the event loop: one pass over the steps, FIFO link state carried along.
  starts = np.empty(n_steps)
  ends = np.empty(n_steps)
  rec = []  # (step, ready, start, end, arrival, bits, needed_by)
  due: dict[int, float] = {}  # step -> latest arrival it must wait for
  link_free = 0.0
  prev_end = 0.0
  for step in range(1, n_steps + 1):
    s = prev_end
    if step in due:
      s = max(s, due.pop(step))
    starts[step - 1] = s
    prev_end = s + t
    ends[step - 1] = prev_end
    for offset, size, delay in plan.get(step % period, ()):
      ready = s + offset
      begin = ready if ready > link_free else link_free
      link_free = begin + size / w
      arrival = link_free + eps
      need = step + delay
      if arrival > due.get(need, -math.inf):
        due[need] = arrival
      rec.append((step, ready, begin, link_free, arrival, size, need))

  first, last = warm * period + 1, (warm + meas) * period
  compute = (last - first + 1) * t
  wall = starts[last] - starts[first - 1]  # starts[last] is the step after the window
  transfers = pd.DataFrame(rec, columns=["step", "ready", "start", "end", "arrival", "bits",
                                         "needed_by"])
  return SimResult(utilization=float(compute / wall), compute_time=float(compute),
                   wall_time=float(wall), window=(first, last), step_start=starts,
                   step_end=ends, transfers=transfers, step_time=t, layers=m.layers,
                   forward_fraction=phi)


def utilization(model, method, bandwidth_gbps, **kwargs) -> float:
  """Compute utilization at one bandwidth: ``run_simulation(...).utilization``.

  Examples:
    >>> round(utilization("1B", "dp", 1000.0), 4)
    0.9934
  """
  return run_simulation(model, method, bandwidth_gbps, **kwargs).utilization


def bandwidth_for_utilization(target, model, method, *, rounding="exact", grid=None,
                              rtol=1e-6, **kwargs):
  """Smallest link bandwidth (Gbit/s) at which the simulated utilization reaches ``target``.

  .. math::
     W^*(u) = \\min\\{W : u_\\text{sim}(W) \\ge u\\}

  ``rounding="exact"`` bisects :math:`\\log W` to a relative precision ``rtol``;
  ``rounding="grid"`` returns the lowest point of ``grid`` (default: the paper's 50
  log-spaced points from 0.1 to 1000 Gbit/s) that reaches the target, as the
  Streaming DiLoCo paper reports its table. Unreachable targets give ``inf`` (with
  ``"grid"``: not reached within the grid; with ``"exact"``: not even at 1e9 Gbit/s,
  e.g. when the latency alone costs more than the allowed idle time).

  Args:
    target: u in (0, 1), or a sequence of them.
    model: a SIM_MODELS name or a SimModel.
    method: "dp", "diloco" or "streaming".
    rounding: "exact" or "grid".
    grid: increasing bandwidths (Gbit/s) for ``rounding="grid"``.
    rtol: relative precision of the exact value.
    **kwargs: the other arguments of :func:`run_simulation` (replicas, sync_every, ...).

  Returns:
    Gbit/s: a float for a scalar target, an array otherwise.

  Examples:
    >>> # DiLoCo, 1B, 16-bit, M=2, H=100: closed form 16e9 bits / (10 s * 0.05/0.95)
    >>> round(bandwidth_for_utilization(0.95, "1B", "diloco"), 3)
    30.4
    >>> round(bandwidth_for_utilization(0.95, "1B", "diloco", rounding="grid"), 3)
    33.932
  """
  _checks.choice("rounding", rounding, ("exact", "grid"))
  targets = _checks.fraction("target", target)
  flat = targets.ravel()
  util = lambda w: run_simulation(model, method, w, **kwargs).utilization  # noqa: E731
  if rounding == "grid":
    g = PAPER_GRID_GBPS if grid is None else _checks.positive("grid", grid)
    if np.any(np.diff(g) <= 0):
      raise ValueError("grid must be strictly increasing.")
    us = np.array([util(x) for x in g])
    res = []
    for u in flat:
      hit = np.nonzero(us >= u)[0]
      res.append(g[hit[0]] if hit.size else np.inf)
  else:
    _checks.positive("rtol", rtol)
    res = [_bisect(util, u, rtol) for u in flat]
  res = np.asarray(res, dtype=float).reshape(targets.shape)
  return float(res) if res.ndim == 0 else res


def _bisect(util, target, rtol, lo=1e-6, hi=1e9):
  if util(hi) < target:
    return math.inf
  if util(lo) >= target:
    return lo
  llo, lhi = math.log(lo), math.log(hi)
  while lhi - llo > math.log1p(rtol):
    mid = 0.5 * (llo + lhi)
    if util(math.exp(mid)) >= target:
      lhi = mid
    else:
      llo = mid
  return math.exp(lhi)


def paper_table(*, rounding="grid", models=("1B", "10B", "100B"), targets=PAPER_TARGETS,
                replicas=2, sync_every=100, fragment_layers=3, latency=0.0) -> pd.DataFrame:
  """The Streaming DiLoCo paper's simulation table: bandwidth for each utilization target.

  Rows: model × {DP, DiLoCo, Streaming, Streaming + overlap (τ = 1), Streaming + overlap
  + 4-bit}; columns: targets. Settings: M = 2, H = 100, fragments of 3 layers, 16-bit
  payloads (4-bit in the last row), the models of ``SIM_MODELS``.

  Args:
    rounding: "grid" (the paper's 50-point log grid, its reporting) or "exact".
    models: names of ``SIM_MODELS`` (or SimModels).
    targets: utilization targets (columns).
    replicas, sync_every, fragment_layers, latency: simulation settings.

  Returns:
    A DataFrame of Gbit/s, indexed by (model, method), one column per target.

  Examples:
    >>> t = paper_table(models=("1B",), targets=(0.5,))
    >>> t.shape
    (5, 1)
  """
  rows, index = [], []
  for name in models:
    sim_model = get_sim_model(name)
    label_model = name if isinstance(name, str) else "custom"
    for label, method, overlap, bits in PAPER_ROWS:
      rows.append(bandwidth_for_utilization(
          list(targets), sim_model, method, rounding=rounding, replicas=replicas,
          sync_every=sync_every, fragment_layers=fragment_layers, overlap=overlap, bits=bits,
          latency=latency))
      index.append((label_model, label))
  cols = [f"{u:.0%}" for u in targets]
  return pd.DataFrame(np.vstack(rows), index=pd.MultiIndex.from_tuples(
      index, names=["model", "method"]), columns=cols)
