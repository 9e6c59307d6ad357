"""Measured overlap: the per-step records of a background run, summarized, beside the simulator.

A run with ``communication="background"`` writes ``<out>/trace/process-<rank>.jsonl``
(:mod:`diloco_core.runtime.background`): ``compute`` rows (a step's local programs, start and end),
``wait`` rows (the main thread blocked on a fragment that had not arrived), ``transfer``
rows (a collective on the link thread: launched, finished) and ``settle`` rows.
:func:`summarize` turns them into the numbers the overlap benchmark (``benchmarks/overlap.py``)
and the background-communication page show; :func:`simulated` asks :mod:`analysis.planning.simulate`
for the same setting; :func:`overlap_benchmark` runs the whole comparison.

Examples:
  >>> rows = [{"kind": "compute", "step": 1, "start": 0.0, "end": 1.0},
  ...         {"kind": "transfer", "what": "fragment 0 @ step 1", "launched": 1.0, "finished": 2.5},
  ...         {"kind": "compute", "step": 2, "start": 1.0, "end": 2.0},
  ...         {"kind": "wait", "step": 3, "fragment": 0, "start": 2.0, "end": 2.5},
  ...         {"kind": "compute", "step": 3, "start": 2.0, "end": 3.5}]
  >>> s = summarize(rows, first_step=1)
  >>> s["compute_s"], s["wait_s"], s["transfer_s"], round(s["hidden"], 4), round(s["utilization"], 4)
  (3.0, 0.5, 1.5, 0.6667, 0.8571)
"""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys

import numpy as np
import pandas as pd

from analysis.planning.simulate import SimModel, run_simulation


def read_trace(out: str) -> dict[int, list[dict]]:
  """Every process's trace rows of the run in ``out``: rank -> rows in file order."""
  traces = {}
  for path in sorted(glob.glob(os.path.join(out, "trace", "process-*.jsonl"))):
    rank = int(os.path.basename(path).split("-")[1].split(".")[0])
    traces[rank] = [json.loads(line) for line in open(path)]
  if not traces:
    raise ValueError(f"{out} holds no trace (trace/process-*.jsonl): was it a `communication` background run?")
  return traces


def summarize(rows: list[dict], first_step: int = 1, last_step: int | None = None) -> dict:
  """One process's measured step time, compute, waits, transfers and utilization.

  Only steps ``first_step`` .. ``last_step`` count (before: compilation, warm-up; after: the
  end of the run, which settles the last sync at once), and only the transfers launched
  while they ran.

  .. math::
     u = \\frac{\\sum_t (\\text{step}_t - \\text{wait}_t)}{\\text{end}_{last} - \\text{start}_{first}},
     \\qquad \\text{hidden} = 1 - \\frac{\\sum \\text{wait}}{\\sum \\text{transfer}}

  Args:
    rows: a process's trace rows (:func:`read_trace`).
    first_step: the first step measured.

  Returns:
    ``{"steps", "wall_s", "step_s" (wall per step), "host_s" (mean time between two steps:
    the loop's own work, data and logging), "compute_s", "compute_step_s" (median pure compute
    of a step), "wait_s", "transfer_s", "transfers", "hidden", "utilization"}``.
  """
  last = float("inf") if last_step is None else last_step
  steps = [r for r in rows if r["kind"] == "compute" and first_step <= r["step"] <= last]
  if not steps:
    raise ValueError(f"no compute rows in steps {first_step}..{last_step}.")
  waits = [r for r in rows if r["kind"] == "wait" and first_step <= r["step"] <= last]
  wait_of = {}
  for r in waits:
    wait_of[r["step"]] = wait_of.get(r["step"], 0.0) + r["end"] - r["start"]
  t0, t1 = steps[0]["start"], steps[-1]["end"]
  transfers = [r for r in rows if r["kind"] == "transfer" and r["what"].startswith("fragment")
               and t0 <= r["launched"] <= t1]
  pure = [r["end"] - r["start"] - wait_of.get(r["step"], 0.0) for r in steps]
  wait = float(sum(wait_of.values()))
  moved = float(sum(r["finished"] - r["launched"] for r in transfers))
  between = float(sum(b["start"] - a["end"] for a, b in zip(steps, steps[1:]))) / len(steps)
  return {"steps": len(steps), "wall_s": t1 - t0, "step_s": (t1 - t0) / len(steps), "host_s": between,
          "compute_s": float(sum(pure)), "compute_step_s": float(np.median(pure)), "wait_s": wait,
          "transfer_s": moved, "transfers": len(transfers),
          "hidden": 1.0 - wait / moved if moved > 0 else float("nan"),
          "utilization": float(sum(pure)) / (t1 - t0)}


def timeline(rows: list[dict], first_step: int = 1) -> pd.DataFrame:
  """A process's measured run as the simulator's timeline
  (:meth:`analysis.planning.simulate.SimResult.timeline`, for :func:`analysis.plots.timelines.plot_timeline`):
  ``kind`` "compute" (a step's local programs, less its waits), "idle" (waiting for a
  fragment), "transfer" (a fragment's gather on the link thread); ``step``, ``start``,
  ``end`` in seconds from the first measured step's start."""
  steps = [r for r in rows if r["kind"] == "compute" and r["step"] >= first_step]
  t0 = steps[0]["start"]
  waits = [r for r in rows if r["kind"] == "wait" and r["step"] >= first_step]
  out = []
  for r in steps:
    w = [x for x in waits if x["step"] == r["step"]]
    cut = [r["start"], *[t for x in w for t in (x["start"], x["end"])], r["end"]]
    out += [("compute", r["step"], a - t0, b - t0) for a, b in zip(cut[::2], cut[1::2]) if b > a]
  out += [("idle", r["step"], r["start"] - t0, r["end"] - t0) for r in waits]
  out += [("transfer", int(r["what"].split("@ step ")[1]), r["launched"] - t0, r["finished"] - t0)
          for r in rows if r["kind"] == "transfer" and r["launched"] >= t0 and r["what"].startswith("fragment")]
  return pd.DataFrame(out, columns=["kind", "step", "start", "end"]).sort_values("start", ignore_index=True)


def simulated(step_s: float, payload_bytes: float, rate_mbit: float, *, processes: int = 2,
              sync_every: int, overlap: int = 0, outer_overlap: str = "none", latency_s: float = 0.0,
              host_s: float = 0.0, record: bool = False):
  """The utilization :mod:`analysis.planning.simulate` predicts for a measured background setting.

  The simulated replica computes ``step_s`` per step and sends one fragment of
  ``payload_bytes`` per process at the end of each sync step (the background runtime hands
  the payload over after the step: one bucket, one layer). On one machine's shaped loopback
  both directions share the rate, and a gather over N processes moves every process's
  payload to the N − 1 others (N (N − 1) payloads through one shared rate R), while the
  simulator charges a payload 2 (N − 1) / N of itself: the link is simulated at
  :math:`W = 2R / N^2` (R / 2 for N = 2). ``latency_s``: a fixed
  cost per collective (gloo's start-up, the process's handover), added after the transfer.
  ``host_s``: the process's own work between two steps (the loop, the data, the log), which
  the simulator does not model: the simulated step lasts ``step_s + host_s``, of which
  ``step_s`` counts as compute (the term this comparison adds to the simulator's model).

  Returns:
    The utilization (float), or the :class:`~analysis.planning.simulate.SimResult` with ``record``
    (its step time then includes ``host_s``).
  """
  n = processes
  values = payload_bytes / 4.0  # the bytes on the link, as float32 values (bits=32 below)
  effective = rate_mbit * 1e6 / (n * (n - 1)) * (2 * (n - 1) / n)
  r = run_simulation(SimModel(params=values, layers=1, step_time=step_s + host_s), "diloco", effective / 1e9,
                     replicas=n, sync_every=sync_every, fragment_layers=1, overlap=overlap, bits=32,
                     latency=latency_s, bucket_layers=1, outer_overlap=outer_overlap)
  return r if record else r.utilization * step_s / (step_s + host_s)


def can_shape() -> str | None:
  """None when this machine can shape a link (:meth:`diloco_core.launch.shaped_link.ShapedLink.unavailable`:
  Linux, root, iproute2, network namespaces), else why not."""
  from diloco_core.launch.shaped_link import ShapedLink
  return ShapedLink.unavailable()


def launch_run(out: str, train_args: list[str], mbit: float | None = None, processes: int = 2,
               launcher_args: tuple = ()) -> None:
  """Runs ``python -m diloco_core.launch`` (one device and an equal share of the CPUs per
  process when there are enough, over a link shaped to ``mbit`` when given, with the launcher's
  own ``launcher_args``) with ``train_args``, writing to ``out``; a failure raises with its output."""
  shaping = [*launcher_args, *([] if mbit is None else ["--link-mbit", f"{mbit:.3f}"])]
  launch_module(None, [*train_args, "--no-progress", "--out", out], processes, shaping)


def launch_module(module: str | None, args: list[str], processes: int = 2, launcher_args: tuple = ()) -> None:
  """Runs ``module`` (None: the trainer) with ``args`` in ``processes`` processes of
  ``python -m diloco_core.launch``, as :func:`launch_run` does; a failure raises with its output."""
  pin = ["--pin-cpus"] if processes <= len(os.sched_getaffinity(0)) else []
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  cmd = [sys.executable, "-m", "diloco_core.launch", "--processes", str(processes), "--devices-per-process", "1",
         *pin, *launcher_args, *([] if module is None else ["--module", module]), "--", *args]
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
  r = subprocess.run(cmd, cwd=root, capture_output=True, text=True, env=env)
  if r.returncode != 0:
    raise RuntimeError(f"a launched run failed ({' '.join(cmd[3:])}):\n{r.stdout[-3000:]}{r.stderr[-3000:]}")


def overlap_benchmark(workdir: str, *, k: int = 3, sync_every: int = 12, steps: int = 60,
                      model: str = "small", batch_size: int = 16) -> tuple[dict, pd.DataFrame]:
  r"""In-step vs background (τ = 0, τ = k + 1, eager) over a link on which one payload takes
  about k steps, measured and simulated (``benchmarks/overlap.py`` prints it).

  A calibration run (no shaping) gives the pure compute time T of a step, the payload
  (float32) and the per-collective cost; the rate is then :math:`R = 2 \cdot
  \text{bytes} \cdot 8 / (k (T + h))`, h the process's own time between steps (the two
  payloads share the loopback). The runs stay in
  ``workdir/<name>`` (their traces feed :func:`timeline`). In-step has no trace: it logs every
  step, and the median wall time of a step that syncs nothing is its compute.

  Returns:
    ``(setting, table)``: the setting (T, the in-step SPMD step's own time, payload, latency, rate,
    H, steps, the measured window, shaped or not) and one row per run: ``run``, ``s_per_step``,
    ``hidden`` and ``measured`` (means over the processes), ``simulated``, ``dir``.
  """
  H = sync_every
  base = ["--model", model, "--replicas", "2", "--sync-every", str(H), "--steps", str(steps),
          "--batch-size", str(batch_size), "--seq-len", "64", "--eval-every", str(steps),
          "--log-every", str(steps), "--warmup-steps", "1"]  # one log row: no row barrier mid-run
  first = 2 * H + 1  # the first two periods compile (the settle programs run first at step H + τ or 2H)
  last = steps - 1  # the last step settles its sync at once: the end of the run, not training
  in_step = ["--mesh", "diloco=2,data=1"]
  calib = os.path.join(workdir, "calibration")
  launch_run(calib, [*base, "--communication", "background"])
  c = [summarize(rows, first, last) for rows in read_trace(calib).values()]
  payload = json.load(open(os.path.join(calib, "summary.json")))["params"] * 4
  latency = float(np.mean([x["transfer_s"] / max(x["transfers"], 1) for x in c]))
  T = float(np.mean([x["compute_step_s"] for x in c]))
  host = float(np.mean([x["host_s"] for x in c]))
  why_not = can_shape()
  mbit = 2 * payload * 8 / (k * (T + host)) / 1e6 if why_not is None else None
  setting = {"model": model, "step_s": T, "host_s": host, "payload_bytes": payload, "latency_s": latency,
             "mbit": mbit, "sync_every": H, "steps": steps, "first_step": first, "last_step": last, "k": k,
             "unshaped_because": why_not}
  runs = [("in-step", [*in_step, "--log-every", "1"], {}),  # a row per step: its own step times
          ("background τ=0", ["--communication", "background"], {}),
          (f"background τ={k + 1}", ["--communication", "background", "--overlap", str(k + 1)],
           {"overlap": k + 1}),
          ("background eager", ["--communication", "background", "--outer-overlap", "eager"],
           {"outer_overlap": "eager"})]
  table = []
  for name, extra, sched in runs:
    out = os.path.join(workdir, name.replace(" ", "_").replace("=", ""))
    launch_run(out, [*base, *extra], mbit)
    if name == "in-step":  # no trace: the median step between syncs is its compute, from its rows
      T_in, step_s = in_step_times(step_walls(out), first, last, H)
      setting["in_step_s"] = T_in
      sim = simulated(T_in, payload, mbit, sync_every=H, **sched) if mbit else float("nan")
      table.append({"run": name, "s_per_step": step_s, "hidden": float("nan"), "measured": T_in / step_s,
                    "simulated": sim, "dir": out})
      continue
    sim = (simulated(T, payload, mbit, sync_every=H, latency_s=latency, host_s=host, **sched) if mbit
           else float("nan"))
    per = [summarize(rows, first, last) for rows in read_trace(out).values()]
    table.append({"run": name, "s_per_step": float(np.mean([x["step_s"] for x in per])),
                  "hidden": float(np.mean([x["hidden"] for x in per])),
                  "measured": float(np.mean([x["utilization"] for x in per])), "simulated": sim, "dir": out})
  return setting, pd.DataFrame(table)


def step_walls(out: str) -> dict[int, float]:
  """Step -> wall time (s) of the run in ``out``, from its ``metrics.jsonl`` rows."""
  return {r["step"]: r["wall_time_s"] for r in map(json.loads, open(os.path.join(out, "metrics.jsonl")))}


def in_step_times(walls: dict[int, float], first: int, last: int, sync_every: int) -> tuple[float, float]:
  """(median wall time of a step that syncs nothing, mean wall time per step) over steps
  ``first`` .. ``last`` of an in-step run logged every step (``walls``: :func:`step_walls`).

  Examples:
    >>> in_step_times({1: 0.0, 2: 1.0, 3: 2.0, 4: 5.0}, 2, 4, sync_every=4)
    (1.0, 1.6666666666666667)
  """
  dt = {t: walls[t] - walls[t - 1] for t in range(first, last + 1)}
  quiet = [d for t, d in dt.items() if t % sync_every]
  return float(np.median(quiet)), (walls[last] - walls[first - 1]) / (last - first + 1)


def machine_provenance(command: str) -> dict:
  """Where a stored measurement of this machine was taken: the CPU's kind, cores, JAX, the trainer
  code, the date and the command that measures it again."""
  import datetime
  import platform

  import jax
  from analysis.lab.cpu_kind import cpu_fingerprint
  from analysis.lab.sweep_cache import code_version
  return {"cpu": cpu_fingerprint(), "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
          "jax": jax.__version__, "code": code_version(),
          "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "command": command}


def json_rows(frame: pd.DataFrame) -> list[dict]:
  """A table's rows as JSON values (NaN, e.g. the simulator's figure on an unshaped link, as None).

  Examples:
    >>> json_rows(pd.DataFrame({"a": [1.5, float("nan")], "b": ["x", "y"]}))
    [{'a': 1.5, 'b': 'x'}, {'a': None, 'b': 'y'}]
  """
  return [{k: (None if isinstance(v, float) and v != v else v.item() if hasattr(v, "item") else v)
           for k, v in row.items()} for row in frame.to_dict("records")]


def write_measurement(path, doc: dict) -> dict:
  """Writes ``doc`` with its content hash (:func:`analysis.lab.stored.content_hash`) to ``path``
  through a temporary file, and returns what it wrote."""
  import pathlib

  from analysis.lab.stored import content_hash
  doc = {**doc, "sha256": content_hash(doc)}
  path = pathlib.Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(f".tmp{os.getpid()}")
  tmp.write_text(json.dumps(doc, indent=1))
  os.replace(tmp, path)
  return doc


def measurement_line(provenance: dict, filename: str, rerun: str) -> str:
  """A stored measurement's provenance as one sentence for a page."""
  p = provenance
  return (f"Measured {p['date']} on {p['machine']} ({p['cpu']}) with JAX {p['jax']}, trainer code {p['code']};"
          f" stored in `analysis/results/measured/{filename}`; measure again with `{rerun}`.")
