"""Colored tables: a paper's published cells beside this simulator's (no figure, a Styler)."""

from __future__ import annotations

import numpy as np
import pandas as pd

#: Cell colors by the signed grid-step difference: equal, one step apart, worse, not expressible.
STEP_COLORS = {"equal": "#d4edda", "one": "#fff3cd", "worse": "#f8d7da", "none": "#e9ecef"}


def _color(step: float) -> str:
  if np.isnan(step):
    return f"background-color: {STEP_COLORS['none']}"
  key = "equal" if step == 0 else "one" if abs(step) <= 1 else "worse"
  return f"background-color: {STEP_COLORS[key]}"


def side_by_side(paper: pd.DataFrame, ours: pd.DataFrame, steps: pd.DataFrame, caption: str = ""):
  """Each cell as ``paper / ours (±k)`` (Gbit/s; k: ours − paper in grid steps), colored by k.

  Args:
    paper, ours, steps: frames of the same index and columns (e.g. from
      :mod:`analysis.planning.paper_tables`: ``reference``, ``simulated``, ``grid_steps``).
    caption: the table's caption.

  Returns:
    A pandas ``Styler`` (a notebook or the docs render it as an HTML table).
  """
  def cell(p, o, k):
    if np.isnan(k):
      return f"{p:g} / n/a"
    return f"{p:g} / {o:.3g} ({int(k):+d})" if k else f"{p:g} / {o:.3g} (0)"

  text = pd.DataFrame([[cell(p, o, k) for p, o, k in zip(*rows)] for rows in zip(
      paper.to_numpy(), ours.to_numpy(), steps.to_numpy())], index=paper.index, columns=paper.columns)
  colors = pd.DataFrame([[_color(k) for k in row] for row in steps.to_numpy()],
                        index=paper.index, columns=paper.columns)
  return text.style.apply(lambda _: colors, axis=None).set_caption(caption)
