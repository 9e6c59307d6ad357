"""Goodput under failures for a heterogeneous pool, and the syncer setting to run it with.

:func:`pool_goodput` puts a pool measured by :func:`~analysis.planning.pool.pool_utilization`
(speeds, quorum, grace, DyLU) into the failure model of :mod:`analysis.planning.goodput`. Two
figures, because a quorum trades one for the other:

* **compute kept**: the local steps whose contribution a round merged, per second, against an
  ideal pool of the same speeds that never waits nor fails (the pool's ``goodput``), times the
  fraction of time failures leave. A straggler costs the others waiting in synchronous DiLoCo;
  a quorum removes the waiting, and with ``late="drop"`` loses the straggler's contributions;
* **contributions merged**: the fraction of contributions that a round merged (with
  ``late="carry"``, some of them stale: ``stale``).

Failures (:class:`~analysis.planning.goodput.Failures`), as in :mod:`analysis.planning.goodput`:
stop and restart keeps :math:`C / E` of the time
(:func:`~analysis.planning.goodput.kept_by_restarts`); elastic loses, per failure and in
replica-seconds, the lost replica's work since its last send (half its period :math:`p`,
:attr:`~analysis.planning.pool.PoolResult.mean_period_s`), its rejoin J, its wait for a round
to join at (half the time between two commits, :math:`r`) and, only when the rounds wait for
every replica (K = M), the others' grace g:

.. math::
   f = \\lambda\\Big(\\frac{p}{2} + J + \\frac{r}{2} + [K = M]\\,(M - 1)\\,g\\Big), \\qquad
   \\text{compute kept} = \\text{goodput}_\\text{pool}\\,(1 - f).

With equal speeds and K = M this is :func:`~analysis.planning.goodput.goodput` of a DiLoCo run
(``p = r = H s``).

:func:`recommend_syncer` tabulates the settings (synchronous, DyLU, quorum K = M - 1 .. 1,
quorum M - 1 with a grace window) on one budget of local steps and recommends one by a stated
rule (its docstring; the constants below).

Examples:
  >>> from analysis.planning.goodput import Failures
  >>> from analysis.planning.pool import pool_utilization
  >>> r = pool_utilization((1.0, 1.0, 0.5), sync_every=4, steps=48)
  >>> pool_goodput(r, Failures(rate_per_hour=0.0))
  {'compute_kept': 0.6, 'contributions_merged': 1.0, 'stale': 0.0}
"""

from __future__ import annotations

import dataclasses
from fractions import Fraction

import numpy as np

from analysis.planning import _checks
from analysis.planning.goodput import Failures, kept_by_restarts
from analysis.planning.pool import DEFAULT_ROUNDS, PoolResult, check_speeds, exact_seconds, pool_utilization
from diloco_core.spec.syncer import SyncerConfig, tape_only_knobs
from diloco_core.spec.validity import check_bool, check_choice, check_int

#: The rule's floor: a setting that merges every contribution fresh is taken if its goodput
#: (merged local steps per second against the ideal pool) is at least this.
MIN_GOODPUT = 0.9
#: Otherwise a lossy setting (a quorum) is taken only if it merges at least this fraction of the
#: contributions sent...
MIN_MERGED = 0.75
#: ... and its goodput beats the best lossless setting's by at least this factor.
MIN_GAIN = 1.05
#: The default grace window of the grace row: this fraction of the fastest replica's period
#: :math:`H / v_\\max`.
GRACE_PERIODS = 0.5

__all__ = ["GRACE_PERIODS", "KNOB_DEFAULTS", "MIN_GAIN", "MIN_GOODPUT", "MIN_MERGED", "ON_PROCESSES", "ON_TAPE",
           "choose_setting", "pool_failure_cost", "pool_goodput", "pool_goodput_curves", "recommend_syncer", "runs_on"]


def pool_failure_cost(result: PoolResult, failures: Failures) -> dict[str, float]:
  """What one failure costs an elastic pool, in replica-seconds, by part (module docstring).

  Args:
    result: the pool measured without failures.
    failures: the failure model (its ``rejoin_s`` and ``grace_s``).

  Returns:
    ``{"work": p/2, "rejoin": J, "wait": r/2, "grace": [K = M] (M - 1) g}``.

  Examples:
    >>> r = pool_utilization((1, 1), sync_every=10, steps=100)  # periods and rounds of 10 s
    >>> pool_failure_cost(r, Failures(1.0, rejoin_s=20.0, grace_s=5.0))
    {'work': 5.0, 'rejoin': 20.0, 'wait': 5.0, 'grace': 5.0}
  """
  m = len(result.speeds)
  if m < 2:
    raise ValueError(f"elastic needs replicas (M) >= 2 (a live replica to heal from), got {m}.")
  grace = (m - 1) * float(failures.grace_s) if result.quorum == m else 0.0
  return {"work": float(result.mean_period_s / 2), "rejoin": float(failures.rejoin_s),
          "wait": float(result.round_interval_s / 2), "grace": grace}


def pool_goodput(result: PoolResult, failures: Failures, *, elastic: bool = False) -> dict[str, float]:
  """Goodput of a pool under failures: compute kept and contributions merged (module docstring).

  Args:
    result: the pool measured without failures (:func:`~analysis.planning.pool.pool_utilization`).
    failures: the failure model.
    elastic: a lost replica is left out and rejoins (True), or the job restarts (False).

  Returns:
    ``{"compute_kept", "contributions_merged", "stale"}``: compute kept in [0, 1], the fraction of
    contributions merged, and the fraction of merged ones that were stale.

  Examples:
    >>> f = Failures(rate_per_hour=3.6, rejoin_s=0.0, grace_s=0.0)  # one failure per 1000 s
    >>> r = pool_utilization((1, 1), sync_every=100, steps=2000)  # p = r = 100 s: f = 0.1
    >>> pool_goodput(r, f, elastic=True)["compute_kept"]
    0.9
  """
  if not isinstance(result, PoolResult):
    raise ValueError(f"result must be a PoolResult (from pool_utilization), got {type(result).__name__}.")
  if check_bool("elastic", elastic):
    lost = min(1.0, failures.rate_per_hour / 3600.0 * sum(pool_failure_cost(result, failures).values()))
    factor = 1.0 - lost
  else:
    factor = kept_by_restarts(failures, len(result.speeds))
  return {"compute_kept": float(result.goodput) * factor, "contributions_merged": float(result.merged),
          "stale": float(result.stale)}


def pool_goodput_curves(results: dict, rates_per_hour, failures: Failures) -> "pd.DataFrame":
  """Compute kept by several pools over a range of failure rates, stopping and elastic.

  Args:
    results: label -> :class:`~analysis.planning.pool.PoolResult`.
    rates_per_hour: the failure rates λ (per replica and hour).
    failures: the rest of the failure model (its ``rate_per_hour`` is replaced).

  Returns:
    One row per rate and pool: ``rate_per_hour``, ``run``, ``stop_and_restart``, ``elastic``
    (compute kept) and ``contributions_merged``.

  Examples:
    >>> r = pool_utilization((1, 1), sync_every=4)
    >>> pool_goodput_curves({"sync": r}, [0.0], Failures(0.0)).to_dict("records")
    [{'rate_per_hour': 0.0, 'run': 'sync', 'stop_and_restart': 1.0, 'elastic': 1.0, 'contributions_merged': 1.0}]
  """
  import pandas as pd
  rows = []
  for rate in np.atleast_1d(_checks.nonneg("rates_per_hour", rates_per_hour)):
    f = dataclasses.replace(failures, rate_per_hour=float(rate))
    for label, result in results.items():
      stop, el = pool_goodput(result, f), pool_goodput(result, f, elastic=True)
      rows.append({"rate_per_hour": float(rate), "run": label, "stop_and_restart": stop["compute_kept"],
                   "elastic": el["compute_kept"], "contributions_merged": stop["contributions_merged"]})
  return pd.DataFrame(rows)


#: The planner's knobs at their defaults, the trainer's flags of the same names
#: (:class:`~diloco_core.run.syncer_options.SyncerOptions`): a setting that changes only
#: :data:`~diloco_core.spec.syncer.PROCESS_KNOBS` runs on real processes too.
KNOB_DEFAULTS = {"dylu": False, "late": SyncerConfig().late, "quorum": None, "grace_s": 0.0}
#: The ``runs_on`` values of :func:`recommend_syncer`'s table: on real processes (and on the
#: tape player), or on the tape player only.
ON_PROCESSES, ON_TAPE = "processes", "tape only"


def runs_on(knobs: dict) -> str:
  """Where a setting of :func:`recommend_syncer` (its knobs) runs: :data:`ON_PROCESSES` or :data:`ON_TAPE`.

  Examples:
    >>> runs_on({"quorum": 2, "late": "drop"}), runs_on({"dylu": True})
    ('processes', 'tape only')
  """
  return ON_TAPE if tape_only_knobs(knobs, KNOB_DEFAULTS) else ON_PROCESSES


def _settings(m: int, grace_s, late: str) -> list[tuple[str, dict]]:
  rows = [("synchronous", {}), ("synchronous + DyLU", {"dylu": True})]
  rows += [(f"quorum K={k}", {"quorum": k, "late": late}) for k in range(m - 1, 0, -1)]
  if m > 1 and grace_s:
    rows.append((f"quorum K={m - 1} + grace", {"quorum": m - 1, "late": late, "grace_s": grace_s}))
  return rows


def choose_setting(table) -> tuple[str, str]:
  """The rule of :func:`recommend_syncer` over the rows of its ``table`` (or some of them, which
  must include a lossless one): (the setting, one sentence why)."""
  lossless = table[(table["merged"] == 1.0) & (table["stale"] == 0.0)]
  best = lossless.loc[lossless["goodput"].idxmax()]  # the first of equal ones: the simplest
  if best["goodput"] >= MIN_GOODPUT:
    return best.name, (f"{best.name} merges every contribution fresh at goodput {best['goodput']:.1%}"
                       f" (>= {MIN_GOODPUT:.0%}).")
  lossy = table[table["merged"] >= MIN_MERGED]
  other = lossy.loc[lossy["goodput"].idxmax()]
  if other["goodput"] >= MIN_GAIN * best["goodput"]:
    return other.name, (f"{other.name} reaches goodput {other['goodput']:.1%} against {best['goodput']:.1%}"
                        f" for {best.name} (>= x{MIN_GAIN:g}) and merges {other['merged']:.0%} of the"
                        f" contributions (>= {MIN_MERGED:.0%}), {other['stale']:.0%} of those stale.")
  return best.name, (f"{best.name} merges every contribution fresh at goodput {best['goodput']:.1%};"
                     f" no quorum merging >= {MIN_MERGED:.0%} of them beats it by x{MIN_GAIN:g}.")


def recommend_syncer(speeds, *, sync_every: int, steps: int | None = None, latency_s=0, transfer_s=0,
                     grace_s=None, late: str = "carry") -> tuple[pd.DataFrame, str, str]:
  """The syncer settings for a pool of given speeds, side by side, and the one to use.

  Rows, each played by :func:`~analysis.planning.pool.pool_utilization` on the same budget of
  local steps: ``synchronous`` (K = M, every :math:`H_m = H`), ``synchronous + DyLU``
  (:math:`H_m = \\max(1, \\lfloor H v_m / v_\\max \\rfloor)`), ``quorum K=k`` for k = M - 1 .. 1,
  and ``quorum K=M-1 + grace``. The rule, in order:

  1. Of the settings that merge every contribution fresh (merged 1, stale 0), take the one of
     highest goodput (the first in table order among equal ones) if its goodput is at least
     :data:`MIN_GOODPUT`.
  2. Else take the setting of highest goodput among those merging at least :data:`MIN_MERGED`
     of the contributions if it beats that lossless one by the factor :data:`MIN_GAIN`.
  3. Else the lossless one.

  Args:
    speeds: :math:`v_m > 0`, local steps per second of each replica.
    sync_every: H.
    steps: the budget of local steps of all replicas together (tokens: times the tokens of a
      step); None: :data:`~analysis.planning.pool.DEFAULT_ROUNDS` times M H.
    latency_s, transfer_s: the link, each way (seconds).
    grace_s: the grace row's window (seconds); None: :data:`GRACE_PERIODS` of the fastest
      replica's period :math:`H / v_\\max`; 0: no grace row.
    late: the quorum rows' late contributions, ``"carry"`` (Decoupled DiLoCo's) or ``"drop"``.

  Returns:
    ``(table, setting, reason)``: a DataFrame indexed by the settings' names, with columns ``utilization``
    (mean busy fraction), ``goodput`` (merged local steps per second over the ideal pool's),
    ``wall_s`` (seconds to the budget), ``merged``, ``stale``, ``dropped`` (fractions of the
    contributions), ``runs_on`` (:func:`runs_on`: whether the trainer runs the setting on real
    processes or only on the tape player); the recommended setting; one sentence why, from
    the numbers (it says when the setting runs on the tape only).

  Examples:
    >>> table, setting, reason = recommend_syncer((1.0, 1.0, 0.5), sync_every=4, steps=120)
    >>> table.loc[["synchronous", "synchronous + DyLU"], ["utilization", "goodput", "wall_s"]].round(3)
                        utilization  goodput  wall_s
    synchronous               0.667      0.6    80.0
    synchronous + DyLU        1.000      1.0    48.0
    >>> reason
    'synchronous + DyLU merges every contribution fresh at goodput 100.0% (>= 90%); it runs on the tape player only (one device, simulated time). On real processes: synchronous merges every contribution fresh at goodput 60.0%; no quorum merging >= 75% of them beats it by x1.05.'
  """
  import pandas as pd
  exact = check_speeds(speeds)
  h = check_int("sync_every (H)", sync_every)
  check_choice("late", late, ("drop", "carry"))
  grace = (Fraction(GRACE_PERIODS) * h / max(exact) if grace_s is None else exact_seconds("grace_s", grace_s))
  budget = DEFAULT_ROUNDS * len(exact) * h if steps is None else check_int("steps", steps)
  rows = {}
  for name, kw in _settings(len(exact), grace, late):
    r = pool_utilization(exact, sync_every=h, latency_s=latency_s, transfer_s=transfer_s, steps=budget, **kw)
    rows[name] = {"utilization": float(r.utilization), "goodput": float(r.goodput), "wall_s": float(r.wall_s),
                  "merged": float(r.merged), "stale": float(r.stale), "dropped": float(r.dropped),
                  "runs_on": runs_on(kw)}
  table = pd.DataFrame.from_dict(rows, orient="index")
  setting, reason = choose_setting(table)
  if table.loc[setting, "runs_on"] == ON_TAPE:  # the same rule over what runs on real processes
    real, why = choose_setting(table[table["runs_on"] == ON_PROCESSES])
    reason = (f"{reason[:-1]}; it runs on the tape player only (one device, simulated time). On real"
              f" processes: {why}")
  return table, setting, reason
