"""The arms of the ``stragglers`` experiment: one replica two times slower, the syncer's settings.

M = 4 replicas of speeds :data:`SPEEDS` (the last one half as fast), P = 1, the CPU base run
(:func:`analysis.lab.experiments.base_config`: ``mini``, H = 24, η = 0.5, μ = 0.9, inner LR 2e-2,
1,200 steps), every arm played from its syncer's tape (:mod:`diloco_core.runtime.tape_player`) with
the same budget of M × ``steps`` local steps, all replicas together (equal total local steps),
and the same seeds (paired). The arms (:func:`straggler_arms`), each a row of
:data:`~diloco_core.spec.syncer_settings.SYNCER_SETTINGS` through
:func:`~diloco_core.spec.syncer_settings.syncer_preset`:

* ``sync``: synchronous DiLoCo on the slow pool (every round waits for the slow replica); also
  the quorum trade-off's K = M = 4 (the same config: one set of runs);
* ``sync+DyLU``: synchronous with DyLU's :math:`H_m` (the slow replica runs H / 2 inner steps);
* ``async naive``: Liu et al.'s naive asynchronous Local-SGD (quorum 1, late carried, one outer
  Nesterov step per contribution);
* ``async DN``: the same with Delayed Nesterov (buffer N = M);
* ``async DN+DyLU``: the same with DyLU's :math:`H_m`;
* ``K=1``: a quorum of one, late contributions carried, one merged outer step per round;
* ``K=1+grace``: the same with a grace window of :data:`~analysis.planning.pool_plan.GRACE_PERIODS`
  of the fast replicas' period (:func:`grace_ticks`; the stragglers page's planner's rule).

The quorum arms keep the merged round's plain mean (uniform weights, no radial mean), not
Decoupled DiLoCo's token weights and radial mean, so that K = 4 is exactly ``sync`` and the
quorum alone differs between the three. Learning rates are the base run's for every arm.
"""

from __future__ import annotations

import math
from fractions import Fraction
from typing import Any

from analysis.lab.sweeps import with_values
from analysis.planning.pool_plan import GRACE_PERIODS

#: The replicas' speeds: three at 1, one two times slower.
SPEEDS = (1.0, 1.0, 1.0, 0.5)
#: Seeds of every arm (paired).
STRAGGLER_SEEDS = 8
#: The reference arm of every paired difference.
REFERENCE = "sync"
#: Arms that are the same config as another (name -> the arm whose runs they are).
SAME_AS = {"K=4": REFERENCE}


def grace_ticks(sync_every: int, speeds=SPEEDS) -> int:
  """The grace window of ``K=1+grace`` in ticks: :data:`~analysis.planning.pool_plan.GRACE_PERIODS`
  of the fastest replica's period H (its step is one tick for these speeds), rounded up.

  Examples:
    >>> grace_ticks(24)
    12
  """
  from diloco_core.runtime.tape_player import speed_ticks  # here: it imports JAX
  fast = min(speed_ticks(tuple(speeds)))
  return math.ceil(Fraction(str(GRACE_PERIODS)) * sync_every * fast)


def straggler_syncers(replicas: int, sync_every: int, speeds=SPEEDS) -> dict[str, Any]:
  """Each arm's :class:`~diloco_core.run.syncer_options.SyncerOptions` (module docstring), by name."""
  from diloco_core.run.syncer_options import SyncerOptions
  from diloco_core.spec.syncer_settings import syncer_preset

  def options(name, **kw):
    preset = syncer_preset(name, replicas, speeds=speeds, quorum=kw.pop("quorum", None), grace=kw.pop("grace", None))
    fields = {k: getattr(preset, k) for k in ("quorum", "grace", "late", "apply", "buffer", "weights", "radial")}
    return SyncerOptions(speeds=tuple(speeds), dylu=preset.speeds is not None, **{**fields, **kw})

  decoupled = {"weights": "uniform", "radial": False}  # plain mean: K = M is synchronous DiLoCo
  return {
      "sync": options("synchronous DiLoCo"),
      "sync+DyLU": options("synchronous DiLoCo with DyLU's H_m"),
      "async naive": options("asynchronous Local-SGD, naive"),
      "async DN": options("asynchronous Local-SGD, Delayed Nesterov"),
      "async DN+DyLU": options("asynchronous Local-SGD, Delayed Nesterov + DyLU"),
      "K=1": options("Decoupled DiLoCo", quorum=1, grace=0, **decoupled),
      "K=1+grace": options("Decoupled DiLoCo", quorum=1, grace=grace_ticks(sync_every, speeds), **decoupled),
  }


def straggler_arms(base) -> dict[str, Any]:
  """The arms by name around ``base`` (the CPU base run: module docstring), ``K=4`` included
  (the same config as ``sync``, :data:`SAME_AS`)."""
  syncers = straggler_syncers(base.algo.replicas, base.algo.sync_every)
  arms = {name: with_values(base, {"syncer": s}) for name, s in syncers.items()}
  for name, same in SAME_AS.items():
    arms[name] = arms[same]
  return arms
