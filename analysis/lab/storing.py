"""Training an experiment and writing its stored file (``python -m analysis experiments run``).

:func:`run_experiment` trains every run of a named experiment (from the sweep cache where it
can, :func:`train_parallel` over several processes if asked), and writes
``analysis/results/NAME.json`` (:mod:`analysis.lab.stored` reads it) with its
:func:`provenance`, after checking that it can write there (:func:`check_writable`), so that
no training is lost to a folder it cannot keep.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import json
import multiprocessing
import os
import pathlib
import platform
import time
from typing import Sequence

import pandas as pd

from analysis.lab import experiments
from analysis.lab import stored
from analysis.lab.cpu_kind import cpu_fingerprint
from analysis.lab.cpu_kind import max_isa
from analysis.lab.stored import FORMAT
from analysis.lab.stored import METRIC_COLUMNS
from analysis.lab.stored import content_hash
from analysis.lab.stored import path_of
from analysis.lab.stored import plain
from analysis.lab.stored import plain_config
from analysis.lab.stored import realization_name
from analysis.lab.sweep_cache import code_version
from analysis.lab.sweep_cache import config_key
from analysis.lab.sweeps import run_sweep
from analysis.lab.sweeps import sweep_curves
from diloco_core.spec.validity import check_int


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


def check_writable(folder: pathlib.Path) -> None:
  """Raises a one-line :class:`OSError` unless a stored file can be written into ``folder``
  (created if missing): checked before an experiment trains, so no training is lost to it.

  Examples:
    >>> import tempfile
    >>> check_writable(pathlib.Path(tempfile.mkstemp()[1]))
    Traceback (most recent call last):
    ...
    OSError: cannot write the stored file into ... (it is a file); make it writable (or, from Python, pass another out_dir).
  """
  why = None
  if folder.exists() and not folder.is_dir():
    why = "it is a file"
  elif not folder.exists():
    try:
      folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
      why = f"it cannot be created: {e.strerror or e}"
  if why is None and not os.access(folder, os.W_OK | os.X_OK):
    why = "it is read-only"
  if why is not None:
    raise OSError(f"cannot write the stored file into {folder} ({why}); make it writable (or, from Python,"
                  " pass another out_dir).")


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
    out_dir: where to write (default :data:`analysis.lab.stored.RESULTS_DIR`).
    workers: processes that train at once (:func:`train_parallel`; 1 trains in this process).
    realization: store a second realization (:func:`~analysis.lab.stored.path_of`), trained under
      ``--xla_cpu_max_isa`` set to it (:func:`~analysis.lab.stored.realization_name`); the flag must be in
      ``$XLA_FLAGS`` before JAX starts (``python -m analysis experiments run NAME --isa AVX2``
      sets it).

  Returns:
    The path of the stored file.
  """
  configs = experiments.named_sweep(name, scale)
  workers = check_int("workers", workers, low=1)
  folder = pathlib.Path(out_dir) if out_dir is not None else stored.RESULTS_DIR
  check_writable(folder)  # before the training, not after it
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
  folder.mkdir(parents=True, exist_ok=True)
  path = folder / path_of(name, None if realization is None else realization_name(realization)).name
  tmp = path.with_suffix(".json.tmp")
  tmp.write_text(json.dumps(doc, indent=None, sort_keys=True, allow_nan=False) + "\n")
  os.replace(tmp, path)
  return path
