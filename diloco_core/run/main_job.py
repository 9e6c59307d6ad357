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
  :class:`~diloco_core.interrupts.Interrupted` with the name of the run in its ``run`` attribute.
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


def eval_spread(cfg: TrainConfig, params_path: str) -> dict:
  """The final params' eval loss sequence by sequence: how far the table's eval loss can be off.

  The eval loss is a mean over ``n`` held-out sequences, an estimate of the expected loss; its
  standard error over the sequences (independent draws; the tokens within one are not) is

  .. math:: \\mathrm{SE} = \\frac{s}{\\sqrt{n}}, \\qquad
     s^2 = \\frac{1}{n-1} \\sum_{i=1}^{n} (\\ell_i - \\bar\\ell)^2 ,

  with :math:`\\ell_i` sequence i's mean loss. The data's entropy floor is exact, so a run near
  it can print a gap below zero by up to about 2 SE without beating it.

  Args:
    cfg: the run's config (its data and model).
    params_path: its exported final params (``summary["final_params"]``).

  Returns:
    ``{"mean": the eval loss (up to the order of summation), "se": SE, "sequences": n}``.

  Examples:
    >>> import tempfile
    >>> from diloco_core.run.loop import train
    >>> with tempfile.TemporaryDirectory() as out:
    ...   cfg = default_configs(model="tiny", steps=2, batch_size=2, seq_len=8, out=out, progress=False)["dp"]
    ...   result = train(cfg)
    ...   spread = eval_spread(cfg, result.summary["final_params"])
    >>> abs(spread["mean"] - result.summary["final_eval_loss"]) < 1e-5, spread["sequences"], spread["se"] > 0
    (True, 64, True)
  """
  import jax
  import jax.numpy as jnp
  import numpy as np
  from diloco_core.run.run_setup import build_model
  from diloco_core.store.params_io import load_params
  data, _, params, loss_fn = build_model(cfg)
  final = load_params(params_path, like=params)
  per_seq = np.asarray(jax.jit(jax.vmap(lambda x: loss_fn(final, x[None])))(jnp.asarray(data.eval_batch())),
                       np.float64)
  return {"mean": float(per_seq.mean()), "se": float(per_seq.std(ddof=1) / np.sqrt(per_seq.size)),
          "sequences": int(per_seq.size)}


def summary_rows(results: dict[str, TrainResult], spread: dict[str, dict] | None = None) -> list[dict]:
  """One row per algorithm (the comparison table) from :class:`~diloco_core.TrainResult` objects.

  Beside each run's own numbers: its final eval loss relative to DP's (percent above) and how
  many times fewer bytes each replica sent than with DP (when a ``"dp"`` run is present); with
  ``spread`` (:func:`eval_spread` by run name), the eval loss's standard error ("eval SE").
  """
  dp = results.get("dp")
  rows = []
  for name, r in results.items():
    s = r.summary
    row = {
        "algorithm": name,
        "final eval loss": s["final_eval_loss"],
        "gap to floor": s["gap_to_floor"],
        **({} if spread is None else {"eval SE": spread[name]["se"]}),
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


def floor_note(table, sequences: int) -> str | None:
  """The sentence under the table when a run's eval loss is below the data's exact floor.

  The floor is exact and the eval loss an estimate (:func:`eval_spread`), so a run at the floor
  prints a gap of a few standard errors either side of zero; this says how many, for each run
  below it. None when no gap is negative or the table has no "eval SE" column.

  Args:
    table: the comparison table (:func:`summary_rows`) indexed by algorithm.
    sequences: the held-out sequences the eval loss averages.

  Examples:
    >>> import pandas as pd
    >>> t = pd.DataFrame({"gap to floor": [-0.0009, 0.005], "eval SE": [0.017, 0.017]}, index=["dp", "diloco"])
    >>> floor_note(t, 64)
    'dp: eval loss 0.0009 below the exact entropy floor, 0.05 standard errors of the estimate (64 held-out sequences): within sampling error.'
    >>> floor_note(t.assign(**{"gap to floor": [0.001, 0.005]}), 64) is None
    True
  """
  if "eval SE" not in table:
    return None
  below = [(name, -table.loc[name, "gap to floor"], table.loc[name, "eval SE"]) for name in table.index
           if table.loc[name, "gap to floor"] < 0]
  if not below:
    return None
  parts = [f"{name}: eval loss {gap:.4f} below the exact entropy floor, {gap / se:.2f} standard errors of the"
           f" estimate ({sequences} held-out sequences): "
           + ("within sampling error." if gap <= 2 * se else "more than sampling error explains; please report it.")
           for name, gap, se in below]
  return " ".join(parts)
