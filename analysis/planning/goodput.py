"""Goodput under replica failures: DP, DiLoCo and Streaming DiLoCo, stopping or elastic.

Goodput is the fraction of the replicas' time spent computing steps that end up in the model:
the compute utilization :math:`u` of :mod:`analysis.planning.simulate` (what the network's waits
leave) times the fraction of time that failures do not take. Each of the :math:`M` replicas
fails independently at rate :math:`\\lambda` (a Poisson process, ``rate_per_hour``), and one step
lasts :math:`s = T / u` of wall time (:math:`T`: its compute).

**Stop and restart** (``elastic=False``; every method): a failure anywhere ends the job, which
starts again from its last checkpoint after :math:`R` seconds (``restart_s``); a checkpoint is
taken every :math:`C` seconds of progress (``checkpoint_every_s``; writing it is not counted).
The job fails at rate :math:`\\Lambda = M\\lambda`, and an interval of :math:`C` seconds of
progress takes, in expectation (Daly 2006; exact for exponential failures, failures during a
restart included),

.. math::
   E = \\frac{e^{\\Lambda R}\\,(e^{\\Lambda C} - 1)}{\\Lambda}, \\qquad
   \\text{goodput} = u\\,\\frac{C}{E} \\approx u\\,\\big(1 - \\Lambda\\,(C/2 + R)\\big).

The failure rate grows with :math:`M`: more islands, more restarts.

**Elastic** (``elastic=True``; DiLoCo and Streaming DiLoCo leaving a lost replica out of the
average, the ``--drop-schedule`` semantics; DP healing a replica at the next step, as torchft
does): a failure costs only the lost replica's time and the others' wait. Per failure,

* the lost replica's work since its last sync, which never reaches the average:
  :math:`w = H s / 2` on average (DP: :math:`s / 2`);
* its replacement's start and heal from a live peer, :math:`J` seconds (``rejoin_s``), then the
  wait for a sync to join at, half the time between two syncs on average: :math:`v = H s / 2`
  (DiLoCo), :math:`H s / (2P)` (Streaming: any fragment's sync), :math:`s / 2` (DP);
* the grace window :math:`g` (``grace_s``) during which the :math:`M - 1` others wait for it
  at the first sync it misses.

Failures arrive at rate :math:`M\\lambda` over :math:`M` replica-seconds per second, so

.. math::
   f = \\lambda\\,\\big(w + J + v + (M - 1)\\,g\\big), \\qquad \\text{goodput} = u\\,(1 - f)

(first order in :math:`\\lambda`: two failures at once are not modelled, nor a run that falls
below its minimum of replicas; the replicas left out do not lower the others' utilization,
and a smaller average is not counted as lost time). Elasticity needs :math:`M \\ge 2` (someone
to heal from) and holds only if the coordination service outlives the replicas.

Examples:
  Two replicas, one failure per replica every 100 hours, a 10-minute restart and hourly
  checkpoints, against an elastic DiLoCo run with H = 100 steps of 1 s:

  >>> f = Failures(rate_per_hour=0.01, restart_s=600, checkpoint_every_s=3600, rejoin_s=300, grace_s=30)
  >>> round(goodput("diloco", 1.0, f, replicas=2, step_s=1.0, sync_every=100), 5)  # 1 - Λ(C/2 + R) ≈ 0.98667
  0.98674
  >>> round(goodput("diloco", 1.0, f, replicas=2, step_s=1.0, sync_every=100, elastic=True), 5)  # w + J + v + g = 430 s
  0.99881
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from analysis.planning import _checks
from diloco_core.spec.validity import check_choice, check_int, check_real

#: The methods whose goodput is modelled (those of :mod:`analysis.planning.simulate`).
METHODS = ("dp", "diloco", "streaming")


@dataclasses.dataclass(frozen=True)
class Failures:
  """How replicas fail and come back (see the module docstring).

  Attributes:
    rate_per_hour: λ, failures of one replica per hour (>= 0).
    restart_s: R, seconds to restart the whole job from its last checkpoint (stop and restart).
    checkpoint_every_s: C, seconds of progress between two checkpoints (stop and restart).
    rejoin_s: J, seconds for a replacement to start and heal from a live peer (elastic).
    grace_s: g, seconds the others wait for a lost replica at a sync before leaving it out (elastic).
  """

  rate_per_hour: float
  restart_s: float = 600.0
  checkpoint_every_s: float = 3600.0
  rejoin_s: float = 300.0
  grace_s: float = 30.0

  def __post_init__(self):
    check_real("rate_per_hour", self.rate_per_hour, low=0.0)
    check_real("restart_s", self.restart_s, low=0.0)
    check_real("checkpoint_every_s", self.checkpoint_every_s, low=0.0, low_open=True)
    check_real("rejoin_s", self.rejoin_s, low=0.0)
    check_real("grace_s", self.grace_s, low=0.0)


def kept_by_restarts(failures: Failures, replicas: int) -> float:
  """The fraction of wall time that makes progress when every failure restarts the job:
  :math:`C / E` with :math:`E = e^{\\Lambda R} (e^{\\Lambda C} - 1) / \\Lambda`, :math:`\\Lambda = M\\lambda`.

  Examples:
    >>> kept_by_restarts(Failures(rate_per_hour=0.0), replicas=8)
    1.0
    >>> round(kept_by_restarts(Failures(rate_per_hour=0.5, restart_s=0, checkpoint_every_s=3600), 2), 6)  # ΛC = 1: 1 / (e - 1)
    0.581977
  """
  rate = check_int("replicas (M)", replicas) * failures.rate_per_hour / 3600.0
  C, R = failures.checkpoint_every_s, failures.restart_s
  if rate == 0:
    return 1.0
  return float(C * rate / (math.exp(rate * R) * math.expm1(rate * C)))


def elastic_failure_cost(method: str, failures: Failures, *, replicas: int, step_wall_s: float,
                         sync_every: int = 1, fragments: int = 1) -> dict[str, float]:
  """What one failure costs an elastic run, in replica-seconds, by part: ``work`` (w, the lost
  replica's work since its last sync), ``rejoin`` (J), ``wait`` (v, its replacement's wait for a
  sync to join at) and ``grace`` ((M - 1) g, the others' wait at the sync it misses).

  Args:
    method: ``"dp"``, ``"diloco"`` or ``"streaming"``.
    failures: the failure model (its ``rejoin_s`` and ``grace_s``).
    replicas: M >= 2.
    step_wall_s: s, the wall time of one step (compute and waits).
    sync_every: H (DiLoCo, Streaming).
    fragments: P (Streaming).

  Returns:
    ``{"work", "rejoin", "wait", "grace"}``; their sum is the cost of one failure.

  Examples:
    >>> elastic_failure_cost("streaming", Failures(1.0, rejoin_s=20.0, grace_s=5.0), replicas=3,
    ...                      step_wall_s=0.5, sync_every=8, fragments=2)  # w = 8·0.5/2, v = 8·0.5/4
    {'work': 2.0, 'rejoin': 20.0, 'wait': 1.0, 'grace': 10.0}
  """
  check_choice("method", method, METHODS)
  M = check_int("replicas (M)", replicas)
  if M < 2:
    raise ValueError(f"elastic needs replicas (M) >= 2 (a live replica to heal from), got {M}.")
  s = float(_checks.positive("step_wall_s", step_wall_s))
  H, P = check_int("sync_every (H)", sync_every), check_int("fragments (P)", fragments)
  if method == "dp":
    work, wait = s / 2, s / 2
  else:
    work, wait = H * s / 2, H * s / (2 * (P if method == "streaming" else 1))
  return {"work": work, "rejoin": float(failures.rejoin_s), "wait": wait, "grace": (M - 1) * float(failures.grace_s)}


def lost_to_elastic_failures(method: str, failures: Failures, *, replicas: int, step_wall_s: float,
                             sync_every: int = 1, fragments: int = 1) -> float:
  """The fraction of replica time that failures take from an elastic run,
  :math:`f = \\lambda (w + J + v + (M - 1) g)` (the parts of :func:`elastic_failure_cost`), capped at 1.

  Args:
    method: ``"dp"``, ``"diloco"`` or ``"streaming"``.
    failures: the failure model.
    replicas: M >= 2.
    step_wall_s: s, the wall time of one step (compute and waits).
    sync_every: H (DiLoCo, Streaming).
    fragments: P (Streaming).

  Examples:
    >>> f = Failures(rate_per_hour=3.6, rejoin_s=0.0, grace_s=0.0)  # one failure per 1000 s
    >>> lost_to_elastic_failures("diloco", f, replicas=2, step_wall_s=1.0, sync_every=100)  # w = v = 50 s
    0.1
  """
  per_failure = sum(elastic_failure_cost(method, failures, replicas=replicas, step_wall_s=step_wall_s,
                                         sync_every=sync_every, fragments=fragments).values())
  return min(1.0, failures.rate_per_hour / 3600.0 * per_failure)


def goodput(method: str, utilization: float, failures: Failures, *, replicas: int, step_s: float,
            sync_every: int = 1, fragments: int = 1, elastic: bool = False) -> float:
  """Goodput of a run: its utilization times the fraction of time failures leave it.

  Args:
    method: ``"dp"``, ``"diloco"`` or ``"streaming"``.
    utilization: u in (0, 1], the run's compute utilization without failures
      (:func:`analysis.planning.simulate.utilization`).
    failures: the failure model.
    replicas: M.
    step_s: T, the compute time of one step (a step lasts T / u).
    sync_every: H; fragments: P.
    elastic: a lost replica is left out and healed (True), or the job restarts (False).

  Returns:
    The goodput in [0, 1].

  Examples:
    >>> goodput("streaming", 0.9, Failures(rate_per_hour=0.0), replicas=4, step_s=2.0)
    0.9
  """
  check_choice("method", method, METHODS)
  u = float(check_real("utilization", utilization, low=0.0, high=1.0, low_open=True, high_open=False))
  if not elastic:
    return u * kept_by_restarts(failures, replicas)
  lost = lost_to_elastic_failures(method, failures, replicas=replicas, step_wall_s=step_s / u,
                                  sync_every=sync_every, fragments=fragments)
  return u * (1.0 - lost)


def goodput_curves(runs: dict, rates_per_hour, failures: Failures, *, replicas: int,
                   step_s: float) -> "pd.DataFrame":
  """Goodput of several runs over a range of failure rates, stopping and elastic.

  Args:
    runs: label -> ``dict(method=..., utilization=..., sync_every=..., fragments=...)``.
    rates_per_hour: the failure rates λ (per replica and hour) to evaluate.
    failures: the rest of the failure model (its ``rate_per_hour`` is replaced).
    replicas: M; step_s: T.

  Returns:
    One row per rate and run: ``rate_per_hour``, ``run``, ``stop_and_restart``, ``elastic``.

  Examples:
    >>> runs = {"DiLoCo": dict(method="diloco", utilization=1.0, sync_every=100)}
    >>> goodput_curves(runs, [0.0], Failures(0.0), replicas=2, step_s=1.0).to_dict("records")
    [{'rate_per_hour': 0.0, 'run': 'DiLoCo', 'stop_and_restart': 1.0, 'elastic': 1.0}]
  """
  import pandas as pd
  rows = []
  for rate in np.atleast_1d(_checks.nonneg("rates_per_hour", rates_per_hour)):
    f = dataclasses.replace(failures, rate_per_hour=float(rate))
    for label, run in runs.items():
      kw = dict(replicas=replicas, step_s=step_s, sync_every=run.get("sync_every", 1),
                fragments=run.get("fragments", 1))
      rows.append({"rate_per_hour": float(rate), "run": label,
                   "stop_and_restart": goodput(run["method"], run["utilization"], f, **kw),
                   "elastic": goodput(run["method"], run["utilization"], f, elastic=True, **kw)})
  return pd.DataFrame(rows)
