"""The elastic data plane: payloads sent peer to peer over ZeroMQ, every wait bounded.

An elastic run (:mod:`~diloco_core.runtime.elastic`) agrees on who takes part in each sync
through JAX's coordination service (:mod:`~diloco_core.runtime.membership`: membership,
incarnations, the quorum's decision, the heal's status, a few bytes each). The payloads (a
sync's rows, a log row's values, a checkpoint's rows, a replacement's heal) do not cross that
service: each process sends its own to the processes that need it, directly, through a
:class:`DataPlane`.

**Why ZeroMQ** (pyzmq over libzmq), measured before choosing: one 4 MiB-chunked payload from one
process to another on 127.0.0.1 of a 2-core CPU (median of 5, each until the receiver's
acknowledgement) took 0.8 / 9 / 32 ms for 1 / 16 / 64 MiB with ZeroMQ (about 1.4 / 1.8 / 2.1
GB/s) and 2.9 / 18 / 100 ms with gRPC streams (grpcio 1.85: 0.36 / 0.94 / 0.67 GB/s), whose
receiver also spent 3.5-4 times the CPU (several threads on a 2-core machine). ZeroMQ adds two
native I/O threads per process and no Python thread; gRPC about seven and a worker pool. Both
can listen on one address only.

**How a payload crosses.** Each process binds one ROUTER socket on one address (:func:`bind_host`:
the interface that reaches the coordinator, or ``DILOCO_PLANE_HOST``; never every interface) and
publishes it in the coordination service. :meth:`DataPlane.send` cuts the payload into chunks of
:func:`chunk_bytes` (``DILOCO_PLANE_CHUNK_BYTES``, default 1 MiB: with three processes on two
cores, 1 MiB chunks moved 4-64 MiB payloads 1.2-2 times faster than 4 MiB ones, the receiver
copying one chunk while the next crosses) and sends them on one DEALER socket per receiver
(each chunk copied once into its message: ZeroMQ's zero-copy sends would start pyzmq's
tracking thread, which outlives the run); each receiver's thread assembles them in place and
acknowledges the whole payload; the sender returns when every receiver acknowledged, or the
connection to it dropped (a killed peer's socket closes at once), or ``timeout_s`` passed.
:meth:`DataPlane.take` waits, bounded, for a sender's payload of a key. Each process thus sends
its payload :math:`N - 1` times and receives :math:`(N - 1)` payloads, the bytes of gloo's
all-gather, and no host carries more than its own share (through the service, process 0's
host carried :math:`N^2` payloads). With ``reduction="reduce-scatter"`` a sync sends each
receiver a payload of its own (:meth:`DataPlane.send_each`), and each process moves under two
payloads whatever N (:mod:`~diloco_core.runtime.plane_reduce`).

**Nobody else gets in.** Every message carries the run's token (random bytes that the first
process put in the coordination service, :func:`run_token`), the sender's process and
incarnation, and the agreement's key (:mod:`~diloco_core.runtime.plane_frames`). The receiving
thread drops, with one log line (:attr:`DataPlane.dropped`), a message that is malformed or
truncated, carries another token, comes from a process outside the current membership
(:meth:`DataPlane.set_peers`) or from a stale incarnation; nothing it receives can stop it.

**Nothing outlives the run.** :meth:`DataPlane.close` stops the thread and closes every socket
and the ZeroMQ context (its I/O threads end with it).

Examples:
  >>> a, b = DataPlane(0, 5, bytes(16)), DataPlane(1, 6, bytes(16), chunk=3)
  >>> a.set_peers({1: (6, b.address)}); b.set_peers({0: (5, a.address)})
  >>> b.send("sync-0", b"payload", to=[0])  # three chunks of 3, 3 and 1 bytes; acknowledged
  (0,)
  >>> bytes(a.take("sync-0", 1, timeout_s=5))
  b'payload'
  >>> a.close(); b.close()
"""

from __future__ import annotations

import collections
import ipaddress
import os
import socket
import sys
import threading
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

from diloco_core.runtime.plane_frames import ACK, PAYLOAD, FrameError, Header, decode, encode

#: Bytes of one chunk unless ``DILOCO_PLANE_CHUNK_BYTES`` says otherwise.
CHUNK_BYTES = 2**20
#: Keys remembered as finished (a late payload for one is acknowledged and dropped).
FINISHED_KEYS = 4096
#: Connection events that say a receiver is gone (a killed process's socket closes at once).
GONE_EVENTS = zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED | zmq.EVENT_CLOSED


class PlaneTimeout(ConnectionError):
  """A payload did not arrive in time (its sender was lost, or cut off)."""


def chunk_bytes(environ=os.environ) -> int:
  """The chunk size: ``DILOCO_PLANE_CHUNK_BYTES`` (whole bytes >= 1), default :data:`CHUNK_BYTES`.

  Examples:
    >>> chunk_bytes({}), chunk_bytes({"DILOCO_PLANE_CHUNK_BYTES": "4096"})
    (1048576, 4096)
    >>> chunk_bytes({"DILOCO_PLANE_CHUNK_BYTES": "1.5"})
    Traceback (most recent call last):
    ...
    ValueError: DILOCO_PLANE_CHUNK_BYTES must be a whole number of bytes >= 1, got '1.5'.
  """
  text = environ.get("DILOCO_PLANE_CHUNK_BYTES")
  if text is None:
    return CHUNK_BYTES
  if not text.strip().isdigit() or int(text) < 1:
    raise ValueError(f"DILOCO_PLANE_CHUNK_BYTES must be a whole number of bytes >= 1, got {text!r}.")
  return int(text)


def bind_host(coordinator: str | None, environ=os.environ) -> str:
  """The one address the data plane listens on: ``DILOCO_PLANE_HOST`` if set; else the local
  address of the route to the coordinator's host (127.0.0.1 for a coordinator on this host).

  Examples:
    >>> bind_host("127.0.0.1:1234"), bind_host(None), bind_host("x:1", {"DILOCO_PLANE_HOST": "10.0.0.2"})
    ('127.0.0.1', '127.0.0.1', '10.0.0.2')
  """
  if environ.get("DILOCO_PLANE_HOST"):
    return environ["DILOCO_PLANE_HOST"]
  host = (coordinator or "127.0.0.1").rsplit(":", 1)[0].strip("[]")
  try:
    if ipaddress.ip_address(socket.gethostbyname(host)).is_loopback:
      return "127.0.0.1"
  except (OSError, ValueError):
    return "127.0.0.1"
  with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:  # no packet is sent
    probe.connect((host, 9))
    return probe.getsockname()[0]


def coordinator_address() -> str | None:
  """The ``host:port`` this process joined ``jax.distributed`` at (None before it joined)."""
  from jax._src import distributed  # the coordinator's address (no public accessor)
  return getattr(distributed.global_state, "coordinator_address", None)


def run_token(client, prefix: str) -> bytes:
  """The run's 16-byte identity: the first process to ask puts random bytes (create-only) in
  the coordination service under ``<prefix>/plane/token``; every process reads the same."""
  key = f"{prefix}/plane/token"
  try:
    client.key_value_set_bytes(key, os.urandom(16), allow_overwrite=False)
  except Exception:  # noqa: BLE001 - ALREADY_EXISTS: another process put it first
    pass
  return bytes(client.blocking_key_value_get_bytes(key, 60_000))


class DataPlane:
  """One process's end of the data plane (the module docstring).

  Args:
    rank: this process.
    incarnation: this process's incarnation (the coordination service's).
    token: the run's identity (:func:`run_token`).
    host: the address to listen on (:func:`bind_host`).
    chunk: bytes per chunk (:func:`chunk_bytes`).
    log: called with each line about a dropped message (default: stderr).
  """

  def __init__(self, rank: int, incarnation: int, token: bytes, host: str = "127.0.0.1", chunk: int | None = None,
               log=None):
    self.rank, self.incarnation, self.token = rank, incarnation, token
    self.chunk = chunk or chunk_bytes()
    self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
    #: The lines about dropped messages, in order.
    self.dropped: list[str] = []
    self._ctx = zmq.Context(io_threads=1)
    self._router = self._ctx.socket(zmq.ROUTER)
    self._router.setsockopt(zmq.LINGER, 0)
    self._router.setsockopt(zmq.RCVHWM, 0)
    port = self._router.bind_to_random_port(f"tcp://{host}")
    #: Where the others send to (``tcp://host:port``).
    self.address = f"tcp://{host}:{port}"
    wake = f"inproc://diloco-plane-{id(self)}"
    self._wake_thread = self._ctx.socket(zmq.PAIR)
    self._wake_thread.bind(wake)
    self._wake = self._ctx.socket(zmq.PAIR)
    self._wake.connect(wake)
    self._peers: dict[int, tuple[int, str]] = {}  # rank -> (incarnation, address): who may send
    self._senders: dict[int, tuple[int, zmq.Socket, zmq.Socket]] = {}  # rank -> (incarnation, DEALER, monitor)
    self._gone: set[tuple[int, int]] = set()  # (rank, incarnation) whose connection dropped
    self._cond = threading.Condition()
    self._inbox: dict[tuple[str, int], bytearray] = {}  # (key, sender) -> a whole payload
    self._partial: dict[tuple[str, int, int], list] = {}  # (key, sender, incarnation) -> [buffer, bytes in]
    self._finished: collections.OrderedDict[str, None] = collections.OrderedDict()
    self._send_lock = threading.Lock()
    self._closed = False
    self._thread = threading.Thread(target=self._serve, name="diloco-plane", daemon=True)
    self._thread.start()

  # -- who may send and receive ---------------------------------------------------------------

  def set_peers(self, peers: dict[int, tuple[int, str]]) -> None:
    """The current membership's other processes, ``{rank: (incarnation, address)}``: only they
    may send to this process, and :meth:`send` reaches only them (an address None: not yet
    known; its messages are accepted, nothing is sent to it). A peer whose incarnation changed
    (a replacement) gets a new connection."""
    with self._cond:
      self._peers = {r: tuple(p) for r, p in peers.items() if r != self.rank}
    with self._send_lock:
      for r in [r for r, (inc, _, _) in self._senders.items() if self._peers.get(r, (None,))[0] != inc]:
        self._close_sender(r)

  def _sender(self, r: int):
    inc, address = self._peers[r]
    if r not in self._senders:
      dealer = self._ctx.socket(zmq.DEALER)
      for option, value in ((zmq.LINGER, 0), (zmq.SNDHWM, 0), (zmq.RCVHWM, 0)):
        dealer.setsockopt(option, value)
      monitor = dealer.get_monitor_socket(GONE_EVENTS)
      dealer.connect(address)
      self._senders[r] = (inc, dealer, monitor)
    return self._senders[r]

  def _close_sender(self, r: int) -> None:
    _, dealer, monitor = self._senders.pop(r)
    dealer.disable_monitor()
    monitor.close(linger=0)
    dealer.close(linger=0)

  # -- sending ----------------------------------------------------------------------------------

  def send(self, key: str, payload, to, timeout_s: float = 60.0) -> tuple[int, ...]:
    """Sends ``payload`` (bytes-like) under ``key`` to each process of ``to`` (members of
    :meth:`set_peers`), chunk by chunk, and waits until each acknowledged it whole, its
    connection dropped, or ``timeout_s`` passed.

    Returns:
      The processes that acknowledged (sorted).
    """
    return self.send_each(key, {r: payload for r in to}, timeout_s)

  def send_each(self, key: str, payloads: dict, timeout_s: float = 60.0) -> tuple[int, ...]:
    """:meth:`send` with one payload per receiver, ``{process: bytes-like}`` (a reduce-scatter
    sends each owner its own chunk): every chunk goes out before the first acknowledgement is
    awaited, so the transfers overlap."""
    views = {r: memoryview(x).cast("B") for r, x in payloads.items()}
    acked = set()
    with self._send_lock:
      targets = {r: self._sender(r) for r in sorted(views) if self._peers.get(r, (0, None))[1]
                 and (r, self._peers[r][0]) not in self._gone}
      for r, (_, dealer, _) in targets.items():
        view, total = views[r], views[r].nbytes
        for offset in range(0, max(total, 1), self.chunk):
          body = view[offset:offset + self.chunk]
          header = encode(Header(self.token, PAYLOAD, self.rank, self.incarnation, offset, body.nbytes, total, key))
          self._send_chunk(dealer, header, body)
      deadline, waiting = time.monotonic() + timeout_s, dict(targets)
      poller = zmq.Poller()
      for _, dealer, monitor in targets.values():
        poller.register(dealer, zmq.POLLIN)
        poller.register(monitor, zmq.POLLIN)
      while waiting and time.monotonic() < deadline:
        ready = dict(poller.poll(100))
        for r, (inc, dealer, monitor) in list(waiting.items()):
          if monitor in ready and recv_monitor_message(monitor)["event"] & GONE_EVENTS:
            self._gone.add((r, inc))
            del waiting[r]
          elif dealer in ready and self._is_ack(dealer.recv_multipart(), key, r, views[r].nbytes):
            acked.add(r)
            del waiting[r]
    return tuple(sorted(acked))

  def gone(self, r: int) -> bool:
    """Whether the connection this process opened to process ``r`` (by sending to it) dropped:
    a killed process's socket closes at once. False when it never sent to ``r``."""
    with self._send_lock:
      peer = self._peers.get(r)
      if peer is None or r not in self._senders:
        return peer is not None and (r, peer[0]) in self._gone
      inc, _, monitor = self._senders[r]
      while monitor.poll(0):
        if recv_monitor_message(monitor)["event"] & GONE_EVENTS:
          self._gone.add((r, inc))
      return (r, inc) in self._gone

  def _send_chunk(self, dealer, header: bytes, body: memoryview) -> None:
    """One chunk on its way (a seam for the tests that kill a process mid-transfer)."""
    dealer.send_multipart([header, body])  # copied into the message: no zero-copy tracking thread

  def _is_ack(self, frames: list, key: str, r: int, total: int) -> bool:
    try:
      h = decode(frames[0])
    except FrameError:
      return False
    return h.kind == ACK and h.token == self.token and h.key == key and h.rank == r and h.total == total

  # -- receiving --------------------------------------------------------------------------------

  def take(self, key: str, sender: int | None, timeout_s: float, watch: bool = False) -> bytearray:
    """``sender``'s payload of ``key`` (any sender's: None), waiting at most ``timeout_s``.

    Args:
      key: the agreement's key.
      sender: the process that sends it, or None for any.
      timeout_s: the longest wait.
      watch: stop waiting as soon as the connection to ``sender`` dropped (:meth:`gone`; this
        process must have sent to it): a killed sender is then noticed at once.

    Raises:
      PlaneTimeout: it did not arrive whole in time, or (``watch``) its sender is gone.
    """
    deadline, who = time.monotonic() + timeout_s, "any process" if sender is None else f"process {sender}"
    while True:
      with self._cond:
        found = next((k for k in self._inbox if k[0] == key and sender in (None, k[1])), None)
        if found is not None:
          return self._inbox.pop(found)
        left = deadline - time.monotonic()
        if left <= 0 or self._closed:
          raise PlaneTimeout(f"the payload of {key!r} from {who} did not arrive within {timeout_s:g} s")
        self._cond.wait(min(left, 0.1))
      if watch and sender is not None and self.gone(sender):
        with self._cond:  # it may have come whole before its sender went
          if (key, sender) in self._inbox:
            return self._inbox.pop((key, sender))
        raise PlaneTimeout(f"the payload of {key!r} from {who} did not come: its connection dropped")

  def finish(self, key: str) -> None:
    """``key``'s agreement is over here: what arrives for it later is acknowledged and dropped."""
    with self._cond:
      self._finished[key] = None
      while len(self._finished) > FINISHED_KEYS:
        self._finished.popitem(last=False)
      for k in [k for k in self._inbox if k[0] == key]:
        del self._inbox[k]
      for k in [k for k in self._partial if k[0] == key]:
        del self._partial[k]

  def _serve(self) -> None:
    poller = zmq.Poller()
    poller.register(self._router, zmq.POLLIN)
    poller.register(self._wake_thread, zmq.POLLIN)
    while True:
      ready = dict(poller.poll())
      if self._wake_thread in ready:
        return
      while True:
        try:
          frames = self._router.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
          break
        try:
          self._receive(frames)
        except Exception as e:  # noqa: BLE001 - never trusted, never a crash
          self._drop(f"a message that could not be read ({type(e).__name__}: {e})")

  def _receive(self, frames: list) -> None:
    if len(frames) != 3:
      return self._drop(f"a message of {len(frames) - 1} frame(s) (a header and a body expected)")
    try:
      h = decode(frames[1].bytes)
    except FrameError as e:
      return self._drop(str(e))
    body = frames[2].buffer
    peer = self._peers.get(h.rank)
    if h.token != self.token:
      return self._drop(f"a message that does not carry this run's token (says process {h.rank}, {h.key!r})")
    if peer is None:
      return self._drop(f"a message from process {h.rank}, outside the current membership ({h.key!r})")
    if peer[0] != h.incarnation:
      return self._drop(f"a message from a stale incarnation of process {h.rank} ({h.incarnation}, now"
                        f" {peer[0]}; {h.key!r})")
    if h.kind != PAYLOAD:
      return self._drop(f"an acknowledgement sent to the receiving socket by process {h.rank}")
    if len(body) != h.length:
      return self._drop(f"a truncated chunk from process {h.rank} ({len(body)} of {h.length} bytes; {h.key!r})")
    self._assemble(frames[0].bytes, h, body)

  def _assemble(self, identity: bytes, h: Header, body) -> None:
    with self._cond:
      slot = self._partial.get((h.key, h.rank, h.incarnation))
      if slot is None:
        slot = self._partial[h.key, h.rank, h.incarnation] = [bytearray(h.total), 0]
      elif len(slot[0]) != h.total:
        return self._drop(f"a chunk of a {h.total}-byte payload from process {h.rank} into a {len(slot[0])}-byte"
                          f" one ({h.key!r})")
      slot[0][h.offset:h.offset + h.length] = body
      slot[1] += h.length
      if slot[1] < h.total:
        return None
      del self._partial[h.key, h.rank, h.incarnation]
      if h.key not in self._finished:
        self._inbox[h.key, h.rank] = slot[0]
        self._cond.notify_all()
    ack = Header(self.token, ACK, self.rank, self.incarnation, 0, 0, h.total, h.key)
    self._router.send_multipart([identity, encode(ack), b""])
    return None

  def _drop(self, why: str) -> None:
    line = f"data plane (process {self.rank}): dropped {why}"
    self.dropped.append(line)
    self._log(line)

  # -- the end --------------------------------------------------------------------------------

  def close(self) -> None:
    """Stops the receiving thread, closes every socket and the context (idempotent)."""
    if self._closed:
      return
    self._closed = True
    self._wake.send(b"")
    self._thread.join()
    with self._send_lock:
      for r in list(self._senders):
        self._close_sender(r)
    for s in (self._router, self._wake, self._wake_thread):
      s.close(linger=0)
    self._ctx.term()
    with self._cond:
      self._cond.notify_all()
