"""The on-disk cache of :mod:`analysis.lab.sweeps`: one folder per run, keyed by its config and code.

The cache is a folder holding one subfolder per run, named by :func:`config_key`: a hash
of the full config (every field of ``TrainConfig``, ``DiLoCoConfig`` and ``DataConfig``,
except the ones that cannot change a number: ``out``, ``overwrite``, ``progress``) and of
the trainer's source code. A rebuild reuses every finished run; changing any field, or
the trainer, reruns exactly the runs it affects. Results are written to a temporary
folder and renamed into place (:func:`save_run`), so an interrupted sweep never leaves
half a run behind and two processes may share one cache.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import pathlib
import shutil
import tempfile
from typing import Any

import pandas as pd

from analysis.lab.cpu_kind import max_isa
from diloco_core.spec.fields import non_result_fields

#: The environment variable that names the cache folder (the docs build sets it).
CACHE_ENV = "DILOCO_SWEEPS_CACHE"
#: The cache folder when neither an argument nor the environment names one.
DEFAULT_CACHE_DIR = ".cache/sweeps"


def cache_dir(path: str | os.PathLike | None = None) -> pathlib.Path:
  """The sweep cache folder: ``path``, else ``$DILOCO_SWEEPS_CACHE``, else ``.cache/sweeps``;
  under ``--xla_cpu_max_isa=ISA`` (:func:`~analysis.lab.cpu_kind.max_isa`) the latter two end in
  ``-isa``, so that runs of another realization never mix with the CPU's own.

  Examples:
    >>> str(cache_dir("/tmp/my-sweeps"))
    '/tmp/my-sweeps'
  """
  if path is None:
    path = os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR
    isa = max_isa()
    if isa is not None:  # runs compiled for fewer instruction sets round differently: kept apart
      path = f"{path}-{isa.lower()}"
  return pathlib.Path(path)


@functools.lru_cache(maxsize=1)
def code_version() -> str:
  """A hash of the trainer's source (``diloco_core/**/*.py``): part of every cache key."""
  import diloco_core
  h = hashlib.sha256()
  root = pathlib.Path(diloco_core.__file__).parent
  for f in sorted(root.rglob("*.py")):
    h.update(f.relative_to(root).as_posix().encode())
    h.update(f.read_bytes())
  return h.hexdigest()[:16]


def config_dict(cfg) -> dict[str, Any]:
  """Every field of a TrainConfig that can change a result, as nested plain Python."""
  d = dataclasses.asdict(cfg)
  for name in non_result_fields(type(cfg)):  # out, overwrite, progress: from the field metadata
    d.pop(name, None)
  return d


def config_key(cfg) -> str:
  """The cache key of a run: a hash of :func:`config_dict` and :func:`code_version`.

  Examples:
    >>> from diloco_core.train import TrainConfig
    >>> a = TrainConfig(steps=100)
    >>> config_key(a) == config_key(dataclasses.replace(a, progress=False, out="x"))
    True
    >>> config_key(a) == config_key(dataclasses.replace(a, steps=101))
    False
  """
  payload = json.dumps({"config": config_dict(cfg), "code": code_version()},
                       sort_keys=True, default=str)
  return hashlib.sha256(payload.encode()).hexdigest()[:20]


def cache_root(cache: str | os.PathLike | None | bool) -> pathlib.Path | None:
  """The folder a ``cache`` argument names: None for ``False`` (no cache), the default
  (:func:`cache_dir`) for ``None`` or ``True``, else the folder given.

  Examples:
    >>> cache_root(False) is None, str(cache_root("/tmp/c"))
    (True, '/tmp/c')
  """
  return None if cache is False else cache_dir(None if cache is True else cache)


def is_cached(cfg, root: pathlib.Path | None) -> bool:
  """Whether the cache folder ``root`` holds a finished run of ``cfg`` (False when ``root`` is None)."""
  return root is not None and (root / config_key(cfg) / "summary.json").exists()


def load_run(run_dir: pathlib.Path):
  """``(summary, metrics)`` of a cached run."""
  with open(run_dir / "summary.json") as f:
    summary = json.load(f)
  metrics = pd.read_json(run_dir / "metrics.jsonl", lines=True)
  return summary, metrics


def save_run(root: pathlib.Path, key: str, cfg, summary: dict, metrics: pd.DataFrame) -> None:
  """Writes a run under ``root / key`` atomically (a temporary folder renamed into place)."""
  root.mkdir(parents=True, exist_ok=True)
  tmp = pathlib.Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
  try:
    with open(tmp / "config.json", "w") as f:
      json.dump({"config": config_dict(cfg), "code": code_version()}, f, indent=1, default=str)
    with open(tmp / "summary.json", "w") as f:
      json.dump(summary, f, indent=1, default=str)
    metrics.to_json(tmp / "metrics.jsonl", orient="records", lines=True)
    try:
      os.replace(tmp, root / key)
    except OSError:  # another process finished the same run first: keep theirs
      pass
  finally:
    if tmp.exists():
      shutil.rmtree(tmp, ignore_errors=True)


def enable_compilation_cache(root: pathlib.Path) -> None:
  """Switches on JAX's persistent compilation cache in a ``jax`` folder beside ``root``."""
  import jax
  if jax.config.jax_compilation_cache_dir:
    return
  path = root.parent / "jax"
  path.mkdir(parents=True, exist_ok=True)
  jax.config.update("jax_compilation_cache_dir", str(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
