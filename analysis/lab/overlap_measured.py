"""The overlap measurement stored: in-step against background runs, with their raw traces.

:func:`analysis.lab.measured.overlap_benchmark` trains five two-process runs over a shaped link
(minutes), so the background-communication page does not run it as it is built:
``benchmarks/overlap.py --store`` runs it with the page's setting (:data:`PAGE_SETTING`) and
:func:`store_overlap` keeps the setting, the table and the raw measurement behind every row (each
background run's trace rows from both processes, the in-step run's logged wall times), with the
machine's provenance and a content hash, in ``analysis/results/measured/overlap.json``.

:func:`load_overlap` refuses an edited file and recomputes the whole table from those raw rows
with the functions that made it (:func:`~analysis.lab.measured.summarize`,
:func:`~analysis.lab.measured.in_step_times`, and the simulator through
:func:`~analysis.lab.measured.simulated`): the page shows what the project's code computes from
the stored measurement, and its timelines are drawn from the same rows.
"""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np
import pandas as pd

from analysis.lab.measured import (in_step_times, json_rows, machine_provenance, measurement_line, read_trace,
                                   simulated, step_walls, summarize, write_measurement)
from analysis.lab.stored import RESULTS_DIR, content_hash

#: The page's run of :func:`~analysis.lab.measured.overlap_benchmark` (``benchmarks/overlap.py --store``).
PAGE_SETTING = {"k": 3, "sync_every": 12, "steps": 48, "model": "small", "batch_size": 16}
#: The stored measurement the page shows, and the command that stores it again.
STORED = RESULTS_DIR / "measured" / "overlap.json"
RERUN = "python benchmarks/overlap.py --store"
#: The table's measured and simulated columns, recomputed at load.
COLUMNS = ("s_per_step", "hidden", "measured", "simulated")
#: Relative agreement required between a stored figure and its recomputation.
RTOL = 1e-9


class OverlapResultError(ValueError):
  """The stored overlap measurement is missing, edited, or not what its raw rows give."""


def _schedule(run: str, k: int) -> dict:
  """The simulator's schedule of a run of :func:`~analysis.lab.measured.overlap_benchmark`, by its name."""
  if run == "background eager":
    return {"outer_overlap": "eager"}
  if run == f"background τ={k + 1}":
    return {"overlap": k + 1}
  return {}


def store_overlap(setting: dict, table: pd.DataFrame, command: str, path: pathlib.Path = STORED) -> dict:
  """Writes the setting, the table and each run's raw rows (from the run folders in ``table["dir"]``)
  with the machine's provenance and a content hash to ``path``.

  Returns:
    The document written.
  """
  raw = {}
  for r in table.itertuples():
    if r.run == "in-step":
      raw[r.run] = {"walls": {str(t): w for t, w in step_walls(r.dir).items()}}
    else:
      raw[r.run] = {"traces": {str(rank): rows for rank, rows in read_trace(r.dir).items()}}
  return write_measurement(path, {"provenance": machine_provenance(command), "setting": setting,
                                  "table": json_rows(table.drop(columns="dir")), "raw": raw})


def recompute(setting: dict, raw: dict) -> pd.DataFrame:
  """The table, one row per run, computed from the raw rows as
  :func:`~analysis.lab.measured.overlap_benchmark` computes it."""
  s, rows = setting, []
  first, last, H, mbit = s["first_step"], s["last_step"], s["sync_every"], s["mbit"]
  for run, data in raw.items():
    sched = _schedule(run, s["k"])
    if run == "in-step":
      T_in, step_s = in_step_times({int(t): w for t, w in data["walls"].items()}, first, last, H)
      sim = simulated(T_in, s["payload_bytes"], mbit, sync_every=H, **sched) if mbit else float("nan")
      rows.append({"run": run, "s_per_step": step_s, "hidden": float("nan"), "measured": T_in / step_s,
                   "simulated": sim})
      continue
    per = [summarize(t, first, last) for t in data["traces"].values()]
    sim = (simulated(s["step_s"], s["payload_bytes"], mbit, sync_every=H, latency_s=s["latency_s"],
                     host_s=s["host_s"], **sched) if mbit else float("nan"))
    rows.append({"run": run, "s_per_step": float(np.mean([x["step_s"] for x in per])),
                 "hidden": float(np.mean([x["hidden"] for x in per])),
                 "measured": float(np.mean([x["utilization"] for x in per])), "simulated": sim})
  return pd.DataFrame(rows)


def check_overlap(doc: dict) -> pd.DataFrame:
  """The hash, and the stored table against :func:`recompute` (one line if not); returns the table."""
  where = "stored overlap measurement"
  if doc.get("sha256") != content_hash(doc):
    raise OverlapResultError(f"{where}: its sha256 does not match its content (edited by hand?); run `{RERUN}`"
                             " to measure and store it again.")
  table = recompute(doc["setting"], doc["raw"])
  stored = {r["run"]: r for r in doc["table"]}
  if sorted(stored) != sorted(table["run"]):
    raise OverlapResultError(f"{where}: its table has runs {sorted(stored)}, its raw rows {sorted(table['run'])}")
  for r in table.to_dict("records"):
    for c in COLUMNS:
      got, want = stored[r["run"]][c], r[c]
      nan = want != want
      if (got is None) != nan or (got is not None and not math.isclose(got, want, rel_tol=RTOL)):
        raise OverlapResultError(f"{where}, {r['run']}: stored {c} {got!r} is not {want!r}, what its raw rows give")
  return table


def load_overlap(path: pathlib.Path = STORED) -> tuple[dict, pd.DataFrame, dict, str]:
  """The stored measurement, checked by :func:`check_overlap`.

  Returns:
    ``(setting, table, traces, provenance)``: the setting and table as
    :func:`~analysis.lab.measured.overlap_benchmark` returns them (without ``dir``), each
    background run's trace rows of process 0 (for :func:`~analysis.lab.measured.timeline`),
    and one provenance sentence.

  Examples:
    >>> setting, table, traces, line = load_overlap()
    >>> list(table["run"])[:2], sorted(traces) == sorted(set(table["run"]) - {"in-step"})
    (['in-step', 'background τ=0'], True)
  """
  path = pathlib.Path(path)
  if not path.exists():
    raise OverlapResultError(f"no stored overlap measurement at {path}; run `{RERUN}` to measure and store it.")
  doc = json.loads(path.read_text())
  table = check_overlap(doc)
  traces = {run: data["traces"]["0"] for run, data in doc["raw"].items() if "traces" in data}
  return doc["setting"], table, traces, measurement_line(doc["provenance"], path.name, RERUN)
