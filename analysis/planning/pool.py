"""A heterogeneous pool under the syncer rule: busy time, waiting, goodput and contributions kept.

M replicas of given speeds :math:`v_m` (local steps per second; only their ratios and the
link's seconds matter) run the syncer rule of :mod:`diloco_core.spec.syncer` (quorum K, grace
G, per-replica or DyLU inner steps :math:`H_m`, late contributions dropped or carried), played
by :func:`diloco_core.spec.tape.simulate_tape` over a link of ``latency_s + transfer_s`` seconds
each way. One replica's inner step takes :math:`t_m = 1 / v_m` seconds.

**Seconds to ticks** (exact): every duration is read as an exact rational (a float as the
decimal it prints as, 0.3 is 3/10: the rule of :func:`~diloco_core.spec.syncer.dylu_inner_steps`),
and the tick is their greatest common divisor, the longest time of which every step time
:math:`1/v_m`, the latency, the transfer time and the grace are whole multiples
(:func:`to_ticks`). The tape then runs on integers and every figure below is an exact fraction.

**Figures**, over the whole run (tick 0 to the tape's last event, the merge that gives every
replica the final version: wall time :math:`W`), replica m sending :math:`n_m` local steps:

.. math::
   b_m = \\frac{n_m t_m}{W}, \\qquad u = \\frac{1}{M}\\sum_m b_m, \\qquad
   \\text{throughput} = \\frac{\\sum_m n_m}{W \\sum_m v_m}, \\qquad
   \\text{goodput} = \\frac{\\sum_{\\text{merged}} H_i}{W \\sum_m v_m}

(:math:`b_m` busy fraction; :math:`u` the pool's utilization, each replica's time weighing
the same, as in :mod:`analysis.planning.simulate`; throughput: local steps per second against
an ideal pool of the same speeds that never waits; goodput: the same for the steps whose
contribution a round merged). ``waiting``: the time a replica spends between sending and its
next period (the rest of :math:`W` after its last send is its tail: it has no period left).
Contributions: ``merged`` (committed in a round), ``dropped`` (late, ``late="drop"``), and
``stale`` (merged with staleness :math:`s = v - 1 - b > 0`, ``late="carry"``).

Closed forms (tests/test_pool.py): synchronous DiLoCo, equal H, no link, one replica of M
twice as slow: the others are busy 1/2 the time, :math:`u = (M + 1) / (2M)`, goodput
:math:`M / (2M - 1)`; with DyLU (:math:`H_m = \\lfloor H v_m / v_\\max \\rfloor`) everyone is
busy whenever :math:`H v_m / v_\\max` is whole; with K = 1 and no link nobody waits.

Examples:
  Three replicas, the third twice as slow, H = 4, synchronous then DyLU:

  >>> r = pool_utilization((1.0, 1.0, 0.5), sync_every=4, steps=48)
  >>> r.busy, r.utilization, r.goodput  # (M + 1) / 2M = 2/3, M / (2M - 1) = 3/5
  ((Fraction(1, 2), Fraction(1, 2), Fraction(1, 1)), Fraction(2, 3), Fraction(3, 5))
  >>> pool_utilization((1.0, 1.0, 0.5), sync_every=4, dylu=True, steps=40).utilization
  Fraction(1, 1)
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction

from diloco_core.spec.syncer import SyncerConfig, dylu_inner_steps, exact_decimal
from diloco_core.spec.tape import Committed, Dropped, Sent, simulate_tape
from diloco_core.spec.validity import check_bool, check_choice, check_int, is_real

#: Rounds of every replica's period that make the default budget (``steps=None``).
DEFAULT_ROUNDS = 12

__all__ = ["DEFAULT_ROUNDS", "PoolResult", "exact_seconds", "pool_utilization", "to_ticks"]


def exact_seconds(name: str, value, *, positive: bool = False) -> Fraction:
  """``value`` as an exact rational (a float as the decimal it prints as); a one-line error otherwise.

  Examples:
    >>> exact_seconds("latency_s", 0.3)
    Fraction(3, 10)
  """
  if isinstance(value, Fraction):
    exact = value
  elif is_real(value):
    exact = exact_decimal(value)
  else:
    raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}.")
  if exact < 0 or (positive and exact == 0):
    raise ValueError(f"{name} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}.")
  return exact


def to_ticks(*durations: Fraction) -> tuple[Fraction, tuple[int, ...]]:
  """The tick: the greatest common divisor of the nonzero exact durations, and each in ticks.

  .. math:: \\tau = \\gcd(p_i / q_i) = \\frac{\\gcd_i(p_i\\,Q / q_i)}{Q},\\quad Q = \\operatorname{lcm}_i q_i

  Args:
    durations: exact durations (seconds) >= 0, at least one of them > 0.

  Returns:
    ``(tick, counts)``: the tick in seconds, and every duration as a whole number of ticks.

  Examples:
    >>> to_ticks(Fraction(1), Fraction(10, 3), Fraction(0))  # steps of 1 s and 10/3 s, no latency
    (Fraction(1, 3), (3, 10, 0))
  """
  nonzero = [d for d in durations if d]
  denominator = math.lcm(*(d.denominator for d in nonzero))
  tick = Fraction(math.gcd(*(d.numerator * (denominator // d.denominator) for d in nonzero)), denominator)
  return tick, tuple(int(d / tick) for d in durations)


@dataclasses.dataclass(frozen=True, eq=False)
class PoolResult:
  """What :func:`pool_utilization` measures (module docstring); every ratio an exact fraction.

  Attributes:
    speeds: :math:`v_m`, exact (steps per second).
    inner_steps: :math:`H_m`.
    quorum: K.
    tick_s: the tick (seconds).
    wall_s: W, seconds from the start to the tape's last event.
    steps: :math:`n_m`, local steps each replica sent.
    busy: :math:`b_m = n_m t_m / W`.
    waiting: each replica's time between a send and its next period, over W.
    utilization: u, the mean of ``busy``.
    throughput: local steps per second over :math:`\\sum_m v_m`.
    goodput: merged local steps per second over :math:`\\sum_m v_m`.
    kept: merged local steps over local steps sent.
    contributions: contributions sent.
    merged: the fraction of contributions a round merged.
    dropped: the fraction discarded as late.
    stale: the fraction of merged contributions with staleness > 0.
    rounds: rounds committed.
    tape: the tape itself (:func:`~diloco_core.spec.tape.simulate_tape`).
  """

  speeds: tuple[Fraction, ...]
  inner_steps: tuple[int, ...]
  quorum: int
  tick_s: Fraction
  wall_s: Fraction
  steps: tuple[int, ...]
  busy: tuple[Fraction, ...]
  waiting: tuple[Fraction, ...]
  utilization: Fraction
  throughput: Fraction
  goodput: Fraction
  kept: Fraction
  contributions: int
  merged: Fraction
  dropped: Fraction
  stale: Fraction
  rounds: int
  tape: tuple

  @property
  def mean_period_s(self) -> Fraction:
    """The mean over replicas of W / (contributions sent): the wall time of one replica's period."""
    sent = [sum(1 for e in self.tape if isinstance(e, Sent) and e.replica == m) for m in range(len(self.speeds))]
    return sum((self.wall_s / n for n in sent if n), Fraction(0)) / max(1, sum(1 for n in sent if n))

  @property
  def round_interval_s(self) -> Fraction:
    """W / rounds: the mean wall time between two commits."""
    return self.wall_s / max(1, self.rounds)


def check_speeds(speeds) -> tuple[Fraction, ...]:
  """The speeds as exact positive rationals; a one-line error naming the option otherwise.

  Examples:
    >>> check_speeds([2, 0.5])
    (Fraction(2, 1), Fraction(1, 2))
  """
  if isinstance(speeds, (str, bytes)) or not hasattr(speeds, "__len__") or len(speeds) == 0:
    raise ValueError("speeds must be a non-empty sequence of positive steps per second, one per replica,"
                     f" got {speeds!r}.")
  return tuple(exact_seconds(f"speeds (v_m) of replica {i}", s, positive=True) for i, s in enumerate(speeds))


def _syncer(speeds, sync_every, quorum, grace_ticks, dylu, late) -> SyncerConfig:
  m = len(speeds)
  if quorum is not None:
    k = check_int("quorum (K)", quorum, what=" (None: every replica)")
    if k > m:
      raise ValueError(f"quorum (K={k}) must be at most the replicas (M={m}): use K in 1..{m}, or None"
                       " for every replica.")
  if grace_ticks and (quorum is None or quorum == m):
    raise ValueError(f"grace_s waits after the K-th contribution for the others, and quorum K = M = {m}"
                     f" leaves none: pass quorum in 1..{m - 1} or grace_s=0.")
  check_choice("late", late, ("drop", "carry"))
  inner = dylu_inner_steps(speeds, sync_every) if check_bool("dylu", dylu) else None  # exact speeds
  return SyncerConfig(inner_steps=inner, quorum=quorum, grace=grace_ticks, late=late)


def pool_utilization(speeds, *, sync_every: int, quorum: int | None = None, grace_s=0, dylu: bool = False,
                     late: str = "drop", latency_s=0, transfer_s=0, steps: int | None = None) -> PoolResult:
  """Plays the syncer rule on a pool of given speeds and measures it (module docstring).

  Args:
    speeds: :math:`v_m > 0`, each replica's local steps per second (a sequence, one per replica).
    sync_every: H (every replica's :math:`H_m`, or the fastest one's with ``dylu``).
    quorum: K in 1..M, the contributions a round waits for; None: every replica (synchronous).
    grace_s: seconds a round stays open after its K-th contribution (needs K < M).
    dylu: DyLU's inner steps :math:`H_m = \\max(1, \\lfloor H v_m / v_\\max \\rfloor)`.
    late: ``"drop"`` or ``"carry"``: a contribution whose round has committed.
    latency_s: link latency each way (seconds).
    transfer_s: seconds to carry one contribution, or one global version, over the link.
    steps: the local steps of all replicas together; None: ``DEFAULT_ROUNDS`` times
      :math:`\\sum_m H_m`.

  Returns:
    A :class:`PoolResult`.

  Examples:
    Equal speeds, a link of 1 s latency and 0.5 s transfer each way, H = 4 steps of 1 s: a round
    is 4 s of compute and 3 s of link, so :math:`u = 4/7`:

    >>> pool_utilization((1, 1), sync_every=4, latency_s=1, transfer_s=0.5).utilization
    Fraction(4, 7)
    >>> pool_utilization((1, 0), sync_every=4)
    Traceback (most recent call last):
    ...
    ValueError: speeds (v_m) of replica 1 must be a finite number > 0, got 0.
  """
  exact = check_speeds(speeds)
  h = check_int("sync_every (H)", sync_every)
  link = [exact_seconds(n, x) for n, x in (("latency_s", latency_s), ("transfer_s", transfer_s), ("grace_s", grace_s))]
  tick, counts = to_ticks(*(1 / v for v in exact), *link)
  step_ticks, (lat, xfer, grace) = counts[:len(exact)], counts[len(exact):]
  config = _syncer(exact, h, quorum, grace, dylu, late)
  inner = config.inner_steps_of(h, len(exact))
  budget = DEFAULT_ROUNDS * sum(inner) if steps is None else check_int("steps", steps)
  tape = simulate_tape(config, step_ticks, h, budget, latency=lat, transfer=xfer)
  return _measure(exact, inner, config.quorum_of(len(exact)), tick, step_ticks, tape)


def _measure(speeds, inner, quorum, tick, step_ticks, tape) -> PoolResult:
  """The figures of the module docstring, read off the tape."""
  m_count = len(speeds)
  wall = max(e.tick for e in tape)
  last_sent, steps, sent = [0] * m_count, [0] * m_count, 0
  for e in tape:
    if isinstance(e, Sent):
      last_sent[e.replica], steps[e.replica], sent = e.tick, e.step, sent + 1
  commits = [e for e in tape if isinstance(e, Committed)]
  members = [(c.version, x) for c in commits for x in c.members]
  merged_steps = sum(x.inner_steps for _, x in members)
  dropped = sum(1 for e in tape if isinstance(e, Dropped))
  compute = [n * t for n, t in zip(steps, step_ticks)]
  total_speed = sum(speeds)
  frac = lambda a, b: Fraction(a, b) if b else Fraction(0)  # noqa: E731
  busy = tuple(frac(c, wall) for c in compute)
  return PoolResult(
      speeds=speeds, inner_steps=tuple(inner), quorum=quorum, tick_s=tick, wall_s=wall * tick,
      steps=tuple(steps), busy=busy,
      waiting=tuple(frac(last - c, wall) for last, c in zip(last_sent, compute)),
      utilization=sum(busy, Fraction(0)) / m_count,
      throughput=Fraction(sum(steps)) / (wall * tick * total_speed) if wall else Fraction(0),
      goodput=Fraction(merged_steps) / (wall * tick * total_speed) if wall else Fraction(0),
      kept=frac(merged_steps, sum(steps)), contributions=sent, merged=frac(len(members), sent),
      dropped=frac(dropped, sent), stale=frac(sum(1 for v, x in members if v - 1 - x.base > 0), len(members)),
      rounds=len(commits), tape=tape)
