"""Elastic membership: which processes take part in a sync, agreed through JAX's coordination service.

An elastic run must go on when a process dies, and let a replacement in. On CPU a gloo
collective whose peer died cannot be cancelled (it waits for gloo's own timeout; JAX cancels
collectives in flight on GPUs only), and a restarted process cannot set up a gloo context under
the key its first incarnation left in the coordination service (``ALREADY_EXISTS: key
cpu:gloo/...``). So an elastic exchange crosses no gloo collective: the agreement on who takes
part goes through the coordination service that ``jax.distributed`` already runs (its key-value
store and its membership barrier, whose waits are bounded by the heartbeat), and the payloads go
peer to peer over the data plane (:mod:`~diloco_core.runtime.data_plane`, ZeroMQ), whose waits
are bounded too. The service carries a few bytes per process and sync: markers, addresses, the
run's token, the quorum's decision, a replacement's status.

One sync (:meth:`Membership.exchange`):

1. the process sends its payload (bytes) to every process of the last agreement over the data
   plane and waits until each acknowledged it whole (or its connection dropped: a killed peer);
   then it puts a marker under ``<prefix>/<key>/<rank>`` (the payload's length; empty: nothing);
2. it calls the service's ``get_live_nodes`` over every process: a barrier over the *live*
   ones, which returns the same ``{process: incarnation}`` to each of them. A process that
   died is left out once the service stops hearing its heartbeat (``heartbeat_timeout_seconds``
   of ``jax.distributed.initialize``: the bounded wait); a process killed after step 1, or in
   the middle of sending its payload, is left out too (what it sent is dropped), so every
   survivor agrees on the same contributors;
3. the contributors (*members*) are the live processes with the incarnation they had at the
   previous agreement and a non-empty marker; a live process with a new incarnation (a
   replacement that called :meth:`Membership.enter`) *joins* at this sync;
4. it takes every contributor's payload from its data plane (each was acknowledged before its
   sender's barrier: it is there, unless a peer was cut off without dying).

Steps 2 and 3 alone are :meth:`Membership.agree` (a barrier with a marker of a few bytes), on
which :mod:`~diloco_core.runtime.plane_reduce` builds a sync that reduces instead of gathering.

**A replacement** must take part in every barrier from its first on (the barrier waits for
every live process: from its connection on, so it enters at once, :func:`process_membership`,
and a thread takes part while it builds and compiles), but has no state yet. The leader (the lowest member of the agreement it
joined at) writes, before each of its next barriers, a status for it: "take part in agreement
*key* with nothing" (an empty payload: no contribution), until the trainer hands the leader
its heal (the trainer waits until the replacement said it is ready, :meth:`Membership.mark_ready`) (:meth:`Membership.send_heal`, at a point where nothing of the leader is in flight);
the leader then sends the heal over the data plane, and the next status says "heal": that
agreement is the replacement's first as a member (:meth:`Membership.wait_for_heal`). Every
process reads the same markers, so every process agrees on who counted, at every agreement.

The coordination service must run with ``jax_enable_recoverability`` (see
:func:`diloco_core.devices.processes.initialize_distributed`): without it, the service ends every
process when one misses its heartbeat. The process hosting the service (process 0) cannot be
lost unless the service runs in a process of its own. No payload crosses the service, so no
value approaches its 2 GiB limit: the largest elastic run is bounded by memory (which the
pre-flight checks); ``benchmarks/elastic_path.py`` times the data plane beside gloo.

Examples:
  >>> agreement = Agreement("sync/4", members=(0, 2), joined=(1,), lost=(), payloads={0: b"a", 2: b"b"},
  ...                       incarnations={0: 7, 1: 9, 2: 8})
  >>> agreement.leader, agreement.present(3).tolist()
  (0, [1.0, 0.0, 1.0])
"""

from __future__ import annotations

import dataclasses
import threading

import jax

from diloco_core.runtime.agreement import Agreement, delete_key, first_line, frame, marker_of, try_get, unframe
from diloco_core.runtime.data_plane import DataPlane, PlaneTimeout, bind_host, coordinator_address, run_token

#: Seconds a process waits for a contributor's payload once the barrier has passed (it was
#: acknowledged before the barrier, so only a peer cut off without dying makes this wait expire),
#: and for its own payload's acknowledgements.
PAYLOAD_TIMEOUT_S = 60.0
#: Seconds a process waits for a new peer's data plane address (put right after its first barrier).
ADDRESS_TIMEOUT_S = 30.0
#: Seconds a replacement waits for the leader's heal data after it entered.
HEAL_TIMEOUT_S = 120.0
#: The key-value prefix of the membership's keys.
PREFIX = "diloco/elastic"


class MembershipError(ConnectionError):
  """The coordination service could not complete an agreement (it was lost, or a key timed out)."""


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
    chunk: the data plane's bytes per chunk (default:
      :func:`~diloco_core.runtime.data_plane.chunk_bytes`).
  """

  def __init__(self, prefix: str = PREFIX, payload_timeout_s: float = PAYLOAD_TIMEOUT_S, client=None,
               chunk: int | None = None):
    self.prefix, self.payload_timeout_s, self._chunk = prefix, payload_timeout_s, chunk
    self._client = client or _client()
    self.plane: DataPlane | None = None  # this process's end of the data plane, from enter()
    self._addresses: dict[int, tuple[int, str]] = {}  # the peers' (incarnation, data plane address)
    self.rank, self.processes = jax.process_index(), jax.process_count()
    self._known: dict[int, int] | None = None  # {process: incarnation} of the last agreement
    self.incarnation: int | None = None  # this process's, from enter()
    self._last_key: str | None = None
    self._to_free: list[str] = []  # keys of this process's votes, freed at the next barrier
    #: Whether :meth:`enter` found the run started: this process is a replacement.
    self.rejoined = False
    #: The leader's replacements waiting for their heal: ``{process: [incarnation, statuses told]}``.
    self.pending: dict[int, list[int]] = {}
    self._heals: dict[int, bytes] = {}
    self._heal_wait: tuple[threading.Thread, list] | None = None  # start_waiting_for_heal's thread, result

  @property
  def client(self):
    """The coordination service's client."""
    return self._client

  @property
  def live(self) -> dict[int, int]:
    """``{process: incarnation}`` of the processes live at the last agreement."""
    return dict(self._known or {})

  def free_later(self, *keys: str) -> None:
    """Keys (a vote's, :mod:`~diloco_core.runtime.quorum`) deleted after the next barrier."""
    self._to_free.extend(keys)

  def _barrier(self) -> dict[int, int]:
    try:
      return {int(r): int(i) for r, i in self._client.get_live_nodes(list(range(self.processes))).items()}
    except Exception as e:  # noqa: BLE001 - the service itself gone
      raise MembershipError(f"the membership barrier failed: the coordination service was lost ({first_line(e)})") from None

  @classmethod
  def entered(cls, **kwargs) -> "Membership":
    """A membership that has made its first agreement (:meth:`enter`)."""
    membership = cls(**kwargs)
    membership.enter()
    return membership

  def enter(self) -> Agreement:
    """The first agreement of this process: at start (every process calls it, everyone is a
    member), or as a replacement (the others are at a sync: they see it join there; then
    :attr:`rejoined` is True and :meth:`wait_for_heal` gives what the leader sent)."""
    self.rejoined = try_get(self._client, f"{self.prefix}/started") is not None
    live = self._barrier()
    self._known, self.incarnation = live, live[self.rank]
    if self.plane is None:
      self.plane = DataPlane(self.rank, self.incarnation, run_token(self._client, self.prefix),
                             bind_host(coordinator_address()), self._chunk)
    self.plane.set_peers({r: (i, None) for r, i in live.items()})  # accepted before anyone can send
    self._client.key_value_set(f"{self.prefix}/plane/{self.rank}/{self.incarnation}", self.plane.address,
                               allow_overwrite=True)
    if not self.rejoined and self.rank == min(live):
      self._client.key_value_set(f"{self.prefix}/started", "1", allow_overwrite=True)
    self._update_peers(live)
    return Agreement("enter", tuple(sorted(live)), (), (), {}, dict(live))

  def _update_peers(self, live: dict[int, int]) -> None:
    """The data plane's peers: the live processes (accepted at once), at the addresses their
    incarnations put (sent to once read)."""
    peers = lambda: {r: (i, self._addresses[r][1] if self._addresses.get(r, (None,))[0] == i else None)
                     for r, i in live.items()}
    self.plane.set_peers(peers())
    for r, incarnation in live.items():
      if r != self.rank and self._addresses.get(r, (None,))[0] != incarnation:
        key = f"{self.prefix}/plane/{r}/{incarnation}"
        try:
          address = self._client.blocking_key_value_get_bytes(key, int(ADDRESS_TIMEOUT_S * 1000))
        except Exception:  # noqa: BLE001 - lost right after its first barrier: nothing to send it
          continue
        self._addresses[r] = (incarnation, bytes(address).decode())
    self.plane.set_peers(peers())

  def send(self, key: str, payload: bytes, to=None) -> tuple[int, ...]:
    """Sends ``payload`` under ``key`` over the data plane to the processes ``to`` (default: the
    others of the last agreement); returns those that acknowledged it."""
    to = [r for r in (self._known if to is None else to) if r != self.rank]
    return self.plane.send(key, payload, to, self.payload_timeout_s)

  def send_each(self, key: str, payloads: dict) -> tuple[int, ...]:
    """Sends each process of ``payloads`` (``{process: bytes}``) its own payload under ``key``;
    returns those that acknowledged it."""
    return self.plane.send_each(key, {r: x for r, x in payloads.items() if r != self.rank}, self.payload_timeout_s)

  def take(self, key: str, sender: int | None, watch: bool = False) -> bytes:
    """``sender``'s payload of ``key`` from the data plane (None: any sender's; ``watch``: give
    up as soon as the connection this process opened to ``sender`` dropped).

    Raises:
      MembershipError: it did not come within the payload timeout, or (``watch``) its sender is gone.
    """
    try:
      return self.plane.take(key, sender, self.payload_timeout_s, watch)
    except PlaneTimeout as e:
      raise MembershipError(f"{e} (a peer was lost or cut off during the transfer)") from None

  def finish(self, key: str) -> None:
    """``key``'s agreement is over on this process: its data plane drops what comes later."""
    self.plane.finish(key)

  def close(self) -> None:
    """Closes the data plane (its thread and sockets); the membership cannot exchange after it."""
    if self.plane is not None:
      self.plane.close()

  def exchange(self, key: str, payload: bytes) -> Agreement:
    """One sync: sends ``payload``, agrees on the live processes, takes the members' payloads.

    Args:
      key: the sync's name, the same on every process (no ``/``).
      payload: this process's bytes (empty: a replacement waiting for its heal takes part in
        the barrier without counting).

    Returns:
      The :class:`~diloco_core.runtime.agreement.Agreement`.

    Raises:
      MembershipError: the coordination service was lost, or a member's payload did not come.
    """
    if self._known is None:
      raise RuntimeError("call Membership.enter() before the first exchange.")
    self.tell_joiners(key)
    if payload:
      self.send(key, payload)
    agreement = self.agree(key, marker_of(payload))
    payloads = {}
    if payload:  # one that sends nothing reads nothing (it was not sent the others' payloads)
      payloads = {r: payload if r == self.rank else self.take(key, r) for r in agreement.members}
    self.finish(key)
    return dataclasses.replace(agreement, payloads=payloads)

  def agree(self, key: str, marker: bytes) -> Agreement:
    """One barrier: puts ``marker`` under ``<prefix>/<key>/<rank>``, passes the service's barrier
    over the live processes, reads the markers of those with their previous incarnation.

    Args:
      key: the barrier's name, the same on every process (no ``/``).
      marker: a few bytes (empty: this process takes part without counting).

    Returns:
      The :class:`~diloco_core.runtime.agreement.Agreement` (no payloads): its members put a non-empty marker.

    Raises:
      MembershipError: the coordination service was lost, or a marker did not come.
    """
    client = self._client
    client.key_value_set_bytes(f"{self.prefix}/{key}/{self.rank}", marker, allow_overwrite=True)
    live = self._barrier()
    known = self._known
    joined = tuple(r for r in sorted(live) if known.get(r) != live[r])
    lost = tuple(r for r in sorted(known) if live.get(r) != known[r])
    markers = {}
    for r in (r for r in sorted(live) if known.get(r) == live[r]):
      try:
        markers[r] = bytes(client.blocking_key_value_get_bytes(f"{self.prefix}/{key}/{r}",
                                                               int(self.payload_timeout_s * 1000)))
      except Exception as e:  # noqa: BLE001
        raise MembershipError(f"process {r}'s marker of {key!r} did not come within"
                              f" {self.payload_timeout_s:g} s ({first_line(e)})") from None
    if self._last_key is not None:  # everyone has read it: they all passed this barrier
      delete_key(client, f"{self.prefix}/{self._last_key}/{self.rank}")
    for k in self._to_free:  # the votes before this barrier: every process read them before it
      delete_key(client, k)
    self._to_free = []
    self._known, self._last_key = live, key
    if joined or lost:
      self._update_peers(live)
    members = tuple(r for r, m in markers.items() if m)  # an empty marker: a replacement not healed yet
    agreement = Agreement(key, members, joined, lost, {}, dict(live), markers)
    if joined and marker and self.rank == agreement.leader:  # the leader heals them (send_heal)
      self.pending.update({r: [live[r], 0] for r in joined})
    return agreement

  def tell_joiners(self, key: str, heal: bool = True) -> None:
    """The leader, before each barrier: tells each replacement waiting for its heal what this
    barrier is (take part with nothing), or that its heal is there (its first agreement as a
    member is this one; only with ``heal``: the first barrier of a sync or exchange)."""
    for r, (incarnation, n) in list(self.pending.items()):
      status = f"{self.prefix}/status/{r}/{incarnation}/{n}"
      if heal and r in self._heals:
        self.send(f"heal/{r}/{incarnation}", frame(key, self._heals.pop(r)), to=[r])
        self._client.key_value_set(status, "heal", allow_overwrite=True)
        del self.pending[r]
      else:
        self._client.key_value_set(status, "key:" + key, allow_overwrite=True)
        self.pending[r][1] = n + 1

  def send_heal(self, process: int, data: bytes) -> None:
    """The leader: ``data`` (what the replacement ``process`` needs to continue) goes with its
    next agreement, the replacement's first as a member. Call it when nothing of this process
    is in flight: the next :meth:`exchange` is then the next sync of the schedule."""
    self._heals[process] = data

  def wait_for_heal(self, timeout_s: float = HEAL_TIMEOUT_S) -> tuple[str, bytes]:
    """A replacement, after :meth:`enter`: takes part (with nothing) in the agreements the
    leader names until its heal comes; returns ``(key of its first agreement as a member,
    data)``: the caller's next :meth:`exchange` must be that one."""
    incarnation, n = self._known[self.rank], 0
    while True:
      status = self._get(f"{self.prefix}/status/{self.rank}/{incarnation}/{n}", timeout_s).decode()
      if status == "heal":
        try:
          return unframe(bytes(self.plane.take(f"heal/{self.rank}/{incarnation}", None, timeout_s)))
        except PlaneTimeout as e:
          raise MembershipError(f"the heal did not come: {e}") from None
      if status == "ended":
        raise MembershipError("the run ended before this replacement could join it.")
      self.exchange(status.removeprefix("key:"), b"")
      n += 1

  def start_waiting_for_heal(self, timeout_s: float = HEAL_TIMEOUT_S) -> None:
    """A replacement: :meth:`wait_for_heal` on a thread, so that it takes part in every
    agreement (with nothing) from now on while the process builds and compiles its programs;
    the others' barriers then never wait for its start. :meth:`heal` gives the result."""
    box: list = []

    def run():
      try:
        box.append(("ok", self.wait_for_heal(timeout_s)))
      except BaseException as e:  # noqa: BLE001 - handed to heal()
        box.append(("error", e))
    thread = threading.Thread(target=run, daemon=True, name="diloco-heal-wait")
    thread.start()
    self._heal_wait = (thread, box)

  def heal(self) -> tuple[str, bytes]:
    """A replacement: what :meth:`wait_for_heal` returns, from the thread of
    :meth:`start_waiting_for_heal` (started now if it was not)."""
    if self._heal_wait is None:
      self.start_waiting_for_heal()
    thread, box = self._heal_wait
    thread.join()
    kind, value = box[0]
    if kind == "error":
      raise value
    return value

  def mark_ready(self) -> None:
    """A replacement: it is ready to count (its programs are compiled); the leader heals it at
    its next heal point (:meth:`ready`)."""
    self._client.key_value_set(f"{self.prefix}/ready/{self.rank}/{self.incarnation}", "1", allow_overwrite=True)

  def ready(self, process: int) -> bool:
    """The leader: whether the replacement ``process`` waiting for its heal is ready
    (:meth:`mark_ready`; no wait)."""
    return try_get(self._client, f"{self.prefix}/ready/{process}/{self.pending[process][0]}") is not None

  def release(self) -> None:
    """The leader, at its end: tells the replacements still waiting that the run ended."""
    for r, (incarnation, n) in self.pending.items():
      self._client.key_value_set(f"{self.prefix}/status/{r}/{incarnation}/{n}", "ended", allow_overwrite=True)
    self.pending.clear()

  def _get(self, key: str, timeout_s: float) -> bytes:
    try:
      return self._client.blocking_key_value_get_bytes(key, int(timeout_s * 1000))
    except Exception as e:  # noqa: BLE001
      raise MembershipError(f"no live process answered this replacement within {timeout_s:g} s (at {key}:"
                            f" {first_line(e)})") from None


_PROCESS: Membership | None = None


def process_membership() -> Membership:
  """This process's membership (an elastic run has one): entered at the first call, which the
  command line makes right after joining the coordination service. A replacement then takes
  part in the agreements at once (:meth:`Membership.start_waiting_for_heal`): the others wait
  for it only from its connection to its first barrier, not while it builds and compiles."""
  global _PROCESS
  if _PROCESS is None:
    _PROCESS = Membership.entered()
    if _PROCESS.rejoined:
      _PROCESS.start_waiting_for_heal()
  return _PROCESS


def close_process_membership() -> None:
  """Closes this process's membership (:func:`process_membership`) if any: its data plane ends."""
  global _PROCESS
  if _PROCESS is not None:
    _PROCESS.close()
    _PROCESS = None
