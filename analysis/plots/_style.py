"""Labels, symbols and the figure helpers every plot of :mod:`analysis.plots` shares."""

from __future__ import annotations

import json
from typing import Any, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

#: The axis label of each known column, with its symbol (the notation of docs/semantics.md).
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


#: How the legends name the algorithms (a legend entry is the name, not ``algorithm=dp``).
ALGORITHMS: dict[str, str] = {"dp": "DP", "diloco": "DiLoCo", "streaming": "Streaming DiLoCo"}


def label(column: str) -> str:
  """The axis label of a column (its symbol and name), or the column name itself."""
  return LABELS.get(column, column.replace("_", " "))


def short(column: str) -> str:
  """The legend name of a column: its symbol, or the column name itself."""
  return SYMBOLS.get(column, column.replace("_", " "))


def fmt(value: Any) -> str:
  if isinstance(value, float):
    return f"{value:g}"
  if isinstance(value, (list, dict, tuple)):
    return json.dumps(value)
  return str(value)


def new_figure(figsize=(6.4, 3.8), ncols=1, nrows=1):
  with plt.rc_context(_STYLE):
    fig, axes = plt.subplots(nrows, ncols, figsize=figsize, layout="constrained", squeeze=False)
  for ax in axes.ravel():
    ax.grid(True, alpha=0.3)
    ax.spines[["top", "right"]].set_visible(False)
  return fig, list(axes.ravel())


def done(fig):
  plt.close(fig)
  return fig


def floor_line(ax, floor):
  if floor is not None and np.isfinite(floor):
    ax.axhline(floor, color="k", ls="--", lw=1, label=f"entropy floor {floor:.3f}")


def groups(df: pd.DataFrame, hue: str | Sequence[str] | None):
  if hue is None:
    yield None, df
    return
  cols = [hue] if isinstance(hue, str) else list(hue)
  keys = df[cols].map(fmt) if len(cols) > 1 else df[cols[0]].map(fmt)
  # keep the order of first appearance (sweep order), not string order
  entry = lambda c, v: ALGORITHMS.get(v, v) if c == "algorithm" else f"{short(c)}={v}"
  if len(cols) > 1:
    keys = keys.apply(lambda r: ", ".join(entry(c, r[c]) for c in cols), axis=1)
  for k in dict.fromkeys(keys):
    name = k if len(cols) > 1 else entry(cols[0], k)
    yield name, df[keys == k]


def finish(fig, ax, x: str, y: str, *, title, floor, legend: bool):
  """Floor line, axis labels, title and legend shared by the sweep plots."""
  floor_line(ax, floor)
  ax.set_xlabel(label(x))
  ax.set_ylabel(label(y))
  if title:
    ax.set_title(title)
  if legend:
    ax.legend(fontsize=8)
  return done(fig)
