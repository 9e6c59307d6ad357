"""The design of the in-step runtime, drawn: the device mesh and what crosses which axis.

:func:`plot_mesh` draws the ``(diloco, data)`` mesh of :mod:`diloco_core.devices.mesh`: one row per
replica group (the ``diloco`` axis, over which drjax places the replicas), one column per
data-parallel shard inside a replica (the ``data`` axis), and the two collectives of one step:
the gradient all-reduce inside each replica (along a row, every inner step) and the
pseudo-gradient mean across replicas (along a column, only at a sync).
"""

from __future__ import annotations

from analysis.plots._style import done
from analysis.plots._style import new_figure


def plot_mesh(diloco: int = 4, data: int = 2, *, title: str | None = None):
  """The device mesh ``diloco x data`` with the collectives of one step.

  Args:
    diloco: devices along the ``diloco`` axis (replicas, or groups of them).
    data: devices along the ``data`` axis (shards of one replica's batch).
    title: the axes title.

  Returns:
    The matplotlib Figure.

  Examples:
    >>> fig = plot_mesh(4, 2)
    >>> len(fig.axes[0].patches)  # one box per device
    8
  """
  import matplotlib.patches as mpatches
  fig, (ax,) = new_figure(figsize=(6.4, 0.9 * diloco + 1.6))
  ax.grid(False)
  for r in range(diloco):
    for c in range(data):
      y = diloco - 1 - r
      ax.add_patch(mpatches.FancyBboxPatch((c * 1.6, y), 1.2, 0.7, boxstyle="round,pad=0.03",
                                           facecolor=f"C{r % 10}", alpha=0.35, edgecolor="k"))
      ax.text(c * 1.6 + 0.6, y + 0.35, f"replica {r}\nshard {c}", ha="center", va="center", fontsize=8)
    if data > 1:  # the gradient all-reduce inside replica r, every inner step
      ax.annotate("", xy=(1.6 * (data - 1) + 0.05, diloco - 1 - r + 0.35), xytext=(1.15, diloco - 1 - r + 0.35),
                  arrowprops=dict(arrowstyle="<->", color="C0", lw=1.5))
  x = 1.6 * data - 0.1  # the pseudo-gradient mean across replicas, at a sync
  ax.annotate("", xy=(x, 0.35), xytext=(x, diloco - 1 + 0.35), arrowprops=dict(arrowstyle="<->", color="C3", lw=2))
  ax.text(x + 0.15, (diloco - 1) / 2 + 0.35, "at a sync:\nmean of the\npseudo-gradients\n(drjax.reduce_mean,\nthe 'diloco' axis)",
          va="center", fontsize=8, color="C3")
  ax.text(0.0, diloco + 0.1, "every inner step: gradient all-reduce inside a replica (the 'data' axis)",
          fontsize=8, color="C0")
  ax.set_xlim(-0.3, 1.6 * data + 2.6)
  ax.set_ylim(-0.3, diloco + 0.5)
  ax.set_axis_off()
  if title:
    ax.set_title(title)
  return done(fig)
