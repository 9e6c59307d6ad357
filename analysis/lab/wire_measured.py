"""Packed wire formats over a shaped link: transfer times, bytes per process, utilization.

:func:`wire_benchmark` runs background DiLoCo (τ = 0: each sync's gather is waited for) with
float32, bf16 and fp4 payloads over one link, shaped so that a float32 payload's gather takes
about k steps, and reads from the runs' own traces what each transfer took and the bytes each
process handed to the link and received (:mod:`diloco_core.wire.packing`). It then runs fp4
payloads over 4 processes on the plain loopback to measure what one process receives from
more than one peer, with each ``--reduction`` (:mod:`diloco_core.wire.reduce_scatter`). ``benchmarks/overlap.py --wire`` prints it; the
background-communication page shows it.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pandas as pd

from analysis.lab.measured import can_shape, launch_run, read_trace, simulated, summarize

#: The wire formats compared, float32 first (the reference of the ratios).
FORMATS = ("none", "bf16", "fp4")
#: The (processes, reduction) runs of the bytes-per-process table (fp4 in blocks of PROCESS_BLOCK,
#: so that the reduce-scatter's chunks come out even); two processes are the formats' runs.
PROCESS_ROWS = ((4, "all-gather"), (4, "reduce-scatter"))
#: Elements per absmax block of the fp4 payloads of the bytes-per-process runs.
PROCESS_BLOCK = 256


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
