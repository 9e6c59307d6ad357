"""``communication="background"``: each process trains its replicas; fragments cross on a thread.

The in-step runtime (:class:`~diloco_core.runtime.communication.InStep`) runs every replica in one SPMD
program, and a fragment's all-reduce inside the step that sends it. Here the replicas are
split over processes (M / N per process, kept batched on the process's devices) and the
step of :class:`~diloco_core.DiLoCo` runs as its phases, each a program with no collective
(compiled over the run's mesh like the in-step program, so each process runs its own part
alone, without waiting for the others):

1. ``inner``: one inner step of the local replicas;
2. ``send`` (fragment p due): the local replicas' payloads
   :math:`Q(\\Delta_m + \\beta e_m)` (compression and error feedback as in-step), flattened into
   one float32 buffer and handed to the :class:`~diloco_core.runtime.link.Link` thread, which packs them
   to the wire format's own bits (:mod:`~diloco_core.wire.packing`, exactly: they unpack to the
   same float32 values) and gathers every process's payloads (``process_allgather``: gloo on
   CPU, NCCL on GPU), or with ``reduction="reduce-scatter"`` reduces them
   (:mod:`~diloco_core.wire.reduce_scatter`: each process receives 2 (N - 1) / N of a payload and
   the re-quantized mean comes back), while the main thread goes on training;
3. ``settle`` (the payloads have arrived): the average (``jnp.mean`` over the M payloads in
   replica order, the reduction the SPMD program computes; reduce-scatter: the mean the link
   delivered) and what the SPMD send did with it:
   the outer step (``outer_overlap="none"``), the average kept in flight (``"delayed"``) or
   each replica's others' part (``"eager"``);
4. ``merge`` (fragment sent τ steps ago): the blend with α.

**When it waits.** With ``outer_overlap="none"`` the main thread waits for fragment p's payloads
at p's merge, τ steps after the send (τ = 0: at once, today's blocking numbers); with
``"delayed"`` or ``"eager"`` at p's next send, H steps later, so the whole outer step hides.
Before an eval row, a checkpoint and the end, every fragment in flight is settled: outer steps
of different fragments commute (each touches its own slices of θ_g and of the outer state), so
settling early changes no number, and the state then *is* the SPMD state of that step. That
is why checkpoints are interchangeable between the modes.

**Same numbers, bit for bit (CPU).** The phases are compiled over the run's mesh (every
process's devices, the replica fields sharded along ``diloco``), as the in-step program is, so
XLA partitions them into the same per-device kernels; none of them holds a collective (tested
on the compiled HLO), the link alone moves data. A background run therefore equals the in-step
run *on the same mesh* bit for bit: metrics, checkpoints, final params and summary, with the
replicas split over processes or not (tested: two processes with one replica each against one
process with two devices, for DiLoCo with 4-bit payloads and error feedback, Streaming and
eager; one process and one device with M = 2 and M = 4, and bf16 and fp4 payloads), except with
M > 2 replicas sending a compressed format and with fp8 or top-k payloads (:data:`TOLERANCE`). Two more things make the equality hold: the mean is the same reduction
in replica order (the link moves the payloads, not a partial sum), and the settle program reads
the gathered payloads as leaves shaped like the in-step program's (split on the host, before
the program), so XLA fuses the outer step into the same kernels and contracts the same
products into fused multiply-adds. What differs from one mesh to another (both replicas
batched on one device, or one per device) is the in-step runtime's own numbers: those runs
agree within :data:`TOLERANCE` (tested). On GPU this is not measured (its fusion decisions are
its own).

**Per-step records.** Each process appends to ``<out>/trace/process-<rank>.jsonl`` (kept in
``Background.trace`` without ``out``): when each step computed (``compute``), when each
payload was handed over, gathered and settled, the bytes this process handed to the link and
received (``transfer``), and how long the main thread waited (``wait``); ``time.time()`` seconds.

**Simulated drops** follow the in-step rules (the masked send keeps dropped residuals, the
masked settle averages the present, the merge heals; a ``skip`` row when nobody took part);
each ``settle`` row says who took part. A dropped replica's payload still crosses the link.
**Elastic runs** (:mod:`diloco_core.runtime.elastic`) settle with the live processes' mask the same way.

Not supported here (one-line errors, :func:`~diloco_core.runtime.option_checks.check_background`): data parallelism (it
all-reduces every step), simulated drops with ``reduction="reduce-scatter"``.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from diloco_core.runtime.background_mesh import background_mesh
from diloco_core.runtime.background_programs import PhasePrograms, flat_buffer, fragment_branch, split_buffer
from diloco_core.algorithm.diloco import DiLoCo
from diloco_core.runtime.elastic_runtime import ElasticRuntime
from diloco_core.runtime.link import Link, wait
from diloco_core.runtime.membership import close_process_membership, process_membership
from diloco_core.devices.mesh import MeshPlacement, global_array, host_copy, replica_sharding, replicated
from diloco_core.spec.schedule import merged_fragment, sent_fragment
from diloco_core.algorithm.state import SKIPPED, DiLoCoState, participation_code
from diloco_core.wire.packing import WireLayout

#: How far (relative, and absolute near 0) two runs of one config may be where they are not
#: equal bit for bit, in two cases. (1) Different meshes (both replicas batched on one device,
#: or one replica per device or per process), in either runtime: XLA compiles the inner step
#: for each device's replicas, and its kernels for another shape round differently (without any
#: sync, a few inner steps already differ by an ulp in many elements). (2) More than two
#: replicas sending a compressed format (``compression`` other than ``"none"``), and fp8 or
#: top-k payloads at any M: the in-step program lets XLA fuse the quantizer into the average's
#: reduction, and there a few values round differently (a fused sum differs in a few elements
#: from the sum of the same quantized values computed on their own; packing them for the link
#: changes nothing, tested). (3) More than two processes against in-step on as many devices:
#: the in-step all-reduce across devices sums in its own order, the background mean sums the
#: gathered rows in replica order (tested with four). (4) Float32 payloads with
#: ``reduction="reduce-scatter"``: the settle program reads the mean the link computed, and XLA
#: contracts the Nesterov update's products otherwise than in the in-step program, which fuses
#: the mean into it (the compressed formats' re-quantized mean is equal bit for bit, tested).
#: Otherwise a background run equals the in-step run on the same mesh bit for bit.
TOLERANCE = 1e-5
#: The trace file of process r under ``<out>``.
TRACE_FILE = os.path.join("trace", "process-{rank}.jsonl")
#: Seconds an elastic run's end waits for its link thread before it closes the data plane under it.
CLOSE_WAIT_S = 10.0


@dataclasses.dataclass
class _InFlight:
  """One fragment's payloads on the wire: sent at ``step``, arriving as ``future``."""
  step: int
  future: Any
  handed: float  # time.time() when handed to the link
  present: np.ndarray | None = None  # the [M] participation mask of this sync (simulated drops)


class Background(PhasePrograms, MeshPlacement, ElasticRuntime):
  """The background runtime of one process: its local replicas' programs, the link, the trace.

  Args:
    algo: the run's :class:`~diloco_core.DiLoCo` (config, loss, optimizers, fragment map).
    params: the initial params (gives the fragment map and the leaf kinds).
    mesh: the run's ``mesh`` option (the global mesh; None: one device per process).
    out: the run's output directory (the trace file goes under it), or None.
    resumed: the run resumes (the trace file is appended to).
    min_replicas: an elastic run (:mod:`diloco_core.runtime.elastic`): each sync averages the replicas of
      the processes alive, and the run stops below this many; None: not elastic.
    heal_every: elastic: a replacement is healed after a step that is a multiple of this (the
      log interval: every process's log rows then cover the same steps).
    heal_wait: elastic: seconds the leader may wait there for a replacement still compiling.
    quorum: elastic: a :class:`~diloco_core.runtime.quorum.QuorumRule` deciding each fragment
      sync (a late process is left out); None: each sync waits for every live process.
    step_delay: seconds this process sleeps after each inner step (a straggler for tests and
      demos; its numbers do not change; the ``compute`` rows record it).

  The loop calls it as its runtime (:class:`~diloco_core.runtime.communication.Runtime`): the same
  calls as :class:`~diloco_core.runtime.communication.InStep`.
  """

  name = "background"
  lock_step = True

  def last_step(self, cfg) -> int:
    return cfg.steps

  def __init__(self, algo: DiLoCo, params, mesh: str | None = None, out: str | None = None,
               resumed: bool = False, min_replicas: int | None = None, heal_every: int = 1,
               heal_wait: float = 0.0, quorum=None, step_delay: float = 0.0):
    self.algo, self.config = algo, algo.config
    cfg = self.config
    self.processes, self.rank = jax.process_count(), jax.process_index()
    self.local = cfg.replicas // self.processes
    self.offset = self.rank * self.local
    self.mesh = background_mesh(mesh, cfg.replicas)
    self.replica_fields = algo.replica_fields  # the state's fields with a replica axis
    algo.prepare(params)
    PhasePrograms.__init__(self)
    ElasticRuntime.__init__(self, min_replicas, heal_every, heal_wait)
    membership = None if min_replicas is None else process_membership()
    self.trace: list[dict] = []
    self._trace_file = None
    if out is not None:  # a replacement (elastic) goes on with its lost predecessor's trace
      path = os.path.join(out, TRACE_FILE.format(rank=self.rank))
      os.makedirs(os.path.dirname(path), exist_ok=True)
      self._trace_file = open(path, "a" if resumed or (membership and membership.rejoined) else "w")
    self.link = Link(on_transfer=self._transferred, membership=membership, quorum=quorum)
    self.step_delay = step_delay
    if cfg.reduction == "reduce-scatter":  # its all-to-all's gloo context, set up while all are here
      wait(self.link.connect(), "connecting to the other processes")
    self._in_flight: dict[int, _InFlight] = {}
    self._stale_global: set[int] = set()  # eager: fragments whose θ_g waits for the replicas' mean
    #: The numbers of the link exchanges (their names); a replacement continues its leader's count.
    self.exchange_keys = itertools.count()
    self._shapes: dict[str, list] = {}  # per branch: a fragment's leaves (see payload_leaves)
    self._hp = None
    self._step = 0  # the last step taken (a log row's wait is recorded under it)

  # ---- placement -----------------------------------------------------------------------------
  @property
  def local_replicas(self) -> tuple[int, ...]:
    """The replicas this process trains."""
    return tuple(range(self.offset, self.offset + self.local))

  def local_state(self, state: DiLoCoState) -> DiLoCoState:
    """A state restored from a checkpoint (either mode's, or host values) in this runtime's
    placement."""
    changes = {}
    for name in state.__dataclass_fields__:
      own = name in self.replica_fields
      changes[name] = jax.tree.map(lambda x: self.own_rows(x) if own else host_copy(x), getattr(state, name))
    return self.place_state(state.replace(**changes))

  def own_rows(self, x) -> np.ndarray:
    """This process's rows ``[M / N, ...]`` of a per-replica array ``[M, ...]`` (global or host),
    on the host."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable:
      return np.asarray(x)[self.offset:self.offset + self.local]
    out = np.empty((self.local, *x.shape[1:]), x.dtype)
    lo, hi = self.offset, self.offset + self.local
    for shard in x.addressable_shards:  # a shard may hold more rows than this process's (replicated)
      rows = range(x.shape[0])[shard.index[0]]
      a, b = max(rows.start, lo), min(rows.stop, hi)
      if a < b:
        out[a - lo:b - lo] = np.asarray(shard.data)[a - rows.start:b - rows.start]
    return out

  def place_state(self, state: DiLoCoState) -> DiLoCoState:
    """Host values (this process's rows of the replica fields, full copies of the rest) as
    global arrays on the mesh: the in-step run's placement of the same mesh."""
    rs, rep = replica_sharding(self.mesh), replicated(self.mesh)
    M, off = self.config.replicas, self.offset
    changes = {}
    for name in state.__dataclass_fields__:
      own = name in self.replica_fields

      def to_global(x, own=own):
        host = np.asarray(x)
        if not own:
          return global_array(host, rep)

        def rows(idx):
          r = range(M)[idx[0]]
          return host[(slice(r.start - off, r.stop - off), *idx[1:])]
        return jax.make_array_from_callback((M, *host.shape[1:]), rs, rows)

      changes[name] = jax.tree.map(to_global, getattr(state, name))
    return state.replace(**changes)

  def place_rows(self, x: np.ndarray) -> jax.Array:
    """A per-replica host value ``[M, ...]`` that every process holds, sharded along ``diloco``."""
    return global_array(x, replica_sharding(self.mesh))

  def global_state(self, state: DiLoCoState) -> DiLoCoState:
    """The state as the in-step run holds it (settle first): it already is (global arrays on
    the mesh)."""
    return state

  def host_replicas(self, state: DiLoCoState) -> Any:
    """Every replica's params on the host (gathered over the processes; after :meth:`settle`)."""
    leaves, treedef = jax.tree.flatten(state.params)
    flat = self.own_rows(flat_buffer(leaves))
    full = wait(self.link.gather(flat, "replica params"), "gathering the replicas' params")
    return jax.tree.unflatten(treedef, [x.astype(y.dtype) for x, y in zip(split_buffer(np.asarray(full), leaves), leaves)])

  # ---- the state -----------------------------------------------------------------------------
  def init(self, params) -> DiLoCoState:
    """This process's initial state (:meth:`~diloco_core.algorithm.phases.Phases.initial_state`):
    its local replicas, the global copy, the outer state."""
    return self.place_state(self.algo.initial_state(params, self.local, np))

  def placed_hyperparams(self, last: bool):
    """The algorithm's hyperparameters as replicated scalars (``last``: with α = 1, the last step
    with ``eval_replicas``), placed once."""
    if self._hp is None:
      values = self.algo.typed_hyperparams()  # the cast the in-step runtime places
      self._hp = (self.place_replicated(values), self.place_replicated({**values, "alpha": np.float32(1.0)}))
    return self._hp[int(last)]

  # ---- the step ------------------------------------------------------------------------------
  def step(self, state: DiLoCoState, batch, t: int, present=None, last: bool = False):
    """Inner step t of the local replicas, the due send (handed to the link) and merge.

    Returns ``(state, metrics)`` like :meth:`diloco_core.algorithm.diloco.DiLoCo.step`, with this process's replicas only.
    ``present``: the [M] mask of simulated drops (the same on every process; read at a send), or
    None. Dropped payloads still cross the link: the trace's bytes exceed the metrics' count.
    ``last``: the run's last step with ``eval_replicas`` (α = 1 there, as in-step).
    """
    state = self.heal_joiners(state, t)  # elastic: a replacement waiting gets the state of step t - 1
    cfg, hp = self.config, self.placed_hyperparams(last)
    start, self._step = time.time(), t
    state, loss, metrics = self.inner_program(state, batch, hp)
    if self.step_delay:  # a straggler: late at its send, same numbers
      jax.block_until_ready(loss)
      time.sleep(self.step_delay)
    is_send, p = sent_fragment(t, cfg.sync_every, cfg.fragments, cfg.fragment_order)
    if is_send:
      if p in self._in_flight:  # delayed / eager: the previous sync of p arrives now (H steps on)
        state = self._settle(state, p, t)
      mask = None if present is None else np.asarray(present, np.float32)
      code = None if mask is None else participation_code(mask, cfg.replicas, np)
      if code is not None and (code == SKIPPED).all():  # nobody takes part: the sync is skipped
        state = self.skip_program(state, p)
        self.record({"kind": "skip", "step": t, "fragment": p})
      else:
        state, flat = self.send_program(state, p, hp, None if code is None else self.place_rows(code))
        flat, what = self.own_rows(flat), f"fragment {p} @ step {t}"  # waits for the payload program
        if cfg.reduction == "reduce-scatter":
          future = self.link.reduce(flat, what, self._layout(state, p))
        else:
          future = self.link.gather(flat, what, self._layout(state, p), vote=True)  # a quorum decides it
        self._in_flight[p] = _InFlight(t, future, time.time(), mask)
        if cfg.outer_overlap == "eager":
          self._stale_global.add(p)
    is_merge, q = merged_fragment(t, cfg.sync_every, cfg.fragments, cfg.overlap, cfg.fragment_order)
    if is_merge:
      if cfg.outer_overlap == "none" and q in self._in_flight:
        state = self._settle(state, q, t)
      state = self.merge_program(state, q, hp)
    jax.block_until_ready(loss)
    jax.block_until_ready(state.params)
    self.record({"kind": "compute", "step": t, "start": start, "end": time.time(),
                 **({"delay": self.step_delay} if self.step_delay else {})})
    return state, {"loss": loss, "loss_metrics": metrics, "sent": is_send, "merged": is_merge}

  def _settle(self, state, p: int, t: int):
    """Waits for fragment p's payloads (recording the wait) and settles them into the state."""
    flight = self._in_flight.pop(p)
    waited = time.time()
    gathered = wait(flight.future, f"the all-reduce of fragment {p} sent at step {flight.step}")
    now = time.time()
    if now - waited > 1e-4:
      self.record({"kind": "wait", "step": t, "fragment": p, "start": waited, "end": now})
    gathered, present = self.live_participation(gathered, flight.present, flight.step, p, t)  # elastic
    self.record({"kind": "settle", "step": t, "fragment": p, "sent_at": flight.step, "time": now,  # who took part:
                  "present": None if present is None else present.tolist()})
    return self.settle_program(state, p, self.payload_leaves(state, p, gathered), self.placed_hyperparams(False),
                               None if present is None else self.place_replicated(present))

  def _leaf_shapes(self, state, p: int) -> list:
    """Fragment p's leaves as the payload holds them, ``[M, ...]`` each (abstract)."""
    branch, k = fragment_branch(p, self.config.fragments)
    if branch not in self._shapes:  # the leaves' shapes do not depend on k (a layer's slice)
      take = lambda params, k: self.algo.fragment_of(jax.tree.leaves(params), branch, k, axis=1)
      self._shapes[branch] = jax.eval_shape(take, state.params, 0 if k is None else k)
    return self._shapes[branch]

  def _layout(self, state, p: int) -> WireLayout:
    """Fragment p's payload on the wire (:mod:`~diloco_core.wire.packing`): its leaves in the
    run's format, each leaf's blocks or top-k chunks as the quantizer cut them."""
    cfg = self.config
    sizes = tuple(int(np.prod(x.shape[1:], dtype=np.int64)) for x in self._leaf_shapes(state, p))
    return WireLayout(sizes, cfg.compression, **cfg.wire)

  def payload_leaves(self, state, p: int, gathered) -> list[jax.Array]:
    """Fragment p's gathered ``[M, n]`` buffer as its leaves, ``[M, ...]`` each (:func:`~diloco_core.runtime.background_programs.split_buffer`)."""
    return self.place_replicated(split_buffer(np.asarray(gathered), self._leaf_shapes(state, p)))

  def _refresh_global(self, state, p: int):
    """Eager: θ_g[p] = the mean of every replica's own outer params (gathered)."""
    mine = self.own_rows(self.own_outer_params_program(state, p))
    gathered = wait(self.link.gather(mine, f"outer params of fragment {p}"),
                    f"gathering the replicas' outer params of fragment {p}")
    return self.refresh_program(state, p, self.payload_leaves(state, p, gathered))

  def settle(self, state, t: int):
    """Settles every fragment in flight (and, eager, refreshes θ_g): the state is then the SPMD
    state of step t. Called before eval rows, checkpoints and the end."""
    for p in sorted(self._in_flight, key=lambda q: self._in_flight[q].step):
      state = self._settle(state, p, t)
    for p in sorted(self._stale_global):
      state = self._refresh_global(state, p)
    self._stale_global.clear()
    return state

  # ---- what the loop reads -----------------------------------------------------------------
  def eval_params(self, state: DiLoCoState):
    """The params to evaluate: the global copy θ_g (:meth:`~diloco_core.algorithm.diloco.DiLoCo.eval_params`)."""
    return self.algo.eval_params(state)

  def gather_rows(self, values: list) -> np.ndarray:
    """Queued per-replica values (one per step, this process's rows) as ``[steps, M]`` on the host."""
    local = np.stack([self.own_rows(v) for v in values])  # [steps, M / N]
    every = self._exchange("rows", local, np.nan)  # [N, steps, M / N]
    return np.concatenate(list(every), axis=1)

  def _exchange(self, what: str, x: np.ndarray, fill) -> np.ndarray:
    """Every process's ``x`` (:meth:`Link.exchange`, lost processes' rows ``fill``); elastic: an
    agreement, recorded as a wait (it waits for the slowest process, or past a lost one's heartbeat)."""
    start = time.time()
    every = self.link.exchange(f"{what}/{next(self.exchange_keys)}", x, fill=fill)
    if self.min_replicas is not None:
      self.record({"kind": "wait", "step": self._step, "for": what, "start": start, "end": time.time()})
      self.record_membership(self._step)
    return every

  def finite_flags(self, state: DiLoCoState):
    """(whether each replica's params are all finite [M], over every process; whether θ_g is)."""
    replicas, glob = self.algo.finite_flags(state)
    every = self._exchange("flags", self.own_rows(replicas), True)  # a lost replica: no verdict
    return jnp.asarray(every.reshape(-1)), glob

  # ---- records -------------------------------------------------------------------------------
  def _transferred(self, what: str, launched: float, finished: float, sent: int, received: int,
                   padding: int) -> None:
    self.record({"kind": "transfer", "what": what, "launched": launched, "finished": finished,
                  "sent_bytes": sent, "received_bytes": received, "padding_bytes": padding})

  def record(self, row: dict) -> None:
    """Appends ``row`` (a JSON object: ``"kind"``, ``"step"``, ...) to :attr:`trace`, and to
    the trace file with ``out``."""
    self.trace.append(row)
    if self._trace_file is not None:
      self._trace_file.write(json.dumps(row) + "\n")
      self._trace_file.flush()

  def close(self) -> None:
    """Stops the link thread (after what it holds) and closes the trace file."""
    if self.link.membership is not None:
      self.link.membership.release()  # a replacement still waiting: the run ended
    self.link.close()
    if self.link.membership is not None:  # its data plane's thread and sockets end with the run
      self.link.join(CLOSE_WAIT_S)
      close_process_membership()
    if self._trace_file is not None:
      self._trace_file.close()
      self._trace_file = None
