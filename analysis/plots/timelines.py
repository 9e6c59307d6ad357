"""Timelines: the communication schedules of DP, DiLoCo and Streaming DiLoCo, and simulated runs.

:func:`schedule_text` and :func:`plot_schedule` draw :func:`diloco_core.spec.schedule.schedule_table`;
:func:`plot_timeline` draws a run of :mod:`analysis.planning.simulate`, :func:`plot_hiding` one sync
of several runs, where each transfer hides behind compute; :func:`plot_elastic` an elastic run
that lost a process (:mod:`analysis.lab.elastic_measured`).
"""

from __future__ import annotations

from typing import Sequence

import matplotlib
import numpy as np
import pandas as pd

from analysis.plots._style import done
from analysis.plots._style import new_figure
from diloco_core.spec.schedule import schedule_table


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


def schedule_frame(sync_every: int, fragments: int, overlap: int, steps: int) -> pd.DataFrame:
  """Streaming DiLoCo's schedule as a table to show: one column per inner step, the fragment
  sent and the fragment merged after it (an integer id; ``–``: none), from
  :func:`diloco_core.spec.schedule.schedule_table`.

  Examples:
    >>> schedule_frame(sync_every=6, fragments=3, overlap=1, steps=6)
    step             1  2  3  4  5  6
    fragment sent    –  0  –  1  –  2
    fragment merged  –  –  0  –  1  –
  """
  rows = schedule_table(sync_every=sync_every, fragments=fragments, overlap=overlap, steps=steps)
  cell = lambda p: "–" if p is None else str(p)
  return pd.DataFrame({r["step"]: {"fragment sent": cell(r["send"]), "fragment merged": cell(r["merge"])}
                       for r in rows}).rename_axis(columns="step")


def schedule_text(sync_every: int, fragments: int, overlap: int, steps: int) -> str:
  """The communication schedule of DP, DiLoCo and Streaming DiLoCo as an ASCII timeline.

  One column per inner step t = 1..steps (the header shows t mod 10). ``A``: DP
  all-reduces the whole gradient; ``S``: DiLoCo sends the whole model and every replica
  takes the result (τ = 0); on the two Streaming lines, a digit p: fragment p is sent
  (``send``) or merged (``merge``, τ steps after its send); ``.``: compute only. The
  schedule comes from :func:`diloco_core.spec.schedule.schedule_table`.

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
  behind). Schedules come from :func:`diloco_core.spec.schedule.schedule_table`.

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
  fig, (ax,) = new_figure(figsize=(8.0, 2.9))
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
  return done(fig)


def plot_timeline(timeline: pd.DataFrame, *, start: float | None = None, end: float | None = None,
                  lanes: dict[str, str] | None = None, title: str | None = None, ax=None):
  """A Gantt chart of a simulated run: compute, idle (waiting for the network) and transfers.

  Args:
    timeline: :meth:`analysis.planning.simulate.SimResult.timeline` (columns ``kind``, ``start``,
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
  fig, (ax,) = new_figure(figsize=(8.0, 2.4)) if ax is None else (ax.figure, [ax])
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
  return done(fig)


def plot_hiding(runs: dict, *, after: float = 0.5, title: str | None = None):
  """One sync of each simulated run, compute against the link: where each transfer hides.

  For each :class:`analysis.planning.simulate.SimResult`, from the start of the first step of its
  measured window that sends to a little after the step that needs what it sent: the
  per-layer forward and backward passes and the idle time (top lane), the chunks on the
  link (bottom lane), the *hiding window* (shaded, from the first chunk's release to the
  start of the step that needs the payload) and that step's start (dashed). Time is
  counted from the start of the sending step.

  Args:
    runs: ``{label: SimResult}``, drawn top to bottom.
    after: how much of the needing step to show, in steps.
    title: the figure title.

  Returns:
    The matplotlib Figure.
  """
  fig, axes = new_figure(figsize=(8.0, 1.75 * len(runs) + 0.4), nrows=len(runs))
  for i, (ax, (name, r)) in enumerate(zip(axes, runs.items())):
    tr = r.transfers
    step = int(tr.loc[tr["step"] >= r.window[0], "step"].iloc[0])
    sent = tr[tr["step"] == step]
    t0 = r.step_start[step - 1]
    deadline = r.step_start[int(sent["needed_by"].iloc[0]) - 1] - t0
    end = max(deadline, sent["arrival"].max() - t0) + after * r.step_time
    tl = r.timeline(layers=True)
    tl = tl.assign(start=tl["start"] - t0, end=tl["end"] - t0)
    plot_timeline(tl, start=0.0, end=end, ax=ax, title=name)
    ax.axvspan(sent["ready"].min() - t0, deadline, color="C2", alpha=0.2, lw=0, zorder=0,
               label="hiding window")
    ax.axvline(deadline, color="k", ls="--", lw=1, label="needed by")
    ax.get_legend().remove()
    if i < len(runs) - 1:
      ax.set_xlabel("")
  handles, labels = axes[0].get_legend_handles_labels()
  keep = dict(zip(labels, handles))
  fig.legend(keep.values(), keep.keys(), loc="outside lower center", ncol=len(keep),
             fontsize=8, frameon=False)
  if title:
    fig.suptitle(title)
  return done(fig)


def plot_elastic(timeline: pd.DataFrame, metrics: pd.DataFrame, *, killed: int, kill_time: float,
                 lost_time: float, lost_step: int, heal_time: float | None = None,
                 healed_step: int | None = None, title: str | None = None):
  """An elastic run that lost a process: what each process did, beside the losses.

  Left: one lane per process, its steps (grey), its waits for the others (red: a sync or a log
  row's agreement) and each sync it settled (a tick: black when every replica took part,
  orange when some were left out), the kill and the heal. Right: each replica's training loss
  and the eval loss of the global params, against the step.

  Args:
    timeline: :func:`analysis.lab.elastic_measured.process_timeline`.
    metrics: the run's ``metrics.jsonl`` rows (``step``, ``replica_loss``, ``eval_loss``).
    killed: the process killed; kill_time, lost_time: when its last step ended and when the
      others settled without it (seconds); lost_step: the step of that sync.
    heal_time, healed_step: when the leader sent a replacement the state of that step (None:
      no replacement).
    title: the figure's title.

  Returns:
    The matplotlib Figure.
  """
  fig, (ax, bx) = new_figure(figsize=(10.0, 3.2), ncols=2)
  ax.grid(False)
  procs = sorted(timeline["process"].unique())
  for p in procs:
    y, rows = len(procs) - 1 - p, timeline[timeline["process"] == p]
    for kind, color in (("compute", "0.65"), ("wait", "C3")):
      g = rows[rows["kind"] == kind]
      ax.broken_barh(list(zip(g["start"], g["end"] - g["start"])), (y + 0.2, 0.6), facecolors=color,
                     edgecolor="white", lw=0.3, label=("step" if kind == "compute" else "waits for the others") if p == 0 else None)
    syncs = rows[rows["kind"] == "sync"]
    full = syncs["present"].map(lambda m: m is None or all(v > 0 for v in m))
    ax.vlines(syncs["start"][full], y + 0.05, y + 0.95, colors="k", lw=0.8, label="sync, all present" if p == 0 else None)
    ax.vlines(syncs["start"][~full], y + 0.05, y + 0.95, colors="C1", lw=1.2,
              label="sync without the lost replica" if p == 0 else None)
  ax.axvline(kill_time, color="C3", ls=":", lw=1)
  ax.annotate(f"process {killed} killed", (kill_time, len(procs) - 0.05), fontsize=8, color="C3", ha="right", va="top")
  if heal_time is not None:
    ax.axvline(heal_time, color="C2", ls=":", lw=1)
    ax.annotate("healed", (heal_time, len(procs) - 0.05), fontsize=8, color="C2", ha="left", va="top")
  ax.set_yticks([len(procs) - 1 - p + 0.5 for p in procs], [f"process {p}" for p in procs])
  ax.set_ylim(0, len(procs))
  ax.set_xlabel("time (s)")
  ax.tick_params(axis="y", length=0)
  ax.spines[["left"]].set_visible(False)
  ax.legend(fontsize=7, ncol=2, loc="upper left", bbox_to_anchor=(0.0, 1.32))
  losses = np.array([[np.nan if v is None else v for v in row] for row in metrics["replica_loss"].iloc[1:]], float)
  for m in range(losses.shape[1]):
    bx.plot(metrics["step"].iloc[1:], losses[:, m], lw=1, label=f"replica {m} (train)")
  ev = metrics.dropna(subset=["eval_loss"])
  bx.plot(ev["step"], ev["eval_loss"], "k.-", lw=1.2, label="global params (eval)")
  bx.axvline(lost_step, color="C3", ls=":", lw=1)
  if healed_step is not None:
    bx.axvline(healed_step, color="C2", ls=":", lw=1)
  bx.set_xlabel("step")
  bx.set_ylabel("loss")
  bx.legend(fontsize=7)
  if title:
    fig.suptitle(title, fontsize=10)
  return done(fig)
