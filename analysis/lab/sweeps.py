"""Grids of training runs in one process, cached on disk, returned as tidy DataFrames.

A sweep is a list of :class:`~diloco_core.train.TrainConfig`; :func:`grid` builds one as
the product of a few axes around a base config, :func:`run_sweep` trains each config
(or reads it back from the cache) and returns one row per run, and :func:`sweep_curves`
returns the logged metrics of the same runs, one row per (run, logged step).

Finished runs are cached on disk (:mod:`analysis.lab.sweep_cache`: one folder per run, keyed
by a hash of its config and of the trainer's code), so a rebuild reuses every finished run
and reruns exactly the runs a change affects. The named sweeps the docs and notebooks use
are in :mod:`analysis.lab.experiments`; :func:`compare`, :func:`best`, :func:`summarize` and
:func:`varying_columns` query the results.

Compiled steps. Runs are trained one after the other in this process. The trainer
feeds H, τ, η, μ, α, the inner learning rate, weight decay and clipping norm to its compiled
step as inputs and keeps the last programs it built
(:func:`diloco_core.train.program_key`), so runs that differ only in those values or in
seeds compile once; :func:`run_sweep` trains runs that share a program back to back (and
returns rows in the order given). With ``compilation_cache=True`` JAX's persistent
compilation cache is also switched on (in a ``jax`` folder beside the sweep cache), so a
later process (another notebook, a rebuild) skips XLA compilation of programs already
built.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
from typing import Any, Iterable, Mapping, Sequence

import pandas as pd
from tqdm.auto import tqdm

from analysis.lab.sweep_cache import cache_dir
from analysis.lab.sweep_cache import cache_root
from analysis.lab.sweep_cache import config_dict
from analysis.lab.sweep_cache import config_key
from analysis.lab.sweep_cache import enable_compilation_cache
from analysis.lab.sweep_cache import load_run
from analysis.lab.sweep_cache import save_run
from diloco_core.algorithm.config import DiLoCoConfig

#: The numbers of a run's summary that :func:`run_sweep` puts in each row.
SUMMARY_COLUMNS = (
    "final_eval_loss", "loss_floor", "gap_to_floor", "total_bytes_per_replica",
    "peak_bytes_per_step", "wall_time_s", "compile_time_s", "tokens", "tokens_per_s", "params",
    "final_replica_eval_loss")


def _train_module():
  # Imported lazily: diloco_core.train pulls in JAX, which the docs configure first.
  from diloco_core import train as train_module
  return train_module


def flat_config(cfg) -> dict[str, Any]:
  """One flat dict per config: TrainConfig and DiLoCoConfig fields under their own names,
  DataConfig fields prefixed ``data_`` (``data_distribution``, ``data_seed``, ...)."""
  d = config_dict(cfg)
  algo, data = d.pop("algo"), d.pop("data")
  out = dict(algo)
  out.update(d)
  out.update({f"data_{k}": v for k, v in data.items()})
  return out


def _resolve(name: str, train_fields, algo_fields, data_fields) -> tuple[str, str]:
  if name.startswith("data.") or name.startswith("data_"):
    field = name[5:]
    if field not in data_fields:
      raise ValueError(f"unknown data field {field!r}; DataConfig has {sorted(data_fields)}.")
    return "data", field
  if name.startswith("algo."):
    field = name[5:]
    if field not in algo_fields:
      raise ValueError(f"unknown algo field {field!r}; DiLoCoConfig has {sorted(algo_fields)}.")
    return "algo", field
  if name in train_fields and name not in ("algo", "data"):
    return "train", name
  if name in algo_fields:
    return "algo", name
  if name in data_fields:
    return "data", name
  raise ValueError(
      f"unknown sweep axis {name!r}: use a field of TrainConfig, DiLoCoConfig or DataConfig"
      " (prefix 'data.' for DataConfig fields such as 'data.seed').")


def with_values(base, values: Mapping[str, Any]):
  """``base`` with the named fields replaced (names as in :func:`grid`); validates.

  Raises:
    ValueError: for an unknown field or an invalid combination (the trainer's message).
  """
  train_fields = {f.name for f in dataclasses.fields(base)}
  algo_fields = {f.name for f in dataclasses.fields(base.algo)}
  data_fields = {f.name for f in dataclasses.fields(base.data)}
  changes: dict[str, dict[str, Any]] = {"train": {}, "algo": {}, "data": {}}
  for name, value in values.items():
    where, field = _resolve(name, train_fields, algo_fields, data_fields)
    changes[where][field] = value
  algo = base.algo
  if changes["algo"]:
    # DiLoCoConfig validates in __post_init__; "diloco" with P > 1 is spelled "streaming".
    fields = {**dataclasses.asdict(base.algo), **changes["algo"]}
    if fields["algorithm"] == "diloco" and fields["fragments"] > 1 and "algorithm" not in changes["algo"]:
      fields["algorithm"] = "streaming"
    algo = DiLoCoConfig(**fields)
  data = dataclasses.replace(base.data, **changes["data"]) if changes["data"] else base.data
  cfg = dataclasses.replace(base, algo=algo, data=data, **changes["train"])
  cfg_no_out = dataclasses.replace(cfg, out=None)
  cfg_no_out.validate()
  from diloco_core.run.preflight import preflight  # lazily, as diloco_core.train (_train_module)
  preflight(cfg_no_out)  # the mesh, the memory and init_from against this machine, as before
  return cfg


def grid(base, axes: Mapping[str, Sequence[Any]] | None = None, *, skip_invalid: bool = False,
         **kw_axes: Sequence[Any]) -> list:
  """The cartesian product of ``axes`` around ``base``, as a list of TrainConfigs.

  Axis names are fields of ``TrainConfig`` (``steps``, ``inner_lr``, ``seed``, ...),
  ``DiLoCoConfig`` (``sync_every``, ``replicas``, ``outer_lr``, ...) or ``DataConfig``
  (``distribution``; write ``data.seed`` for the data seed). Setting ``fragments`` > 1 on
  a ``"diloco"`` base switches it to ``"streaming"``.

  Args:
    base: the TrainConfig every run starts from.
    axes: ``{name: values}`` (for names that are not Python identifiers, e.g. "data.seed").
    skip_invalid: drop combinations the trainer rejects (e.g. H not a multiple of P)
      instead of raising.
    **kw_axes: more axes.

  Returns:
    One TrainConfig per valid combination, in product order (first axis slowest).

  Examples:
    >>> from diloco_core.train import TrainConfig
    >>> cfgs = grid(TrainConfig(model="tiny", steps=20), sync_every=[4, 6], fragments=[1, 3],
    ...             skip_invalid=True)
    >>> [(c.algo.algorithm, c.algo.sync_every, c.algo.fragments) for c in cfgs]
    [('diloco', 4, 1), ('diloco', 6, 1), ('streaming', 6, 3)]
  """
  all_axes = dict(axes or {})
  all_axes.update(kw_axes)
  names = list(all_axes)
  out = []
  for combo in itertools.product(*(list(all_axes[n]) for n in names)):
    try:
      out.append(with_values(base, dict(zip(names, combo))))
    except ValueError:
      if not skip_invalid:
        raise
  return out


def run_one(cfg, *, cache: str | os.PathLike | None | bool = None, rerun: bool = False,
            until: int | None = None):
  """Trains one config, or reads it from the cache; returns ``(summary, metrics, cached)``.

  With ``until`` below the config's steps, only its first ``until`` steps are trained (the
  schedule still that of the whole run; :func:`~diloco_core.run.loop.train`): ``summary`` is
  None, and the partial run is neither read from nor written to the cache."""
  if until is not None and until < cfg.steps:
    result = _train_module().train(dataclasses.replace(cfg, out=None, progress=False), until=until)
    return None, result.metrics, False
  key = config_key(cfg)
  root = cache_root(cache)
  if root is not None and not rerun and (root / key / "summary.json").exists():
    summary, metrics = load_run(root / key)
    return summary, metrics, True
  result = _train_module().train(dataclasses.replace(cfg, out=None, progress=False))
  if root is not None:
    save_run(root, key, cfg, result.summary, result.metrics)
  return result.summary, result.metrics, False


def run_sweep(configs: Iterable, *, cache: str | os.PathLike | None | bool = None,
              rerun: bool = False, progress: bool = True, compilation_cache: bool = True,
              desc: str = "sweep") -> pd.DataFrame:
  """Trains every config (or reads it from the cache) and returns one tidy row per run.

  Args:
    configs: TrainConfigs, e.g. from :func:`grid`.
    cache: the cache folder (default :func:`~analysis.lab.sweep_cache.cache_dir`); ``False`` disables caching.
    rerun: train again even when a cached result exists (and overwrite it).
    progress: show a progress bar over the runs (also silenced by ``TQDM_DISABLE=1``).
    compilation_cache: switch on JAX's persistent compilation cache beside the sweep cache.
    desc: the progress bar's label.

  Returns:
    A DataFrame with one row per config: every config field (see :func:`flat_config`),
    the run's summary numbers (:data:`SUMMARY_COLUMNS`), ``key`` (its cache key),
    ``cached`` (read back rather than trained) and ``run_s`` (seconds spent on it now).

  Examples:
    >>> from diloco_core.train import TrainConfig
    >>> from diloco_core.data.sources import DataConfig
    >>> base = TrainConfig(model="tiny", steps=4, batch_size=2, seq_len=8, eval_every=4,
    ...                    log_every=2, warmup_steps=1, data=DataConfig(vocab_size=16))
    >>> df = run_sweep(grid(base, sync_every=[2, 4]), cache=False, progress=False)
    >>> df[["sync_every", "replicas"]].values.tolist()
    [[2, 2], [4, 2]]
  """
  configs = list(configs)
  root = cache_root(cache)
  if compilation_cache and root is not None:
    enable_compilation_cache(root)
  rows: list[dict | None] = [None] * len(configs)
  quiet = not progress or os.environ.get("TQDM_DISABLE", "") not in ("", "0")
  bar = tqdm(total=len(configs), desc=desc, unit="run", disable=quiet)
  for i in training_order(configs):
    cfg = configs[i]
    start = time.perf_counter()
    summary, _, cached = run_one(cfg, cache=False if root is None else root, rerun=rerun)
    row = flat_config(cfg)
    row.update({c: summary.get(c) for c in SUMMARY_COLUMNS})
    row.update(key=config_key(cfg), cached=cached, run_s=time.perf_counter() - start)
    rows[i] = row
    bar.update(1)
    bar.set_postfix(loss=f"{summary['final_eval_loss']:.3f}", cached=cached)
  bar.close()
  return pd.DataFrame(rows)


def program_groups(configs: Sequence) -> list[list[int]]:
  """Indices of ``configs`` grouped by the compiled program they share, in order of first use.

  Examples:
    >>> from diloco_core.train import TrainConfig
    >>> cfgs = grid(TrainConfig(model="tiny"), replicas=[2, 4], sync_every=[2, 4])
    >>> program_groups([cfgs[0], cfgs[2], cfgs[1], cfgs[3]])  # M is a shape, H an input
    [[0, 2], [1, 3]]
  """
  train = _train_module()
  groups: dict[str, list[int]] = {}
  for i, cfg in enumerate(configs):
    groups.setdefault(train.program_key(cfg, cfg.model_config()), []).append(i)
  return list(groups.values())


def training_order(configs: Sequence) -> list[int]:
  """Indices of ``configs`` with runs sharing a compiled program next to each other.

  Groups keep the order of their first run, and runs keep their order within a group.

  Examples:
    >>> from diloco_core.train import TrainConfig
    >>> cfgs = grid(TrainConfig(model="tiny"), replicas=[2, 4], sync_every=[2, 4])
    >>> [(c.algo.replicas, c.algo.sync_every) for c in cfgs]
    [(2, 2), (2, 4), (4, 2), (4, 4)]
    >>> mixed = [cfgs[0], cfgs[2], cfgs[1], cfgs[3]]  # M = 2, 4, 2, 4 (H is an input, M a shape)
    >>> training_order(mixed)  # both M = 2 runs, then both M = 4 runs
    [0, 2, 1, 3]
  """
  return [i for members in program_groups(configs) for i in members]


def sweep_curves(df: pd.DataFrame, configs: Iterable | None = None, *,
                 cache: str | os.PathLike | None = None) -> pd.DataFrame:
  """The logged metrics of the runs in ``df`` (from :func:`run_sweep`), long format.

  Args:
    df: a :func:`run_sweep` result (its ``key`` column names the cached runs).
    configs: unused; kept so that callers may pass the sweep's configs for clarity.
    cache: the cache folder the runs were written to (default :func:`~analysis.lab.sweep_cache.cache_dir`).

  Returns:
    One row per (run, logged step): the metrics columns of ``train`` (``step``,
    ``train_loss``, ``eval_loss``, ``tokens``, ``bytes_sent``, ``total_bytes_sent``,
    ``wall_time_s``) next to every column of ``df``'s row for that run.
  """
  del configs
  root = cache_dir(cache)
  parts = []
  summary_cols = set(SUMMARY_COLUMNS) | {"wall_time_s"}
  for _, row in df.iterrows():
    path = root / row["key"] / "metrics.jsonl"
    if not path.exists():
      raise FileNotFoundError(
          f"no cached metrics for run {row['key']} in {root}; run_sweep with caching first.")
    m = pd.read_json(path, lines=True)
    for col, value in row.items():
      if col not in summary_cols and col not in m.columns:
        m[col] = [value] * len(m)
    parts.append(m)
  return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()


def varying_columns(df: pd.DataFrame) -> list[str]:
  """The config columns of a sweep that take more than one value (its axes)."""
  skip = set(SUMMARY_COLUMNS) | {"key", "cached", "run_s"}
  out = []
  for c in df.columns:
    if c in skip:
      continue
    values = df[c].map(lambda v: json.dumps(v, sort_keys=True, default=str))
    if values.nunique() > 1:
      out.append(c)
  return out


def _select(df: pd.DataFrame, where: Mapping[str, Any]) -> pd.DataFrame:
  mask = pd.Series(True, index=df.index)
  for k, v in where.items():
    mask &= df[k] == v
  if not mask.any():
    raise ValueError(f"no run matches {dict(where)}.")
  return df[mask]


def compare(df: pd.DataFrame, where_a: Mapping[str, Any], where_b: Mapping[str, Any], *,
            metric: str = "final_eval_loss", pair_on: str | None = "seed") -> dict[str, Any]:
  """Compares two groups of runs of a sweep on ``metric`` (lower is better).

  The docs turn the result into sentences, so that a sentence can never contradict the
  table it comes from.

  Args:
    df: one row per run.
    where_a, where_b: column values selecting each group.
    metric: the column compared.
    pair_on: a column (the seed) matching runs of ``a`` with runs of ``b``; ``wins_b``
      counts the pairs where ``b`` is lower. None skips the pairing.

  Returns:
    ``{"a", "b", "diff", "better", "wins_b", "pairs"}``: the two means, ``diff = b - a``,
    ``better`` ("a", "b" or "tie": the lower mean) and the paired count.

  Examples:
    >>> df = pd.DataFrame({"H": [1, 1, 2, 2], "seed": [0, 1, 0, 1],
    ...                    "final_eval_loss": [3.0, 2.0, 2.5, 2.5]})
    >>> compare(df, {"H": 1}, {"H": 2})
    {'a': 2.5, 'b': 2.5, 'diff': 0.0, 'better': 'tie', 'wins_b': 1, 'pairs': 2}
  """
  ga, gb = _select(df, where_a), _select(df, where_b)
  a, b = float(ga[metric].mean()), float(gb[metric].mean())
  better = "tie" if a == b else ("a" if a < b else "b")
  wins, pairs = 0, 0
  if pair_on is not None and pair_on in df.columns:
    merged = ga[[pair_on, metric]].merge(gb[[pair_on, metric]], on=pair_on, suffixes=("_a", "_b"))
    pairs = len(merged)
    wins = int((merged[f"{metric}_b"] < merged[f"{metric}_a"]).sum())
  return {"a": a, "b": b, "diff": b - a, "better": better, "wins_b": wins, "pairs": pairs}


def paired_noise(df: pd.DataFrame, *, metric: str = "final_eval_loss", pair_on: str = "seed") -> float:
  r"""The seed noise of a paired difference in a sweep: the median, over every two
  configurations A and B, of the standard deviation over their shared seeds of
  :math:`m_{A,s} - m_{B,s}`.

  This is the noise :func:`compare` faces (it pairs runs by seed): a seed that is good
  for every configuration cancels out of it. The median keeps a few diverged
  configurations from deciding it.

  Args:
    df: one row per run; configurations are told apart by :func:`varying_columns`.
    metric: the column compared.
    pair_on: the column that pairs runs (the seed).

  Returns:
    The median standard deviation (NaN with fewer than two configurations sharing two
    seeds).

  Examples:
    >>> df = pd.DataFrame({"H": [1, 1, 2, 2, 4, 4], "seed": [0, 1] * 3,
    ...                    "final_eval_loss": [2.0, 3.0, 2.5, 3.5, 2.0, 3.5]})
    >>> round(paired_noise(df), 4)  # pairs (1,2): 0; (1,4): 0.5/√2; (2,4): 0.5/√2
    0.3536
  """
  cols = [c for c in varying_columns(df) if c != pair_on]
  if not cols:
    return float("nan")
  key = df[cols].apply(lambda r: json.dumps(list(r), default=str), axis=1)
  table = df.assign(_config=key).pivot_table(index=pair_on, columns="_config", values=metric)
  sds = []
  for a, b in itertools.combinations(table.columns, 2):
    diff = (table[a] - table[b]).dropna()
    if len(diff) >= 2:
      sds.append(float(diff.std()))
  return float(pd.Series(sds).median()) if sds else float("nan")


def best(df: pd.DataFrame, by: str | Sequence[str], x: str,
         metric: str = "final_eval_loss") -> pd.DataFrame:
  """For each group of ``by``, the value of ``x`` with the lowest mean ``metric`` (over seeds).

  Examples:
    >>> df = pd.DataFrame({"lr": [1, 1, 2, 2], "eta": [0.3, 0.9, 0.3, 0.9],
    ...                    "final_eval_loss": [2.0, 1.0, 1.0, 2.0]})
    >>> best(df, "lr", "eta")["eta"].to_dict()
    {1: 0.9, 2: 0.3}
  """
  by_list = [by] if isinstance(by, str) else list(by)
  means = df.groupby(by_list + [x])[metric].mean().reset_index()
  idx = means.groupby(by_list)[metric].idxmin()
  return means.loc[idx].set_index(by_list)


def summarize(df: pd.DataFrame, by: str | Sequence[str], metric: str = "final_eval_loss") -> pd.DataFrame:
  """Mean, standard deviation and count of ``metric`` over the runs sharing ``by`` (seeds).

  Examples:
    >>> df = pd.DataFrame({"H": [1, 1, 2], "seed": [0, 1, 0], "final_eval_loss": [3.0, 2.0, 2.5]})
    >>> summarize(df, "H").round(3).to_dict("index")
    {1: {'mean': 2.5, 'std': 0.707, 'n': 2}, 2: {'mean': 2.5, 'std': nan, 'n': 1}}
  """
  g = df.groupby(by)[metric]
  return pd.DataFrame({"mean": g.mean(), "std": g.std(), "n": g.count()})
