"""Figures of sweep results and calculator tables: curves, metrics, trade-offs, bars, lines.

The inputs are the tidy DataFrames of :mod:`analysis.lab.sweeps` (one row per run, or one row
per logged step from :func:`~analysis.lab.sweeps.sweep_curves`) or plain tables from the
calculator; nothing here computes a result.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd

from analysis.plots._style import done
from analysis.plots._style import finish
from analysis.plots._style import floor_line
from analysis.plots._style import fmt
from analysis.plots._style import groups
from analysis.plots._style import label
from analysis.plots._style import new_figure
from analysis.plots._style import short


def plot_curves(curves: pd.DataFrame, *, x: str = "step", y: str = "eval_loss",
                hue: str | Sequence[str] | None = "algorithm", floor: float | None = None,
                logy: bool = False, logx: bool = False, title: str | None = None, ax=None):
  """Loss (or any metric) against step or tokens, one line per ``hue`` group.

  Args:
    curves: long-format metrics, e.g. :func:`analysis.lab.sweeps.sweep_curves`.
    x, y: columns to plot (rows where ``y`` is missing are dropped).
    hue: column(s) whose values make one line each.
    floor: draw the data's entropy floor as a dashed line.
    logy: log-scale the y axis.
    logx: log-scale the x axis (e.g. bytes sent, which differ by orders of magnitude).
    title: the axes title.
    ax: draw into this Axes instead of a new figure.

  Returns:
    The matplotlib Figure.
  """
  fig, (ax,) = new_figure() if ax is None else (ax.figure, [ax])
  data = curves.dropna(subset=[y])
  for name, g in groups(data, hue):
    g = g.groupby(x, sort=True)[y].mean()
    ax.plot(g.index, g.values, label=name, lw=1.5)
  floor_line(ax, floor)
  ax.set_xlabel(label(x))
  ax.set_ylabel(label(y))
  if logy:
    ax.set_yscale("log")
  if logx:
    ax.set_xscale("log")
  if title:
    ax.set_title(title)
  ax.legend(fontsize=8)
  return done(fig)


def plot_metric(df: pd.DataFrame, *, x: str, y: str = "final_eval_loss",
                hue: str | Sequence[str] | None = None, logx: bool = False, logy: bool = False,
                floor: float | None = None, title: str | None = None, categorical: bool = False,
                ax=None):
  """One metric of a sweep against one axis, one line per ``hue`` group.

  Rows sharing (hue, x) — e.g. seeds — are averaged, with their spread as error bars.

  Args:
    df: one row per run (:func:`analysis.lab.sweeps.run_sweep`).
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
  fig, (ax,) = new_figure() if ax is None else (ax.figure, [ax])
  order = list(dict.fromkeys(df[x].map(fmt))) if categorical else None
  for name, g in groups(df, hue):
    keyed = g.assign(_x=g[x].map(fmt)) if categorical else g.assign(_x=g[x])
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
    ax.set_xticks(ticks, [fmt(t) for t in ticks])
  if logy:
    ax.set_yscale("log")
  return finish(fig, ax, x, y, title=title, floor=floor, legend=hue is not None or floor is not None)


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
  fig, (ax,) = new_figure() if ax is None else (ax.figure, [ax])
  labelled = set()  # (cost, label) pairs already written: groups sharing a cost (same H) get one label
  for name, g in groups(df, hue):
    g = g[g[x] > 0] if logx else g
    pts = ax.scatter(g[x], g[y], s=24, label=name)
    if annotate is not None:  # DP has no H, P or τ: its points are not labelled
      for _, r in (g[g["algorithm"] != "dp"] if "algorithm" in g else g).iterrows():
        key = (round(float(r[x]), 6), fmt(r[annotate]))
        if key in labelled:
          continue
        labelled.add(key)
        ax.annotate(fmt(r[annotate]), (r[x], r[y]), textcoords="offset points", xytext=(4, 3),
                    fontsize=7, color="0.3")
  if logx:
    ax.set_xscale("log")
  floor_line(ax, floor)
  ax.set_xlabel(label(x))
  ax.set_ylabel(label(y))
  if title:
    ax.set_title(title)
  ax.legend(fontsize=8)
  return done(fig)


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
  fig, (ax,) = new_figure() if ax is None else (ax.figure, [ax])
  xs = list(dict.fromkeys(df[x].map(fmt)))
  hues = [None] if hue is None else list(dict.fromkeys(df[hue].map(fmt)))
  width = 0.8 / len(hues)
  for j, h in enumerate(hues):
    sub = df if h is None else df[df[hue].map(fmt) == h]
    means = sub.assign(_x=sub[x].map(fmt)).groupby("_x")[y].mean().reindex(xs)
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
  return finish(fig, ax, x, y, title=title, floor=floor, legend=hue is not None or floor is not None)


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
    xlabel, ylabel: axis labels (default: the columns' ``label``).
    title: the axes title.
    ax: draw into this Axes instead of a new figure.

  Returns:
    The matplotlib Figure.
  """
  fig, (ax,) = new_figure() if ax is None else (ax.figure, [ax])
  ys = [y] if isinstance(y, str) else list(y)
  if hue is not None:
    for name, g in groups(df, hue):
      g = g.sort_values(x)
      ax.plot(g[x], g[ys[0]], lw=1.5, label=name)
  else:
    d = df.sort_values(x)
    for i, col in enumerate(ys):  # line styles and widths differ, so lines that coincide both show
      ax.plot(d[x], d[col], lw=2.6 - 0.5 * (i % 3), ls=("-", "--", ":", "-.")[i % 4],
              label=label(col) if len(ys) > 1 else None)
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
  return done(fig)


def plot_goodput(gp: pd.DataFrame, *, title: str | None = None, ax=None):
  """Goodput against the failure rate: one color per run, solid elastic, dashed stopping.

  Args:
    gp: :func:`analysis.planning.goodput.goodput_curves`'s table (``rate_per_hour``, ``run``,
      ``stop_and_restart``, ``elastic``).
    title: the axes title.
    ax: draw into this Axes instead of a new figure.

  Returns:
    The matplotlib Figure.
  """
  fig, (ax,) = new_figure() if ax is None else (ax.figure, [ax])
  for i, run in enumerate(dict.fromkeys(gp["run"])):
    g = gp[gp["run"] == run].sort_values("rate_per_hour")
    ax.plot(g["rate_per_hour"], g["elastic"], color=f"C{i}", lw=2.2, label=f"{run}, elastic")
    ax.plot(g["rate_per_hour"], g["stop_and_restart"], color=f"C{i}", lw=1.6, ls="--",
            label=f"{run}, stops and restarts")
  ax.set_xscale("log")
  ax.set_ylim(0, 1.02)
  ax.set_xlabel("failures per replica and hour")
  ax.set_ylabel("goodput")
  if title:
    ax.set_title(title)
  ax.legend(fontsize=8, loc="center left")
  return done(fig)


#: Colors of the claims page's verdicts (and its forest plot).
VERDICT_COLORS = {"agrees": "#2e7d32", "disagrees": "#c62828", "not resolved": "#9e9e9e"}


def plot_intervals(rows: pd.DataFrame, *, title: str | None = None):
  """A forest plot: one horizontal 95% interval per row, colored by its verdict.

  Args:
    rows: columns ``label``, ``mean``, ``low``, ``high``, ``verdict`` and optionally
      ``tolerance`` (a dotted tick at the tolerance of a "costs nothing" condition).
    title: the figure title.

  Returns:
    The Figure.
  """
  fig, (ax,) = new_figure(figsize=(7.2, 0.32 * len(rows) + 1.2))
  y = np.arange(len(rows))[::-1]
  for yi, (_, r) in zip(y, rows.iterrows()):
    color = VERDICT_COLORS.get(r["verdict"], "k")
    ax.plot([r["low"], r["high"]], [yi, yi], color=color, lw=2.5, solid_capstyle="butt")
    ax.plot([r["mean"]], [yi], "o", color=color, ms=4)
    tol = r.get("tolerance")
    if tol is not None and np.isfinite(tol):
      ax.plot([tol], [yi], "|", color="k", ms=10)
  ax.axvline(0.0, color="k", lw=0.8)
  # linear within ±1% (where the tolerances of the verdicts lie), logarithmic beyond: a
  # diverged or far-off arm does not squeeze the band that decides the others
  ax.set_xscale("symlog", linthresh=1.0, linscale=1.5)
  lo, hi = float(np.nanmin(rows["low"])), float(np.nanmax(rows["high"]))
  ticks = [t for t in (-100, -10, -1, -0.5, 0, 0.5, 1, 10, 100) if min(lo, -0.5) <= t <= max(hi, 0.5)]
  ax.set_xticks(ticks, [f"{t:+g}%" if t else "0" for t in ticks], fontsize=8)
  ax.set_yticks(y, rows["label"].tolist(), fontsize=8)
  ax.set_xlabel("paired difference, % of the reference loss (95% interval; linear within ±1%)")
  for verdict, color in VERDICT_COLORS.items():
    ax.plot([], [], color=color, lw=2.5, label=verdict)
  ax.plot([], [], "|", color="k", ms=10, label="tolerance")
  ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.55 / (0.32 * len(rows))),  # under the axis label
            ncol=len(VERDICT_COLORS) + 1, frameon=False)
  if title:
    ax.set_title(title)
  return done(fig)


def plot_roofline(points: pd.DataFrame, ceilings: dict, *, title: str | None = None):
  """Measured FLOP/s against arithmetic intensity, on rooflines ``min(C, I·W)`` (log-log).

  Args:
    points: one row per measured operation (``kind``, ``intensity``, ``flops_per_s``), as
      :func:`analysis.lab.roofline_measured.load_roofline` returns them.
    ceilings: line label -> ``(C, W)``: peak FLOP/s and bytes/s of one roofline each (the
      calculator's, the measured one).
    title: the axes title.

  Returns:
    The matplotlib Figure.
  """
  fig, (ax,) = new_figure()
  lo, hi = points["intensity"].min() / 2, points["intensity"].max() * 2
  x = np.geomspace(lo, hi, 400)
  for i, (name, (peak, bandwidth)) in enumerate(ceilings.items()):
    ax.plot(x, np.minimum(peak, x * bandwidth) / 1e12, color=f"C{i}", lw=1.8, ls="-" if i == 0 else "--",
            label=name)
    ax.axvline(peak / bandwidth, color=f"C{i}", lw=0.8, ls=":")
  markers = {"matmul": ("o", "bf16 matmul [m, k] @ [k, k]"), "elementwise": ("s", "x + 1 (bf16)")}
  for kind, (marker, text) in markers.items():
    p = points[points["kind"] == kind]
    if len(p):
      ax.scatter(p["intensity"], p["flops_per_s"] / 1e12, marker=marker, color="k", s=22, zorder=3,
                 label=f"measured: {text}")
  ax.set_xscale("log")
  ax.set_yscale("log")
  ax.set_xlabel("arithmetic intensity (FLOPs per HBM byte)")
  ax.set_ylabel("TFLOP/s")
  if title:
    ax.set_title(title)
  ax.legend(fontsize=8, loc="lower right")
  return done(fig)
