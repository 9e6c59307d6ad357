"""The notebooks measured on a device, read back: ``benchmarks/notebooks.py``'s stored runs.

For each notebook the file holds its wall time (every cell's), the figures it glues and every
live sweep it trained (:data:`analysis.lab.live.TRAINED`): the plan's estimate
:math:`\\hat T`, the time :math:`T` the training took, and each run's settings and final eval
loss. :func:`load_notebooks` refuses an edited file (its hash) and checks what the site says
about it: every sweep trained as many runs as the plan said, and its estimate agrees with the
time it took, :math:`|T / \\hat T - 1| \\le` :data:`ESTIMATE_RTOL`.

A sweep's headline (:func:`headline`) is the same function of its rows on every backend: its best
run and, for each method in it, the method's best final eval loss against DP's best (or, without
DP, against DiLoCo's), so that the tutorial can set a TPU's sweep beside the CPU's stored one.
"""

from __future__ import annotations

import json
import pathlib
import re

import pandas as pd

from analysis.lab.accelerator import (ACCELERATOR_DIR, NOTEBOOKS_SUFFIX, PROVENANCE, AcceleratorResultError,
                                      check_stamp, provenance_sentence)
from analysis.lab.measured import json_rows, measurement_line
from analysis.lab.stored import RESULTS_DIR, content_hash

#: How far a live sweep's measured time may sit from its printed estimate (relative).
ESTIMATE_RTOL = 0.2
#: The settings kept for each run of a stored sweep, beside its final eval loss.
RUN_COLUMNS = ("algorithm", "model", "params", "compute_dtype", "steps", "replicas", "sync_every",
               "fragments", "overlap", "alpha", "compression", "outer_lr", "inner_lr", "seed",
               "data_non_iid_share", "loss_floor", "final_eval_loss")
#: Columns that tell the runs of a sweep apart (the best run is named by those that vary and
#: apply to its method: :data:`NOT_FOR`).
SWEPT = ("algorithm", "replicas", "sync_every", "fragments", "overlap", "alpha", "compression",
         "outer_lr", "inner_lr", "data_non_iid_share")
#: The swept settings a method ignores.
NOT_FOR = {"dp": ("sync_every", "fragments", "overlap", "alpha", "compression", "outer_lr"),
           "diloco": ("fragments", "overlap", "alpha")}
RERUN = "python benchmarks/notebooks.py --store"
#: The CPU's live sweep, measured (``benchmarks/live_estimate.py --store``).
CPU_ESTIMATE_PATH = RESULTS_DIR / "measured" / "live_estimate.json"
CPU_RERUN = "python benchmarks/live_estimate.py --store"
#: The repository's notebooks (in a clone; an installed package has none).
NOTEBOOKS_DIR = pathlib.Path(__file__).resolve().parents[2] / "notebooks"


def sweep_record(trained) -> dict:
  """What is stored of one live sweep (an :class:`analysis.lab.live.Trained`)."""
  plan, df = trained.plan, trained.frame
  probe = None if plan.probe is None else {k: float(v) for k, v in vars(plan.probe).items()}
  return {"sweep": trained.desc, "runs": plan.runs, "trained": plan.to_train, "programs": plan.programs,
          "estimate_s": plan.estimate_s, "took_s": trained.took_s, "probe": probe,
          "rows": json_rows(df[[c for c in RUN_COLUMNS if c in df.columns]])}


def merged(previous: dict | None, new: dict) -> dict:
  """The stored document with the notebooks of ``new`` (name → result) replacing their entries;
  its provenance is the newest notebook's.

  Examples:
    >>> doc = merged(None, {"01_x": {"provenance": {"date": "1"}}})
    >>> doc = merged(doc, {"02_y": {"provenance": {"date": "2"}}})
    >>> sorted(doc["notebooks"]), doc["provenance"]["date"]
    (['01_x', '02_y'], '2')
  """
  notebooks = {**(previous or {}).get("notebooks", {}), **new}
  newest = max(notebooks.values(), key=lambda r: r["provenance"]["date"])
  return {"provenance": newest["provenance"], "notebooks": dict(sorted(notebooks.items()))}


def estimate_error(sweep: dict) -> float:
  """:math:`T / \\hat T - 1` of a stored sweep.

  Examples:
    >>> estimate_error({"estimate_s": 100.0, "took_s": 110.0})
    0.10000000000000009
  """
  return sweep["took_s"] / sweep["estimate_s"] - 1.0


def check_notebooks(doc: dict, name: str = "stored notebooks") -> None:
  """The hash, every notebook's provenance and every sweep's counts and estimate (one line if not).

  Examples:
    >>> from analysis.lab.stored import content_hash
    >>> sweep = {"sweep": "h_m", "runs": 2, "trained": 2, "estimate_s": 100.0, "took_s": 130.0,
    ...          "rows": [{"final_eval_loss": 1.0}] * 2}
    >>> nb = {"provenance": dict.fromkeys(PROVENANCE, "x"), "sweeps": [sweep]}
    >>> doc = {"provenance": nb["provenance"], "notebooks": {"03_sweep_h_m": nb}}
    >>> check_notebooks({**doc, "sha256": content_hash(doc)})
    Traceback (most recent call last):
    ...
    analysis.lab.accelerator.AcceleratorResultError: stored notebooks, 03_sweep_h_m, sweep h_m: it took 130 s against an estimate of 100 s (+30%, more than ±20%)
  """
  check_stamp(doc, name, RERUN)
  for nb, r in doc["notebooks"].items():
    missing = [k for k in PROVENANCE if not r["provenance"].get(k)]
    if missing:
      raise AcceleratorResultError(f"{name}, {nb}: provenance lacks {missing}")
    for s in r["sweeps"]:
      check_sweep(s, f"{name}, {nb}, sweep {s['sweep']}")


def check_sweep(s: dict, where: str) -> None:
  """A stored sweep's runs are those planned, and its time is within :data:`ESTIMATE_RTOL` of its estimate."""
  if s["trained"] != len(s["rows"]) or s["trained"] > s["runs"]:
    raise AcceleratorResultError(f"{where}: {len(s['rows'])} runs stored, {s['trained']} planned of {s['runs']}")
  err = estimate_error(s)
  if abs(err) > ESTIMATE_RTOL:
    raise AcceleratorResultError(f"{where}: it took {s['took_s']:.0f} s against an estimate of"
                                 f" {s['estimate_s']:.0f} s ({err:+.0%}, more than ±{ESTIMATE_RTOL:.0%})")


def cpu_sweep() -> list:
  """The CPU's live sweep (``benchmarks/live_estimate.py``): the stored experiments' CPU run
  (:func:`~analysis.lab.experiments.base_config`) at 400 steps, DiLoCo at H = 12 and 24 (one
  program) and DP (a second).

  Examples:
    >>> [(c.algo.algorithm, c.algo.sync_every, c.steps, c.model) for c in cpu_sweep()][0]
    ('diloco', 12, 400, 'mini')
  """
  from analysis.lab.experiments import base_config
  return ([base_config("cpu", sync_every=h, steps=400) for h in (12, 24)]
          + [base_config("cpu", algorithm="dp", steps=400)])


def load_cpu_estimate() -> dict:
  """The CPU's stored live sweep (:data:`CPU_ESTIMATE_PATH`), checked: its hash, and
  :func:`check_sweep`.

  Examples:
    >>> abs(estimate_error(load_cpu_estimate()["sweep"])) <= ESTIMATE_RTOL
    True
  """
  doc = json.loads(CPU_ESTIMATE_PATH.read_text())
  if doc.get("sha256") != content_hash(doc):
    raise AcceleratorResultError(f"{CPU_ESTIMATE_PATH.name}: its sha256 does not match its content; run `{CPU_RERUN}`")
  check_sweep(doc["sweep"], CPU_ESTIMATE_PATH.name)
  return doc


def cpu_estimate_provenance(doc: dict) -> str:
  """The CPU's stored live sweep's provenance as one sentence."""
  return measurement_line(doc["provenance"], CPU_ESTIMATE_PATH.name, CPU_RERUN)


def load_notebooks(device: str) -> dict:
  """The stored notebooks of ``device`` (e.g. ``"tpu-v5-lite"``), checked by :func:`check_notebooks`.

  Examples:
    >>> doc = load_notebooks("tpu-v5-lite")
    >>> sorted(doc["notebooks"])[0]
    '01_roofline'
  """
  path = ACCELERATOR_DIR / f"{device}{NOTEBOOKS_SUFFIX}.json"
  if not path.exists():
    stored = sorted(p.stem[:-len(NOTEBOOKS_SUFFIX)] for p in ACCELERATOR_DIR.glob(f"*{NOTEBOOKS_SUFFIX}.json"))
    raise AcceleratorResultError(f"no stored notebooks for {device!r}; stored: {stored}; run `{RERUN}` on it")
  doc = json.loads(path.read_text())
  check_notebooks(doc, path.name)
  return doc


def headline(rows: pd.DataFrame) -> dict:
  """A sweep's headline: its best run (named by the settings that vary), its loss, the floor,
  and each method's best final eval loss against the reference method's best in percent (DP's,
  or DiLoCo's in a sweep without DP).

  Examples:
    >>> rows = pd.DataFrame({"algorithm": ["dp", "diloco", "diloco"], "sync_every": [1, 10, 50],
    ...                      "final_eval_loss": [1.0, 1.02, 1.05], "loss_floor": 0.9})
    >>> h = headline(rows)
    >>> h["best"], h["best_loss"], {k: round(v, 6) for k, v in h["vs"].items()}, h["reference"]
    ('algorithm=dp', 1.0, {'diloco': 2.0}, 'dp')
  """
  best = rows.loc[rows["final_eval_loss"].idxmin()]
  varying = [c for c in SWEPT if c in rows.columns and rows[c].astype(str).nunique() > 1
             and c not in NOT_FOR.get(best["algorithm"], ())]
  by_method = rows.groupby("algorithm")["final_eval_loss"].min()
  reference = "dp" if "dp" in by_method.index else "diloco"
  vs = {a: float(100.0 * (loss / by_method[reference] - 1.0)) for a, loss in by_method.items()
        if a != reference and reference in by_method.index}
  return {"best": ", ".join(f"{c}={best[c]}" for c in varying), "best_loss": float(best["final_eval_loss"]),
          "floor": float(rows["loss_floor"].iloc[0]), "vs": vs, "reference": reference}


def headline_text(h: dict) -> str:
  """A :func:`headline` in a few words.

  Examples:
    >>> headline_text({"best": "algorithm=dp", "best_loss": 1.0, "floor": 0.9, "vs": {"diloco": 2.0},
    ...                "reference": "dp"})
    'best 1.000 (floor 0.900; algorithm=dp); diloco +2.00% vs dp'
  """
  vs = "".join(f"; {a} {pct:+.2f}% vs {h['reference']}" for a, pct in sorted(h["vs"].items()))
  where = f"; {h['best']}" if h["best"] else ""
  return f"best {h['best_loss']:.3f} (floor {h['floor']:.3f}{where}){vs}"


def not_measured(doc: dict) -> list[str]:
  """The repository's notebooks (``notebooks/NN_*.md``) that ``doc`` holds no run of (in a clone:
  an installed package has no notebooks folder to compare with)."""
  if not NOTEBOOKS_DIR.is_dir():
    raise FileNotFoundError(f"no notebooks folder at {NOTEBOOKS_DIR}: not_measured needs a clone of the repository")
  return sorted(p.stem for p in NOTEBOOKS_DIR.glob("[0-9][0-9]_*.md") if p.stem not in doc["notebooks"])


#: A live sweep in a notebook's source: its ``stored.results("name", ...)`` call.
LIVE_SWEEP = re.compile(r"""stored\.results\(\s*["']([A-Za-z0-9_]+)["']""")


def live_sweeps(notebook: str, scale: str = "accelerator") -> list[tuple[str, int]]:
  """The sweeps a notebook trains live, in order, with their runs at ``scale``: its
  ``stored.results("name", ...)`` calls, each sweep planned by
  :func:`analysis.lab.experiments.named_sweep` (in a clone, as :func:`not_measured`).

  Examples:
    >>> live_sweeps("05_compression"), [name for name, _ in live_sweeps("03_sweep_h_m")]
    ([('compression', 27)], ['h_m', 'outer_lr'])
  """
  from analysis.lab import experiments  # the trainer's config, only when a plan is asked for
  path = NOTEBOOKS_DIR / f"{notebook}.md"
  if not path.is_file():
    raise FileNotFoundError(f"no notebook {path}: live_sweeps needs a clone of the repository")
  return [(name, len(experiments.named_sweep(name, scale))) for name in LIVE_SWEEP.findall(path.read_text())]


def notebooks_provenance(device: str, doc: dict) -> str:
  """The stored notebooks' provenance as one sentence (the newest notebook's run)."""
  return provenance_sentence(doc["provenance"], f"{device}{NOTEBOOKS_SUFFIX}.json", RERUN)


def scale_text(rows: pd.DataFrame, compute_dtype: str | None = None) -> str:
  """The scale of a sweep's runs: model, parameters, steps and compute dtype.

  Examples:
    >>> scale_text(pd.DataFrame({"model": ["base"], "params": [7_000_000], "steps": [1500]}), "bfloat16")
    'base, 7.0M params, 1500 steps, bfloat16'
  """
  steps = "/".join(str(s) for s in sorted(rows["steps"].unique()))
  dtype = f", {compute_dtype}" if compute_dtype else ""
  params = rows["params"].iloc[0]
  size = f"{params / 1e6:.1f}M" if params >= 1e5 else f"{params:,}"
  return f"{rows['model'].iloc[0]}, {size} params, {steps} steps{dtype}"


def timing_table(doc: dict) -> pd.DataFrame:
  """One row per stored notebook and live sweep: the notebook's run time on the device, the runs
  the sweep trained, and its estimate against the time it took.

  Args:
    doc: a :func:`load_notebooks` document.

  Returns:
    Columns "notebook", "run time", "live sweep", "runs", "estimate → took" (the last three
    empty for a notebook without live sweeps).
  """
  from analysis.lab.live import duration
  out = []
  for nb, r in doc["notebooks"].items():
    first = {"notebook": nb, "run time": duration(r["wall_s"])}
    if not r["sweeps"]:
      out.append({**first, "live sweep": "", "runs": "", "estimate → took": ""})
    for s in r["sweeps"]:
      out.append({**first, "live sweep": s["sweep"], "runs": s["trained"],
                  "estimate → took": f"{duration(s['estimate_s'])} → {duration(s['took_s'])} ({estimate_error(s):+.0%})"})
      first = {"notebook": "", "run time": ""}
  return pd.DataFrame(out)


def headline_table(doc: dict, device: str, cpu_frame=None) -> pd.DataFrame:
  """Two rows per stored live sweep: its headline and scale on the device, and those of the
  CPU's stored sweep of the same name.

  Args:
    doc: a :func:`load_notebooks` document.
    device: the device's name for the "where" column.
    cpu_frame: ``name -> rows`` of the CPU's stored sweep (default
      :func:`analysis.lab.stored.frame`).

  Returns:
    Columns "sweep", "where", "scale", "headline".
  """
  if cpu_frame is None:
    from analysis.lab.stored import frame as cpu_frame
  from diloco_core.devices.backend import default_compute_dtype
  out = []
  for r in doc["notebooks"].values():
    for s in r["sweeps"]:
      rows, cpu = pd.DataFrame(s["rows"]), cpu_frame(s["sweep"])
      out.append({"sweep": s["sweep"], "where": device, "scale": scale_text(rows, r["compute_dtype"]),
                  "headline": headline_text(headline(rows))})
      out.append({"sweep": "", "where": "CPU (stored)", "scale": scale_text(cpu, default_compute_dtype("cpu")),
                  "headline": headline_text(headline(cpu))})
  return pd.DataFrame(out)
