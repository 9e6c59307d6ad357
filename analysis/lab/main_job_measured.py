"""The main job measured on an accelerator, read back: ``benchmarks/main_job.py``'s stored runs.

The file holds the main job's table (:func:`diloco_core.run.main_job.summary_rows` of the three
runs), the data's entropy floor and each run's eval loss sequence by sequence
(:func:`~diloco_core.run.main_job.eval_spread`). :func:`load_main_job` refuses an edited file (its
hash) and recomputes what the table derives: each gap to the floor, each loss against DP's, and
that the sequence-by-sequence mean is the run's eval loss.
"""

from __future__ import annotations

import json

import pandas as pd

from analysis.lab.accelerator import (ACCELERATOR_DIR, MAIN_JOB_SUFFIX, AcceleratorResultError, agrees,
                                      check_stamp, provenance_sentence)
from diloco_core.run.main_job import floor_note

#: How far a stored run's sequence-by-sequence mean may sit from its eval loss (float32 sums in
#: another order: a few float32 ulps at a loss near 1).
MEAN_ATOL = 1e-5
RERUN = "python benchmarks/main_job.py --store"


def check_main_job(doc: dict, name: str = "stored main job") -> None:
  """The hash, the provenance and the table's derived columns recomputed (one line if not).

  Examples:
    >>> from analysis.lab.accelerator import PROVENANCE
    >>> from analysis.lab.stored import content_hash
    >>> rows = [{"algorithm": "dp", "final eval loss": 1.0, "gap to floor": 0.25, "loss vs DP (%)": 0.0}]
    >>> doc = {"provenance": dict.fromkeys(PROVENANCE, "x"), "loss_floor": 0.75, "rows": rows,
    ...        "eval_spread": {"dp": {"mean": 1.0, "se": 0.01, "sequences": 64}}}
    >>> check_main_job({**doc, "sha256": content_hash(doc)})
    >>> bad = {**doc, "rows": [{**rows[0], "gap to floor": 0.3}]}
    >>> check_main_job({**bad, "sha256": content_hash(bad)})
    Traceback (most recent call last):
    ...
    analysis.lab.accelerator.AcceleratorResultError: stored main job, dp: stored gap to floor 0.3 is not its eval loss minus the floor (0.25)
  """
  check_stamp(doc, name, RERUN)
  rows = {r["algorithm"]: r for r in doc["rows"]}
  dp = rows["dp"]["final eval loss"]
  for algo, r in rows.items():
    loss = r["final eval loss"]
    for field, want, what in (("gap to floor", loss - doc["loss_floor"], "its eval loss minus the floor"),
                              ("loss vs DP (%)", 100.0 * (loss / dp - 1.0), "its eval loss against DP's")):
      if not agrees(r[field], want):
        raise AcceleratorResultError(f"{name}, {algo}: stored {field} {r[field]:g} is not {what} ({want:g})")
    mean = doc["eval_spread"][algo]["mean"]
    if abs(mean - loss) > MEAN_ATOL:
      raise AcceleratorResultError(f"{name}, {algo}: the eval loss sequence by sequence averages {mean:.6f},"
                                   f" not the table's {loss:.6f}")


def load_main_job(device: str) -> tuple[dict, pd.DataFrame]:
  """The stored main job of ``device`` (e.g. ``"tpu-v5-lite"``), checked by :func:`check_main_job`.

  Returns:
    ``(doc, table)``: the document (``provenance``, ``settings``, ``loss_floor``,
    ``eval_spread``, ...) and the table indexed by algorithm with its "eval SE" column.

  Examples:
    >>> doc, table = load_main_job("tpu-v5-lite")
    >>> doc["settings"]["compute_dtype"], list(table.index)
    ('bfloat16', ['dp', 'diloco', 'streaming'])
  """
  path = ACCELERATOR_DIR / f"{device}{MAIN_JOB_SUFFIX}.json"
  if not path.exists():
    stored = sorted(p.stem[:-len(MAIN_JOB_SUFFIX)] for p in ACCELERATOR_DIR.glob(f"*{MAIN_JOB_SUFFIX}.json"))
    raise AcceleratorResultError(f"no stored main job for {device!r}; stored: {stored}; run `{RERUN}` on it")
  doc = json.loads(path.read_text())
  check_main_job(doc, f"{path.name}")
  table = pd.DataFrame(doc["rows"]).set_index("algorithm")
  table.insert(list(table.columns).index("gap to floor") + 1, "eval SE",
               [doc["eval_spread"][a]["se"] for a in table.index])
  return doc, table


def main_job_note(doc: dict, table: pd.DataFrame) -> str | None:
  """The sentence the main job prints under a table with a gap below zero (:func:`~diloco_core.run.main_job.floor_note`)."""
  return floor_note(table, next(iter(doc["eval_spread"].values()))["sequences"])


def main_job_provenance(device: str, doc: dict) -> str:
  """The stored main job's provenance as one sentence (what, where, the file, how to measure it again)."""
  return provenance_sentence(doc["provenance"], f"{device}{MAIN_JOB_SUFFIX}.json", RERUN)
