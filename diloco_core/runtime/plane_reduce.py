"""An elastic sync as a reduce-scatter over the data plane: O(payload) per process, a lost owner retried.

With ``elastic`` and ``reduction="reduce-scatter"`` a sync is not an exchange of whole payloads
(:meth:`~diloco_core.runtime.membership.Membership.exchange`, where each process receives the
:math:`K - 1` payloads of the others) but the reduction of :mod:`~diloco_core.wire.reduce_scatter`
over the sync's K members, peer to peer over the data plane (:mod:`~diloco_core.runtime.data_plane`):

1. **Agree.** One barrier (:meth:`~diloco_core.runtime.membership.Membership.agree`): the members
   are the live processes with their previous incarnation that put a marker, in rank order.
2. **Reduce-scatter.** The payload's elements are cut into K chunks on scaling-unit boundaries
   (:class:`~diloco_core.wire.reduce_scatter.ChunkPlan`); the j-th member owns chunk j, and
   each member sends each owner its replicas' rows of that chunk, packed to the wire format.
3. **Re-quantized mean.** Each owner averages its chunk over the M replicas, the replicas of
   the processes left out counting as dropped (the masked mean of ``drop_schedule``,
   :func:`~diloco_core.algorithm.phases.present_mean`, in replica order), and re-quantizes it.
4. **All-gather.** Each owner sends its packed reduced chunk to every member.
5. **Commit.** One more barrier: each member puts ``ok`` when it holds every reduced chunk,
   ``again`` otherwise. The sync commits when every member is still live and said ``ok``.
   Otherwise the members still live start again from 2 (each still holds its payload), with
   the chunks re-cut for them, at most :data:`MAX_ATTEMPTS` times. Every process reads the same
   markers, so every process commits the same attempt, with the same members.

The outer gradient is :math:`Q\\big(\\frac{M}{|S|}\\,\\frac1M \\sum_{m \\in S} Q(\\Delta_m)\\big)`
over the replicas S of the committing attempt's members: what the in-step runtime computes for
that sync with the others dropped (``reduction="reduce-scatter"`` cuts on the format's scaling
units, so the second :math:`Q` does not depend on K), so the run equals its trace replayed
in-step (:func:`~diloco_core.run.drops.schedule_from_trace`), bit for bit.

**Bytes.** A member j with m replicas puts on the wire :math:`\\sum_{d \\ne j} m\\,b_d + (K - 1)\\,b_j`
and receives :math:`(K - 1)\\,m\\,b_j + \\sum_{d \\ne j} b_d` (:math:`b_d`: one packed row of chunk d):
with one replica per process and equal chunks, :math:`2 (K - 1) / K \\cdot V` each way for a
payload of V bytes, under :math:`2V` whatever K, where the exchange receives :math:`(K - 1)\\,V`.
The counters it returns count each byte a process originates once, as the link does
(:func:`~diloco_core.wire.reduce_scatter.traffic`). Unlike JAX's collectives, the data plane
moves each chunk at its own length: no padding.

**A lost peer.** Every wait is bounded: a take from a member whose connection dropped (a killed
process's socket closes at once) gives up at once, a silent one after the plane's timeout. A
member that misses a chunk still sends what the others wait for from it (an owner that lacks
its input sends an abort byte in place of its reduced chunk), so every survivor reaches the
commit barrier, whose wait for a dead process is bounded by the heartbeat. A replacement
waiting for its heal takes part in every barrier with nothing (the leader names each one,
:meth:`~diloco_core.runtime.membership.Membership.tell_joiners`).

Examples:
  Three processes, one replica each; process 2 was left out, so each replica present counts
  with weight :math:`M / |S| = 3/2` in the mean over all three rows (its row is ignored):

  >>> import numpy as np
  >>> rows = np.array([[1.0, 2.0], [3.0, 6.0], [np.nan, np.nan]], np.float32)
  >>> masked_mean(rows, np.array([1.0, 1.0, 0.0], np.float32)).tolist()
  [2.0, 4.0]
"""

from __future__ import annotations

import struct

import numpy as np

from diloco_core.algorithm.phases import present_mean
from diloco_core.runtime.agreement import Agreement
from diloco_core.runtime.background_programs import local_mean
from diloco_core.runtime.membership import MembershipError
from diloco_core.wire import reduce_scatter
from diloco_core.wire.packing import WireLayout

#: The most attempts of one sync (each after a member was lost or cut off during the last).
MAX_ATTEMPTS = 3
#: The commit markers: every reduced chunk is here, or not.
OK, AGAIN = b"ok", b"again"
#: The first byte of an owner's message in the all-gather: its reduced chunk follows, or it has none.
_CHUNK, _ABORT = b"\x01", b"\x00"


def masked_mean(rows, present):
  """The mean of ``rows`` ``[M, n]`` over the replicas ``present`` marks (``[M]``, 1 or 0):
  :func:`~diloco_core.algorithm.phases.present_mean`, the rule of both runtimes."""
  return present_mean([rows], present, present.shape[0], local_mean)[0]


def reduce_over_members(membership, key: str, rows: np.ndarray, layout: WireLayout,
                        replicas: int) -> tuple[np.ndarray, Agreement, int, int]:
  """One sync of an elastic run with ``reduction="reduce-scatter"`` (see the module).

  Args:
    membership: this process's :class:`~diloco_core.runtime.membership.Membership`.
    key: the sync's name, the same on every process (no ``/``).
    rows: this process's payload rows, float32 ``[m, elements]`` (values on the format's grid).
    layout: the payload's dense wire layout.
    replicas: M, every process's replicas together.

  Returns:
    ``(mean, agreement, sent, received)``: the re-quantized mean ``[1, elements]``; the
    committing attempt's :class:`~diloco_core.runtime.agreement.Agreement` (its members; every
    process joined or lost at any barrier of the sync); the payload bytes this process handed
    on (each counted once) and received, over every attempt.

  Raises:
    MembershipError: the service was lost, or :data:`MAX_ATTEMPTS` attempts did not commit.
  """
  membership.tell_joiners(key)
  agreement = membership.agree(key, struct.pack("<Q", rows.nbytes))
  joined, lost, sent, received = set(agreement.joined), set(agreement.lost), 0, 0
  for attempt in range(MAX_ATTEMPTS):
    members, sub = agreement.members, f"{key}~{attempt}"
    mean, s, r = _attempt(membership, sub, rows, layout, members, replicas)
    sent, received = sent + s, received + r
    membership.tell_joiners(f"{sub}~commit", heal=False)
    agreement = membership.agree(f"{sub}~commit", AGAIN if mean is None else OK)
    joined, lost = joined | set(agreement.joined), lost | set(agreement.lost)
    membership.finish(f"{sub}/rs")
    membership.finish(f"{sub}/ag")
    if all(agreement.markers.get(p) == OK for p in members):
      return mean, Agreement(key, members, tuple(sorted(joined)), tuple(sorted(lost)), {},
                             agreement.incarnations), sent, received
  raise MembershipError(f"the reduction of {key!r} did not complete in {MAX_ATTEMPTS} attempts (a peer was"
                        " cut off without dying)")


def _attempt(membership, sub: str, rows: np.ndarray, layout: WireLayout, members: tuple[int, ...],
             replicas: int) -> tuple[np.ndarray | None, int, int]:
  """One attempt over ``members``: the mean (None when a chunk did not come), bytes sent and received."""
  me, k = membership.rank, len(members)
  j, m = members.index(me), rows.shape[0]
  plan = reduce_scatter.chunk_plan(layout, k)
  chunks = reduce_scatter.scatter(rows, plan)
  mine = {owner: chunks[d] for d, owner in enumerate(members)}
  membership.send_each(f"{sub}/rs", mine)
  sent = sum(x.nbytes for p, x in mine.items() if p != me)
  got, ok = {me: chunks[j]}, True
  for p in members:
    if p != me:
      try:
        got[p] = np.frombuffer(membership.take(f"{sub}/rs", p, watch=True), np.uint8)  # no copy
      except MembershipError:
        ok = False
  received = sum(x.nbytes for p, x in got.items() if p != me)
  reduced = {}
  if ok:
    blank = np.zeros(m * plan.chunk(j).row_bytes, np.uint8)  # a process left out: masked away
    present = np.repeat(np.isin(np.arange(replicas // m), members).astype(np.float32), m)
    reduced[j], _ = reduce_scatter.reduce_owned([got.get(p, blank) for p in range(replicas // m)], plan, j,
                                                present, masked_mean)
  message = _CHUNK + reduced[j].tobytes() if ok else _ABORT
  membership.send_each(f"{sub}/ag", {p: message for p in members})
  sent += len(message) - 1  # counted once, as the link counts what it hands on
  for d, p in enumerate(members):
    if p == me:
      continue
    try:
      raw = memoryview(membership.take(f"{sub}/ag", p, watch=True))
    except MembershipError:
      ok = False
      continue
    if raw[:1] != _CHUNK:  # an owner that had no chunk to send
      ok = False
      continue
    reduced[d] = np.frombuffer(raw[1:], np.uint8)
    received += raw.nbytes - 1
  if not ok:
    return None, sent, received
  return reduce_scatter.assemble([reduced[d] for d in range(k)], plan), sent, received
