"""A process lost during an elastic run and its replacement, measured: who trained, who
synced, when it was lost, when it was healed.

:func:`elastic_demo` launches Streaming DiLoCo over three processes with ``--elastic``
(:mod:`diloco_core.elastic`) and has the launcher kill one of them (``--kill-at``, SIGKILL)
during the run and start it again (``--restart``): the replacement rejoins. :func:`process_timeline` reads what each process did from the run's traces
(steps computed, waits, syncs and who took part in each), and the background-communication
page draws it beside the loss curve (:func:`analysis.plots.timelines.plot_elastic`).
"""

from __future__ import annotations

import os

import pandas as pd

from analysis.lab.measured import launch_run, read_trace

#: The demo run: three processes, one replica each, Streaming DiLoCo with 4-bit payloads.
DEMO_FLAGS = ("--model", "tiny", "--replicas", "3", "--algorithm", "streaming", "--fragments", "2",
              "--sync-every", "4", "--batch-size", "4", "--seq-len", "32", "--log-every", "2",
              "--eval-every", "4", "--warmup-steps", "2", "--compression", "fp4", "--error-feedback",
              "--communication", "background", "--elastic")

#: The first step the timeline shows (the steps before it compile).
FIRST_STEP = 3


def elastic_demo(workdir: str, *, kill: tuple[int, int] = (2, 10), steps: int = 32) -> dict:
  """Runs the demo (:data:`DEMO_FLAGS`) and kills process ``kill[0]`` once it computed step ``kill[1]``.

  Returns:
    ``{"out": the run's directory, "traces": rank -> trace rows, "metrics": the metrics rows
    (DataFrame), "killed": the process killed, "last_step": the last step it computed,
    "lost_step": the step of the first agreement (a sync or a log row) that left it out,
    "wait_s": how long process 0 waited
    between the killed process's last step and that sync (for a sync or a log row: the
    heartbeat at work), "kill_time": when its last step ended, "lost_time": when that agreement
    passed, "healed_step": the step whose state the leader sent the replacement,
    "heal_time": when (seconds from step :data:`FIRST_STEP`), "join_wait_s": how long process 0
    then waited until the replacement took part in a sync}``.
  """
  out = os.path.join(workdir, "elastic")
  launch_run(out, [*DEMO_FLAGS, "--steps", str(steps)], processes=3,
             launcher_args=("--kill-at", f"{kill[0]}:{kill[1]}", "--restart"))
  traces = read_trace(out)
  metrics = pd.read_json(os.path.join(out, "metrics.jsonl"), lines=True)
  lost = [r for r in traces[0] if r["kind"] == "lost"]
  if not lost:
    raise RuntimeError(f"process {kill[0]} was not lost in {out} (the run ended before the kill?)")
  t0 = _t0(traces, FIRST_STEP)
  heals = [r for r in traces[0] if r["kind"] == "heal"]
  if not heals:
    raise RuntimeError(f"process {kill[0]}'s replacement was not healed in {out} (the run ended first?)")
  killed_steps = [r for r in traces[kill[0]] if r["kind"] == "compute" and r["step"] <= heals[0]["step"]]
  waits = [r for r in traces[0] if r["kind"] == "wait"  # the agreement's time is its link thread's, just before
           and killed_steps[-1]["end"] < r["end"] <= lost[0]["time"] + 0.5]
  return {"out": out, "traces": traces, "metrics": metrics, "killed": kill[0],
          "last_step": killed_steps[-1]["step"], "lost_step": lost[0]["step"],
          "wait_s": sum(r["end"] - r["start"] for r in waits), "kill_time": killed_steps[-1]["end"] - t0,
          "lost_time": lost[0]["time"] - t0, "healed_step": heals[0]["step"], "heal_time": heals[0]["time"] - t0,
          "join_wait_s": _join_wait(traces, heals[0], kill[0])}


def _join_wait(traces: dict, heal: dict, replaced: int) -> float:
  """Seconds process 0 waited between the heal and the first sync the replacement took part in
  (its first steps compile its programs, and every agreement waits for every live process)."""
  back = next(r for r in traces[0] if r["kind"] == "settle" and r["time"] >= heal["time"]
              and r["present"] is not None and r["present"][replaced] > 0)
  return sum(r["end"] - r["start"] for r in traces[0]
             if r["kind"] == "wait" and heal["time"] - 0.01 <= r["start"] and r["end"] <= back["time"] + 0.01)


def _t0(traces: dict, first_step: int = 1) -> float:
  return min(r["start"] for rows in traces.values() for r in rows if r["kind"] == "compute" and r["step"] >= first_step)


def process_timeline(traces: dict, first_step: int = 1) -> pd.DataFrame:
  """Every process's run from step ``first_step`` on (the first steps compile) as rows
  ``process, kind, step, start, end, present`` (seconds from that step's start on the earliest
  process): ``compute`` (a step, less its waits), ``wait`` (for a sync, or for a log row's
  exchange: an agreement too, where a lost process is waited for), and ``sync`` (a
  zero-length row at each settle; ``present``: the replicas that took part).

  Examples:
    >>> rows = {0: [{"kind": "compute", "step": 1, "start": 10.0, "end": 11.0},
    ...             {"kind": "settle", "step": 1, "fragment": 0, "sent_at": 1, "time": 11.0, "present": [1.0, 0.0]}]}
    >>> process_timeline(rows)[["process", "kind", "start", "end"]].values.tolist()
    [[0, 'compute', 0.0, 1.0], [0, 'sync', 1.0, 1.0]]
  """
  t0, out = _t0(traces, first_step), []
  for rank, rows in traces.items():
    waits = [r for r in rows if r["kind"] == "wait"]
    for r in rows:
      if r["kind"] == "compute":
        inside = [w for w in waits if r["start"] <= w["start"] and w["end"] <= r["end"]]
        cut = [r["start"], *[t for w in inside for t in (w["start"], w["end"])], r["end"]]
        out += [(rank, "compute", r["step"], a - t0, b - t0, None) for a, b in zip(cut[::2], cut[1::2]) if b > a]
      elif r["kind"] == "wait":
        out.append((rank, "wait", r["step"], r["start"] - t0, r["end"] - t0, None))
      elif r["kind"] == "settle":
        out.append((rank, "sync", r["sent_at"], r["time"] - t0, r["time"] - t0, r.get("present")))
  frame = pd.DataFrame(out, columns=["process", "kind", "step", "start", "end", "present"])
  return frame[frame["end"] >= 0].sort_values(["process", "start"], ignore_index=True)
