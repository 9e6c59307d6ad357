r"""When a quorum round closes: one rule for the simulated tape (ticks) and real processes (seconds).

A round expects the :math:`n` members that can still contribute (live, with a contribution to
come) and needs :math:`k = \min(K, n)` of them; :math:`t_{(i)}` is the time of its i-th arrival.
It closes at the first time :math:`t` at which

.. math:: \text{all } n \text{ have arrived} \quad\text{or}\quad
          \text{at least } k \text{ have arrived and } t \ge t_{(k)} + G,

so a round never waits for a replica that cannot come (a lost or finished one shrinks
:math:`n`), never waits the grace window G out once everyone it could wait for is in (the
papers' "wait only when necessary"), and with K = n is the synchronous barrier whatever G is.
Every contribution arrived by the closing time is a member (the window is closed at both ends).

:func:`close_time` is the rule given the arrivals so far; the simulated tape
(:func:`~diloco_core.spec.tape.simulate_tape`) commits at it, and the quorum over real
processes (:func:`~diloco_core.runtime.quorum.decide`) decides when its clock reaches it.

Examples:
  Four replicas, K = 2, G = 8: the second arrival at 4 opens the window until 12; the last two
  arriving at 6 close it then.

  >>> close_time([4, 4], expected=4, need=2, grace=8)
  12
  >>> close_time([4, 4, 6, 6], expected=4, need=2, grace=8)
  6
  >>> close_time([4], expected=4, need=2, grace=8) is None  # fewer than k: no closing time yet
  True
"""

from __future__ import annotations

from typing import Sequence

from diloco_core.spec import validity as v

__all__ = ["close_time", "closed"]


def close_time(arrivals: Sequence[float], expected: int, need: int, grace: float) -> float | None:
  r"""The time the round closes if no other contribution arrives and no replica is lost.

  Args:
    arrivals: the arrival times of the contributions so far (any order, one clock).
    expected: n, the members that can still contribute, arrived ones included.
    need: K, the quorum (at most ``expected`` is asked for: :math:`k = \min(K, n)`).
    grace: G, how long the round stays open after its k-th arrival.

  Returns:
    The latest arrival once all ``expected`` arrived, or :math:`t_{(k)} + G` when that is
    earlier; :math:`t_{(k)} + G` with k or more but not all arrived; None with fewer than k.

  Examples:
    >>> close_time([3, 1], expected=2, need=1, grace=10)  # both in: no need to wait for more
    3
    >>> close_time([3, 1], expected=3, need=1, grace=10)  # the window opened at the first, 1
    11
    >>> close_time([0.5, 0.7, 0.75], expected=3, need=3, grace=0.0)
    0.75
  """
  v.check_int("expected", expected, low=0)
  v.check_int("need", need, low=1)
  times = sorted(arrivals)
  k = min(need, expected)
  if len(times) < max(k, 1):
    return None
  window = times[k - 1] + grace if k else times[-1]
  return min(times[-1], window) if len(times) >= expected else window


def closed(arrivals: Sequence[float], expected: int, need: int, grace: float, now: float) -> bool:
  """Whether the round is closed at ``now`` (:func:`close_time` reached).

  Examples:
    >>> closed([1.0, 1.2], expected=3, need=2, grace=0.5, now=1.3), closed([1.0, 1.2], 3, 2, 0.5, now=1.7)
    (False, True)
  """
  at = close_time(arrivals, expected, need, grace)
  return at is not None and now >= at
