r"""How far two realizations of a stored experiment are apart, and how noisy its seeds are.

A *realization* is an experiment trained on one kind of CPU; another kind of CPU rounds
differently and gives another realization (:mod:`analysis.lab.recheck`). The statistics here
measure the seeds' spread (:func:`seed_spread`, :func:`run_scales`, :func:`stable_runs`) and
the distance between two realizations (:func:`realization_drift`, :func:`final_z`,
:func:`cross_cpu_noise`): the re-check's bounds and the tuning page's resolution come from them.
"""

from __future__ import annotations

import json
import math
from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from analysis.lab.claims import AGREES, NOT_RESOLVED  # noqa: F401 (AGREES: the doctest's verdicts)

#: A configuration whose seed spread exceeds this multiple of the experiment's
#: (:func:`seed_spread`) is unstable and never sampled. For two seeds from one normal law the
#: spread of a pair exceeds three times its typical value with probability below 0.3%.
UNSTABLE = 3.0


def rel(a, b) -> float:
  """Relative difference of two stored numbers (None = a missing value, NaN in the run).

  Examples:
    >>> rel(2.0, 2.0), rel(1.0, 2.0), rel(None, None), rel(None, 1.0)
    (0.0, 0.5, 0.0, inf)
  """
  if a is None or b is None:
    return 0.0 if a is None and b is None else math.inf
  a, b = float(a), float(b)
  if a == b:
    return 0.0
  return abs(a - b) / max(abs(a), abs(b), 1e-300)


def config_of(run: dict) -> str:
  """A run's config without its seed, as a key (runs that differ only in the seed share it)."""
  config = dict(run["config"])
  config.pop("seed", None)
  return json.dumps(config, sort_keys=True, default=str)


def median_sd_ratio(k: int) -> float:
  r"""The median of the sample standard deviation (``ddof = 1``) of :math:`k` draws of a normal
  law, in units of its :math:`\sigma`: :math:`\sqrt{\operatorname{median}(\chi^2_{k-1}) / (k - 1)}`
  (:math:`(k-1)\,s^2/\sigma^2` follows :math:`\chi^2_{k-1}`). For two draws
  :math:`s = |x_1 - x_2| / \sqrt 2 = \sigma |Z|`, whose median is :math:`\Phi^{-1}(3/4)`.

  Examples:
    >>> round(median_sd_ratio(2), 4), round(median_sd_ratio(8), 4)
    (0.6745, 0.9521)
  """
  from scipy.special import gammaincinv  # the chi-square median: 2 * gammaincinv(nu / 2, 1/2)
  nu = k - 1
  return math.sqrt(2.0 * float(gammaincinv(nu / 2.0, 0.5)) / nu)


def seed_spread(runs: Sequence[dict]) -> tuple[list[float | None], float | None]:
  r"""The seed spread of each run's configuration and of the experiment.

  Runs are grouped by their config without the seed; a group's spread is the standard
  deviation (``ddof = 1``) of its final eval losses over its :math:`k` seeds, divided by
  :func:`median_sd_ratio` of :math:`k`: a median-unbiased estimate of the seed noise
  :math:`\sigma`, so that experiments of two seeds per configuration and of eight are judged on
  one scale (the plain standard deviation of two seeds is below :math:`\sigma` in more than
  half the draws: its median is :math:`0.674\,\sigma`). The experiment's spread
  :math:`\sigma_E` is the median over the groups with two seeds or more (the median keeps a few
  unstable configurations from deciding it).

  Args:
    runs: stored runs (dicts with ``config`` and ``row``).

  Returns:
    ``(per_run, sigma)``: each run's group spread (None for a group of one), and
    :math:`\sigma_E` (None when no group has two seeds).

  Examples:
    >>> runs = [{"config": {"h": h, "seed": s}, "row": {"final_eval_loss": v}}
    ...         for h, s, v in [(1, 0, 1.0), (1, 1, 1.2), (2, 0, 2.0), (2, 1, 2.0), (3, 0, 5.0)]]
    >>> per_run, sigma = seed_spread(runs)
    >>> [None if x is None else round(x, 4) for x in per_run], round(sigma, 4)
    ([0.2097, 0.2097, 0.0, 0.0, None], 0.1048)
  """
  groups: dict[str, list[int]] = {}
  for i, run in enumerate(runs):
    groups.setdefault(config_of(run), []).append(i)
  per_run: list[float | None] = [None] * len(runs)
  spreads = []
  for members in groups.values():
    values = [runs[i]["row"].get("final_eval_loss") for i in members]
    values = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    if len(values) >= 2:
      sd = float(np.std(values, ddof=1)) / median_sd_ratio(len(values))
      spreads.append(sd)
      for i in members:
        per_run[i] = sd
  return per_run, (float(np.median(spreads)) if spreads else None)


def run_scales(runs: Sequence[dict]) -> list[float | None]:
  r"""Each run's scale for check 2: :math:`\max(\sigma_E, \sigma_c)` of :func:`seed_spread`.

  Returns:
    One scale per run (None when the experiment has no configuration with two seeds).

  Examples:
    >>> runs = [{"config": {"h": h, "seed": s}, "row": {"final_eval_loss": v}}
    ...         for h, s, v in [(1, 0, 1.0), (1, 1, 1.2), (2, 0, 2.0), (2, 1, 2.0), (3, 0, 5.0)]]
    >>> [None if x is None else round(x, 4) for x in run_scales(runs)]
    [0.2097, 0.2097, 0.1048, 0.1048, 0.1048]
  """
  per_run, sigma = seed_spread(runs)
  return [None if sigma is None else max(sigma, sd or 0.0) for sd in per_run]


def stable_runs(runs: Sequence[dict]) -> list[bool]:
  """Which runs may be sampled: those whose configuration's seed spread is at most
  :data:`UNSTABLE` times the experiment's (a configuration of one seed counts as stable).

  Examples:
    >>> runs = [{"config": {"h": h, "seed": s}, "row": {"final_eval_loss": v}} for h, s, v in
    ...         [(1, 0, 1.0), (1, 1, 1.01), (2, 0, 2.0), (2, 1, 2.01), (3, 0, 1.0), (3, 1, 1.5)]]
    >>> stable_runs(runs)
    [True, True, True, True, False, False]
  """
  per_run, sigma = seed_spread(runs)
  return [sd is None or sigma is None or sd <= UNSTABLE * sigma for sd in per_run]


def realization_drift(first, second, steps: Sequence[int] = (0, 20, 40, 60, 100, 200)) -> pd.DataFrame:
  """How far two realizations of one experiment (two kinds of CPU) are apart, step by step.

  Args:
    first, second: two :class:`~analysis.lab.stored.StoredExperiment` of the same experiment.
    steps: the logged steps to report.

  Returns:
    One row per step: the median and largest relative difference of the train loss (eval loss
    at step 0) over the runs, and the share of runs still equal to the bit.
  """
  rows = []
  for step in steps:
    diffs = []
    for a, b in zip(first.runs, second.runs):
      col = "eval_loss" if step == 0 else "train_loss"
      if step in a["metrics"]["step"]:
        j = a["metrics"]["step"].index(step)
        diffs.append(rel(a["metrics"][col][j], b["metrics"][col][j]))
    if diffs:
      rows.append({"step": step, "median": float(np.median(diffs)), "largest": max(diffs),
                   "equal": sum(d == 0.0 for d in diffs) / len(diffs), "runs": len(diffs)})
  return pd.DataFrame(rows)


def final_z(first, second) -> pd.Series:
  r"""Each run's final-loss change between two realizations in units of
  :math:`\sqrt{2}\,\max(\sigma_E, \sigma_c)` (the statistic of check 2, :data:`analysis.lab.recheck.SPREAD_Z`;
  :func:`run_scales` of ``first``)."""
  return pd.Series([abs(float(b["row"]["final_eval_loss"]) - float(a["row"]["final_eval_loss"]))
                    / (math.sqrt(2) * scale)
                    for a, b, scale in zip(first.runs, second.runs, run_scales(first.runs))])


def cross_cpu_noise(first, second) -> float:
  r"""The noise another kind of CPU adds to a paired difference, in the units of
  :func:`analysis.lab.sweeps.paired_noise`.

  For each run, :math:`\delta = m^{(2)} - m^{(1)}` is the change of its final eval loss from one
  realization to the other. A paired difference between configurations A and B at seed s then
  changes by :math:`\delta_{A,s} - \delta_{B,s}`; this returns the median over the pairs of
  configurations of the root mean square over seeds of that change, divided by
  :math:`\sqrt 2` (if the realizations were independent draws, this equals the paired seed
  noise).

  Args:
    first, second: two :class:`~analysis.lab.stored.StoredExperiment` of the same experiment (the
      same runs, in order).

  Returns:
    The noise in nats (NaN with fewer than two configurations sharing a seed).

  Examples:
    >>> from types import SimpleNamespace as NS
    >>> run = lambda h, s, v: {"config": {"h": h, "seed": s}, "row": {"final_eval_loss": v}}
    >>> a = NS(runs=[run(1, 0, 1.0), run(1, 1, 1.0), run(2, 0, 2.0), run(2, 1, 2.0)])
    >>> b = NS(runs=[run(1, 0, 1.1), run(1, 1, 0.9), run(2, 0, 2.0), run(2, 1, 2.0)])
    >>> round(cross_cpu_noise(a, b), 4)  # one pair: changes +0.1, -0.1 -> rms 0.1, / sqrt 2
    0.0707
  """
  by_config: dict[str, dict] = {}
  for a, b in zip(first.runs, second.runs):
    if a["config"] != b["config"]:
      raise ValueError("cross_cpu_noise: the two realizations hold other runs.")
    delta = float(b["row"]["final_eval_loss"]) - float(a["row"]["final_eval_loss"])
    by_config.setdefault(config_of(a), {})[a["config"].get("seed")] = delta
  keys = list(by_config)
  values = []
  for i, ka in enumerate(keys):
    for kb in keys[i + 1:]:
      shared = sorted(set(by_config[ka]) & set(by_config[kb]))
      if shared:
        d = np.array([by_config[ka][s] - by_config[kb][s] for s in shared])
        if np.all(np.isfinite(d)):
          values.append(float(np.sqrt(np.mean(d ** 2)) / math.sqrt(2)))
  return float(np.median(values)) if values else float("nan")


def across_realizations(results: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
  """One verdict per claim over several realizations of the claims experiment.

  A realization is the same experiment trained on another kind of CPU (its rounding differs, so
  every run drifts to another trajectory: :mod:`analysis.lab.recheck`). A verdict that one
  realization reaches and another does not is not a finding: it is **not resolved**. A claim
  whose experiment has no such realization is judged on the realizations that tested it.

  Args:
    results: realization label -> :func:`~analysis.lab.claims.evaluate_all` of its runs; the first holds every claim,
      the others the same claims or fewer.

  Returns:
    One row per claim: ``claim``, a column per realization with its verdict (None where it did
    not test the claim), and ``verdict`` (the common verdict, or ``"not resolved"`` when they differ).

  Examples:
    >>> a = pd.DataFrame({"claim": [1, 2], "verdict": [AGREES, AGREES]})
    >>> b = pd.DataFrame({"claim": [1, 2], "verdict": [AGREES, NOT_RESOLVED]})
    >>> across_realizations({"x": a, "y": b})["verdict"].tolist()
    ['agrees', 'not resolved']
    >>> across_realizations({"x": a, "y": b[b["claim"] == 1]})["verdict"].tolist()  # y lacks claim 2
    ['agrees', 'agrees']
  """
  labels = list(results)
  out = pd.DataFrame({"claim": results[labels[0]]["claim"].tolist()})
  for label in labels:
    verdicts = dict(zip(results[label]["claim"], results[label]["verdict"]))
    if not set(verdicts) <= set(out["claim"]):
      raise ValueError(f"realization {label!r}: claims that {labels[0]!r} lacks.")
    out[label] = [verdicts.get(c) for c in out["claim"]]
  tested = [{v for v in row if pd.notna(v)} for row in out[labels].itertuples(index=False)]
  out["verdict"] = [v.pop() if len(v) == 1 else NOT_RESOLVED for v in tested]
  return out
