"""The main job: DP vs DiLoCo vs Streaming DiLoCo on the built-in data, one table, one plot.

``python -m diloco_core.compare --out runs/compare`` trains the same model from the same
initialisation with the three algorithms (same replicas M, per-replica batch, steps and
inner optimizer), prints a comparison table (final eval loss, gap to the data's exact
entropy floor, bytes each replica sent in total and at peak, wall time) and writes
``loss.png``, ``comparison.csv`` and every run's ``metrics.jsonl`` / ``summary.json``.

This module is the library part (the runs and the table's rows); the command line, the
table and the figure are built at the edge (:mod:`diloco_core.compare`).
"""

from __future__ import annotations

import dataclasses
import os

from diloco_core.devices.backend import default_demo_steps
from diloco_core.algorithm.config import DiLoCoConfig
from diloco_core.data.sources import DataConfig
from diloco_core.run.loop import Interrupted, TrainResult, train
from diloco_core.store.out_dir import check_out_dir
from diloco_core.run.config import TrainConfig
from diloco_core.run.preflight import preflight

#: The comparison's own defaults, by field path (every other option: TrainConfig's default).
#: steps None: :func:`diloco_core.devices.backend.default_demo_steps` (3000 on GPU/TPU, 1500 on CPU).
#: H = 30 and 1,500 steps give 50 outer steps (the regime of the papers: many outer steps, DP
#: near the data's floor), 30x fewer bytes than DP; 32-token sequences keep it under 8 minutes
#: on 2 CPU cores.
DEFAULTS = {"out": "runs/compare", "model": "small", "steps": None, "nondeterministic": False, "algo.replicas": 4,
            "algo.sync_every": 30, "algo.fragments": 5, "algo.overlap": 1, "batch_size": 8,
            "seq_len": 32, "overwrite": False, "progress": True}
#: The built-in language of the comparison: V = 16, order 2, 4 successors per context.
DATA = DataConfig(vocab_size=16)
_OUTER = ("replicas", "sync_every", "fragments", "overlap")


def default_configs(**changes) -> dict[str, TrainConfig]:
  """The main job's three runs with :data:`DEFAULTS`, ``changes`` applied (TrainConfig field
  names, or ``replicas`` / ``sync_every`` / ``fragments`` / ``overlap``); ``steps`` None is
  the backend's :func:`~diloco_core.devices.backend.default_demo_steps`.

  Examples:
    >>> runs = default_configs(steps=1500, out=None)
    >>> [(c.algo.algorithm, c.algo.fragments, c.steps, c.seq_len, c.data.vocab_size) for c in runs.values()]
    [('dp', 1, 1500, 32, 16), ('diloco', 1, 1500, 32, 16), ('streaming', 5, 1500, 32, 16)]
  """
  values = {k.split(".")[-1]: v for k, v in DEFAULTS.items()}
  values.update(changes)
  if values["steps"] is None:
    values["steps"] = default_demo_steps()
  outer = {k: values.pop(k) for k in _OUTER}
  return comparison_configs(TrainConfig(data=DATA, **values), **outer)


def comparison_configs(base: TrainConfig, *, replicas: int, sync_every: int, fragments: int,
                       overlap: int) -> dict[str, TrainConfig]:
  """The three runs: DP, vanilla DiLoCo and Streaming DiLoCo sharing everything else.

  Examples:
    >>> runs = comparison_configs(TrainConfig(out="r"), replicas=4, sync_every=50, fragments=5, overlap=1)
    >>> {k: (c.algo.algorithm, c.algo.fragments, c.out) for k, c in runs.items()}
    {'dp': ('dp', 1, 'r/dp'), 'diloco': ('diloco', 1, 'r/diloco'), 'streaming': ('streaming', 5, 'r/streaming')}
  """
  runs = {
      "dp": DiLoCoConfig(algorithm="dp", replicas=replicas),
      "diloco": DiLoCoConfig(algorithm="diloco", replicas=replicas, sync_every=sync_every),
      "streaming": DiLoCoConfig(algorithm="streaming", replicas=replicas, sync_every=sync_every,
                                fragments=fragments, overlap=overlap),
  }
  out = {}
  for name, algo in runs.items():
    sub = None if base.out is None else os.path.join(base.out, name)
    out[name] = dataclasses.replace(base, algo=algo, out=sub)
  return out


def compare(configs: dict[str, TrainConfig]) -> dict[str, TrainResult]:
  """Trains every run of ``configs`` (each is validated before the first one trains).

  A comparison has no resume: an output directory holding a run is refused unless
  ``overwrite`` is set (the message says so), and an interrupted run (Ctrl-C) raises
  :class:`~diloco_core.run.loop.Interrupted` with the name of the run in its ``run`` attribute.
  """
  for cfg in configs.values():
    if cfg.out is not None and not cfg.resume:
      check_out_dir(cfg.out, cfg.overwrite, resumable=False)
    cfg.validate()
    preflight(cfg)
  results = {}
  for name, cfg in configs.items():
    try:
      results[name] = train(cfg)
    except Interrupted as e:
      e.run = name
      raise
  return results


def summary_rows(results: dict[str, TrainResult]) -> list[dict]:
  """One row per algorithm (the comparison table) from :class:`~diloco_core.TrainResult` objects.

  Beside each run's own numbers: its final eval loss relative to DP's (percent above) and how
  many times fewer bytes each replica sent than with DP (when a ``"dp"`` run is present).
  """
  dp = results.get("dp")
  rows = []
  for name, r in results.items():
    s = r.summary
    row = {
        "algorithm": name,
        "final eval loss": s["final_eval_loss"],
        "gap to floor": s["gap_to_floor"],
        "MB sent / replica": s["total_bytes_per_replica"] / 1e6,
        "peak MB / step": s["peak_bytes_per_step"] / 1e6,
        "wall time (s)": s["wall_time_s"],
    }
    if dp is not None:
      d = dp.summary
      row["loss vs DP (%)"] = 100.0 * (s["final_eval_loss"] / d["final_eval_loss"] - 1.0)
      row["bytes: DP / this"] = d["total_bytes_per_replica"] / max(s["total_bytes_per_replica"], 1e-300)
    rows.append(row)
  return rows
