"""The papers' own compute-utilization tables, as published, beside this simulator's.

Reference data, cited: the numbers in :data:`TABLE4` and :data:`TABLE5` are the papers'
figures (Gbit/s needed to reach each compute utilization), copied from public copies of the
papers' arXiv HTML (see :data:`SOURCES`) and never computed or edited here. Everything else
in this module compares them with :func:`analysis.planning.simulate.bandwidth_for_utilization` run
with the settings each row states.

* **Table 4** of the Streaming DiLoCo paper (arXiv 2501.18512, v1): 1B / 10B / 100B models
  (24 / 48 / 108 layers, 0.1 / 0.8 / 4.9 s per step), DP, DiLoCo and three Streaming
  variants, H = 100, fragments of 3 layers, M = 2 (:data:`analysis.planning.simulate.PAPER_ROWS`).
* **Table 5** of the eager-updates paper (arXiv 2502.12996, v1): DP, Streaming DiLoCo, and
  Streaming with FP4 payloads overlapped over one inner step (τ = 1) or over one whole outer
  step (the eager mode: a payload may arrive up to H steps later), at H = 30 and H = 100.
  Its caption is word for word Table 4's (it says H = 100 for all variants, while the rows
  name H = 30 or H = 100: the rows are followed here). At H = 30 the 100B model's 36
  fragments outnumber the 30 steps of a period, which this simulator cannot express (one
  send per step at most): those 10 cells are left out of the counts and named.

The printed values are points of the paper's grid (:data:`analysis.planning.simulate.PAPER_GRID_GBPS`,
50 log-spaced points from 0.1 to 1000 Gbit/s, a step of ×1.207) printed with one decimal
(within 0.055 of the point, under half a step away), so each cell maps to one grid index
(:func:`grid_index`) and two tables compare in signed grid
steps (:func:`grid_steps`: positive where this simulator needs more bandwidth).

Examples:
  >>> reference(4).loc[("1B", "DiLoCo")].tolist()  # the paper's numbers
  [1.4, 6.2, 13.3, 23.3, 86.8]
  >>> grid_index([0.1, 86.8, 1000.0, float("inf")]).tolist()
  [0, 36, 49, 50]
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from analysis.planning import simulate as sim

#: Where each table's numbers come from (copies of the arXiv HTML, cross-checked cell by cell
#: against a second, independent copy).
SOURCES = {
    4: ("Douillard et al., Streaming DiLoCo with overlapping communication: Towards a Distributed"
        " Free Lunch, arXiv 2501.18512v1, Table 4; transcribed from the copy of its arXiv HTML in"
        " github.com/deep-diver/ai-paper-reviewer, content/paper-reviews/2501.18512/tables.json at"
        " commit b09059692a0689d8998627aac734d7bbea7bffa0, checked against a text copy of the PDF"),
    5: ("Kale et al., Eager Updates For Overlapped Communication and Computation in DiLoCo,"
        " arXiv 2502.12996v1, Table 5; transcribed from the copy of its arXiv HTML in"
        " github.com/deep-diver/ai-paper-reviewer, content/2025-02-19/2502.12996/index.md at commit"
        " 767bc5198ef16a03a9ab16cc965401e84fabc9e2, checked against"
        " github.com/TikaToka/ai-paper-reviewer, content/paper-reviews/2502.12996/index.md at commit"
        " 197eff7c0ab2568f8078442dc27e394dbe6c499c"),
}
#: The tables' columns: the compute-utilization targets.
TARGETS = sim.PAPER_TARGETS
COLUMNS = tuple(f"{u:.0%}" for u in TARGETS)
#: Settings every row shares (the papers' captions): M = 2, fragments of 3 layers, no latency.
COMMON = {"replicas": 2, "fragment_layers": 3, "latency": 0.0}


@dataclasses.dataclass(frozen=True)
class Setting:
  """How this simulator runs one of the papers' rows (:func:`analysis.planning.simulate.run_simulation`)."""

  method: str
  overlap: int = 0
  bits: int = 16
  outer_overlap: str = "none"
  sync_every: int = 100


#: The paper's row labels -> (our label, setting).
ROWS = {
    "Data-Parallel": ("DP", Setting("dp")),
    "Vanilla DiLoCo": ("DiLoCo", Setting("diloco")),
    "Streaming DiLoCo": ("Streaming", Setting("streaming")),
    "Streaming DiLoCo w/ overlapped com.": ("Streaming + overlap", Setting("streaming", 1)),
    "Streaming DiLoCo w/ overlapped FP4 com.": ("Streaming + overlap + 4-bit", Setting("streaming", 1, 4)),
    "Streaming DiLoCo with 1-inner-step overlapped FP4 com. H=30":
        ("Streaming + overlap + 4-bit, H = 30", Setting("streaming", 1, 4, sync_every=30)),
    "Streaming DiLoCo with 1-inner-step overlapped FP4 com. H=100":
        ("Streaming + overlap + 4-bit, H = 100", Setting("streaming", 1, 4)),
    "Streaming DiLoCo with 1-outer-step overlapped FP4 com. H=30":
        ("Streaming + eager + 4-bit, H = 30", Setting("streaming", 0, 4, "eager", 30)),
    "Streaming DiLoCo with 1-outer-step overlapped FP4 com. H=100":
        ("Streaming + eager + 4-bit, H = 100", Setting("streaming", 0, 4, "eager", 100)),
}

#: Table 4 of arXiv 2501.18512 as printed (Gbit/s): (model, the paper's row label, 50/80/90/95/99%).
TABLE4 = (
    ("1B", "Data-Parallel", (86.8, 152.6, 184.2, 222.3, 569.0)),
    ("1B", "Vanilla DiLoCo", (1.4, 6.2, 13.3, 23.3, 86.8)),
    ("1B", "Streaming DiLoCo", (1.4, 5.2, 9.1, 16.0, 28.1)),
    ("1B", "Streaming DiLoCo w/ overlapped com.", (1.4, 4.3, 6.2, 9.1, 11.0)),
    ("1B", "Streaming DiLoCo w/ overlapped FP4 com.", (0.4, 0.9, 1.7, 2.0, 3.0)),
    ("10B", "Data-Parallel", (104.8, 222.3, 222.3, 268.3, 471.5)),
    ("10B", "Vanilla DiLoCo", (1.7, 7.5, 16.0, 33.9, 104.8)),
    ("10B", "Streaming DiLoCo", (1.7, 5.2, 9.1, 13.3, 19.3)),
    ("10B", "Streaming DiLoCo w/ overlapped com.", (1.7, 3.6, 5.2, 6.2, 7.5)),
    ("10B", "Streaming DiLoCo w/ overlapped FP4 com.", (0.4, 0.9, 1.4, 1.4, 1.7)),
    ("100B", "Data-Parallel", (184.2, 323.8, 390.7, 390.7, 471.5)),
    ("100B", "Vanilla DiLoCo", (3.0, 11.0, 23.3, 49.4, 184.2)),
    ("100B", "Streaming DiLoCo", (2.4, 6.2, 9.1, 11.0, 19.3)),
    ("100B", "Streaming DiLoCo w/ overlapped com.", (1.7, 3.6, 4.3, 5.2, 5.2)),
    ("100B", "Streaming DiLoCo w/ overlapped FP4 com.", (0.5, 0.9, 1.1, 1.1, 1.4)),)
#: Table 5 of arXiv 2502.12996 as printed (Gbit/s), same layout.
TABLE5 = (
    ("1B", "Data-Parallel", (86.8, 152.6, 184.2, 222.3, 569.0)),
    ("1B", "Streaming DiLoCo", (1.4, 5.2, 9.1, 16.0, 28.1)),
    ("1B", "Streaming DiLoCo with 1-inner-step overlapped FP4 com. H=30", (2.4, 3.6, 4.3, 4.3, 4.3)),
    ("1B", "Streaming DiLoCo with 1-inner-step overlapped FP4 com. H=100", (0.4, 0.9, 1.7, 2.0, 3.0)),
    ("1B", "Streaming DiLoCo with 1-outer-step overlapped FP4 com. H=30", (1.1, 2.0, 2.0, 2.0, 2.4)),
    ("1B", "Streaming DiLoCo with 1-outer-step overlapped FP4 com. H=100", (0.1, 0.2, 0.2, 0.2, 0.2)),
    ("10B", "Data-Parallel", (104.8, 222.3, 222.3, 268.3, 471.5)),
    ("10B", "Streaming DiLoCo", (1.7, 5.2, 9.1, 13.3, 19.3)),
    ("10B", "Streaming DiLoCo with 1-inner-step overlapped FP4 com. H=30", (1.4, 2.4, 2.4, 3.0, 3.0)),
    ("10B", "Streaming DiLoCo with 1-inner-step overlapped FP4 com. H=100", (0.4, 0.9, 1.4, 1.4, 1.7)),
    ("10B", "Streaming DiLoCo with 1-outer-step overlapped FP4 com. H=30", (0.7, 1.1, 1.4, 1.4, 1.4)),
    ("10B", "Streaming DiLoCo with 1-outer-step overlapped FP4 com. H=100", (0.1, 0.2, 0.2, 0.3, 0.3)),
    ("100B", "Data-Parallel", (184.2, 323.8, 390.7, 390.7, 471.5)),
    ("100B", "Streaming DiLoCo", (2.4, 6.2, 9.1, 11.0, 19.3)),
    ("100B", "Streaming DiLoCo with 1-inner-step overlapped FP4 com. H=30", (0.9, 1.7, 2.0, 2.0, 2.0)),
    ("100B", "Streaming DiLoCo with 1-inner-step overlapped FP4 com. H=100", (0.5, 0.9, 1.1, 1.1, 1.4)),
    ("100B", "Streaming DiLoCo with 1-outer-step overlapped FP4 com. H=30", (0.5, 0.8, 0.9, 0.9, 0.9)),
    ("100B", "Streaming DiLoCo with 1-outer-step overlapped FP4 com. H=100", (0.2, 0.3, 0.3, 0.3, 0.4)),)
TABLES = {4: TABLE4, 5: TABLE5}


def _check_table(table: int) -> int:
  if table not in TABLES:
    raise ValueError(f"table must be one of {sorted(TABLES)}, got {table!r}.")
  return table


def reference(table: int) -> pd.DataFrame:
  """The paper's table as printed, indexed by (model, our row label), one column per target."""
  rows = TABLES[_check_table(table)]
  index = pd.MultiIndex.from_tuples([(m, ROWS[label][0]) for m, label, _ in rows], names=["model", "method"])
  return pd.DataFrame([list(v) for _, _, v in rows], index=index, columns=list(COLUMNS))


def unexpressible(table: int) -> dict[tuple[str, str], str]:
  """(model, row) -> why this simulator cannot run that row (fragments outnumber the steps)."""
  out = {}
  for model, label, _ in TABLES[_check_table(table)]:
    name, s = ROWS[label]
    p = sim.get_sim_model(model).layers // COMMON["fragment_layers"]
    if s.method == "streaming" and p > s.sync_every:
      out[(model, name)] = (f"{p} fragments of 3 layers in H = {s.sync_every} steps: more than one send per"
                            " step, which the simulator does not model")
  return out


def simulated(table: int, rounding: str = "paper") -> pd.DataFrame:
  """This simulator's value of every cell of a paper table (same index and columns as
  :func:`reference`; NaN where :func:`unexpressible`)."""
  skip = unexpressible(table)
  rows = []
  for model, label, _ in TABLES[_check_table(table)]:
    name, s = ROWS[label]
    if (model, name) in skip:
      rows.append([np.nan] * len(TARGETS))
      continue
    rows.append(np.atleast_1d(sim.bandwidth_for_utilization(
        list(TARGETS), model, s.method, rounding=rounding, overlap=s.overlap, bits=s.bits,
        outer_overlap=s.outer_overlap, sync_every=s.sync_every, **COMMON)))
  ref = reference(table)
  return pd.DataFrame(np.vstack(rows), index=ref.index, columns=ref.columns)


def grid_index(values) -> np.ndarray:
  """Index of the nearest point of the paper's grid for each value (inf: one past the end).

  The papers print grid points with one decimal; the nearest point (in log) is the one
  printed (0.2 is 0.212, 0.4 is 0.373).
  """
  v = np.asarray(values, dtype=float)
  g = np.log(sim.PAPER_GRID_GBPS)
  with np.errstate(divide="ignore"):
    idx = np.abs(np.log(np.where(np.isfinite(v), v, 1.0))[..., None] - g).argmin(axis=-1)
  return np.where(np.isinf(v), len(g), idx)


def grid_steps(ours: pd.DataFrame, paper: pd.DataFrame) -> pd.DataFrame:
  """Signed difference in grid steps, ours − paper (positive: we need more bandwidth);
  NaN where ours is NaN (a row the simulator cannot express)."""
  d = grid_index(ours.to_numpy()) - grid_index(paper.to_numpy())
  return pd.DataFrame(np.where(np.isnan(ours.to_numpy()), np.nan, d), index=paper.index, columns=paper.columns)


def summary(steps: pd.DataFrame) -> dict[str, int]:
  """Counts of cells: ``cells`` compared, ``equal``, ``within_one`` step (equal included),
  ``worse`` (more than one step apart) and ``unexpressible``.

  Examples:
    >>> summary(pd.DataFrame([[0, 1, -3, np.nan]]))
    {'cells': 3, 'equal': 1, 'within_one': 2, 'worse': 1, 'unexpressible': 1}
  """
  v = steps.to_numpy().ravel()
  ok = v[~np.isnan(v)]
  return {"cells": int(ok.size), "equal": int(np.sum(ok == 0)), "within_one": int(np.sum(np.abs(ok) <= 1)),
          "worse": int(np.sum(np.abs(ok) > 1)), "unexpressible": int(np.isnan(v).sum())}


def summary_line(steps: pd.DataFrame) -> str:
  """:func:`summary` in words, e.g. ``"63 of 75 cells equal, 75 within one grid step, 0 worse"``."""
  s = summary(steps)
  text = (f"{s['equal']} of {s['cells']} cells equal, {s['within_one']} within one grid step,"
          f" {s['worse']} worse")
  return text + (f" ({s['unexpressible']} cells not expressible)" if s["unexpressible"] else "")


def calculator_settings(run: dict, constants: dict) -> tuple[sim.SimModel, dict]:
  """(model, options of :func:`analysis.planning.simulate.utilization`) that set this simulator to the
  public calculator's choices for one run of ``tests/fixtures/calculator_parity.json``: its
  ``K_buckets`` equal buckets as that many "layers" released one by one, strided fragments.

  Examples:
    >>> m, kw = calculator_settings({"method": "streaming", "params": 1e9, "step_time": 0.1,
    ...     "replicas": 2, "bytes_per_param": 0.5, "sync_every": 64, "fragments": 8, "overlap": 1},
    ...     {"K_buckets": 128})
    >>> m.layers, kw["bits"], kw["fragment_layers"]
    (128, 4.0, 16)
  """
  m = sim.SimModel(params=run["params"], layers=constants["K_buckets"], step_time=run["step_time"])
  kw = {"replicas": run["replicas"], "bits": run["bytes_per_param"] * 8, "bucket_layers": 1}
  if run["method"] != "dp":
    kw["sync_every"] = run["sync_every"]
  if run["method"] == "streaming":
    kw.update(fragment_layers=m.layers // run["fragments"], overlap=run["overlap"])
  return m, kw


def throughput_floor(table: int = 5) -> pd.DataFrame:
  """For the eager rows: the bandwidth a *shared* link needs just to carry the payload, in
  steady state, at each utilization u (any deadline aside),

  .. math::
     W_\\text{min}(u) = \\frac{N \\, b \\, 2(M-1)/M}{H T / u}

  (the payload of one period, all P fragments, over the period's wall time). A paper cell
  below it cannot be a steady state of one link carrying every payload; NaN for other rows.
  """
  from analysis.planning.bandwidth import allreduce_factor
  ref = reference(table)
  out = pd.DataFrame(np.nan, index=ref.index, columns=ref.columns)
  for model, label, _ in TABLES[_check_table(table)]:
    name, s = ROWS[label]
    if s.outer_overlap == "none":
      continue
    m = sim.get_sim_model(model)
    bits = m.params * s.bits * allreduce_factor(COMMON["replicas"])
    out.loc[(model, name)] = [bits * u / (s.sync_every * m.step_time) / 1e9 for u in TARGETS]
  return out


#: The payload widths and overlaps :func:`h30_search` tries on the 1-inner-step H = 30 rows.
H30_BITS, H30_OVERLAPS = (4, 8, 16), (1, 2, 5)


def h30_search(table: int = 5) -> pd.DataFrame:
  """Which payload width and overlap make this simulator reproduce the 1-inner-step H = 30 rows.

  The paper states 4-bit payloads and τ = 1 for these rows. Each (bits, τ) of
  :data:`H30_BITS` × :data:`H30_OVERLAPS` is simulated with the rows' other settings, and
  compared cell by cell with the paper's (grid steps, ``rounding="paper"``).

  Returns:
    One row per (model, bits, τ): ``cells within one step`` (of 5), ``sum |steps|``, and
    ``stated`` (True for the paper's own 4-bit, τ = 1); the rows 100B cannot express are left out.
  """
  ref = reference(table)
  skip = unexpressible(table)
  rows = []
  for model, label, _ in TABLES[_check_table(table)]:
    name, s = ROWS[label]
    if s.sync_every != 30 or s.outer_overlap != "none" or (model, name) in skip:
      continue
    paper = ref.loc[(model, name)].to_numpy()
    for bits in H30_BITS:
      for tau in H30_OVERLAPS:
        ours = sim.bandwidth_for_utilization(list(TARGETS), model, s.method, rounding="paper",
                                             overlap=tau, bits=bits, sync_every=30, **COMMON)
        d = grid_index(np.asarray(ours)) - grid_index(paper)
        rows.append({"model": model, "bits": bits, "tau": tau,
                     "cells within one step": int((np.abs(d) <= 1).sum()),
                     "sum |steps|": int(np.abs(d).sum()), "stated": bits == s.bits and tau == s.overlap})
  return pd.DataFrame(rows).set_index(["model", "bits", "tau"])
