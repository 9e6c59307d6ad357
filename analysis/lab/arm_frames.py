"""The runs of a stored experiment by arm name: the frame of the claims and the paired comparisons.

An *arm* is one named configuration of an experiment (:func:`analysis.lab.experiments.claims_arms`,
:func:`~analysis.lab.experiments.overlap_eta_arms`, :func:`~analysis.lab.experiments.sparse_arms`),
trained with several seeds; :func:`arm_frame` finds each arm's stored runs by their config.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Mapping

import pandas as pd


def arm_frame(stored, arms: Mapping[str, object]) -> pd.DataFrame:
  """The stored runs of the named arms with an ``arm`` column, one row per (arm, seed).

  Args:
    stored: a :class:`~analysis.lab.stored.StoredExperiment` (or anything with ``runs``: dicts
      holding ``config`` and ``row``).
    arms: arm name -> TrainConfig (seed 0), e.g. :func:`analysis.lab.experiments.claims_arms`.
      Arms with the same config share its runs.

  Returns:
    The rows of :func:`analysis.lab.sweeps.run_sweep`, plus ``arm`` and ``metrics`` (the run's
    logged metrics, column -> values).
  """
  # here: analysis.lab.stored imports the trainer's config
  from analysis.lab.stored import default_config, plain_config, with_defaults

  def marker(cfg_dict):
    d = dict(cfg_dict)
    d.pop("seed", None)
    return json.dumps(d, sort_keys=True, default=str)

  by_marker: dict[str, list[str]] = {}
  for name, cfg in arms.items():
    plain = plain_config(dataclasses.replace(cfg, seed=0))
    by_marker.setdefault(marker(plain), []).append(name)
  rows = []
  defaults = default_config()
  for run in stored.runs:
    for name in by_marker.get(marker(with_defaults(run["config"], defaults)), []):
      rows.append({**run["row"], "arm": name, "metrics": run.get("metrics")})
  missing = set(arms) - {r["arm"] for r in rows}
  if missing:
    raise ValueError(f"no stored run of arm(s) {sorted(missing)}.")
  return pd.DataFrame(rows)
