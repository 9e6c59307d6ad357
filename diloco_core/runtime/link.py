"""The cross-process link of ``communication="background"``: one FIFO thread for the collectives.

Every process of a background run holds a :class:`Link`. Fragment payloads are handed to it
(:meth:`Link.gather`), packed to their wire format's own bits on its one thread
(:mod:`diloco_core.wire.packing`: two fp4 values per byte, a bf16 value in two bytes, top-k
as its values and positions), and cross processes there, through JAX's own collectives
(:func:`jax.experimental.multihost_utils.process_allgather`: gloo on CPU, NCCL on GPU; or,
:meth:`Link.reduce`, the reduce-scatter of :mod:`diloco_core.wire.reduce_scatter`: an all-to-all
over one device per process, then an all-gather), while the main thread goes on with local
inner steps. JAX releases the GIL while a collective runs,
so the two overlap; a collective dispatched from the main thread would not (the local
programs after it would wait for it on the CPU backend). Every process hands the link the same
collectives in the same order (the schedule is the same everywhere), and one thread runs them
in that order, so no two processes ever wait on different collectives.

Small per-row values (the replicas' losses, finite flags) travel through the coordination
service's key-value store (:meth:`Link.exchange`), not through the collective thread: a log
row never waits behind a fragment in flight.

In an elastic run (``membership``: a :class:`~diloco_core.runtime.membership.Membership`) nothing
crosses gloo: each payload and each log row's values are one agreement over the live processes
(the payloads peer to peer over the data plane, :mod:`~diloco_core.runtime.data_plane`), on the link's thread (a log row then waits behind a
fragment in flight); a process left out sends nothing that counts, and its rows come back as
``fill``. :meth:`Link.reduce` is then a reduce-scatter over the sync's members on the same
plane (:mod:`~diloco_core.runtime.plane_reduce`).

With one process there is nothing to cross: :meth:`Link.gather` returns its input at once
(still through the thread, so the code path is the same).

Examples:
  >>> link = Link()
  >>> link.gather(np.arange(3.0)[None], what="payload").result().tolist()
  [[0.0, 1.0, 2.0]]
  >>> bf16 = wire_packing.WireLayout(sizes=(2,), name="bf16")  # two bytes per value on the wire
  >>> link.gather(np.array([[1.5, -2.0]], np.float32), "payload", bf16).result().tolist()
  [[1.5, -2.0]]
  >>> link.exchange("row/1", np.array([0.5])).tolist()
  [[0.5]]
  >>> link.close()
"""

from __future__ import annotations

import concurrent.futures
import functools
import queue
import threading
import time

import jax
import numpy as np

from diloco_core.runtime.plane_reduce import reduce_over_members
from diloco_core.runtime.quorum import vote_exchange
from diloco_core.wire import reduce_scatter

from diloco_core.wire import packing as wire_packing

#: Seconds a process waits for another's per-row values before it says which one is lost.
PEER_TIMEOUT_S = 45


class LostProcessError(ConnectionError):
  """Another process of a background run stopped answering (killed, crashed or cut off)."""


def wait(future: concurrent.futures.Future, what: str):
  """The result of a link future; a stop request (:func:`diloco_core.interrupts.check`) ends the
  wait, and a failed collective becomes a one-line :class:`LostProcessError`."""
  from diloco_core import interrupts
  while True:
    interrupts.check()
    try:
      return future.result(timeout=0.1)
    except concurrent.futures.TimeoutError:
      continue
    except wire_packing.WirePackingError:  # this process's own payload, not a lost peer
      raise
    except Exception as e:
      first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
      raise LostProcessError(f"{what} failed: another process was lost or cut off ({first})") from None


def _kv_client():
  from jax._src import distributed  # the coordination service's client (no public accessor)
  return distributed.global_state.client


class Link:
  """The collectives of one background-mode process, run in order on one thread.

  Args:
    on_transfer: called on the link thread after each job as ``on_transfer(what, launched,
      finished, sent_bytes, received_bytes, padding_bytes)``: ``time.time()`` seconds when the
      job started (before packing) and when the result was unpacked, the bytes this process
      handed to the collectives and those it received from the others (payload bytes, each
      counted once), and the padding the collectives added to equalize blocks (reduce-scatter
      only); the run's trace records them.
  """

  def __init__(self, on_transfer=None, membership=None, quorum=None):
    self.processes, self.rank = jax.process_count(), jax.process_index()
    self._on_transfer = on_transfer
    self.membership = membership
    self.quorum = quorum  # elastic: a QuorumRule decides the syncs gathered with vote=True
    self.last = None  # elastic: the link thread's last Agreement
    self.events: list[dict] = []  # elastic: the losses and joins the agreements saw, for the trace
    self.replaced: set[int] = set()  # elastic: the processes an agreement saw join as a replacement
    self._jobs: queue.Queue = queue.Queue()
    self._closed = False
    self._thread = threading.Thread(target=self._run, name="diloco-link", daemon=True)
    self._thread.start()

  def _run(self) -> None:
    while True:
      job = self._jobs.get()
      if job is None:
        return
      future, what, work = job
      launched = time.time()
      try:
        out, sent, received, padding = work()
      except BaseException as e:  # a lost peer, a gloo error: the waiting step re-raises it
        future.set_exception(e)
        continue
      if self._on_transfer is not None and sent is not None:  # connect() moves no payload
        self._on_transfer(what, launched, time.time(), sent, received, padding)
      future.set_result(out)

  def _submit(self, what: str, work) -> concurrent.futures.Future:
    if self._closed:
      raise RuntimeError("the link is closed.")
    future: concurrent.futures.Future = concurrent.futures.Future()
    self._jobs.put((future, what, work))
    return future

  def gather(self, x: np.ndarray, what: str, layout: wire_packing.WireLayout | None = None,
             vote: bool = False) -> concurrent.futures.Future:
    """Starts gathering ``x`` ``[n, ...]`` of every process along axis 0, in process order.

    Args:
      x: this process's rows (the same shape on every process).
      what: a label for the trace (e.g. ``"fragment 1 @ step 6"``).
      layout: the payload's wire layout: the rows (float32 ``[n, elements]``) cross packed to
        its bits and come back as float32, bit for bit; None: ``x`` crosses as it is.
      vote: elastic with a ``quorum``: the members are decided by it
        (:func:`~diloco_core.runtime.quorum.vote_exchange`), not by a barrier over every live process.

    Returns:
      A future of the ``[processes * n, ...]`` array; it raises what the collective raised.
      Elastic: of ``(array, agreement)``, the rows of the processes left out zero.
    """
    x = np.ascontiguousarray(x)

    def work():
      sent = x if layout is None else wire_packing.pack_payload(x, layout)
      if self.membership is not None:
        rows, received, agreement = self._agree(what, sent, 0, vote and self.quorum is not None)
        out = rows if layout is None else wire_packing.unpack_payload(rows, layout)
        return (out, agreement), sent.nbytes, received, 0
      got = sent if self.processes == 1 else _allgather(sent)
      out = got if layout is None else wire_packing.unpack_payload(got, layout)
      return out, sent.nbytes, got.nbytes - sent.nbytes, 0
    return self._submit(what, work)

  def connect(self) -> concurrent.futures.Future:
    """Runs the reduce-scatter's all-to-all once on one byte per process, so that it sets up its
    gloo context while the processes are together: the first use of a device set waits at most
    30 s for every process, which a process still compiling its first step can miss. (Under the
    all-gather nothing is run at start: a late peer would hold the others there.)"""
    def work():
      if self.processes > 1 and self.membership is None:  # elastic: nothing crosses gloo
        _all_to_all(np.zeros((self.processes, 1), np.uint8))
      return None, None, None, None
    return self._submit("connect", work)

  def reduce(self, x: np.ndarray, what: str,
             layout: wire_packing.WireLayout | None = None) -> concurrent.futures.Future:
    """Starts the reduction that scales (:mod:`~diloco_core.wire.reduce_scatter`) of every process's
    payload rows: an all-to-all of packed chunks, each owner's re-quantized mean, an all-gather.

    Args:
      x: this process's payload rows, float32 ``[m, elements]`` (values on the format's grid).
      what: a label for the trace.
      layout: the payload's dense wire layout (None: float32 values as they are), cut into one
        chunk per process (:class:`~diloco_core.wire.reduce_scatter.ChunkPlan`).

    Returns:
      A future of the mean ``[1, elements]`` (float32, re-quantized). Elastic: of ``(mean,
      agreement)``, over the replicas of the agreement's members
      (:func:`~diloco_core.runtime.plane_reduce.reduce_over_members`, peer to peer; the chunks
      cut for them).
    """
    x = np.ascontiguousarray(x, np.float32)
    layout = layout or wire_packing.WireLayout((x.shape[1],), "none")
    if self.membership is not None:
      def elastic():
        mean, agreement, sent, received = reduce_over_members(
            self.membership, what.replace("/", "-"), x, layout, self.processes * x.shape[0])
        self._note(agreement)
        return (mean, agreement), sent, received, 0
      return self._submit(what, elastic)
    plan = reduce_scatter.chunk_plan(layout, self.processes)

    def work():
      r, n = self.rank, self.processes
      mine = reduce_scatter.scatter(x, plan)
      if n == 1:
        received = mine
      else:
        width = max(b.size for b in mine)
        got = _all_to_all(np.stack([np.pad(b, (0, width - b.size)) for b in mine]))
        received = [got[s, :mine[r].size] for s in range(n)]  # each process's rows of my chunk
      packed, _ = reduce_scatter.reduce_owned(received, plan, r)
      if n == 1:
        reduced = [packed]
      else:
        width2 = max(plan.chunk(d).row_bytes for d in range(n))
        reduced = list(_allgather(np.pad(packed, (0, width2 - packed.size))[None]))
      sent, received_bytes = reduce_scatter.traffic(plan, r, x.shape[0])
      padding = 0 if n == 1 else (n - 1) * (width + width2) - received_bytes
      return reduce_scatter.assemble(reduced, plan), sent, received_bytes, padding
    return self._submit(what, work)

  def _agree(self, what: str, x: np.ndarray, fill, vote: bool = False) -> tuple[np.ndarray, int, object]:
    """Elastic, on the link thread: every process's ``x`` ``[n, ...]`` through one agreement
    (:meth:`~diloco_core.runtime.membership.Membership.exchange`; ``vote``: decided by the
    ``quorum``, its trace row among :attr:`events`), as ``[processes * n, ...]`` with
    ``fill`` in the rows of the processes left out; the bytes received; the agreement."""
    if vote:
      agreement, row = vote_exchange(self.membership, what.replace("/", "-"), x.tobytes(), self.quorum)
      self.events.append(row)
    else:
      agreement = self.membership.exchange(what.replace("/", "-"), x.tobytes())
    rows = np.full((self.processes, *x.shape), fill, x.dtype)
    for r, raw in agreement.payloads.items():
      rows[r] = np.frombuffer(raw, x.dtype).reshape(x.shape)
    received = sum(len(raw) for r, raw in agreement.payloads.items() if r != self.rank)
    if not vote:  # no loss or join is seen by a vote: `last` stays the last barrier's
      self._note(agreement)
    return rows.reshape(-1, *x.shape[1:]), received, agreement

  def _note(self, agreement) -> None:
    """Elastic: ``agreement`` is the last; its losses and joins go to :attr:`events`."""
    self.last = agreement
    self.replaced.update(agreement.joined)
    for kind in ("lost", "joined"):
      if getattr(agreement, kind):
        self.events.append({"kind": kind, "processes": list(getattr(agreement, kind)), "at": agreement.key,
                            "time": time.time()})

  def exchange(self, key: str, x: np.ndarray, timeout_s: float = PEER_TIMEOUT_S, fill=np.nan) -> np.ndarray:
    """Every process's ``x`` (small: a log row's values) as ``[processes, ...]``, through the
    coordination service's key-value store; raises :class:`LostProcessError` naming the
    process that did not answer within ``timeout_s``. Elastic: one agreement on the link's
    thread, ``fill`` in the rows of the processes left out."""
    x = np.ascontiguousarray(x)
    if self.processes == 1:
      return x[None]
    if self.membership is not None:
      future = self._submit(key, lambda: (self._agree(key, x[None], fill)[0], None, None, None))
      return wait(future, f"the exchange of {key}")
    client = _kv_client()
    client.key_value_set_bytes(f"diloco/{key}/{self.rank}", x.tobytes())
    rows = []
    for r in range(self.processes):
      try:
        raw = client.blocking_key_value_get_bytes(f"diloco/{key}/{r}", int(timeout_s * 1000))
      except Exception:  # the service reports a timeout or a dead peer as a runtime error
        raise LostProcessError(f"process {r} did not answer for {timeout_s:.0f} s (at {key});"
                               " it was killed or lost its connection.") from None
      rows.append(np.frombuffer(raw, dtype=x.dtype).reshape(x.shape))
    return np.stack(rows)

  def close(self) -> None:
    """Lets the thread finish the collectives already handed to it, then stops it."""
    if not self._closed:
      self._closed = True
      self._jobs.put(None)

  def join(self, timeout_s: float) -> bool:
    """Waits up to ``timeout_s`` for the thread to end after :meth:`close`; whether it ended."""
    self._thread.join(timeout_s)
    return not self._thread.is_alive()


def _process_mesh():
  """A mesh of one device per process (each process's first), along ``"processes"``."""
  from jax.sharding import Mesh
  n = jax.process_count()
  firsts = [min((d for d in jax.devices() if d.process_index == r), key=lambda d: d.id) for r in range(n)]
  return Mesh(np.array(firsts), ("processes",))


def _all_to_all(blocks: np.ndarray) -> np.ndarray:
  """Block d of ``blocks`` ``[N, B]`` goes to process d; returns ``[N, B]``, row s from process s
  (``jax.lax.all_to_all`` over one device per process: gloo on CPU, NCCL on GPU)."""
  from jax.sharding import NamedSharding, PartitionSpec
  mesh, n = _process_mesh(), blocks.shape[0]
  spec = PartitionSpec("processes")
  mine = jax.device_put(blocks, mesh.devices[jax.process_index()])
  x = jax.make_array_from_single_device_arrays((n * n, blocks.shape[1]), NamedSharding(mesh, spec), [mine])
  out = _all_to_all_program(mesh)(x)
  return np.asarray(out.addressable_shards[0].data)


@functools.lru_cache(maxsize=None)
def _all_to_all_program(mesh):
  swap = lambda x: jax.lax.all_to_all(x, "processes", 0, 0, tiled=True)
  spec = jax.sharding.PartitionSpec("processes")
  return jax.jit(jax.shard_map(swap, mesh=mesh, in_specs=spec, out_specs=spec))


def _allgather(x: np.ndarray) -> np.ndarray:
  from jax.experimental import multihost_utils
  return np.asarray(multihost_utils.process_allgather(x, tiled=True))
