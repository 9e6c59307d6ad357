"""Elastic membership: which processes take part in a sync, agreed through JAX's coordination service.

An elastic run must go on when a process dies, and let a replacement in. On CPU a gloo
collective whose peer died cannot be cancelled (it waits for gloo's own timeout; JAX cancels
collectives in flight on GPUs only), and a restarted process cannot set up a gloo context under
the key its first incarnation left in the coordination service (``ALREADY_EXISTS: key
cpu:gloo/...``). So an elastic exchange crosses no gloo collective: it goes through the
coordination service that ``jax.distributed`` already runs (its key-value store and its
membership barrier), whose waits are bounded by the heartbeat.

One sync (:meth:`Membership.exchange`):

1. the process puts its payload (bytes) under ``<prefix>/<key>/<rank>``;
2. it calls the service's ``get_live_nodes`` over every process: a barrier over the *live*
   ones, which returns the same ``{process: incarnation}`` to each of them. A process that
   died is left out once the service stops hearing its heartbeat (``heartbeat_timeout_seconds``
   of ``jax.distributed.initialize``: the bounded wait); a process killed after step 1 is left
   out too (its payload is ignored), so every survivor agrees on the same contributors;
3. the contributors are the live processes with the incarnation they had at the previous
   agreement; a live process with a new incarnation (a replacement that called
   :meth:`Membership.enter`) *joins* at this sync: it sends nothing now and receives what it
   needs from the leader (the lowest contributor, :meth:`Membership.send_heal`);
4. it reads every contributor's payload (they were put before the barrier: each is there).

The coordination service must run with ``jax_enable_recoverability`` (see
:func:`diloco_core.processes.initialize_distributed`): without it, the service ends every
process when one misses its heartbeat. The process hosting the service (process 0) cannot be
lost. The payloads cross the service (one host), so this suits small payloads and tests of
the mechanism; collectives over the live devices, cancelled when a peer dies, are the GPU path.

Examples:
  >>> agreement = Agreement("sync/4", members=(0, 2), joined=(1,), lost=(), payloads={0: b"a", 2: b"b"},
  ...                       incarnations={0: 7, 1: 9, 2: 8})
  >>> agreement.leader, agreement.present(3).tolist()
  (0, [1.0, 0.0, 1.0])
"""

from __future__ import annotations

import dataclasses
import struct

import jax
import numpy as np

#: Seconds a process waits for a contributor's payload once the barrier has passed (it was put
#: before the barrier, so only a lost coordination service makes this wait expire).
PAYLOAD_TIMEOUT_S = 60.0
#: Seconds a replacement waits for the leader's heal data after it entered.
HEAL_TIMEOUT_S = 120.0
#: The key-value prefix of the membership's keys.
PREFIX = "diloco/elastic"


class MembershipError(ConnectionError):
  """The coordination service could not complete an agreement (it was lost, or a key timed out)."""


@dataclasses.dataclass(frozen=True)
class Agreement:
  """What every live process agreed on at one sync.

  Attributes:
    key: the sync's name (the same on every process, e.g. ``"fragment 1 @ step 6"``).
    members: the processes whose payloads count (sorted): live, with the incarnation they had at
      the previous agreement.
    joined: live processes with a new incarnation: replacements that get the heal now and
      count from the next sync.
    lost: processes of the previous agreement that are gone (dead, or restarted: a restarted
      process is lost and joined at once).
    payloads: ``{process: bytes}`` of the members (empty for :meth:`Membership.enter`).
    incarnations: ``{process: incarnation}`` of every live process.
  """

  key: str
  members: tuple[int, ...]
  joined: tuple[int, ...]
  lost: tuple[int, ...]
  payloads: dict
  incarnations: dict

  @property
  def leader(self) -> int:
    """The member that sends the heal to the joiners (the lowest)."""
    return min(self.members)

  def present(self, processes: int) -> np.ndarray:
    """The float32 ``[processes]`` mask of the members (1 counts, 0 does not)."""
    mask = np.zeros(processes, np.float32)
    mask[list(self.members)] = 1.0
    return mask


def _client():
  from jax._src import distributed  # the coordination service's client (no public accessor)
  client = distributed.global_state.client
  if client is None:
    raise RuntimeError("elastic membership needs jax.distributed (initialize_distributed) first.")
  return client


class Membership:
  """The elastic agreements of one process, in the order every process makes them.

  Call :meth:`enter` once at start (every process, or a replacement), then :meth:`exchange` at
  each sync, from one thread, in the same order on every process.

  Args:
    prefix: the key-value prefix (two memberships of one run need two prefixes).
    payload_timeout_s: :data:`PAYLOAD_TIMEOUT_S`.
    client: the coordination service's client (tests); default: ``jax.distributed``'s.
  """

  def __init__(self, prefix: str = PREFIX, payload_timeout_s: float = PAYLOAD_TIMEOUT_S, client=None):
    self.prefix, self.payload_timeout_s = prefix, payload_timeout_s
    self._client = client or _client()
    self.rank, self.processes = jax.process_index(), jax.process_count()
    self._known: dict[int, int] | None = None  # {process: incarnation} of the last agreement
    self._last_key: str | None = None
    #: Whether :meth:`enter` found the run started: this process is a replacement.
    self.rejoined = False

  def _barrier(self) -> dict[int, int]:
    try:
      return {int(r): int(i) for r, i in self._client.get_live_nodes(list(range(self.processes))).items()}
    except Exception as e:  # noqa: BLE001 - the service itself gone
      raise MembershipError(f"the membership barrier failed: the coordination service was lost ({_first_line(e)})") from None

  @classmethod
  def entered(cls, **kwargs) -> "Membership":
    """A membership that has made its first agreement (:meth:`enter`)."""
    membership = cls(**kwargs)
    membership.enter()
    return membership

  def enter(self) -> Agreement:
    """The first agreement of this process: at start (every process calls it, everyone is a
    member), or as a replacement (the others are at a sync: they see it join there; then
    :attr:`rejoined` is True and :meth:`receive_heal` gives what the leader sent)."""
    self.rejoined = _try_get(self._client, f"{self.prefix}/started") is not None
    live = self._barrier()
    self._known = live
    if not self.rejoined and self.rank == min(live):
      self._client.key_value_set(f"{self.prefix}/started", "1", allow_overwrite=True)
    return Agreement("enter", tuple(sorted(live)), (), (), {}, dict(live))

  def exchange(self, key: str, payload: bytes) -> Agreement:
    """One sync: puts ``payload``, agrees on the live processes, reads the members' payloads.

    Args:
      key: the sync's name, the same on every process (no ``/``).
      payload: this process's bytes.

    Returns:
      The :class:`Agreement` (this process is always among its members).

    Raises:
      MembershipError: the coordination service was lost, or a member's payload did not come.
    """
    if self._known is None:
      raise RuntimeError("call Membership.enter() before the first exchange.")
    client = self._client
    client.key_value_set_bytes(f"{self.prefix}/{key}/{self.rank}", payload, allow_overwrite=True)
    live = self._barrier()
    known = self._known
    members = tuple(r for r in sorted(live) if known.get(r) == live[r])
    joined = tuple(r for r in sorted(live) if known.get(r) != live[r])
    lost = tuple(r for r in sorted(known) if live.get(r) != known[r])
    payloads = {}
    for r in members:
      try:
        payloads[r] = client.blocking_key_value_get_bytes(f"{self.prefix}/{key}/{r}", int(self.payload_timeout_s * 1000))
      except Exception as e:  # noqa: BLE001
        raise MembershipError(f"process {r}'s payload of {key!r} did not come within"
                              f" {self.payload_timeout_s:g} s ({_first_line(e)})") from None
    if self._last_key is not None:  # everyone has read it: they all passed this barrier
      _delete(client, f"{self.prefix}/{self._last_key}/{self.rank}")
    self._known, self._last_key = live, key
    return Agreement(key, members, joined, lost, payloads, dict(live))

  def send_heal(self, agreement: Agreement, data: bytes) -> None:
    """The leader's heal for each process that joined at ``agreement``: ``data`` (what it needs
    to continue) under a key of the joiner's incarnation."""
    for r in agreement.joined:
      self._client.key_value_set_bytes(f"{self.prefix}/heal/{r}/{agreement.incarnations[r]}",
                                       _frame(agreement.key, data), allow_overwrite=True)

  def receive_heal(self, timeout_s: float = HEAL_TIMEOUT_S) -> tuple[str, bytes]:
    """A replacement's heal: ``(key of the sync it joined at, data)``, after :meth:`enter`."""
    incarnation = self._known[self.rank]
    try:
      raw = self._client.blocking_key_value_get_bytes(f"{self.prefix}/heal/{self.rank}/{incarnation}",
                                                      int(timeout_s * 1000))
    except Exception as e:  # noqa: BLE001
      raise MembershipError(f"no live process sent this replacement its state within {timeout_s:g} s"
                            f" ({_first_line(e)})") from None
    return _unframe(raw)


def _try_get(client, key: str) -> bytes | None:
  """The value under ``key``, or None when there is none (the service raises NOT_FOUND)."""
  try:
    return client.key_value_try_get_bytes(key)
  except Exception:  # noqa: BLE001 - NOT_FOUND
    return None


def _delete(client, key: str) -> None:
  try:
    client.key_value_delete(key)
  except Exception:  # noqa: BLE001 - already gone: nothing to free
    pass


def _first_line(e: Exception) -> str:
  return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def _frame(key: str, data: bytes) -> bytes:
  """``key`` and ``data`` in one value: the key's length (4 bytes), the key, the data.

  Examples:
    >>> _unframe(_frame("fragment 0 @ step 4", b"xyz"))
    ('fragment 0 @ step 4', b'xyz')
  """
  k = key.encode()
  return struct.pack("<I", len(k)) + k + data


def _unframe(raw: bytes) -> tuple[str, bytes]:
  (n,) = struct.unpack("<I", raw[:4])
  return raw[4:4 + n].decode(), raw[4 + n:]
