"""Stored experiments: heavy results trained once, kept in the repository, re-checked by every build.

A named experiment (:data:`analysis.lab.experiments.SWEEPS`) is trained by
``python -m analysis experiments run NAME`` (:func:`run_experiment`, the project's own runner
:func:`analysis.lab.sweeps.run_sweep`) and written to ``analysis/results/NAME.json``: one entry per
run (its full config, its row of :func:`~analysis.lab.sweeps.run_sweep`, its logged metrics) and a
provenance block (the trainer's code hash, JAX / jaxlib / NumPy / Python versions, platform
and device, date, wall time, the command). The file ends with ``sha256``, the hash of
everything else in it (:func:`content_hash`), so a hand-edited number is caught: :func:`load`
refuses a file whose hash does not match, and a test checks every stored file.

Pages and notebooks read the stored results (:func:`load`, :func:`frame`) instead of
training; the docs build re-trains a deterministic sample of every experiment's runs and
fails when one differs from what was stored: exactly on the kind of CPU that stored it, by
its counts, a prefix and the spread of its seeds on another (:mod:`analysis.lab.recheck`, the CPU
kind from :mod:`analysis.lab.cpu_kind`). A second realization of an experiment, trained under
``--xla_cpu_max_isa``, is stored beside it as ``NAME@ISA.json``. :func:`load` also refuses a file whose configs
are not the ones the registry gives now (the experiment was changed but not re-run), naming
the command that brings it up to date.

File format (``format`` 1), every float as Python writes it (exact round trip)::

  {"name", "scale", "format", "provenance": {...},
   "runs": [{"key", "config", "row": {...}, "metrics": {column: [values]}}, ...],
   "sha256": "<hex>"}
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import hashlib
import json
import math
import multiprocessing
import os
import pathlib
import platform
import time
from typing import Any, Sequence

import pandas as pd

from analysis.lab import experiments
from analysis.lab.cpu_kind import ISA_LEVELS
from analysis.lab.cpu_kind import cpu_fingerprint
from analysis.lab.cpu_kind import max_isa
from analysis.lab.sweep_cache import code_version
from analysis.lab.sweep_cache import config_dict
from analysis.lab.sweep_cache import config_key
from analysis.lab.sweeps import SUMMARY_COLUMNS
from analysis.lab.live import live_sweep
from analysis.lab.sweeps import run_sweep
from analysis.lab.sweeps import sweep_curves
from diloco_core.validity import check_choice
from diloco_core.validity import check_int

#: Where stored experiments live (package data, so an installed copy has them too).
RESULTS_DIR = pathlib.Path(__file__).resolve().parents[1] / "results"
#: The format of the stored files; :func:`load` refuses any other.
FORMAT = 1
#: The logged metrics kept per run (wall time stays out: it is the machine's, not the run's).
METRIC_COLUMNS = ("step", "train_loss", "eval_loss", "tokens", "bytes_sent", "total_bytes_sent")


class StoredResultError(ValueError):
  """A stored experiment is missing, edited by hand, stale, or no longer reproduced."""


def path_of(name: str, realization: str | None = None) -> pathlib.Path:
  """The stored file of experiment ``name``: ``analysis/results/NAME.json``, or a second
  realization of it (the same runs trained on another kind of CPU): ``NAME@REALIZATION.json``.

  Examples:
    >>> path_of("claims").name, path_of("claims", "avx2").name
    ('claims.json', 'claims@avx2.json')
  """
  check_choice("experiment", name, sorted(experiments.SWEEPS))
  return RESULTS_DIR / (f"{name}.json" if realization is None else f"{name}@{realization}.json")


def realization_name(isa: str) -> str:
  """The realization a run under ``--xla_cpu_max_isa=ISA`` is stored as (``"AVX2"`` -> ``"avx2"``)."""
  check_choice("--isa", isa.upper(), ISA_LEVELS)
  return isa.lower()


def realizations(name: str, path: str | os.PathLike | None = None) -> list[str]:
  """The second realizations stored for ``name`` (files ``NAME@R.json`` beside its file).

  Args:
    name: the experiment.
    path: the experiment's main file, when it is not :func:`path_of` (tests).
  """
  main = pathlib.Path(path) if path is not None else path_of(name)
  return sorted(p.stem.split("@", 1)[1] for p in main.parent.glob(f"{name}@*.json"))


def plain(value: Any) -> Any:
  """JSON-safe Python: NaN becomes None, numpy scalars become Python numbers."""
  if isinstance(value, dict):
    return {str(k): plain(v) for k, v in value.items()}
  if isinstance(value, (list, tuple)):
    return [plain(v) for v in value]
  if hasattr(value, "item") and not isinstance(value, (str, bytes)):
    value = value.item()
  if isinstance(value, float) and not math.isfinite(value):
    return None
  return value


def default_config() -> dict:
  """:func:`plain_config` of a run config with every field at its default."""
  from diloco_core.train import TrainConfig  # imported here: JAX is configured by the caller first
  return plain_config(TrainConfig())


def plain_config(cfg) -> dict:
  """A config as it is stored: :func:`~analysis.lab.sweep_cache.config_dict` in plain JSON values."""
  return json.loads(json.dumps(plain(config_dict(cfg)), allow_nan=False))


def with_defaults(stored: dict, defaults: dict) -> dict:
  """A stored config completed with today's defaults for the fields it does not have.

  A field added to the trainer after an experiment was stored is read as its default: the
  option did not exist, and its default keeps the former behaviour (which the docs build's
  re-training of a sample, :func:`analysis.lab.recheck.verify`, checks number for number). A field the stored
  config has keeps its stored value.

  Examples:
    >>> with_defaults({"a": 1, "algo": {"h": 2}}, {"a": 0, "b": 5, "algo": {"h": 1, "topk": None}})
    {'a': 1, 'algo': {'h': 2, 'topk': None}, 'b': 5}
  """
  out = dict(stored)
  for key, value in defaults.items():
    if key not in out:
      out[key] = value
    elif isinstance(value, dict) and isinstance(out[key], dict):
      out[key] = with_defaults(out[key], value)
  return out


def content_hash(doc: dict) -> str:
  """SHA-256 of a stored document without its ``sha256`` entry (sorted keys, compact JSON).

  Examples:
    >>> content_hash({"a": 1, "sha256": "x"}) == content_hash({"a": 1})
    True
    >>> content_hash({"a": 1}) == content_hash({"a": 1.0000001})
    False
  """
  body = {k: v for k, v in doc.items() if k != "sha256"}
  text = json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False)
  return hashlib.sha256(text.encode()).hexdigest()


def provenance(wall_time_s: float, runs: int, scale: str, elapsed_s: float | None = None,
               workers: int = 1) -> dict:
  """Where and how a stored experiment was computed (versions, platform, date, code hash)."""
  import importlib.metadata

  import jax
  import numpy as np
  device = jax.devices()[0]
  return {
      "code": code_version(),
      "jax": jax.__version__,
      "jaxlib": importlib.metadata.version("jaxlib"),
      "numpy": np.__version__,
      "python": platform.python_version(),
      "platform": device.platform,
      "device_kind": device.device_kind,
      "devices": jax.device_count(),
      "machine": f"{platform.system()} {platform.machine()}, {os.cpu_count()} CPUs",
      "cpu": cpu_fingerprint(),
      "max_isa": max_isa(),  # --xla_cpu_max_isa in effect (None: the CPU's own sets)
      "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
      "wall_time_s": round(wall_time_s, 1),  # the runs' own training wall times, summed
      "elapsed_s": None if elapsed_s is None else round(elapsed_s, 1),  # this command (cached runs: read)
      "runs": runs,
      "workers": workers,  # processes that trained at once (the numbers do not depend on it)
      "scale": scale,
      "command": f"python -m analysis experiments run {{name}} --scale {scale}",
  }


def _metrics_columns(metrics: pd.DataFrame) -> dict[str, list]:
  return {c: plain(metrics[c].tolist()) for c in METRIC_COLUMNS if c in metrics.columns}


def _train_group(configs: list, cache: str) -> int:
  """Trains ``configs`` into the sweep cache ``cache`` (a worker of :func:`train_parallel`)."""
  run_sweep(configs, cache=cache, progress=False)
  return len(configs)


def train_parallel(configs: Sequence, *, workers: int, cache: str | os.PathLike | None = None,
                   progress: bool = True, desc: str = "sweep") -> None:
  """Trains ``configs`` into the sweep cache with ``workers`` processes at once.

  The runs are split into groups that share a compiled program
  (:func:`~analysis.lab.sweeps.program_groups`), so each group compiles once, and a group of more
  than a ``2 * workers``-th of the runs into equal parts (one compile more each, so that no
  worker is left with most of the runs); the groups go to ``workers`` processes started with
  ``spawn`` (JAX starts afresh in each), the largest first. Runs already in the cache are
  read, not trained. CPU runs are deterministic, so the numbers do not depend on ``workers``
  (the docs build's re-check of every stored experiment trains its sample in one process and
  compares).

  Args:
    configs: TrainConfigs.
    workers: processes that train at once (>= 1).
    cache: the sweep cache folder (default: :func:`~analysis.lab.sweep_cache.cache_dir`).
    progress: a progress bar over the runs (advanced as each group finishes).
    desc: the progress bar's label.
  """
  # here: only this function needs the program keys and the progress bar
  from tqdm.auto import tqdm

  from analysis.lab.sweep_cache import cache_dir
  from analysis.lab.sweeps import program_groups
  workers = check_int("workers", workers, low=1)
  root = str(cache_dir(cache))
  most = max(1, -(-len(configs) // (2 * workers)))  # the most runs one part may hold
  groups = []
  for group in program_groups(configs):
    parts = -(-len(group) // most)
    groups += [group[k::parts] for k in range(parts)]
  groups.sort(key=len, reverse=True)
  ctx = multiprocessing.get_context("spawn")
  with tqdm(total=len(configs), desc=desc, unit="run", disable=not progress) as bar, \
      concurrent.futures.ProcessPoolExecutor(min(workers, len(groups)), mp_context=ctx) as pool:
    futures = [pool.submit(_train_group, [configs[i] for i in g], root) for g in groups]
    for done in concurrent.futures.as_completed(futures):
      bar.update(done.result())


def run_experiment(name: str, *, scale: str = "cpu", cache: str | os.PathLike | None = None,
                   progress: bool = True, out_dir: str | os.PathLike | None = None,
                   workers: int = 1, realization: str | None = None) -> pathlib.Path:
  """Trains every run of experiment ``name`` and writes its stored file; returns the path.

  Finished runs are read from the sweep cache (:mod:`analysis.lab.sweep_cache`, keyed by config
  and code), so an interrupted experiment picks up where it stopped. The file is written to a
  temporary name and renamed into place: a stored file is never half written.

  Args:
    name: one of :data:`analysis.lab.experiments.SWEEPS`.
    scale: one of :data:`analysis.lab.experiments.SCALES`.
    cache: the sweep cache folder (default: :func:`~analysis.lab.sweep_cache.cache_dir`).
    progress: show a progress bar over the runs.
    out_dir: where to write (default :data:`RESULTS_DIR`).
    workers: processes that train at once (:func:`train_parallel`; 1 trains in this process).
    realization: store a second realization (:func:`path_of`), trained under
      ``--xla_cpu_max_isa`` set to it (:func:`realization_name`); the flag must be in
      ``$XLA_FLAGS`` before JAX starts (``python -m analysis experiments run NAME --isa AVX2``
      sets it).

  Returns:
    The path of the stored file.
  """
  configs = experiments.named_sweep(name, scale)
  workers = check_int("workers", workers, low=1)
  if realization is not None and max_isa() != realization_name(realization).upper():
    raise ValueError(f"realization {realization!r}: XLA_FLAGS must hold --xla_cpu_max_isa="
                     f"{realization.upper()} before JAX starts (it holds {max_isa()!r}); use"
                     f" `python -m analysis experiments run {name} --isa {realization.upper()}`.")
  start = time.perf_counter()
  if workers > 1:
    train_parallel(configs, workers=workers, cache=cache, progress=progress, desc=name)
  df = run_sweep(configs, cache=cache, progress=progress and workers == 1, desc=name)
  curves = sweep_curves(df, cache=cache)
  runs = []
  for cfg, (_, row) in zip(configs, df.iterrows()):
    key = config_key(cfg)
    metrics = curves[curves["key"] == key] if "key" in curves.columns else curves.iloc[0:0]
    runs.append({"key": key, "config": plain_config(cfg),
                 "row": plain({k: v for k, v in row.items() if k not in ("cached", "run_s")}),
                 "metrics": _metrics_columns(metrics)})
  trained_s = float(df["wall_time_s"].sum())  # each run's wall time, whether cached or trained now
  prov = provenance(trained_s, len(runs), scale, elapsed_s=time.perf_counter() - start, workers=workers)
  prov["command"] = prov["command"].format(name=name) + (
      "" if realization is None else f" --isa {realization.upper()}")
  doc = {"name": name, "scale": scale, "format": FORMAT, "provenance": prov, "runs": runs}
  doc["sha256"] = content_hash(doc)
  folder = pathlib.Path(out_dir) if out_dir is not None else RESULTS_DIR
  folder.mkdir(parents=True, exist_ok=True)
  path = folder / path_of(name, None if realization is None else realization_name(realization)).name
  tmp = path.with_suffix(".json.tmp")
  tmp.write_text(json.dumps(doc, indent=None, sort_keys=True, allow_nan=False) + "\n")
  os.replace(tmp, path)
  return path


@dataclasses.dataclass(frozen=True)
class StoredExperiment:
  """One stored experiment as read back (see :func:`load`)."""

  name: str
  scale: str
  provenance: dict
  runs: list
  path: pathlib.Path

  @property
  def frame(self) -> pd.DataFrame:
    """One row per run, the columns of :func:`analysis.lab.sweeps.run_sweep` (``cached`` True)."""
    df = pd.DataFrame([r["row"] for r in self.runs])
    df["cached"] = True
    return df

  @property
  def curves(self) -> pd.DataFrame:
    """The logged metrics of every run, long format, as :func:`analysis.lab.sweeps.sweep_curves`."""
    parts = []
    for r in self.runs:
      m = pd.DataFrame(r["metrics"])
      for col, value in r["row"].items():
        if col not in m.columns and col not in SUMMARY_COLUMNS:
          m[col] = [value] * len(m)
      parts.append(m)
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()

  def provenance_line(self) -> str:
    """One sentence: how many runs, when, on what, with which code (for the pages)."""
    p = self.provenance
    return (f"`{self.name}`: {p['runs']} runs trained {p['date']} on {p['device_kind']} "
            f"({p['platform']}, {p['machine']}) in {p['wall_time_s'] / 60:.1f} min with JAX "
            f"{p['jax']}, trainer code {p['code']}; stored in `analysis/results/{self.path.name}`, "
            f"regenerate with `{p['command']}`.")


def _refuse(name: str, why: str) -> StoredResultError:
  return StoredResultError(
      f"stored experiment {name!r} ({path_of(name)}): {why}; run"
      f" `python -m analysis experiments run {name}` to train and store it again.")


def load(name: str, *, scale: str = "cpu", check_configs: bool = True,
         path: str | os.PathLike | None = None, realization: str | None = None) -> StoredExperiment:
  """Reads a stored experiment, checking its hash and (by default) that it is up to date.

  Args:
    name: one of :data:`analysis.lab.experiments.SWEEPS`.
    scale: the scale it must have been run at.
    check_configs: refuse a file whose configs differ from ``named_sweep(name, scale)``.
    path: read this file instead of :func:`path_of` (tests); with ``realization``, the
      realization's file beside it.
    realization: read a second realization (:func:`realizations`).

  Returns:
    A :class:`StoredExperiment`.

  Raises:
    StoredResultError: the file is missing, edited (hash), of another format or scale, or
      stale (its configs are not the registry's).
  """
  p = pathlib.Path(path) if path is not None else path_of(name)
  if realization is not None:
    p = p.parent / path_of(name, realization).name
  if not p.exists():
    raise _refuse(name, f"no stored file {p.name}")
  try:
    doc = json.loads(p.read_text())
  except ValueError as e:
    raise _refuse(name, f"not valid JSON ({e})") from None
  if doc.get("format") != FORMAT:
    raise _refuse(name, f"format {doc.get('format')!r}, this code reads format {FORMAT}")
  if doc.get("sha256") != content_hash(doc):
    raise StoredResultError(
        f"stored experiment {name!r} ({p}): its contents do not match its sha256 (edited by"
        f" hand?); stored results are written only by `python -m analysis experiments run {name}`.")
  if doc.get("scale") != scale:
    raise _refuse(name, f"stored at scale {doc.get('scale')!r}, asked for {scale!r}")
  if check_configs:
    want = [plain_config(c) for c in experiments.named_sweep(name, scale)]
    defaults = default_config()
    have = [with_defaults(r["config"], defaults) for r in doc["runs"]]
    if want != have:
      differ = sum(a != b for a, b in zip(want, have)) + abs(len(want) - len(have))
      raise _refuse(name, f"stale: {differ} of its {len(want)} configs differ from"
                          f" analysis.lab.experiments.named_sweep({name!r})")
  return StoredExperiment(name=name, scale=scale, provenance=doc["provenance"], runs=doc["runs"], path=p)


def frame(name: str, scale: str = "cpu") -> pd.DataFrame:
  """The rows of a stored experiment (shorthand for ``load(name, scale=scale).frame``)."""
  return load(name, scale=scale).frame


def results(name: str, scale: str = "cpu", *, live: bool | None = None, curves: bool = False,
            max_runs: int | None = None):
  """The rows of experiment ``name``: stored on CPU, trained live at other scales or on request.

  Args:
    name: one of :data:`analysis.lab.experiments.SWEEPS`.
    scale: the scale (``"accelerator"`` has no stored results unless one was run and stored).
    live: train now (:func:`analysis.lab.live.live_sweep`: the plan and a time estimate first, then
      each run cached on disk); default: live when no stored file exists for the scale.
    curves: also return the logged metrics of the runs (long format).
    max_runs: live only: train at most this many new runs
      (:class:`~analysis.lab.live.LiveLimitReached` when more remain; calling again goes on).

  Returns:
    One row per run, as :func:`analysis.lab.sweeps.run_sweep`; with ``curves``, ``(rows, curves)``.
  """
  if live is None:
    p = path_of(name)
    live = not (p.exists() and json.loads(p.read_text()).get("scale") == scale)
  if live:
    df = live_sweep(experiments.named_sweep(name, scale), desc=name, max_runs=max_runs)
    return (df, sweep_curves(df)) if curves else df
  e = load(name, scale=scale)
  return (e.frame, e.curves) if curves else e.frame


def stored_names() -> list[str]:
  """The experiments that have a stored file."""
  return sorted(n for n in experiments.SWEEPS if path_of(n).exists())
