"""A process lost during an elastic run and its replacement, measured: who trained, who
synced, when it was lost, when it was healed, and what the failure cost.

:func:`elastic_demo` launches Streaming DiLoCo over three processes with ``--elastic``
(:mod:`diloco_core.runtime.elastic`) and has the launcher kill one of them (``--kill-at``, SIGKILL)
during the run and start it again (``--restart``): the replacement rejoins.
:func:`process_timeline` reads what each process did from the run's traces (steps computed,
waits, syncs and who took part in each), and the background-communication page draws it
beside the loss curve (:func:`analysis.plots.timelines.plot_elastic`).
:func:`measure_failure` reads when the failure's events happened, and :func:`failure_cost`
sets what it cost beside the goodput model's
(:func:`analysis.planning.goodput.elastic_failure_cost`).

:func:`path_benchmark` measures the path every payload of an elastic run takes (JAX's coordination
service) beside gloo's, and the largest value the service carries
(:mod:`diloco_core.launch.path_probe`; ``benchmarks/elastic_path.py`` prints it).

The demo takes a minute of three processes, so the page does not run it as it is built:
``benchmarks/elastic_demo.py --store`` runs it and :func:`store_demo` keeps its raw measurement
(every process's trace rows and the metrics rows) with the machine's provenance and a content
hash; :func:`load_demo` refuses an edited file and computes everything the page says from those
rows again (:func:`measure_failure`, :func:`process_timeline`, :func:`failure_cost`)."""

from __future__ import annotations

import json
import os
import tempfile

import numpy as np
import pandas as pd

from analysis.lab.measured import (launch_module, launch_run, machine_provenance, measurement_line, read_trace,
                                   write_measurement)
from analysis.lab.stored import RESULTS_DIR, content_hash
from diloco_core.launch.path_probe import PATHS
from analysis.planning.goodput import Failures, elastic_failure_cost

#: The demo run's shape: replicas M (one per process), sync interval H, fragments P.
DEMO_SHAPE = {"replicas": 3, "sync_every": 4, "fragments": 2}

#: The demo run: three processes, one replica each, Streaming DiLoCo with 4-bit payloads; a log
#: row (where a replacement is healed) every H / P steps, as often as a fragment's sync. The run
#: is short (its steps take milliseconds), so the others wait at a log row for the replacement
#: to compile (``--heal-wait``) instead of finishing before it is ready.
DEMO_FLAGS = ("--model", "tiny", "--replicas", str(DEMO_SHAPE["replicas"]), "--algorithm", "streaming",
              "--fragments", str(DEMO_SHAPE["fragments"]), "--sync-every", str(DEMO_SHAPE["sync_every"]),
              "--batch-size", "4", "--seq-len", "32", "--log-every", str(DEMO_SHAPE["sync_every"] // DEMO_SHAPE["fragments"]),
              "--eval-every", "4", "--warmup-steps", "2", "--compression", "fp4", "--error-feedback",
              "--communication", "background", "--elastic", "--heal-wait", "120")

#: The first step the timeline shows (the steps before it compile).
FIRST_STEP = 3
#: The stored demo the page shows, and the command that stores it again.
DEMO_STORED = RESULTS_DIR / "measured" / "elastic_demo.json"
DEMO_RERUN = "python benchmarks/elastic_demo.py --store"


def elastic_demo(workdir: str, *, kill: tuple[int, int] = (2, 10), steps: int = 32) -> dict:
  """Runs the demo (:data:`DEMO_FLAGS`) and kills process ``kill[0]`` once it computed step ``kill[1]``.

  Returns:
    ``{"out": the run's directory, "traces": rank -> trace rows, "metrics": the metrics rows
    (DataFrame), "kill_step": kill[1], **measure_failure(traces, kill[0])}``
    (:func:`measure_failure`).
  """
  out = os.path.join(workdir, "elastic")
  launch_run(out, [*DEMO_FLAGS, "--steps", str(steps)], processes=3,
             launcher_args=("--kill-at", f"{kill[0]}:{kill[1]}", "--restart"))
  return _demo(read_trace(out), pd.read_json(os.path.join(out, "metrics.jsonl"), lines=True), kill[0], kill[1], out)


def _demo(traces: dict, metrics: pd.DataFrame, killed: int, kill_step: int, out: str | None) -> dict:
  """The demo's result from its raw rows (what :func:`elastic_demo` and :func:`load_demo` return)."""
  return {"out": out, "traces": traces, "metrics": metrics, "kill_step": kill_step, **measure_failure(traces, killed)}


def store_demo(demo: dict, command: str, path=DEMO_STORED) -> dict:
  """Writes an :func:`elastic_demo` run's raw rows (traces, metrics) and its kill with the
  machine's provenance and a content hash to ``path``; returns the document written."""
  metrics = [{k: (None if isinstance(v, float) and v != v else v) for k, v in row.items()}
             for row in json.loads(demo["metrics"].to_json(orient="records"))]
  return write_measurement(path, {"provenance": machine_provenance(command), "killed": demo["killed"],
                                  "kill_step": demo["kill_step"], "metrics": metrics,
                                  "traces": {str(rank): rows for rank, rows in demo["traces"].items()}})


def load_demo(path=DEMO_STORED) -> tuple[dict, str]:
  """The stored demo, as :func:`elastic_demo` returns it (``out`` None), computed again from its
  raw rows, and one provenance sentence; an edited file is refused (its hash).

  Examples:
    >>> demo, line = load_demo()
    >>> demo["killed"], demo["healed_step"] >= demo["lost_step"], line.startswith("Measured ")
    (2, True, True)
  """
  import pathlib
  path = pathlib.Path(path)
  if not path.exists():
    raise ValueError(f"no stored elastic demo at {path}; run `{DEMO_RERUN}` to measure and store it.")
  doc = json.loads(path.read_text())
  if doc.get("sha256") != content_hash(doc):
    raise ValueError(f"stored elastic demo {path.name}: its sha256 does not match its content (edited by hand?);"
                     f" run `{DEMO_RERUN}` to measure and store it again.")
  traces = {int(rank): rows for rank, rows in doc["traces"].items()}
  demo = _demo(traces, pd.DataFrame(doc["metrics"]), doc["killed"], doc["kill_step"], None)
  return demo, measurement_line(doc["provenance"], path.name, DEMO_RERUN)


def measure_failure(traces: dict, killed: int, first_step: int = FIRST_STEP) -> dict:
  """When process ``killed`` was lost and healed, from the run's traces (times in seconds from
  the start of step ``first_step`` on the earliest process; process 0 leads and records).

  Returns:
    ``{"killed", "last_step": the last step its first life computed (recorded, or sent in a
    sync that counted it), "kill_time": its last trace record, "lost_step", "lost_time": the step and time of the first agreement (a sync or a
    log row) that left it out, "wait_s": how long process 0 waited between that last step and
    that agreement (the heartbeat at work), "sent_step", "sent_time": the last step whose
    fragment it sent counted in a sync, and when that step ended on it, "join_time": when its
    replacement joined an agreement, "healed_step", "heal_time": the step whose state the
    leader sent it, and when, "heal_wait_s": how long process 0 waited before that for it to be
    ready (compiled; ``heal_wait``), "join_wait_s": how long process 0 then waited until the
    replacement took part in a sync, "step_s": process 0's median step time (start to start)
    before the kill}``.

  Examples:
    >>> step = lambda r, t: {"kind": "compute", "step": t, "start": 10.0 * t, "end": 10.0 * t + 9}
    >>> traces = {0: [*(step(0, t) for t in range(1, 5)),
    ...               {"kind": "settle", "sent_at": 2, "time": 30.0, "present": [1.0, 1.0]},
    ...               {"kind": "wait", "step": 4, "start": 49.0, "end": 55.0},
    ...               {"kind": "lost", "step": 4, "processes": [1], "time": 55.0},
    ...               {"kind": "joined", "step": 5, "processes": [1], "time": 70.0},
    ...               {"kind": "heal", "step": 6, "processes": [1], "time": 75.0},
    ...               {"kind": "wait", "step": 7, "start": 80.0, "end": 84.0},
    ...               {"kind": "settle", "sent_at": 6, "time": 85.0, "present": [1.0, 1.0]}],
    ...           1: [step(1, 1), step(1, 2), step(1, 3), {"kind": "healed", "step": 6}]}
    >>> m = measure_failure(traces, 1, first_step=1)
    >>> [m[k] for k in ("last_step", "kill_time", "sent_time", "join_time", "heal_time", "wait_s", "join_wait_s", "step_s")]
    [3, 29.0, 19.0, 60.0, 65.0, 6.0, 4.0, 10.0]
    >>> m["heal_wait_s"]  # no wait for it at the log row
    0.0
  """
  rows = traces[0]
  lost = next((r for r in rows if r["kind"] == "lost" and killed in r["processes"]), None)
  if lost is None:
    raise RuntimeError(f"process {killed} was not lost in this run (it ended before the kill?)")
  heal = next((r for r in rows if r["kind"] == "heal" and killed in r["processes"]), None)
  if heal is None:
    raise RuntimeError(f"process {killed}'s replacement was not healed in this run (it ended first?)")
  mine = traces[killed]
  first_life = mine[:next((i for i, r in enumerate(mine) if r["kind"] in ("warm-up", "healed")), len(mine))]
  computed = {r["step"]: r["end"] for r in first_life if r["kind"] == "compute"}
  killed_at = max(r.get("end", r.get("time", r.get("finished", 0.0))) for r in first_life)  # its last record
  sent = max(r["sent_at"] for r in rows if r["kind"] == "settle" and r["time"] <= lost["time"]
             and r["present"] is not None and r["present"][killed] > 0)
  # killed after it put a sync's payload and before it recorded that step: its work up to then counted
  sent_end = computed.get(sent, killed_at)
  joined = next(r for r in rows if r["kind"] == "joined" and killed in r["processes"] and r["time"] >= killed_at)
  waits = [r for r in rows if r["kind"] == "wait"  # the agreement's time is its link thread's, just before
           and killed_at < r["end"] <= lost["time"] + 0.5]
  starts = [r["start"] for r in rows if r["kind"] == "compute" and first_step <= r["step"] and r["end"] <= killed_at]
  t0 = _t0(traces, first_step)
  return {"killed": killed, "last_step": max(max(computed), sent), "kill_time": killed_at - t0,
          "lost_step": lost["step"], "lost_time": lost["time"] - t0, "wait_s": sum(r["end"] - r["start"] for r in waits),
          "sent_step": sent, "sent_time": sent_end - t0, "join_time": joined["time"] - t0,
          "healed_step": heal["step"], "heal_time": heal["time"] - t0, "join_wait_s": _join_wait(traces, heal, killed),
          "heal_wait_s": float(sum(r["end"] - r["start"] for r in rows
                                   if r["kind"] == "wait" and r.get("for") == "heal" and r["end"] <= heal["time"])),
          "step_s": float(np.median(np.diff(starts))) if len(starts) > 1 else float("nan")}


def failure_cost(measured: dict, *, replicas: int, sync_every: int, fragments: int, heartbeat_s: float,
                 method: str = "streaming") -> pd.DataFrame:
  """One measured failure (:func:`measure_failure`) beside what the goodput model
  (:func:`analysis.planning.goodput.elastic_failure_cost`) says it costs, in replica-seconds.

  The run's parts: ``work``, the lost replica's steps after its last counted send (kill time −
  that step's end); ``rejoin``, until its replacement joined an agreement; ``wait``, until the
  leader sent it the heal; ``grace``, the others' wait at the agreement that left it out, times
  M − 1; ``compile``, their wait while the replacement compiled (at the log row, ``heal_wait``,
  and after the heal until its first sync), times M − 1 (not in the model: with ``heal_wait``
  0 the others never wait for it). The model is given the measured rejoin time (a property of the
  machine, fitted here), the heartbeat as its grace window (the longest the others can wait)
  and the measured step time; its ``work`` and ``wait`` are expectations over when the
  failure lands (H s / 2 and H s / (2P): the trainer heals after a log row, so ``wait``
  matches when the log interval is H / P steps).

  Returns:
    Rows ``part, model_s, run_s`` for the five parts and their ``total``.

  Examples:
    >>> m = {"kill_time": 29.0, "sent_time": 19.0, "join_time": 60.0, "heal_time": 65.0, "wait_s": 6.0,
    ...      "join_wait_s": 4.0, "step_s": 10.0}
    >>> failure_cost(m, replicas=2, sync_every=4, fragments=2, heartbeat_s=10.0).values.tolist()
    [['work', 20.0, 10.0], ['rejoin', 31.0, 31.0], ['wait', 10.0, 5.0], ['grace', 10.0, 6.0], ['compile', 0.0, 4.0], ['total', 71.0, 56.0]]
  """
  rejoin = measured["join_time"] - measured["kill_time"]
  model = elastic_failure_cost(method, Failures(0.0, rejoin_s=rejoin, grace_s=heartbeat_s), replicas=replicas,
                               step_wall_s=measured["step_s"], sync_every=sync_every, fragments=fragments)
  others = replicas - 1
  run = {"work": measured["kill_time"] - measured["sent_time"], "rejoin": rejoin,
         "wait": measured["heal_time"] - measured["join_time"], "grace": others * measured["wait_s"],
         "compile": others * (measured.get("heal_wait_s", 0.0) + measured["join_wait_s"])}
  model["compile"] = 0.0
  parts = list(run)
  return pd.DataFrame({"part": [*parts, "total"], "model_s": [*(model[p] for p in parts), sum(model.values())],
                       "run_s": [*(run[p] for p in parts), sum(run.values())]})


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


#: The payload sizes (MiB) :func:`path_benchmark` measures unless told.
PATH_SIZES_MIB = (1, 4, 16, 64)
#: The ratios :func:`path_table` adds, ``(name, numerator path, denominator path)``: the data
#: plane's rate over gloo's and over the service's, and the reduction's over gloo's.
PATH_RATIOS = (("elastic_over_gloo", "elastic", "gloo"), ("elastic_over_service", "elastic", "service"),
               ("elastic_reduce_over_gloo_reduce", "elastic_reduce", "gloo_reduce"))


def path_benchmark(sizes_mib=PATH_SIZES_MIB, *, repeats: int = 3, processes: int = 2,
                   paths=PATHS) -> tuple[pd.DataFrame, dict]:
  """Launches the path probe (:mod:`diloco_core.launch.path_probe`) over ``processes`` processes:
  one payload of each size per process over the data plane (an elastic sync), through the
  coordination service (the path before it) and through gloo, and its mean reduced over the
  data plane and over gloo (``reduction="reduce-scatter"``), ``repeats`` times; ``paths``: some
  of them (:data:`~diloco_core.launch.path_probe.PATHS`).

  Returns:
    ``(path_table(result), result)``: the table (:func:`path_table`) and the probe's JSON
    (``processes``, ``repeats``, ``heartbeat_s``, ``chunk_bytes``).
  """
  with tempfile.TemporaryDirectory(prefix="path-probe-") as tmp:
    out = os.path.join(tmp, "paths.json")
    launch_module("diloco_core.launch.path_probe", ["--sizes-mib", ",".join(map(str, sizes_mib)), "--repeats",
                                                    str(repeats), "--paths", ",".join(paths), "--json", out],
                  processes)
    with open(out) as f:
      result = json.load(f)
  return path_table(result), result


def path_table(result: dict) -> pd.DataFrame:
  """The probe's rows (:mod:`diloco_core.launch.path_probe`) as one row per payload size: for
  each path timed (``elastic``: the data plane, ``service``: the coordination service, ``gloo``;
  ``elastic_reduce`` and ``gloo_reduce``: the mean over the data plane and over gloo)
  ``<path>_s`` (median seconds until every process had every payload, or the mean) and
  ``<path>_mb_s`` (MB/s: a process's payload over that time); the ratios of
  :data:`PATH_RATIOS` whose two paths were timed.

  Examples:
    >>> rows = [{"size_mib": 8, "path": "elastic", "seconds": 0.1, "mb_per_s": 84.0},
    ...         {"size_mib": 8, "path": "service", "seconds": 0.5, "mb_per_s": 16.8},
    ...         {"size_mib": 8, "path": "gloo", "seconds": 0.05, "mb_per_s": 168.0}]
    >>> path_table({"rows": rows}).iloc[0][["elastic_mb_s", "gloo_mb_s", "elastic_over_gloo", "elastic_over_service"]].tolist()
    [84.0, 168.0, 0.5, 5.0]
  """
  rows = pd.DataFrame(result["rows"])
  wide = rows.pivot(index="size_mib", columns="path", values=["seconds", "mb_per_s"])
  table = pd.DataFrame({"size_mib": wide.index.astype(float)})
  timed = [p for p in PATHS if p in set(rows["path"])]
  for path in timed:
    table[f"{path}_s"] = wide["seconds", path].values
    table[f"{path}_mb_s"] = wide["mb_per_s", path].values
  for name, a, b in PATH_RATIOS:
    if a in timed and b in timed:
      table[name] = table[f"{a}_mb_s"] / table[f"{b}_mb_s"]
  return table
