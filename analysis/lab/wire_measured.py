"""Packed wire formats over a shaped link: transfer times, bytes per process, utilization.

:func:`wire_benchmark` runs background DiLoCo (τ = 0: each sync's gather is waited for) with
float32, bf16 and fp4 payloads over one link, shaped so that a float32 payload's gather takes
about k steps, and reads from the runs' own traces what each transfer took and the bytes each
process handed to the link and received (:mod:`diloco_core.wire.packing`). It then runs fp4
payloads over 4 processes on the plain loopback to measure what one process receives from
more than one peer, with each ``--reduction`` (:mod:`diloco_core.wire.reduce_scatter`). ``benchmarks/overlap.py --wire`` prints it.

Stored: ``benchmarks/overlap.py --wire --store`` writes the measurement with its provenance
(:func:`store_wire`, ``analysis/results/measured/wire.json``); the background-communication page
shows that file (:func:`load_wire`), whose derived columns are recomputed from the measured ones by
the project's code (float32's time over each format's, the simulator's utilization for each
payload, received over sent) and whose hash refuses an edited number. The build trains nothing
for it (the measurement took minutes of four-process runs).
"""

from __future__ import annotations

import json
import math
import os
import pathlib

import numpy as np
import pandas as pd

from analysis.lab.measured import (can_shape, json_rows, launch_run, machine_provenance, measurement_line,
                                   read_trace, simulated, summarize, write_measurement)
from analysis.lab.stored import RESULTS_DIR, content_hash

#: The wire formats compared, float32 first (the reference of the ratios).
FORMATS = ("none", "bf16", "fp4")
#: The (processes, reduction) runs of the bytes-per-process table (fp4 in blocks of PROCESS_BLOCK,
#: so that the reduce-scatter's chunks come out even); two processes are the formats' runs.
PROCESS_ROWS = ((4, "all-gather"), (4, "reduce-scatter"))
#: Elements per absmax block of the fp4 payloads of the bytes-per-process runs.
PROCESS_BLOCK = 256
#: The stored measurement the page shows, and the command that stores it again.
STORED = RESULTS_DIR / "measured" / "wire.json"
RERUN = "python benchmarks/overlap.py --wire --store"
#: Relative agreement required between a stored derived figure and its recomputation.
RTOL = 1e-9


class WireResultError(ValueError):
  """The stored wire measurement is missing, edited, or inconsistent with its own measured columns."""


def transfers(rows: list[dict], first_step: int, last_step: int) -> list[dict]:
  """A process's fragment transfers launched while steps ``first_step`` .. ``last_step`` ran.

  Args:
    rows: the process's trace rows (:func:`analysis.lab.measured.read_trace`).
    first_step, last_step: the measured steps.

  Returns:
    The ``transfer`` rows of fragments (not the end's gathers of params) in that window.

  Examples:
    >>> rows = [{"kind": "compute", "step": 1, "start": 0.0, "end": 1.0},
    ...         {"kind": "transfer", "what": "fragment 0 @ step 1", "launched": 0.9, "finished": 1.5},
    ...         {"kind": "compute", "step": 2, "start": 1.0, "end": 2.0},
    ...         {"kind": "transfer", "what": "replica params", "launched": 2.0, "finished": 2.1}]
    >>> [r["what"] for r in transfers(rows, 1, 2)]
    ['fragment 0 @ step 1']
  """
  steps = [r for r in rows if r["kind"] == "compute" and first_step <= r["step"] <= last_step]
  t0, t1 = steps[0]["start"], steps[-1]["end"]
  return [r for r in rows if r["kind"] == "transfer" and r["what"].startswith("fragment")
          and t0 <= r["launched"] <= t1]


def wire_benchmark(workdir: str, *, k: int = 4, sync_every: int = 8, steps: int = 40,
                   model: str = "small", batch_size: int = 16) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
  """Transfer time and bytes of each wire format over one shaped link, and bytes per process
  with 4 processes by each reduction (:data:`PROCESS_ROWS`).

  A calibration run (float32, no shaping) gives the compute time T of a step, the process's own
  time between steps, the float32 payload (as the trace measured it) and the cost of one
  collective; the link is then shaped as in :func:`analysis.lab.measured.overlap_benchmark`.

  Returns:
    ``(setting, formats, processes)``: the setting; per format (``formats``): the bytes one
    process handed to the link and received per sync, the median transfer time (packing,
    gather and unpacking), float32's time over it, and the utilization measured and simulated
    for that payload (τ = 0); per row of :data:`PROCESS_ROWS` (``processes``, fp4 in blocks of
    :data:`PROCESS_BLOCK`, unshaped): the bytes one process sent and received per sync.
  """
  H, first, last = sync_every, 2 * sync_every + 1, steps - 1
  base = ["--model", model, "--replicas", "2", "--sync-every", str(H), "--steps", str(steps),
          "--batch-size", str(batch_size), "--seq-len", "64", "--eval-every", str(steps),
          "--log-every", str(steps), "--warmup-steps", "1", "--communication", "background"]
  calib = os.path.join(workdir, "calibration")
  launch_run(calib, base)
  c = [summarize(rows, first, last) for rows in read_trace(calib).values()]
  payload = float(np.median([r["sent_bytes"] for r in transfers(read_trace(calib)[0], first, last)]))
  latency = float(np.mean([x["transfer_s"] / max(x["transfers"], 1) for x in c]))
  T, host = float(np.mean([x["compute_step_s"] for x in c])), float(np.mean([x["host_s"] for x in c]))
  why_not = can_shape()
  mbit = 2 * payload * 8 / (k * (T + host)) / 1e6 if why_not is None else None
  setting = {"model": model, "step_s": T, "host_s": host, "payload_bytes": payload, "latency_s": latency,
             "mbit": mbit, "sync_every": H, "k": k, "first_step": first, "last_step": last,
             "unshaped_because": why_not}
  rows = []
  for name in FORMATS:
    out = os.path.join(workdir, f"format-{name}")
    launch_run(out, [*base, "--compression", name], mbit)
    traces = read_trace(out)
    moved = [r for rank in traces for r in transfers(traces[rank], first, last)]
    sent = float(np.median([r["sent_bytes"] for r in moved]))
    per = [summarize(t, first, last) for t in traces.values()]
    rows.append({"format": name, "sent_bytes": sent,
                 "received_bytes": float(np.median([r["received_bytes"] for r in moved])),
                 "counted_bytes": json.load(open(os.path.join(out, "summary.json")))["total_bytes_per_replica"]
                 / (steps // H),  # per sync and replica, as the metrics count it
                 "transfer_s": float(np.median([r["finished"] - r["launched"] for r in moved])),
                 "measured": float(np.mean([x["utilization"] for x in per])),
                 "simulated": (simulated(T, sent, mbit, sync_every=H, latency_s=latency, host_s=host)
                               if mbit else float("nan"))})
  formats = pd.DataFrame(rows)
  formats["f32_over_this"] = formats["transfer_s"].iloc[0] / formats["transfer_s"]
  counts = []
  for n, reduction in PROCESS_ROWS:
    out = os.path.join(workdir, f"processes-{n}-{reduction}")
    args = [*base, "--compression", "fp4", "--compression-block", str(PROCESS_BLOCK), "--replicas", str(n),
            "--reduction", reduction, "--steps", str(2 * H), "--eval-every", str(2 * H), "--log-every", str(2 * H)]
    launch_run(out, args, processes=n)
    moved = [r for t in read_trace(out).values() for r in t if r["kind"] == "transfer"
             and r["what"].startswith("fragment")]
    counts.append({"processes": n, "reduction": reduction,
                   "sent_bytes": float(np.median([r["sent_bytes"] for r in moved])),
                   "received_bytes": float(np.median([r["received_bytes"] for r in moved]))})
  processes = pd.DataFrame(counts)
  processes["received_over_sent"] = processes["received_bytes"] / processes["sent_bytes"]
  return setting, formats, processes


def store_wire(setting: dict, formats: pd.DataFrame, processes: pd.DataFrame, command: str,
               path: pathlib.Path = STORED) -> dict:
  """Writes :func:`wire_benchmark`'s result with its provenance
  (:func:`~analysis.lab.measured.machine_provenance`) and content hash to ``path``.

  Returns:
    The document written.
  """
  return write_measurement(path, {"provenance": machine_provenance(command), "setting": setting,
                                  "formats": json_rows(formats), "processes": json_rows(processes)})


def check_wire(doc: dict) -> None:
  """The hash, and every derived column recomputed from the measured ones (one line if not).

  Examples:
    >>> setting = {"step_s": 0.1, "host_s": 0.0, "payload_bytes": 1e6, "latency_s": 0.0, "mbit": None,
    ...            "sync_every": 8}
    >>> fmt = {"format": "none", "sent_bytes": 1e6, "transfer_s": 0.5, "f32_over_this": 1.0, "simulated": None}
    >>> proc = {"sent_bytes": 100.0, "received_bytes": 150.0, "received_over_sent": 1.5}
    >>> doc = {"provenance": {}, "setting": setting, "formats": [fmt], "processes": [proc]}
    >>> check_wire({**doc, "sha256": content_hash(doc)})
    >>> bad = {**doc, "processes": [{**proc, "received_over_sent": 2.0}]}
    >>> check_wire({**bad, "sha256": content_hash(bad)})
    Traceback (most recent call last):
    ...
    analysis.lab.wire_measured.WireResultError: stored wire measurement, processes row 0: received_over_sent 2 is not 1.5 recomputed
  """
  where = "stored wire measurement"
  if doc.get("sha256") != content_hash(doc):
    raise WireResultError(f"{where}: its sha256 does not match its content (edited by hand?); run `{RERUN}`"
                          " to measure and store it again.")
  s, f32 = doc["setting"], doc["formats"][0]["transfer_s"]

  def same(stored, computed, what):
    if (stored is None) != (computed is None) or (stored is not None and not math.isclose(stored, computed,
                                                                                           rel_tol=RTOL)):
      shown = lambda v: "None" if v is None else f"{v:g}"
      raise WireResultError(f"{where}, {what} {shown(stored)} is not {shown(computed)} recomputed")

  for r in doc["formats"]:
    same(r["f32_over_this"], f32 / r["transfer_s"], f"format {r['format']}: f32_over_this")
    sim = (simulated(s["step_s"], r["sent_bytes"], s["mbit"], sync_every=s["sync_every"], latency_s=s["latency_s"],
                     host_s=s["host_s"]) if s["mbit"] else None)
    same(r["simulated"], sim, f"format {r['format']}: simulated")
  for i, r in enumerate(doc["processes"]):
    same(r["received_over_sent"], r["received_bytes"] / r["sent_bytes"], f"processes row {i}: received_over_sent")


def load_wire(path: pathlib.Path = STORED) -> tuple[dict, pd.DataFrame, pd.DataFrame, str]:
  """The stored measurement, checked by :func:`check_wire`.

  Returns:
    ``(setting, formats, processes, provenance)``: as :func:`wire_benchmark` returns them (the
    simulator's figure NaN where the link was not shaped) and one provenance sentence.

  Examples:
    >>> setting, formats, processes, line = load_wire()
    >>> list(formats["format"]) == list(FORMATS), line.startswith("Measured ")
    (True, True)
  """
  path = pathlib.Path(path)
  if not path.exists():
    raise WireResultError(f"no stored wire measurement at {path}; run `{RERUN}` to measure and store it.")
  doc = json.loads(path.read_text())
  check_wire(doc)
  line = measurement_line(doc["provenance"], path.name, RERUN)
  formats = pd.DataFrame(doc["formats"]).astype({"simulated": float})
  return doc["setting"], formats, pd.DataFrame(doc["processes"]), line
