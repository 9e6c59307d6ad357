"""Timelines of the syncer rule: what each replica does, tick by tick, on a simulated tape.

:func:`tape_spans` reads a tape of :func:`diloco_core.spec.tape.simulate_tape` (or the ``tape``
of :func:`analysis.planning.pool.pool_utilization`) as spans per replica: computing a period
(from the tick it starts, 0 or the merge of a global version, to its
:class:`~diloco_core.spec.tape.Sent`), and waiting (from the send to the next merge: the link
both ways and the round). Each computed period is labelled with what became of its
contribution: ``fresh`` (merged into the round right after its base version), ``stale``
(merged into a later round, ``late="carry"``), ``dropped`` (late and discarded) or
``unmerged`` (the tape ended first, or the replica was lost). :func:`plot_tapes` draws several
tapes one above the other, with each round's commit as a dotted line.

Examples:
  Two replicas, the second twice as slow, synchronous DiLoCo, H = 2 (one round each):

  >>> from diloco_core.spec.syncer import SyncerConfig
  >>> from diloco_core.spec.tape import simulate_tape
  >>> tape = simulate_tape(SyncerConfig(), step_ticks=(1, 2), sync_every=2, total_steps=4)
  >>> spans = tape_spans(tape)  # replica 0 waits from tick 2 to 4 for the slow one
  >>> spans[["replica", "kind", "start", "end"]]
     replica     kind  start  end
  0        0  compute      0    2
  1        1  compute      0    4
  2        0     wait      2    4
  >>> spans["fate"].tolist()  # both merged into round 1, right after their base version 0
  ['fresh', 'fresh', '']
  >>> commit_ticks(tape)
  [4]
"""

from __future__ import annotations

import pandas as pd

from analysis.plots._style import done
from analysis.plots._style import new_figure
from diloco_core.spec.tape import Committed, Dropped, Joined, Lost, Merged, Sent, commit_ticks

__all__ = ["FATE_COLORS", "plot_tapes", "tape_spans"]

#: The color of a computed period, by what became of its contribution.
FATE_COLORS = {"fresh": "0.6", "stale": "C1", "dropped": "C3", "unmerged": "0.85"}
#: The color of a replica's waiting (between its send and its next merge).
WAIT_COLOR = "C0"

_COLUMNS = ["replica", "kind", "start", "end", "fate"]


def _fates(tape) -> dict[tuple[int, int], str]:
  """(replica, local step at the send) -> fresh, stale or dropped."""
  fates = {}
  for e in tape:
    if isinstance(e, Committed):
      for c in e.members:
        fates[(c.replica, c.step)] = "stale" if e.version - 1 - c.base > 0 else "fresh"
    elif isinstance(e, Dropped):
      fates[(e.replica, e.step)] = "dropped"
  return fates


def tape_spans(tape, replicas: int | None = None) -> pd.DataFrame:
  """Each replica's computing and waiting spans on a tape, in ticks (module docstring).

  Args:
    tape: the events of :func:`~diloco_core.spec.tape.simulate_tape`, in tape order.
    replicas: M; None: one more than the largest replica id on the tape.

  Returns:
    One row per span: ``replica``, ``kind`` (``"compute"`` or ``"wait"``), ``start``, ``end``
    (ticks) and ``fate`` (a computed period's: ``fresh``, ``stale``, ``dropped`` or
    ``unmerged``; ``""`` for waiting), in the order the spans end; a wait of no ticks is left out.
  """
  ids = [e.replica for e in tape if getattr(e, "replica", -1) >= 0]
  m_count = replicas if replicas is not None else 1 + max(ids, default=-1)
  fates = _fates(tape)
  start: list[int | None] = [0] * m_count  # the tick the current period started (None: not computing)
  sent: list[int | None] = [None] * m_count  # the tick of the last send not yet merged
  rows = []
  for e in tape:
    r = getattr(e, "replica", -1)
    if isinstance(e, Sent):
      rows.append((r, "compute", start[r], e.tick, fates.get((r, e.step), "unmerged")))
      start[r], sent[r] = None, e.tick
    elif isinstance(e, Merged):
      if sent[r] is not None and e.tick > sent[r]:
        rows.append((r, "wait", sent[r], e.tick, ""))
      start[r], sent[r] = e.tick, None
    elif isinstance(e, Lost):
      if start[r] is not None and e.tick > start[r]:
        rows.append((r, "compute", start[r], e.tick, "unmerged"))
      start[r], sent[r] = None, None
    elif isinstance(e, Joined):
      sent[r] = e.tick  # downloading the current version: waiting
  return pd.DataFrame(rows, columns=_COLUMNS)


def plot_tapes(tapes: dict, *, tick_s: float = 1.0, end: float | None = None, title: str | None = None):
  """Several tapes one above the other: one lane per replica, each round's commit dotted.

  Args:
    tapes: ``{panel title: tape}``, drawn top to bottom (each tape's replicas top to bottom).
    tick_s: seconds per tick (:attr:`~analysis.planning.pool.PoolResult.tick_s`), for the time axis.
    end: the last second drawn (None: the longest tape's end).
    title: the figure's title.

  Returns:
    The matplotlib Figure.
  """
  lanes = [1 + max((e.replica for e in t if getattr(e, "replica", -1) >= 0), default=0) for t in tapes.values()]
  fig, axes = new_figure(figsize=(8.0, 0.3 * sum(lanes) + 0.6 * len(tapes) + 0.5), nrows=len(tapes))
  last = max(max(e.tick for e in t) for t in tapes.values()) * tick_s
  stop = last if end is None else end
  seen = set()
  for ax, (name, tape), m_count in zip(axes, tapes.items(), lanes):
    ax.grid(False)
    spans = tape_spans(tape, m_count)
    for (kind, fate), g in spans.groupby(["kind", "fate"], sort=False):
      label = "waiting" if kind == "wait" else f"computing ({fate})"
      for r, rows in g.groupby("replica"):
        bars = [(s * tick_s, (t - s) * tick_s) for s, t in zip(rows["start"], rows["end"])]
        y = m_count - 1 - r
        height = (y + 0.3, 0.4) if kind == "wait" else (y + 0.15, 0.7)
        ax.broken_barh(bars, height, facecolors=WAIT_COLOR if kind == "wait" else FATE_COLORS[fate],
                       alpha=0.35 if kind == "wait" else 1.0, edgecolor="white", lw=1.2,
                       label=None if label in seen else label)
        seen.add(label)
    commits = [t * tick_s for t in commit_ticks(tape) if t * tick_s <= stop]
    ax.vlines(commits, 0, m_count, colors="k", lw=0.8, linestyles=":", label="round commits")
    ax.set_yticks([m_count - 1 - r + 0.5 for r in range(m_count)], [f"replica {r}" for r in range(m_count)])
    ax.set_ylim(0, m_count)
    ax.set_xlim(0, stop)
    ax.set_title(name, loc="left", fontsize=9)
    ax.tick_params(axis="y", length=0, labelsize=8)
    ax.spines[["left"]].set_visible(False)
  axes[-1].set_xlabel("time (s)")
  handles = {}
  for ax in axes:
    for h, lab in zip(*ax.get_legend_handles_labels()):
      handles.setdefault(lab, h)
  order = [f"computing ({f})" for f in FATE_COLORS] + ["waiting", "round commits"]
  handles = {lab: handles[lab] for lab in order if lab in handles}
  fig.legend(handles.values(), handles.keys(), loc="outside lower center", ncol=min(5, len(handles)),
             fontsize=8, frameon=False)
  if title:
    fig.suptitle(title, fontsize=10)
  return done(fig)
