"""Simulated time: the syncer rule played in integer ticks, as a tape of what happens.

:func:`simulate_tape` runs the rule of :mod:`~diloco_core.spec.syncer` for one fragment (the whole
model, P = 1, τ = 0: a replica waits for the version its contribution goes into) on replicas whose
inner steps take ``step_ticks[m]`` ticks each, over a link that takes ``latency + transfer`` ticks
each way (up: a contribution; down: a global version), with replicas lost and rejoining at given
ticks. It returns the tape: a tuple of frozen event
records, the same for the same inputs (no clock, no randomness, no hashing order):

* :class:`Sent`: replica m finished local step ``step`` and sent its contribution, based on
  global version ``base``;
* :class:`Dropped`: a late contribution was discarded (``late="drop"``, or past ``max_staleness``);
* :class:`Committed`: round ``version`` committed; its ``members`` in arrival order, the order of
  ``apply="sequential"``;
* :class:`Merged`: replica m, at local step ``step``, merged global version ``version`` (``heal``:
  it is replaced by it, as a dropped or rejoining replica is, instead of blended with α);
* :class:`Lost`, :class:`Joined`: replica m stopped, or came back, at local step ``step``.

**Tie order.** Events of one tick happen by kind, then replica id: lost, joined, sent,
arrived (joined the round, or :class:`Dropped`), committed, merged. Every consequence within a
tick is of a later kind (a send arrives, a round commits, a member merges), so the tape is
sorted by ``(tick, kind, replica)``. A contribution that arrives at its round's commit tick is a
member (the grace window is closed at both ends).

**Budget.** ``total_steps`` is the local steps of all replicas together. A replica reserves its
next period of :math:`H_m` steps when it starts or sends, while the reserved total stays within
the budget; the steps of a period a lost replica did not finish are spent. A replica with no
period left still merges its last round, and stops counting towards the quorum once its last
contribution is committed or dropped.

**Quorum.** The open round commits by :func:`~diloco_core.spec.quorum_close.close_time`, the
rule the quorum over real processes uses too: ``grace`` ticks after its :math:`\\min(K, n)`-th
contribution arrived, or as soon as all n have, n the live replicas that can still contribute
(with a period to run, or a contribution on the way or in the round): a lost or finished
replica shrinks the quorum, and a round never waits out its window once nobody is left to wait for.

The trainer plays a tape with the real model (:mod:`~diloco_core.runtime.tape_player`, through
:func:`~diloco_core.runtime.tape_player.tape_for`); a quorum run over real processes records its own,
in ticks of local steps, from its trace (:mod:`~diloco_core.runtime.trace_tape`).

Examples:
  Two replicas, the second twice as slow, synchronous DiLoCo, H = 2, one round each:

  >>> from diloco_core.spec.syncer import SyncerConfig
  >>> tape = simulate_tape(SyncerConfig(), step_ticks=(1, 2), sync_every=2, total_steps=4)
  >>> [type(event).__name__ for event in tape]
  ['Sent', 'Sent', 'Committed', 'Merged', 'Merged']
  >>> tape[0], tape[1]  # replica 0 waits from tick 2 to 4: the round needs both
  (Sent(tick=2, replica=0, step=2, base=0), Sent(tick=4, replica=1, step=2, base=0))
  >>> tape[2].version, tape[2].members[1]
  (1, Contribution(replica=1, step=2, base=0, inner_steps=2))
  >>> tape[3]
  Merged(tick=4, replica=0, step=2, version=1, heal=False)
"""

from __future__ import annotations

import dataclasses
import heapq
from typing import ClassVar, NamedTuple

from diloco_core.spec import validity as v
from diloco_core.spec.quorum_close import close_time
from diloco_core.spec.syncer import SyncerConfig

__all__ = ["Committed", "Contribution", "Dropped", "Joined", "Lost", "Merged", "Sent", "commit_ticks", "simulate_tape"]


class Contribution(NamedTuple):
  """A round's member: who sent it, at which local step, from which version, summing how many steps."""

  replica: int
  step: int
  base: int
  inner_steps: int


@dataclasses.dataclass(frozen=True)
class Lost:
  """Replica ``replica`` stopped at ``tick``; ``step``: its local steps sent so far."""

  KIND: ClassVar[int] = 0
  tick: int
  replica: int
  step: int


@dataclasses.dataclass(frozen=True)
class Joined:
  """Replica ``replica`` came back at ``tick``; it resumes from local step ``step``."""

  KIND: ClassVar[int] = 1
  tick: int
  replica: int
  step: int


@dataclasses.dataclass(frozen=True)
class Sent:
  """Replica ``replica`` sent its contribution after local step ``step``, based on version ``base``."""

  KIND: ClassVar[int] = 2
  tick: int
  replica: int
  step: int
  base: int


@dataclasses.dataclass(frozen=True)
class Dropped:
  """The contribution of ``replica`` sent after ``step`` (base ``base``) arrived ``staleness``
  versions late and was discarded."""

  KIND: ClassVar[int] = 3
  tick: int
  replica: int
  step: int
  base: int
  staleness: int


@dataclasses.dataclass(frozen=True)
class Committed:
  """Round ``version`` committed: the outer step on its ``members`` (arrival order) made it."""

  KIND: ClassVar[int] = 4
  tick: int
  version: int
  members: tuple[Contribution, ...]

  @property
  def replica(self) -> int:
    """A commit is the syncer's, so it sorts before the replicas' events of its kind (-1)."""
    return -1


@dataclasses.dataclass(frozen=True)
class Merged:
  """Replica ``replica``, at local step ``step``, merged global ``version`` (``heal``: replaced by it)."""

  KIND: ClassVar[int] = 5
  tick: int
  replica: int
  step: int
  version: int
  heal: bool


_ARRIVE = 3  # internal: a contribution reaches the syncer (recorded as a member or as Dropped)
_START = Joined.KIND  # internal: a replica's first period at tick 0 (after losses at tick 0)


def _check_events(name: str, events, replicas: int) -> list[tuple[int, int]]:
  out = []
  for item in events:
    if not (isinstance(item, tuple) and len(item) == 2):
      raise ValueError(f"{name} must be (tick, replica) pairs, got {item!r}.")
    tick = v.check_int(f"{name} tick", item[0], low=0)
    out.append((tick, v.check_int(f"{name} replica", item[1], low=0, high=replicas)))
  return out


def _check_alternation(losses, joins, replicas: int) -> None:
  """Per replica, in tick order: lost, joined, lost, ... (a join at the tick of its loss is refused)."""
  for m in range(replicas):
    times = sorted([(t, 0) for t, r in losses if r == m] + [(t, 1) for t, r in joins if r == m])
    alive = True
    for t, kind in times:
      if kind == 0 and not alive:
        raise ValueError(f"losses: replica {m} is lost at tick {t} but was already lost: give it a join"
                         " in between.")
      if kind == 1 and alive:
        raise ValueError(f"joins: replica {m} joins at tick {t} but is not lost then: give it an earlier loss.")
      alive = kind == 1


def simulate_tape(config: SyncerConfig, step_ticks, sync_every: int, total_steps: int, *,
             latency: int = 0, transfer: int = 0, losses=(), joins=()) -> tuple:
  """The tape of one run of the syncer rule in simulated time (module docstring).

  Args:
    config: the syncer's knobs (checked here, with M = ``len(step_ticks)``).
    step_ticks: each replica's inner-step time in ticks (integers >= 1).
    sync_every: H (the replicas' :math:`H_m` come from ``config.inner_steps_of``).
    total_steps: the local steps of all replicas together.
    latency: ticks of link latency, each way.
    transfer: ticks to carry one contribution (or one global version) over the link.
    losses: ``(tick, replica)`` pairs: the replica stops at that tick.
    joins: ``(tick, replica)`` pairs: a lost replica comes back and downloads the current version.

  Returns:
    The tape: a tuple of :class:`Lost`, :class:`Joined`, :class:`Sent`, :class:`Dropped`,
    :class:`Committed` and :class:`Merged`, sorted by ``(tick, KIND, replica)``.
  """
  if not isinstance(step_ticks, tuple) or not step_ticks:
    raise ValueError("step_ticks must be a non-empty tuple of ticks per inner step, one per replica,"
                     f" got {step_ticks!r}.")
  ticks = [v.check_int(f"step_ticks of replica {i}", t) for i, t in enumerate(step_ticks)]
  m_count = len(ticks)
  config.check(m_count, sync_every)
  v.check_int("total_steps", total_steps)
  link = v.check_int("latency", latency, low=0) + v.check_int("transfer", transfer, low=0)
  losses, joins = _check_events("losses", losses, m_count), _check_events("joins", joins, m_count)
  _check_alternation(losses, joins, m_count)
  return _Syncer(config, ticks, config.inner_steps_of(sync_every, m_count), total_steps, link).run(losses, joins)


class _Syncer:
  """The event loop of :func:`simulate_tape` (one instance per call)."""

  def __init__(self, config: SyncerConfig, ticks, inner_steps, budget: int, link: int) -> None:
    m_count = len(ticks)
    self.config, self.ticks, self.h, self.budget, self.link = config, ticks, inner_steps, budget, link
    self.quorum = config.quorum_of(m_count)
    self.reserved = 0
    self.alive = [True] * m_count
    self.epoch = [0] * m_count  # a loss cancels the replica's scheduled send and merge
    self.step = [0] * m_count  # local steps sent
    self.base = [0] * m_count  # the version the replica's current period started from
    self.period = [False] * m_count  # a reserved period not sent yet
    self.in_flight = [False] * m_count
    self.version = 0
    self.pending: list[tuple[Contribution, int, int]] = []  # with the epoch it was sent in, its arrival tick
    self.deadline: int | None = None
    self.queue: list = []
    self.seq = 0
    self.tape: list = []

  def push(self, tick: int, kind: int, replica: int, payload=None) -> None:
    heapq.heappush(self.queue, (tick, kind, replica, self.seq, payload))
    self.seq += 1

  def run(self, losses, joins) -> tuple:
    for tick, m in losses:
      self.push(tick, Lost.KIND, m)
    for tick, m in joins:
      self.push(tick, Joined.KIND, m, "join")
    for m in range(len(self.ticks)):
      self.push(0, _START, m, "start")
    handlers = {Lost.KIND: self.lose, Joined.KIND: self.join, Sent.KIND: self.send, _ARRIVE: self.arrive,
                Committed.KIND: self.commit, Merged.KIND: self.merge}
    while self.queue:
      tick, kind, m, _, payload = heapq.heappop(self.queue)
      handlers[kind](tick, m, payload)
    return tuple(self.tape)

  def reserve(self, m: int) -> None:
    """Reserves replica m's next period if the budget allows it."""
    self.period[m] = self.reserved + self.h[m] <= self.budget
    if self.period[m]:
      self.reserved += self.h[m]

  def start_period(self, tick: int, m: int) -> None:
    if self.period[m]:
      self.push(tick + self.h[m] * self.ticks[m], Sent.KIND, m, self.epoch[m])

  def lose(self, tick: int, m: int, _) -> None:
    self.alive[m], self.period[m] = False, False
    self.epoch[m] += 1
    self.tape.append(Lost(tick, m, self.step[m]))
    self.check_quorum(tick)

  def join(self, tick: int, m: int, how) -> None:
    if how == "start":
      if self.alive[m]:  # not lost at tick 0
        self.reserve(m)
        self.start_period(tick, m)
      return
    self.alive[m] = True
    self.reserve(m)
    self.tape.append(Joined(tick, m, self.step[m]))
    self.push(tick + self.link, Merged.KIND, m, (self.epoch[m], self.version, True))

  def send(self, tick: int, m: int, epoch) -> None:
    if epoch != self.epoch[m]:
      return
    self.step[m] += self.h[m]
    self.tape.append(Sent(tick, m, self.step[m], self.base[m]))
    self.in_flight[m] = True
    self.reserve(m)
    self.push(tick + self.link, _ARRIVE, m, (Contribution(m, self.step[m], self.base[m], self.h[m]), epoch))

  def arrive(self, tick: int, m: int, payload) -> None:
    c, epoch = payload  # the epoch it was sent in: its merge is void if the replica was lost since
    self.in_flight[m] = False
    staleness = self.version - c.base
    bound = self.config.max_staleness
    if staleness and (self.config.late == "drop" or (bound is not None and staleness > bound)):
      self.tape.append(Dropped(tick, m, c.step, c.base, staleness))
      self.push(tick + self.link, Merged.KIND, m, (epoch, self.version, True))
    else:
      self.pending.append((c, epoch, tick))
    self.check_quorum(tick)

  def check_quorum(self, tick: int) -> None:
    """Schedules the open round's commit at its closing time (:func:`~diloco_core.spec.quorum_close.close_time`
    over n, the module docstring), never before this tick; an arrival or a loss can only bring it forward."""
    if not self.pending:
      return
    members = {c.replica for c, _, _ in self.pending}
    n = sum(1 for m, up in enumerate(self.alive)
            if up and (self.period[m] or self.in_flight[m] or m in members))
    at = close_time([t for _, _, t in self.pending], n, self.quorum, self.config.grace)
    if at is not None and (self.deadline is None or max(at, tick) < self.deadline):
      self.deadline = max(at, tick)
      self.push(self.deadline, Committed.KIND, -1, self.version + 1)

  def commit(self, tick: int, _, version: int) -> None:
    if tick != self.deadline or version != self.version + 1:  # brought forward: this one is void
      return
    pending, self.pending, self.deadline = self.pending, [], None
    self.version = version
    self.tape.append(Committed(tick, version, tuple(c for c, _, _ in pending)))
    for c, epoch, _ in pending:
      self.push(tick + self.link, Merged.KIND, c.replica, (epoch, version, False))

  def merge(self, tick: int, m: int, payload) -> None:
    epoch, version, heal = payload
    if epoch != self.epoch[m]:
      return
    self.base[m] = version
    self.tape.append(Merged(tick, m, self.step[m], version, heal))
    self.start_period(tick, m)


def commit_ticks(tape) -> list[int]:
  """The tick of each :class:`Committed` event of ``tape``, in tape order (one per round).

  Examples:
    >>> from diloco_core.spec.syncer import SyncerConfig
    >>> commit_ticks(simulate_tape(SyncerConfig(), (1, 2), 2, 8))  # synchronous: the slow replica's pace
    [4, 8]
  """
  return [e.tick for e in tape if isinstance(e, Committed)]
