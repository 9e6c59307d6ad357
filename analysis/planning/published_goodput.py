"""Decoupled DiLoCo's published goodput under failures, beside this project's goodput model.

Decoupled DiLoCo (Douillard et al., "Decoupled DiLoCo for Resilient Distributed Pre-training",
arXiv 2604.21428, April 2026) simulates chip failures ("chaos engineering") on up to millions
of chips and reports *goodput*, the share of the allocated chips' time spent on useful training
(:data:`PUBLISHED`, in the setting :data:`SETTING`). This module holds those numbers, with where
each is printed, and evaluates the model of :mod:`analysis.planning.goodput` in the same setting.

**Provenance.** The stored copy of the paper could be read here only as far as its abstract
("millions of simulated chips", "strictly zero global downtime"). The setting and the numbers
below are those that several independent readings of the paper (and of DeepMind's blog post on
it) quote alike, with the figure or table they cite (:attr:`PublishedGoodput.where`). What none
of them states is listed in :data:`NOT_PUBLISHED`; the model needs some of it, so its values
for those are this project's defaults (:class:`~analysis.planning.goodput.Failures`), not theirs.

**Their setting** (:data:`SETTING`; Fig. 5, a dense 5B model trained on 1T tokens): every chip
is interrupted once a year on average (:math:`\\mathrm{MTBI}_\\text{chip}`), and
:math:`N` = 1.2 million chips fail together at rate :math:`\\Lambda = N / \\mathrm{MTBI}_\\text{chip}`,
one failure every :math:`1 / \\Lambda` = 26 s (``cluster_mtbf_s``). Decoupled DiLoCo splits
them into :math:`M` learners (quorum K = 1, H = 24, P = 24 fragments); a failed chip removes
one slice of its learner only, which goes on with fewer slices.

**Our model in that setting** (:func:`model_goodput`), one formula per kind of row:

* ``restart`` (data-parallel that stops and restarts): the job fails at rate :math:`\\Lambda`
  and keeps :math:`C / E` of its time, :func:`~analysis.planning.goodput.kept_by_restarts`;
  with checkpoints taken continuously (:math:`C \\to 0`, writing them is not counted) that is
  :math:`e^{-\\Lambda R}`, so a published goodput :math:`g` needs a restart of at most
  :math:`R = -\\ln(g) / \\Lambda`;
* ``elastic_dp`` (elastic data-parallel): each failure holds every replica for the grace
  window :math:`g_w` while the lost one is left out; with many replicas
  (:func:`~analysis.planning.goodput.lost_to_elastic_failures` with :math:`M \\to \\infty`)
  the fraction lost is :math:`f = \\Lambda g_w`, so :math:`g` needs :math:`g_w = (1 - g) / \\Lambda`;
* ``learners`` (Decoupled DiLoCo, K = 1, nobody waits): a learner of :math:`N / M` chips fails
  at rate :math:`\\lambda_L = \\Lambda / M` and loses, per failure, its work since its last
  send, its rejoin and its wait for a round (:func:`~analysis.planning.goodput.elastic_failure_cost`,
  Streaming, no grace): :math:`f = \\lambda_L (H s / 2 + J + H s / (2P))`, so :math:`g` needs
  :math:`(1 - g) M / \\Lambda` learner-seconds per failure (``implied_s``).

The third formula makes the fraction lost depend on :math:`N / M` only, so :math:`M` learners
on :math:`N` chips lose what one learner on :math:`N / M` chips loses, and a published
:math:`g` at :math:`M` predicts :math:`1 - (1 - g) M / M'` at :math:`M'`
(:func:`scale_learners`). What the model cannot express: a learner that goes on with fewer
slices (its replica is all or nothing), the slices' downscale and upscale times, chips of
varying speed, and two failures at once.

Examples:
  >>> round(cluster_mtbf_s(SETTING), 2)  # one year of 365.25 days over 1.2 million chips
  26.3
  >>> table = comparison()
  >>> table[["method", "published", "implied_s"]].round(2)
                       method  published  implied_s
  0             data-parallel       0.27      34.43
  1     elastic data-parallel       0.58      11.05
  2   Decoupled DiLoCo, M = 8       0.88      25.25
  3  Decoupled DiLoCo, M = 16       0.93      29.45
  >>> scale_learners(0.88, 8, 16)  # M = 8's loss halved
  0.94
"""

from __future__ import annotations

import dataclasses
import math

from analysis.planning.goodput import Failures, elastic_failure_cost, kept_by_restarts
from diloco_core.spec.validity import check_choice, check_int, check_real

__all__ = ["HOURS_PER_YEAR", "KINDS", "NOT_PUBLISHED", "PUBLISHED", "PublishedGoodput", "SETTING", "Setting",
           "cluster_mtbf_s", "comparison", "implied_s", "model_goodput", "scale_learners"]

#: The length of a year used for :math:`\mathrm{MTBI}_\text{chip}` (365.25 days; the sources
#: read do not say which year the paper counts).
HOURS_PER_YEAR = 365.25 * 24
#: The formulas of the module docstring, one per kind of published row.
KINDS = ("restart", "elastic_dp", "learners")


@dataclasses.dataclass(frozen=True)
class Setting:
  """The failure simulation the published goodputs come from.

  Attributes:
    chips: N, the simulated chips.
    mtbi_chip_years: the mean time between interruptions of one chip, in years.
    sync_every: H, inner steps between two syncs of a fragment.
    fragments: P, the model's fragments.
    overlap: τ, steps over which a fragment's sync overlaps compute.
    quorum: K, the learners a round waits for.
    workload: the model and token budget of the runs.
    where: where the paper states it.
  """

  chips: int
  mtbi_chip_years: float
  sync_every: int
  fragments: int
  overlap: int
  quorum: int
  workload: str
  where: str


@dataclasses.dataclass(frozen=True)
class PublishedGoodput:
  """One published goodput.

  Attributes:
    method: the method as the source names it.
    learners: M, Decoupled DiLoCo's learners (1 for data-parallel).
    goodput: the published goodput, a fraction.
    where: the figure or table (or the blog post) that prints it.
    kind: which of our formulas models it (:data:`KINDS`).
  """

  method: str
  learners: int
  goodput: float
  where: str
  kind: str

  def __post_init__(self):
    check_int("learners", self.learners)
    check_real("goodput", self.goodput, low=0.0, high=1.0, low_open=True, high_open=True)
    check_choice("kind", self.kind, KINDS)


#: The simulation of Fig. 5 (arXiv 2604.21428): 1.2 million chips each interrupted once a year,
#: the default Decoupled DiLoCo of the paper's experiments (H = P = 24, τ = 2, K = 1).
SETTING = Setting(chips=1_200_000, mtbi_chip_years=1.0, sync_every=24, fragments=24, overlap=2, quorum=1,
                  workload="dense 5B model, 1T tokens",
                  where="Fig. 5, as readings of the paper quote it")

#: The published goodputs at :data:`SETTING`'s 1.2 million chips.
PUBLISHED = (
    PublishedGoodput("data-parallel", 1, 0.27, "DeepMind's blog post on the paper, as news pages quote it",
                     "restart"),
    PublishedGoodput("elastic data-parallel", 1, 0.58, "Fig. 5, as readings of the paper quote it", "elastic_dp"),
    PublishedGoodput("Decoupled DiLoCo, M = 8", 8, 0.88, "Fig. 5, as readings of the paper quote it", "learners"),
    PublishedGoodput("Decoupled DiLoCo, M = 16", 16, 0.93, "two readings of the paper (figure not located)",
                     "learners"),
)

#: What the model needs and none of the sources read states.
NOT_PUBLISHED = (
    "the time to restart data-parallel from a checkpoint, and its checkpoint interval",
    "how the blog's data-parallel baseline recovers (stop and restart is assumed here)",
    "elastic data-parallel's downscale and upscale times, and its chips per slice",
    "a learner's chips per slice, and the time a failed slice takes to return",
    "the step time of the simulated runs",
    "the spread of the chips' speeds",
)


def cluster_mtbf_s(setting: Setting = SETTING) -> float:
  """:math:`1 / \\Lambda`, seconds between two failures anywhere among the setting's chips.

  Examples:
    >>> cluster_mtbf_s(dataclasses.replace(SETTING, chips=1, mtbi_chip_years=1 / HOURS_PER_YEAR))
    3600.0
  """
  return setting.mtbi_chip_years * HOURS_PER_YEAR * 3600.0 / setting.chips


def _learner_failures(row: PublishedGoodput, setting: Setting, failures: Failures) -> Failures:
  """``failures`` at the rate one learner of the setting fails, no grace (K = 1: nobody waits)."""
  per_hour = 3600.0 / (cluster_mtbf_s(setting) * row.learners)
  return dataclasses.replace(failures, rate_per_hour=per_hour, grace_s=0.0)


def model_goodput(row: PublishedGoodput, failures: Failures | None = None, *, setting: Setting = SETTING,
                  step_s: float = 1.0) -> float:
  """Our model's goodput for a published row, in its setting (the module docstring's formulas).

  Args:
    row: the published row (its ``kind`` picks the formula).
    failures: restart R, checkpoint interval C, rejoin J and grace window g (its rate is
      replaced by the setting's); None: :class:`~analysis.planning.goodput.Failures`' defaults.
    setting: the simulation.
    step_s: s, a learner's step in seconds (not published; the compute utilization is taken as 1).

  Returns:
    The goodput in [0, 1].

  Examples:
    >>> row = PUBLISHED[3]  # M = 16: a learner fails every 16 / Λ = 420.8 s
    >>> f = Failures(0.0, rejoin_s=0.0)  # w = 24·1/2 = 12 s, v = 24·1/48 = 0.5 s: 1 - 12.5 / 420.77
    >>> round(model_goodput(row, f), 4)
    0.9703
  """
  failures = Failures(0.0) if failures is None else failures
  rate = 3600.0 / cluster_mtbf_s(setting)  # Λ, per hour
  if row.kind == "restart":
    return kept_by_restarts(dataclasses.replace(failures, rate_per_hour=rate), replicas=1)
  if row.kind == "elastic_dp":
    return 1.0 - min(1.0, failures.grace_s / cluster_mtbf_s(setting))
  learner = _learner_failures(row, setting, failures)
  cost = elastic_failure_cost("streaming", learner, replicas=row.learners, step_wall_s=step_s,
                              sync_every=setting.sync_every, fragments=setting.fragments)
  return 1.0 - min(1.0, learner.rate_per_hour / 3600.0 * sum(cost.values()))


def implied_s(row: PublishedGoodput, setting: Setting = SETTING) -> float:
  """The seconds per failure that make our formula give the published goodput :math:`g`:
  the restart :math:`R = -\\ln(g) / \\Lambda` (``restart``, checkpoints taken continuously), the
  others' wait :math:`(1 - g) / \\Lambda` (``elastic_dp``), or the learner-seconds
  :math:`(1 - g) M / \\Lambda` (``learners``).

  Examples:
    >>> round(implied_s(PUBLISHED[2]), 3)  # 0.12 · 8 · 26.298 s
    25.246
  """
  mtbf = cluster_mtbf_s(setting)
  if row.kind == "restart":
    return -math.log(row.goodput) * mtbf
  return (1.0 - row.goodput) * mtbf * (row.learners if row.kind == "learners" else 1)


def scale_learners(goodput: float, learners: int, to: int) -> float:
  """The goodput our ``learners`` formula predicts at ``to`` learners from one at ``learners``:
  :math:`1 - (1 - g) M / M'` (the fraction lost scales as :math:`N / M`), floored at 0.

  Examples:
    >>> scale_learners(0.88, 8, 4)
    0.76
  """
  g = check_real("goodput", goodput, low=0.0, high=1.0)
  m, m2 = check_int("learners", learners), check_int("to", to)
  return round(max(0.0, 1.0 - (1.0 - g) * m / m2), 12)


def comparison(failures: Failures | None = None, *, setting: Setting = SETTING,
               step_s: float = 1.0) -> "pd.DataFrame":
  """The published goodputs beside our model's in the same setting.

  Args:
    failures: the parts of the failure model the sources do not publish (:func:`model_goodput`).
    setting: the simulation.
    step_s: s, a learner's step in seconds.

  Returns:
    One row per :data:`PUBLISHED` row: ``setting``, ``method``, ``where``, ``published``,
    ``model`` (:func:`model_goodput`), ``difference`` (model - published), ``implied_s``
    (:func:`implied_s`) and ``implied`` (what those seconds are).

  Examples:
    >>> comparison()[["method", "model"]].round(3).to_dict("records")[-1]  # J = 300 s, 1/λ_L = 420.8 s
    {'method': 'Decoupled DiLoCo, M = 16', 'model': 0.257}
  """
  import pandas as pd
  what = {"restart": "restart R (checkpoints continuous)", "elastic_dp": "everyone's wait per failure",
          "learners": "learner-seconds lost per learner failure"}
  rows = []
  for row in PUBLISHED:
    model = model_goodput(row, failures, setting=setting, step_s=step_s)
    rows.append({"setting": f"{setting.chips / 1e6:g}M chips, MTBI {setting.mtbi_chip_years:g} year per chip"
                            f" ({setting.where})",
                 "method": row.method, "where": row.where, "published": row.goodput, "model": model,
                 "difference": model - row.goodput, "implied_s": implied_s(row, setting), "implied": what[row.kind]})
  return pd.DataFrame(rows)
