"""A K-of-M quorum over real processes: a sync decided in wall-clock time, a late process dropped.

With ``--communication background --elastic --quorum K [--grace-s G]`` each fragment sync of an
elastic run (:mod:`diloco_core.runtime.elastic`) is not an agreement over every live process
(:meth:`~diloco_core.runtime.membership.Membership.exchange`, whose barrier waits for the
slowest) but a *vote* (:func:`vote_exchange`) through the same coordination service:

1. each process sends its payload to every live process over the data plane
   (:meth:`~diloco_core.runtime.membership.Membership.send`: acknowledged), then puts a marker
   under ``<prefix>/<key>/in/<rank>`` (the payload is there before its marker);
2. while no decision is written, it reads the markers every :data:`POLL_S` seconds, noting when
   it first saw each (its own clock), and applies :func:`decide`, the closing rule of
   :mod:`~diloco_core.spec.quorum_close` that the simulated tape uses too: with ``n`` the processes
   whose markers it saw and :math:`t_{(k)}` the time it saw the k-th of them (k = the processes
   that hold K replicas, at most the live ones),

   .. math:: \\text{members} = \\begin{cases} \\text{all live} & \\text{every live process arrived}
      \\\\ \\text{those arrived} & n \\ge k \\text{ and } now \\ge t_{(k)} + G \\\\
      \\text{undecided} & \\text{otherwise;} \\end{cases}

3. the first process to reach a decision writes it under ``<prefix>/<key>/decision`` with the
   service's create-only set (a second writer fails and reads the first one's): exactly one
   decision per sync, whoever is slow, process 0 included;
4. every process reads the decision and takes the members' payloads from its data plane (each
   acknowledged before its marker was put).

A process whose marker missed the decision (*late*) reads the decision when it arrives and is
left out of that sync: its payload does not count, and the settle and merge heal its replicas
as a dropped replica's (the masked mean of ``drop_schedule``, docs/semantics.md). Each
process's ``settle`` row records the decision (``present``), so
:func:`~diloco_core.run.drops.schedule_from_trace` replays the run in-step, bit for bit; a
``quorum`` row records who arrived when, and who decided.

**The run's tape.** At the end of a quorum run the process that writes the run's files writes
``<out>/tape.json``, its own trace's settles as a syncer tape in ticks of local steps
(:mod:`~diloco_core.runtime.trace_tape`: a JSON object ``{"replicas", "sync_every", "events"}``);
the trainer's ``--tape`` replays it in-step, its drops as ``drop_schedule``
(:func:`~diloco_core.run.syncer_options.check_tape`; on a mesh of one replica per device, the
run bit for bit).

Log rows, checkpoints and the heals of replacements stay agreements over every live process
(a log row needs every replica's losses): a late process holds the others there. The keys a
vote puts are freed at the next such agreement (every process has read them by then).

Examples:
  >>> decide({0: 1.0, 1: 1.2}, live=(0, 1, 2), need=2, grace_s=0.5, now=1.3) is None  # grace open
  True
  >>> decide({0: 1.0, 1: 1.2}, live=(0, 1, 2), need=2, grace_s=0.5, now=1.7)
  (0, 1)
  >>> decide({0: 1.0, 1: 1.2, 2: 1.25}, live=(0, 1, 2), need=3, grace_s=0.0, now=1.25)
  (0, 1, 2)
"""

from __future__ import annotations

import dataclasses
import math
import time

from diloco_core.runtime.agreement import Agreement
from diloco_core.runtime.membership import MembershipError
from diloco_core.spec.quorum_close import closed

#: Seconds between two reads of a vote's markers.
POLL_S = 0.005


@dataclasses.dataclass(frozen=True)
class QuorumRule:
  """The quorum of an elastic run's syncs over real processes.

  Attributes:
    processes: k, the processes a sync waits for (those holding the run's K replicas).
    grace_s: G, seconds the sync stays open after the k-th arrived.
  """

  processes: int
  grace_s: float = 0.0

  @classmethod
  def of(cls, run, processes: int) -> "QuorumRule | None":
    """The rule of a run (``run.syncer.quorum`` K replicas, ``run.syncer.grace_s``) over
    ``processes`` processes, or None with no quorum below M (every sync a barrier).

    Examples:
      >>> from types import SimpleNamespace as NS
      >>> run = NS(algo=NS(replicas=6), syncer=NS(quorum=3, grace_s=0.5))
      >>> QuorumRule.of(run, processes=3)  # two replicas a process: K = 3 needs two processes
      QuorumRule(processes=2, grace_s=0.5)
    """
    m, k = run.algo.replicas, getattr(run.syncer, "quorum", None)
    if k is None or k >= m:
      return None
    return cls(math.ceil(k / max(m // processes, 1)), float(run.syncer.grace_s))


def decide(arrivals: dict, live, need: int, grace_s: float, now: float) -> tuple[int, ...] | None:
  """The members of a sync, decided at time ``now``, or None while it stays open.

  Args:
    arrivals: ``{process: time its payload was seen}`` (seconds, one clock).
    live: the processes the sync expects.
    need: k, the arrivals that close it (at most ``len(live)``).
    grace_s: G, seconds it stays open after the k-th arrival.
    now: the time of the decision.

  Returns:
    Those arrived, once the round is closed by :func:`~diloco_core.spec.quorum_close.close_time`
    (every live process arrived, or k did and G passed since the k-th; the simulated tape's rule);
    else None.
  """
  arrived = tuple(sorted(r for r in arrivals if r in set(live)))
  return arrived if closed([arrivals[r] for r in arrived], len(tuple(live)), need, grace_s, now) else None


def vote_exchange(membership, key: str, payload: bytes, rule: QuorumRule,
                  poll_s: float = POLL_S) -> tuple[Agreement, dict]:
  """One sync decided by ``rule`` (the module docstring) through ``membership``'s service.

  Args:
    membership: the process's :class:`~diloco_core.runtime.membership.Membership` (entered).
    key: the sync's name, the same on every process (no ``/``).
    payload: this process's bytes.
    rule: the quorum.
    poll_s: seconds between two reads of the markers.

  Returns:
    ``(agreement, row)``: the :class:`~diloco_core.runtime.agreement.Agreement` (the members
    and their payloads; no join or loss: those are seen at the next barrier) and the trace's
    ``quorum`` row (``members``, ``late``, ``arrived``: when this process saw each, ``decided``:
    whether it wrote the decision, ``start``, ``end``).

  Raises:
    MembershipError: no decision within the membership's payload timeout, or a member's
      payload did not come over the data plane.
  """
  client, rank, base = membership.client, membership.rank, f"{membership.prefix}/{key}"
  live = tuple(sorted(membership.live))
  need = min(rule.processes, len(live))
  start = time.time()
  membership.send(key, payload, to=live)
  client.key_value_set(f"{base}/in/{rank}", "1", allow_overwrite=True)
  membership.free_later(f"{base}/in/{rank}")
  arrivals: dict[int, float] = {}
  members, decided = None, False
  while members is None:
    raw = _try_get(client, f"{base}/decision")
    if raw is not None:
      members = tuple(int(r) for r in raw.decode().split(","))
      break
    now = time.time()
    for r in _arrived(client, f"{base}/in"):
      arrivals.setdefault(r, now)
    chosen = decide(arrivals, live, need, rule.grace_s, now)
    if chosen is not None:
      try:
        client.key_value_set(f"{base}/decision", ",".join(map(str, chosen)), allow_overwrite=False)
        members, decided = chosen, True
        membership.free_later(f"{base}/decision")
      except Exception:  # noqa: BLE001 - ALREADY_EXISTS: another process decided first (read it)
        continue
    elif now - start > membership.payload_timeout_s:
      raise MembershipError(f"the sync {key!r} did not gather {need} of the processes {list(live)} within"
                            f" {membership.payload_timeout_s:g} s (quorum)")
    else:
      time.sleep(poll_s)
  payloads = {rank: payload} if rank in members else {}
  for r in (r for r in members if r != rank):
    payloads[r] = membership.take(key, r)
  membership.finish(key)
  agreement = Agreement(key, members, (), (), payloads, dict(membership.live))
  row = {"kind": "quorum", "at": key, "members": list(members), "late": [r for r in live if r not in members],
         "arrived": {str(r): t for r, t in sorted(arrivals.items())}, "decided": decided, "start": start,
         "end": time.time()}
  return agreement, row


def _arrived(client, directory: str) -> list[int]:
  """The processes whose markers are under ``directory``."""
  try:
    return [int(k.rstrip("/").rsplit("/", 1)[-1]) for k, _ in client.key_value_dir_get(directory)]
  except Exception:  # noqa: BLE001 - nothing there yet
    return []


def _try_get(client, key: str) -> bytes | None:
  try:
    return client.key_value_try_get_bytes(key)
  except Exception:  # noqa: BLE001 - NOT_FOUND
    return None
