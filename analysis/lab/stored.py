"""Stored experiments: heavy results trained once, kept in the repository, re-checked by every build.

A named experiment (:data:`analysis.lab.experiments.SWEEPS`) is trained by
``python -m analysis experiments run NAME`` (:func:`~analysis.lab.storing.run_experiment`, the project's own runner
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

import dataclasses
import hashlib
import json
import math
import os
import pathlib
from typing import Any

import pandas as pd

from analysis.lab import experiments
from analysis.lab.cpu_kind import ISA_LEVELS
from analysis.lab.sweep_cache import config_dict
from analysis.lab.sweeps import SUMMARY_COLUMNS
from analysis.lab.live import live_sweep
from analysis.lab.sweeps import sweep_curves
from diloco_core.spec.validity import check_choice

#: Where stored experiments live (package data, so an installed copy has them too).
RESULTS_DIR = pathlib.Path(__file__).resolve().parents[1] / "results"
#: The format of the stored files; :func:`load` refuses any other.
FORMAT = 1
#: The logged metrics kept per run (wall time stays out: it is the machine's, not the run's).
METRIC_COLUMNS = ("step", "train_loss", "eval_loss", "tokens", "bytes_sent", "total_bytes_sent",
                  "tick")  # tick: a tape run's simulated time of the commit (diloco_core.run.tape_run)


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


def read_document(name: str, p: pathlib.Path) -> dict:
  """The JSON object of a stored file, or a one-line :class:`StoredResultError` saying what is
  there instead (nothing, a folder, an unreadable file, not JSON, not a JSON object).

  Examples:
    >>> import tempfile
    >>> bad = pathlib.Path(tempfile.mkdtemp()) / "x.json"
    >>> _ = bad.write_text("[1, 2, 3]")
    >>> read_document("methods", bad)
    Traceback (most recent call last):
    ...
    analysis.lab.stored.StoredResultError: stored experiment 'methods' (...): x.json holds a JSON list, not a stored experiment (an object); run `python -m analysis experiments run methods` to train and store it again.
  """
  if not p.exists():
    raise _refuse(name, f"no stored file {p.name}")
  if not p.is_file():
    raise _refuse(name, f"{p.name} is a folder, not a file")
  try:
    doc = json.loads(p.read_text())
  except OSError as e:
    raise _refuse(name, f"{p.name} cannot be read ({e.strerror or e})") from None
  except ValueError as e:
    raise _refuse(name, f"not valid JSON ({e})") from None
  if not isinstance(doc, dict):
    raise _refuse(name, f"{p.name} holds a JSON {type(doc).__name__}, not a stored experiment (an object)")
  return doc


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
  doc = read_document(name, p)
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
    live = not (p.exists() and read_document(name, p).get("scale") == scale)
  if live:
    df = live_sweep(experiments.named_sweep(name, scale), desc=name, max_runs=max_runs)
    return (df, sweep_curves(df)) if curves else df
  e = load(name, scale=scale)
  return (e.frame, e.curves) if curves else e.frame


def stored_names() -> list[str]:
  """The experiments that have a stored file."""
  return sorted(n for n in experiments.SWEEPS if path_of(n).exists())
