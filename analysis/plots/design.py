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


def plot_layers(layers, arrows, sizes, *, title: str | None = None):
  """The trainer's sub-packages as floors of a house, with the imports between them.

  Args:
    layers: the floors, lowest first, each a tuple of package names
      (:data:`diloco_core.layers.LAYERS`).
    arrows: ``(importer, imported) -> number of module imports``
      (:func:`diloco_core.layers.package_graph`).
    sizes: package -> ``(modules, lines)``, written in each box.
    title: the axes title.

  Returns:
    The matplotlib Figure: one box per package, floor 0 at the bottom; an arrow from a package
    to each package it imports, wider for more imports (every arrow points down). An arrow
    that a longer way down implies (``run -> devices`` beside ``run -> runtime -> devices``)
    is not drawn; the figure says how many.

  Examples:
    >>> fig = plot_layers((("a",), ("b", "c")), {("b", "a"): 3, ("c", "a"): 1},
    ...                   {"a": (2, 100), "b": (1, 50), "c": (3, 90)})
    >>> len(fig.axes[0].patches)  # three boxes and two arrows
    5
    >>> sorted(_reduced({("c", "b"): 1, ("b", "a"): 1, ("c", "a"): 4}))  # c -> a is implied
    [('b', 'a'), ('c', 'b')]
  """
  import matplotlib.patches as mpatches
  width, height, gap = 2.0, 0.62, 0.25
  fig, (ax,) = new_figure(figsize=(7.2, 0.9 * len(layers) + 0.6))
  ax.grid(False)
  span = max(len(names) for names in layers) * (width + gap)
  where = {}
  for floor, names in enumerate(layers):
    x0 = (span - len(names) * (width + gap)) / 2
    for i, name in enumerate(names):
      x, y = x0 + i * (width + gap), floor
      where[name] = (x + width / 2, y, y + height)
      ax.add_patch(mpatches.FancyBboxPatch((x, y), width, height, boxstyle="round,pad=0.02",
                                           facecolor=f"C{floor % 10}", alpha=0.3, edgecolor="k"))
      n_modules, n_lines = sizes.get(name, (0, 0))
      ax.text(x + width / 2, y + height / 2, f"{name}/\n{n_modules} modules, {n_lines:,} lines",
              ha="center", va="center", fontsize=7.5)
    ax.text(-0.2, floor + height / 2, f"layer {floor}", ha="right", va="center", fontsize=8, color="0.35")
  floor_of = {name: f for f, names in enumerate(layers) for name in names}
  shown = _reduced(arrows)
  outs, ins = {}, {}
  for src, dst in shown:
    outs.setdefault(src, []).append(dst)
    ins.setdefault(dst, []).append(src)

  def attach(name, others, y):  # spread a box's arrow ends along its edge, ordered by the other end
    others = sorted(others, key=lambda o: where[o][0])
    return {o: (where[name][0] + width * 0.8 * ((i + 1) / (len(others) + 1) - 0.5), y) for i, o in enumerate(others)}

  starts = {src: attach(src, dsts, where[src][1]) for src, dsts in outs.items()}
  ends = {dst: attach(dst, srcs, where[dst][2]) for dst, srcs in ins.items()}
  for src, dst in shown:
    (xa, ya), (xb, yb) = starts[src][dst], ends[dst][src]
    side = (xa + xb) / 2 - span / 2  # bow a long arrow out, away from the middle column
    skip = floor_of[src] - floor_of[dst] > 1 and abs(side) > 0.05
    rad = (0.4 if side < 0 else -0.4) if skip else 0.0
    ax.add_patch(mpatches.FancyArrowPatch((xa, ya), (xb, yb), arrowstyle="-|>", mutation_scale=8,
                                          lw=0.5 + 0.35 * arrows[(src, dst)] ** 0.5, color="0.3", alpha=0.7,
                                          connectionstyle=f"arc3,rad={rad}",
                                          shrinkA=0, shrinkB=0))
  hidden = len(arrows) - len(shown)
  if hidden:
    ax.text(span / 2, -0.15, f"{hidden} arrows that a longer way down implies are not drawn",
            ha="center", va="top", fontsize=7.5, color="0.35")
  ax.set_xlim(-1.1, span + 0.1)
  ax.set_ylim(-0.45, len(layers) - 1 + height + 0.2)
  ax.set_axis_off()
  if title:
    ax.set_title(title)
  return done(fig)


def _reduced(arrows) -> list[tuple[str, str]]:
  """The arrows no longer way implies (the transitive reduction of an acyclic graph)."""
  out: dict[str, set[str]] = {}
  for src, dst in arrows:
    out.setdefault(src, set()).add(dst)

  def reaches(a, b, first):  # a path a -> ... -> b that does not start with the arrow a -> b
    todo, seen = [n for n in out.get(a, ()) if n != first], set()
    while todo:
      n = todo.pop()
      if n == b:
        return True
      if n not in seen:
        seen.add(n)
        todo.extend(out.get(n, ()))
    return False

  return [(src, dst) for src, dst in arrows if not reaches(src, dst, dst)]
