"""Figures for the docs and notebooks: each function takes data and returns a Figure.

The inputs are the tidy DataFrames of :mod:`analysis.sweeps` (one row per run, or one row
per logged step from :func:`~analysis.sweeps.sweep_curves`) or plain tables from the
calculator; nothing here computes a result. Figures are closed in pyplot before they are
returned, so a notebook shows them only where they are displayed or glued.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

import matplotlib

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from diloco_core.schedule import schedule_table

#: The axis label of each known column, with its symbol (SPEC.md notation).
LABELS: dict[str, str] = {
    "step": "inner step t",
    "tokens": "tokens seen",
    "train_loss": "train loss (nats/token)",
    "eval_loss": "eval loss (nats/token)",
    "final_eval_loss": "final eval loss (nats/token)",
    "gap_to_floor": "gap to entropy floor (nats/token)",
    "replicas": "M (replicas)",
    "sync_every": "H (sync_every)",
    "fragments": "P (fragments)",
    "overlap": "τ (overlap)",
    "alpha": "α (alpha)",
    "outer_lr": "η (outer_lr)",
    "outer_momentum": "μ (outer_momentum)",
    "inner_lr": "inner LR",
    "compression": "compression Q",
    "total_bytes_per_replica": "bytes sent per replica (whole run)",
    "peak_bytes_per_step": "peak bytes per step per replica",
    "total_bytes_sent": "bytes sent per replica",
    "wall_time_s": "wall time (s)",
}

_STYLE = {"figure.dpi": 100, "axes.grid": True, "grid.alpha": 0.3, "axes.spines.top": False,
          "axes.spines.right": False, "legend.frameon": False, "font.size": 10}


#: Short names for legends: the symbol of a swept column.
SYMBOLS: dict[str, str] = {
    "replicas": "M", "sync_every": "H", "fragments": "P", "overlap": "τ", "alpha": "α",
    "outer_lr": "η", "outer_momentum": "μ", "inner_lr": "inner LR", "compression": "Q",
}


def label(column: str) -> str:
  """The axis label of a column (its symbol and name), or the column name itself."""
  return LABELS.get(column, column.replace("_", " "))


def short(column: str) -> str:
  """The legend name of a column: its symbol, or the column name itself."""
  return SYMBOLS.get(column, column.replace("_", " "))


def _fmt(value: Any) -> str:
  if isinstance(value, float):
    return f"{value:g}"
  if isinstance(value, (list, dict, tuple)):
    return json.dumps(value)
  return str(value)


def _new(figsize=(6.4, 3.8), ncols=1):
  with plt.rc_context(_STYLE):
    fig, axes = plt.subplots(1, ncols, figsize=figsize, layout="constrained", squeeze=False)
  for ax in axes.ravel():
    ax.grid(True, alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
  return fig, list(axes.ravel())


def _done(fig):
  plt.close(fig)
  return fig


def _floor_line(ax, floor):
  if floor is not None and np.isfinite(floor):
    ax.axhline(floor, color="k", ls="--", lw=1, label=f"entropy floor {floor:.3f}")


def _groups(df: pd.DataFrame, hue: str | Sequence[str] | None):
  if hue is None:
    yield None, df
    return
  cols = [hue] if isinstance(hue, str) else list(hue)
  keys = df[cols].map(_fmt) if len(cols) > 1 else df[cols[0]].map(_fmt)
  # keep the order of first appearance (sweep order), not string order
  if len(cols) > 1:
    keys = keys.apply(lambda r: ", ".join(f"{short(c)}={r[c]}" for c in cols), axis=1)
  for k in dict.fromkeys(keys):
    name = k if len(cols) > 1 else f"{short(cols[0])}={k}"
    yield name, df[keys == k]


def _finish(fig, ax, x: str, y: str, *, title, floor, legend: bool):
  """Floor line, axis labels, title and legend shared by the sweep plots."""
  _floor_line(ax, floor)
  ax.set_xlabel(label(x))
  ax.set_ylabel(label(y))
  if title:
    ax.set_title(title)
  if legend:
    ax.legend(fontsize=8)
  return _done(fig)


def plot_curves(curves: pd.DataFrame, *, x: str = "step", y: str = "eval_loss",
                hue: str | Sequence[str] | None = "algorithm", floor: float | None = None,
                logy: bool = False, title: str | None = None, ax=None):
  """Loss (or any metric) against step or tokens, one line per ``hue`` group.

  Args:
    curves: long-format metrics, e.g. :func:`analysis.sweeps.sweep_curves`.
    x, y: columns to plot (rows where ``y`` is missing are dropped).
    hue: column(s) whose values make one line each.
    floor: draw the data's entropy floor as a dashed line.
    logy: log-scale the y axis.
    title: the axes title.
    ax: draw into this Axes instead of a new figure.

  Returns:
    The matplotlib Figure.
  """
  fig, (ax,) = _new() if ax is None else (ax.figure, [ax])
  data = curves.dropna(subset=[y])
  for name, g in _groups(data, hue):
    g = g.groupby(x, sort=True)[y].mean()
    ax.plot(g.index, g.values, label=name, lw=1.5)
  _floor_line(ax, floor)
  ax.set_xlabel(label(x))
  ax.set_ylabel(label(y))
  if logy:
    ax.set_yscale("log")
  if title:
    ax.set_title(title)
  ax.legend(fontsize=8)
  return _done(fig)


def plot_metric(df: pd.DataFrame, *, x: str, y: str = "final_eval_loss",
                hue: str | Sequence[str] | None = None, logx: bool = False, logy: bool = False,
                floor: float | None = None, title: str | None = None, categorical: bool = False,
                ax=None):
  """One metric of a sweep against one axis, one line per ``hue`` group.

  Rows sharing (hue, x) — e.g. seeds — are averaged, with their spread as error bars.

  Args:
    df: one row per run (:func:`analysis.sweeps.run_sweep`).
    x: the swept column on the x axis.
    y: the metric.
    hue: column(s) whose values make one line each.
    logx, logy: log-scale an axis (``logx`` uses base 2 ticks).
    floor: draw the entropy floor as a dashed line.
    title: the axes title.
    categorical: treat ``x`` as labels (e.g. compression formats), in order of appearance.
    ax: draw into this Axes instead of a new figure.

  Returns:
    The matplotlib Figure.
  """
  fig, (ax,) = _new() if ax is None else (ax.figure, [ax])
  order = list(dict.fromkeys(df[x].map(_fmt))) if categorical else None
  for name, g in _groups(df, hue):
    keyed = g.assign(_x=g[x].map(_fmt)) if categorical else g.assign(_x=g[x])
    stats = keyed.groupby("_x", sort=not categorical)[y].agg(["mean", "std", "count"])
    if categorical:
      stats = stats.reindex([o for o in order if o in stats.index])
      xs = [order.index(o) for o in stats.index]
    else:
      xs = stats.index.values
    err = stats["std"].where(stats["count"] > 1)
    ax.errorbar(xs, stats["mean"].values, yerr=None if err.isna().all() else err.values,
                marker="o", ms=4, lw=1.5, capsize=3, label=name)
  if categorical:
    ax.set_xticks(range(len(order)), order)
  if logx:
    ax.set_xscale("log", base=2)
  if not categorical and pd.api.types.is_integer_dtype(df[x]) or logx:
    ticks = sorted(df[x].unique())
    ax.set_xticks(ticks, [_fmt(t) for t in ticks])
  if logy:
    ax.set_yscale("log")
  return _finish(fig, ax, x, y, title=title, floor=floor, legend=hue is not None or floor is not None)


def plot_tradeoff(df: pd.DataFrame, *, x: str = "total_bytes_per_replica",
                  y: str = "final_eval_loss", hue: str | Sequence[str] | None = "algorithm",
                  annotate: str | None = None, logx: bool = True, floor: float | None = None,
                  title: str | None = None, ax=None):
  """Scatter of a cost (bytes) against a quality (loss), one colour per ``hue`` group.

  Args:
    df: one row per run.
    x, y: cost and quality columns.
    hue: column(s) for the colour groups.
    annotate: column whose value labels each point (e.g. ``sync_every``).
    logx: log-scale the cost axis.
    floor: draw the entropy floor as a dashed line.
    title: the axes title.
    ax: draw into this Axes instead of a new figure.

  Returns:
    The matplotlib Figure.
  """
  fig, (ax,) = _new() if ax is None else (ax.figure, [ax])
  for name, g in _groups(df, hue):
    g = g[g[x] > 0] if logx else g
    pts = ax.scatter(g[x], g[y], s=24, label=name)
    if annotate is not None:
      for _, r in g.iterrows():
        ax.annotate(_fmt(r[annotate]), (r[x], r[y]), textcoords="offset points", xytext=(4, 3),
                    fontsize=7, color=pts.get_facecolor()[0])
  if logx:
    ax.set_xscale("log")
  _floor_line(ax, floor)
  ax.set_xlabel(label(x))
  ax.set_ylabel(label(y))
  if title:
    ax.set_title(title)
  ax.legend(fontsize=8)
  return _done(fig)


def plot_bars(df: pd.DataFrame, *, x: str, y: str = "final_eval_loss",
              hue: str | None = None, floor: float | None = None, title: str | None = None,
              ylim_from_floor: bool = True, ax=None):
  """Grouped bars of ``y`` per ``x`` category (and ``hue`` sub-category), means over repeats.

  Args:
    df: one row per run.
    x: the category column (bars, in order of appearance).
    y: the metric.
    hue: an optional second category (side-by-side bars).
    floor: draw the entropy floor as a dashed line.
    title: the axes title.
    ylim_from_floor: start the y axis just below the smallest value (or the floor), so
      that small differences stay visible.
    ax: draw into this Axes instead of a new figure.

  Returns:
    The matplotlib Figure.
  """
  fig, (ax,) = _new() if ax is None else (ax.figure, [ax])
  xs = list(dict.fromkeys(df[x].map(_fmt)))
  hues = [None] if hue is None else list(dict.fromkeys(df[hue].map(_fmt)))
  width = 0.8 / len(hues)
  for j, h in enumerate(hues):
    sub = df if h is None else df[df[hue].map(_fmt) == h]
    means = sub.assign(_x=sub[x].map(_fmt)).groupby("_x")[y].mean().reindex(xs)
    pos = np.arange(len(xs)) - 0.4 + width * (j + 0.5)
    ax.bar(pos, means.values, width=width * 0.95,
           label=None if h is None else f"{short(hue)}={h}")
  ax.set_xticks(range(len(xs)), xs)
  if ylim_from_floor:
    lo = np.nanmin(df[y].values)
    if floor is not None:
      lo = min(lo, floor)
    hi = np.nanmax(df[y].values)
    pad = 0.1 * (hi - lo) if hi > lo else 0.05 * abs(hi) + 1e-3
    ax.set_ylim(lo - pad, hi + pad)
  return _finish(fig, ax, x, y, title=title, floor=floor, legend=hue is not None or floor is not None)


def plot_lines(df: pd.DataFrame, *, x: str, y: str | Sequence[str], hue: str | None = None,
               logx: bool = False, logy: bool = False, hlines: dict[str, float] | None = None,
               vlines: dict[str, float] | None = None, xlabel: str | None = None,
               ylabel: str | None = None, title: str | None = None, ax=None):
  """Generic line plot of calculator tables (rooflines, bandwidth curves).

  Args:
    df: a table with column ``x`` and the ``y`` column(s).
    x: the x column.
    y: one column or several (one line each).
    hue: a column whose values make one line each (with a single ``y``).
    logx, logy: log-scale an axis.
    hlines, vlines: labelled reference lines ``{label: value}``.
    xlabel, ylabel: axis labels (default: :func:`label` of the columns).
    title: the axes title.
    ax: draw into this Axes instead of a new figure.

  Returns:
    The matplotlib Figure.
  """
  fig, (ax,) = _new() if ax is None else (ax.figure, [ax])
  ys = [y] if isinstance(y, str) else list(y)
  if hue is not None:
    for name, g in _groups(df, hue):
      g = g.sort_values(x)
      ax.plot(g[x], g[ys[0]], lw=1.5, label=name)
  else:
    d = df.sort_values(x)
    for col in ys:
      ax.plot(d[x], d[col], lw=1.5, label=label(col) if len(ys) > 1 else None)
  for i, (name, v) in enumerate((hlines or {}).items()):
    ax.axhline(v, color=f"C{7 + i % 3}", ls="--", lw=1, label=name)
  for i, (name, v) in enumerate((vlines or {}).items()):
    ax.axvline(v, color=f"C{4 + i % 3}", ls=":", lw=1.2, label=name)
  if logx:
    ax.set_xscale("log")
  if logy:
    ax.set_yscale("log")
  ax.set_xlabel(xlabel or label(x))
  ax.set_ylabel(ylabel or (label(ys[0]) if len(ys) == 1 else ""))
  if title:
    ax.set_title(title)
  if ax.get_legend_handles_labels()[0]:
    ax.legend(fontsize=8)
  return _done(fig)


# ---- schedules: DP vs DiLoCo vs Streaming DiLoCo ------------------------------------------------
def _schedule_rows(sync_every: int, fragments: int, overlap: int, steps: int):
  """Per method: a list of (send_step, merge_step, fragment or None) events."""
  rows = {"DP": [(t, t, None) for t in range(1, steps + 1)]}
  diloco = schedule_table(sync_every, 1, 0, steps)
  rows[f"DiLoCo (H={sync_every})"] = [(r["step"], r["step"], None) for r in diloco if r["send"] is not None]
  stream = schedule_table(sync_every, fragments, overlap, steps)
  events = []
  for r in stream:
    if r["send"] is not None:
      merge = r["step"] + overlap
      events.append((r["step"], merge, r["send"]))
  rows[f"Streaming (P={fragments}, τ={overlap})"] = events
  return rows


def schedule_text(sync_every: int, fragments: int, overlap: int, steps: int) -> str:
  """The communication schedule of DP, DiLoCo and Streaming DiLoCo as an ASCII timeline.

  One column per inner step t = 1..steps (the header shows t mod 10). ``A``: DP
  all-reduces the whole gradient; ``S``: DiLoCo sends the whole model and every replica
  takes the result (τ = 0); on the two Streaming lines, a digit p: fragment p is sent
  (``send``) or merged (``merge``, τ steps after its send); ``.``: compute only. The
  schedule comes from :func:`diloco_core.schedule.schedule_table`.

  Examples:
    >>> print(schedule_text(sync_every=6, fragments=3, overlap=1, steps=12))
    step                          123456789012
    DP                            AAAAAAAAAAAA
    DiLoCo (H=6)                  .....S.....S
    Streaming (P=3, τ=1) send     .0.1.2.0.1.2
    Streaming (P=3, τ=1) merge    ..0.1.2.0.1.
  """
  rows = _schedule_rows(sync_every, fragments, overlap, steps)
  lanes: dict[str, list[str]] = {}
  for name, events in rows.items():
    if name == "DP":
      lanes[name] = ["A"] * steps
      continue
    if not name.startswith("Streaming"):
      cells = ["."] * steps
      for send, _, _ in events:
        cells[send - 1] = "S"
      lanes[name] = cells
      continue
    sends, merges = ["."] * steps, ["."] * steps
    for send, merge, p in events:
      sends[send - 1] = str(p) if p < 10 else "#"
      if merge <= steps:
        merges[merge - 1] = str(p) if p < 10 else "#"
    lanes[name + " send"] = sends
    lanes[name + " merge"] = merges
  width = max(len(k) for k in lanes) + 4
  lines = ["step".ljust(width) + "".join(str(t % 10) for t in range(1, steps + 1))]
  lines += [k.ljust(width) + "".join(v) for k, v in lanes.items()]
  return "\n".join(lines)


def plot_schedule(sync_every: int, fragments: int, overlap: int, steps: int, *,
                  fragment_sizes: Sequence[float] | None = None, title: str | None = None):
  """DP vs DiLoCo vs Streaming DiLoCo on one time axis (one lane per method).

  Each inner step is a grey compute block. DP sends the whole gradient after every step
  (a full-height bar); DiLoCo sends the whole model every H steps; Streaming sends one
  fragment every H/P steps (bar height = the fragment's share of the model, colour = p)
  and merges it τ steps later (the arrow: the steps of compute the transfer can hide
  behind). Schedules come from :func:`diloco_core.schedule.schedule_table`.

  Args:
    sync_every: H.
    fragments: P for the Streaming lane.
    overlap: τ for the Streaming lane.
    steps: how many inner steps to draw.
    fragment_sizes: the fragments' relative sizes (default equal); bar heights use them.
    title: the axes title.

  Returns:
    The matplotlib Figure.
  """
  rows = _schedule_rows(sync_every, fragments, overlap, steps)
  share = np.ones(fragments) if fragment_sizes is None else np.asarray(fragment_sizes, float)
  share = share / share.sum()
  fig, (ax,) = _new(figsize=(8.0, 2.9))
  ax.grid(False)
  cmap = matplotlib.colormaps["viridis"]
  n = len(rows)
  for i, (name, events) in enumerate(rows.items()):
    y0 = n - 1 - i
    for t in range(1, steps + 1):
      ax.add_patch(matplotlib.patches.Rectangle((t - 1, y0 + 0.05), 0.96, 0.18, color="0.8", lw=0))
    for send, merge, p in events:
      h = 0.6 if p is None else max(0.6 * share[p], 0.06)
      color = "C3" if p is None else cmap(p / max(fragments - 1, 1))
      ax.add_patch(matplotlib.patches.Rectangle((send - 0.35, y0 + 0.27), 0.3, h, color=color, lw=0))
      if p is not None and merge > send and merge <= steps:
        ax.annotate("", xy=(merge, y0 + 0.27 + h / 2), xytext=(send - 0.05, y0 + 0.27 + h / 2),
                    arrowprops=dict(arrowstyle="->", color=color, lw=1))
  ax.set_xlim(0, steps + 0.2)
  ax.set_ylim(-0.05, n)
  ax.set_yticks([n - 1 - i + 0.45 for i in range(n)], list(rows))
  ax.set_xlabel("inner step t (grey: compute; bars: bytes on the wire, height ∝ payload)")
  ax.spines[["left"]].set_visible(False)
  ax.tick_params(axis="y", length=0)
  if title:
    ax.set_title(title)
  return _done(fig)


def plot_timeline(timeline: pd.DataFrame, *, start: float | None = None, end: float | None = None,
                  lanes: dict[str, str] | None = None, title: str | None = None, ax=None):
  """A Gantt chart of a simulated run: compute, idle (waiting for the network) and transfers.

  Args:
    timeline: :meth:`analysis.simulate.SimResult.timeline` (columns ``kind``, ``start``,
      ``end``; kinds ``compute``/``forward``/``backward``, ``idle``, ``transfer``).
    start, end: the time window to draw (seconds; default: everything).
    lanes: ``{kind: lane label}``; default puts compute and idle on one lane, transfers on
      another.
    title: the axes title.
    ax: draw into this Axes instead of a new figure.

  Returns:
    The matplotlib Figure.
  """
  lanes = lanes or {"compute": "chips", "forward": "chips", "backward": "chips", "idle": "chips",
                    "transfer": "network"}
  colors = {"compute": "0.65", "forward": "0.55", "backward": "0.75", "idle": "C3",
            "transfer": "C1"}
  fig, (ax,) = _new(figsize=(8.0, 2.4)) if ax is None else (ax.figure, [ax])
  ax.grid(False)
  tl = timeline
  if start is not None:
    tl = tl[tl["end"] > start]
  if end is not None:
    tl = tl[tl["start"] < end]
  names = list(dict.fromkeys(lanes.values()))
  seen = set()
  for kind, g in tl.groupby("kind", sort=False):
    if kind not in lanes:
      continue
    y = len(names) - 1 - names.index(lanes[kind])
    spans = list(zip(g["start"], g["end"] - g["start"]))
    if kind == "transfer":  # transfers may overlap in time: stagger them a little
      for i, (s0, w) in enumerate(spans):
        off = 0.1 + 0.25 * (i % 3)
        ax.broken_barh([(s0, w)], (y + off, 0.25), facecolors=colors.get(kind, "C0"),
                       edgecolor="white", lw=0.3, label=None if kind in seen else kind)
        seen.add(kind)
    else:
      ax.broken_barh(spans, (y + 0.15, 0.7), facecolors=colors.get(kind, "C0"), edgecolor="white",
                     lw=0.3, label=kind)
  ax.set_yticks([len(names) - 1 - i + 0.5 for i in range(len(names))], names)
  if start is not None or end is not None:
    ax.set_xlim(start if start is not None else tl["start"].min(),
                end if end is not None else tl["end"].max())
  ax.set_ylim(0, len(names))
  ax.set_xlabel("time (s)")
  ax.tick_params(axis="y", length=0)
  ax.spines[["left"]].set_visible(False)
  ax.legend(fontsize=8, ncol=4, loc="upper right", bbox_to_anchor=(1.0, 1.3))
  if title:
    ax.set_title(title, loc="left")
  return _done(fig)
