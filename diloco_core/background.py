"""``communication="background"``: each process trains its replicas; fragments cross on a thread.

The in-step runtime (:class:`~diloco_core.communication.InStep`) runs every replica in one SPMD
program, and a fragment's all-reduce inside the step that sends it. Here the replicas are
split over processes (M / N per process, kept batched on the process's devices) and the
step of :class:`~diloco_core.DiLoCo` runs as its phases, each a program with no collective
(compiled over the run's mesh like the in-step program, so each process runs its own part
alone, without waiting for the others):

1. ``inner``: one inner step of the local replicas;
2. ``send`` (fragment p due): the local replicas' payloads
   :math:`Q(\\Delta_m + \\beta e_m)` (compression and error feedback as in-step), flattened into
   one float32 buffer and handed to the :class:`~diloco_core.link.Link` thread, which gathers
   every process's payloads (``process_allgather``: gloo on CPU, NCCL on GPU) while the
   main thread goes on training;
3. ``settle`` (the payloads have arrived): the average (``jnp.mean`` over the M payloads in
   replica order, the reduction the SPMD program computes) and what the SPMD send did with it:
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
eager; one process and one device with M = 2 and M = 4), except with M > 2 replicas sending
a compressed format. Two more things make the equality hold: the mean is the same reduction
in replica order (the link moves the payloads, not a partial sum), and the settle program reads
the gathered payloads as leaves shaped like the in-step program's (split on the host, before
the program), so XLA fuses the outer step into the same kernels and contracts the same
products into fused multiply-adds. What differs from one mesh to another (both replicas
batched on one device, or one per device) is the in-step runtime's own numbers: those runs
agree within :data:`TOLERANCE` (tested). On GPU this is not measured (its fusion decisions are
its own).

**Per-step records.** Each process appends to ``<out>/trace/process-<rank>.jsonl`` (kept in
``Background.trace`` without ``out``): when each step computed (``compute``: the step's
programs, waited for), when each payload was handed over, gathered and settled
(``transfer``), and how long the main thread waited for one (``wait``). Times are
``time.time()`` seconds, comparable across the processes of one machine.

Not supported here (one-line errors, :func:`check_background`): data parallelism (it
all-reduces every step), simulated replica drops.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from typing import Any

import drjax
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, Mesh

from diloco_core import eager
from diloco_core.diloco import DiLoCo, inner_update
from diloco_core.hyperparams import resolve_optimizer
from diloco_core.link import Link, wait
from diloco_core.mesh import AXES, MeshPlacement, global_array, parse_mesh, replica_sharding, replicated
from diloco_core.schedule import merged_fragment, sent_fragment
from diloco_core.state import DiLoCoState, MergeOperands, SendOperands

#: How far (relative, and absolute near 0) two runs of one config may be where they are not
#: equal bit for bit, in two cases. (1) Different meshes (both replicas batched on one device,
#: or one replica per device or per process), in either runtime: XLA compiles the inner step
#: for each device's replicas, and its kernels for another shape round differently (without any
#: sync, a few inner steps already differ by an ulp in many elements). (2) More than two
#: replicas sending a compressed format (``compression`` other than ``"none"``): the in-step
#: program lets XLA fuse the quantizer into the average's reduction, and there a few values
#: round to the neighbouring code (a fused sum differs in a few elements from the sum of the
#: same quantized values computed on their own). Otherwise a background run equals the in-step
#: run on the same mesh bit for bit.
TOLERANCE = 1e-5
#: The trace file of process r under ``<out>``.
TRACE_FILE = os.path.join("trace", "process-{rank}.jsonl")


def check_background(cfg) -> None:
  """One-line errors for a run that cannot use ``communication="background"`` (before anything
  compiles): DP, simulated drops, M not divisible by the process count, a mesh that does not
  split over the processes.

  Examples:
    >>> from diloco_core import TrainConfig, DiLoCoConfig
    >>> check_background(TrainConfig(communication="background", algo=DiLoCoConfig(algorithm="dp")))
    Traceback (most recent call last):
    ...
    ValueError: `communication` background needs algorithm diloco or streaming; dp all-reduces every step (use `communication` in-step).
  """
  if cfg.algo.algorithm == "dp":
    raise ValueError("`communication` background needs algorithm diloco or streaming; dp all-reduces"
                     " every step (use `communication` in-step).")
  if cfg.drop_schedule or cfg.drop_prob:
    raise ValueError("`communication` background does not simulate replica drops; drop"
                     " `drop_schedule` / `drop_prob` or use `communication` in-step.")
  n, M = jax.process_count(), cfg.algo.replicas
  if M % n:
    raise ValueError(f"`communication` background splits the replicas over the processes: replicas"
                     f" (M={M}) must be divisible by the process count ({n}); choose M among"
                     f" {[n * i for i in range(1, 5)]}.")
  _mesh(cfg.mesh, M)


def _mesh(spec: str | None, replicas: int) -> Mesh:
  """The run's mesh: every process's devices, each process's block of rows contiguous along
  ``diloco`` (process r holds replicas ``[r M / N, (r + 1) M / N)``); ``mesh`` describes it
  (None: one device per process)."""
  n = jax.process_count()
  shape = parse_mesh(spec) or {"diloco": n, "data": 1}
  d, b = shape["diloco"], shape["data"]
  if d % n or replicas % d:
    raise ValueError(f"`mesh` {spec!r}: with `communication` background the diloco axis ({d}) must be"
                     f" divisible by the process count ({n}) and divide replicas (M={replicas});"
                     f" e.g. `mesh`='diloco={n},data=1'.")
  per_process = (d // n) * b
  by_process = [sorted((x for x in jax.devices() if x.process_index == r), key=lambda x: x.id)
                for r in range(n)]
  if any(len(devs) < per_process for devs in by_process):
    raise ValueError(f"`mesh` {spec!r} needs {per_process} devices per process, but a process has"
                     f" {min(len(devs) for devs in by_process)}.")
  rows = [np.array(devs[:per_process]).reshape(d // n, b) for devs in by_process]
  return Mesh(np.concatenate(rows), AXES, axis_types=(AxisType.Auto, AxisType.Auto))


def _flat(leaves: list) -> jax.Array:
  """Per-replica leaves ``[m, ...]`` as one float32 ``[m, n]`` buffer (what crosses the link)."""
  return jnp.concatenate([x.reshape(x.shape[0], -1).astype(jnp.float32) for x in leaves], axis=1)


def _split(flat: np.ndarray, like: list) -> list[np.ndarray]:
  """A gathered ``[M, n]`` host buffer back into leaves shaped like ``like`` (each ``[m, ...]``),
  with M rows: views, no arithmetic.

  The split happens on the host, before the settle program: that program then reads each leaf
  in the shape the in-step program reads the replicas' leaves, so XLA fuses the mean and the
  outer step into the same kernels (a buffer sliced inside the program fuses otherwise, and XLA
  on CPU then contracts a different product of the Nesterov update into a fused multiply-add:
  an ulp per outer step).
  """
  out, at = [], 0
  for x in like:
    size = int(np.prod(x.shape[1:]))
    out.append(flat[:, at:at + size].reshape(flat.shape[0], *x.shape[1:]))
    at += size
  return out


@dataclasses.dataclass
class _InFlight:
  """One fragment's payloads on the wire: sent at ``step``, arriving as ``future``."""

  step: int
  future: Any
  handed: float  # time.time() when handed to the link


class Background(MeshPlacement):
  """The background runtime of one process: its local replicas' programs, the link, the trace.

  Args:
    algo: the run's :class:`~diloco_core.DiLoCo` (config, loss, optimizers, fragment map).
    params: the initial params (gives the fragment map and the leaf kinds).
    mesh: the run's ``mesh`` option (the global mesh; None: one device per process).
    out: the run's output directory (the trace file goes under it), or None.
    resumed: the run resumes (the trace file is appended to).

  The loop calls it through :class:`~diloco_core.communication.InBackground`.
  """

  replica_fields = ("params", "opt_state", "ef_residual", "participants")

  def __init__(self, algo: DiLoCo, params, mesh: str | None = None, out: str | None = None,
               resumed: bool = False):
    self.algo, self.config = algo, algo.config
    cfg = self.config
    self.processes, self.rank = jax.process_count(), jax.process_index()
    self.local = cfg.replicas // self.processes
    self.offset = self.rank * self.local
    self.mesh = _mesh(mesh, cfg.replicas)
    if cfg.outer_overlap == "eager":
      self.replica_fields = Background.replica_fields + ("in_flight",)
    algo.prepare(params)
    self.trace: list[dict] = []
    self._trace_file = None
    if out is not None:
      path = os.path.join(out, TRACE_FILE.format(rank=self.rank))
      os.makedirs(os.path.dirname(path), exist_ok=True)
      self._trace_file = open(path, "a" if resumed else "w")
    self.link = Link(on_transfer=self._transferred)
    self._in_flight: dict[int, _InFlight] = {}
    self._stale_global: set[int] = set()  # eager: fragments whose θ_g waits for the replicas' mean
    self._programs: dict[tuple, Any] = {}
    self._shapes: dict[str, list] = {}  # per branch: a fragment's leaves (see _leaves_of)
    self._hp = None

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
      changes[name] = jax.tree.map(lambda x: self.own_rows(x) if own else _any_copy(x), getattr(state, name))
    return self._place(state.replace(**changes))

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

  def _place(self, state: DiLoCoState) -> DiLoCoState:
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

  def global_state(self, state: DiLoCoState) -> DiLoCoState:
    """The state as the in-step run holds it (settle first): it already is (global arrays on
    the mesh)."""
    return state

  def host_replicas(self, state: DiLoCoState) -> Any:
    """Every replica's params on the host (gathered over the processes; after :meth:`settle`)."""
    leaves, treedef = jax.tree.flatten(state.params)
    flat = self.own_rows(_flat(leaves))
    full = wait(self.link.gather(flat, "replica params"), "gathering the replicas' params")
    return jax.tree.unflatten(treedef, [x.astype(y.dtype) for x, y in zip(_split(np.asarray(full), leaves), leaves)])

  # ---- the state -----------------------------------------------------------------------------
  def init(self, params) -> DiLoCoState:
    """This process's initial state: its local replicas, the global copy, the outer state."""
    from diloco_core.fragments import per_fragment_state
    cfg, hp = self.config, self.algo.hyperparams
    m = self.local
    stack = lambda tree: jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (m, *np.shape(x))), tree)
    params = jax.tree.map(np.asarray, params)
    outer_state = per_fragment_state(resolve_optimizer(self.algo.outer_optimizer, hp), params, cfg.fragments)
    zeros = lambda tree: jax.tree.map(lambda x: np.zeros(np.shape(x), np.float32), tree)
    in_flight = {"none": None, "delayed": zeros(params)}.get(cfg.outer_overlap)
    if cfg.outer_overlap == "eager":
      in_flight = eager.EagerInFlight(zeros(stack(params)), stack(params), stack(outer_state))
    state = DiLoCoState(
        params=stack(params), opt_state=stack(resolve_optimizer(self.algo.inner_optimizer, hp).init(params)),
        global_params=params, outer_state=jax.tree.map(np.asarray, outer_state),
        ef_residual=zeros(stack(params)) if cfg.error_feedback else None,
        step=np.zeros((), np.int32), participants=np.ones((m, cfg.fragments), np.float32),
        in_flight=in_flight)
    return self._place(state)

  def _hyperparams(self, last: bool):
    if self._hp is None:
      dtypes = {k: np.dtype(self.algo.config_hyperparams.get(k, "float32")) for k in self.algo.hyperparams}
      values = {k: dtypes[k].type(v) for k, v in self.algo.hyperparams.items()}
      self._hp = (self.place_replicated(values), self.place_replicated({**values, "alpha": np.float32(1.0)}))
    return self._hp[int(last)]

  # ---- programs ------------------------------------------------------------------------------
  def _program(self, name: str, branch: str, state, fn, extra_out: tuple = ()):
    """The jitted local program ``name`` for ``branch`` (built once; the state is donated and
    keeps its shardings)."""
    key = (name, branch)
    if key not in self._programs:
      state_sh = jax.tree.map(lambda x: x.sharding, state)
      shardings = {"replica": replica_sharding(self.mesh), "replicated": replicated(self.mesh)}
      out = (state_sh, *(shardings[e] for e in extra_out)) if extra_out else state_sh
      program = drjax.program(diloco=self.config.replicas)(fn)
      self._programs[key] = jax.jit(program, donate_argnums=0, out_shardings=out)
    jitted = self._programs[key]

    def call(*args):
      with jax.set_mesh(self.mesh):
        return jitted(*args)
    return call

  def compiled_text(self, name: str, branch: str, *args) -> str:
    """The compiled HLO of the local program ``name`` (``"inner"``, ``"send"``, ``"settle"``,
    ``"merge"``) for ``branch`` (``""`` for inner; ``"all"`` when P = 1), built by an earlier
    step, for these arguments (nothing runs): what the tests search for collectives."""
    with jax.set_mesh(self.mesh):
      return self._programs[(name, branch)].lower(*args).compile().as_text()

  def _ops(self, state: DiLoCoState) -> SendOperands:
    return SendOperands(global_params=jax.tree.leaves(state.global_params),
                        outer_state=jax.tree.leaves(state.outer_state),
                        replica_params=jax.tree.leaves(state.params),
                        ef_residual=None if state.ef_residual is None else jax.tree.leaves(state.ef_residual),
                        participation=None, in_flight=eager.leaves(state.in_flight))

  def _rebuild(self, state: DiLoCoState, ops: SendOperands, params=None) -> DiLoCoState:
    unflat = lambda old, leaves: jax.tree.unflatten(jax.tree.structure(old), leaves)
    return state.replace(
        params=state.params if params is None else unflat(state.params, params),
        global_params=unflat(state.global_params, ops.global_params),
        outer_state=unflat(state.outer_state, ops.outer_state),
        ef_residual=None if ops.ef_residual is None else unflat(state.ef_residual, ops.ef_residual),
        in_flight=eager.unflatten_like(state.in_flight, ops.in_flight))

  def _inner(self, state, batch, hp):
    def fn(state, batch, hp):
      update = lambda p, o, b: inner_update(self.algo.loss_fn, resolve_optimizer(self.algo.inner_optimizer, hp),
                                            p, o, b)
      params, opt_state, loss, metrics = drjax.map_fn(update, (state.params, state.opt_state, batch))
      return state.replace(params=params, opt_state=opt_state, step=state.step + 1), loss, metrics
    return self._program("inner", "", state, fn, ("replica", "replica"))(state, batch, hp)

  def _send(self, state, p: int, hp):
    """The local payloads of fragment p (and, delayed: the outer step with the average in flight;
    eager: each replica's outer step with its others' part)."""
    algo, cfg = self.algo, self.config
    branch, k = _branch(p, cfg.fragments)

    def fn(state, k, hp):
      frag, ops = algo.fragments, self._ops(state)
      sent, e_new = algo._pseudo_gradients(branch, k, hp, ops)
      if e_new is not None:
        ops = ops._replace(ef_residual=frag.put(ops.ef_residual, algo._kinds, branch, e_new, k, axis=1))
      if cfg.outer_overlap == "delayed":  # apply the previous sync's average (settled before)
        in_flight = frag.take(ops.in_flight, algo._kinds, branch, k, axis=0)
        update = algo._outer_step(branch, k, hp, ops, sent, in_flight, ops.ef_residual)
        ops = ops._replace(global_params=update.global_params, outer_state=update.outer_state)
      elif cfg.outer_overlap == "eager":
        outer_step = algo._fragment_outer_step(hp, frag.take(ops.global_params, algo._kinds, branch, k, axis=0))
        fl = eager.send_local(frag, (algo._kinds, algo._outer_kinds), branch, k, outer_step, sent,
                              ops.in_flight, cfg.replicas)
        ops = ops._replace(in_flight=fl)
      return self._rebuild(state, ops), _flat(sent)
    return self._program("send", branch, state, fn, ("replica",))(state, k, hp)

  def _settle_program(self, state, p: int, gathered, hp):
    algo, cfg = self.algo, self.config
    branch, k = _branch(p, cfg.fragments)

    def fn(state, gathered, k, hp):
      frag, ops = algo.fragments, self._ops(state)
      mean = [jnp.mean(x, axis=0) for x in gathered]  # float32 payloads, [M, ...] each
      if cfg.outer_overlap == "none":
        update = algo._outer_step(branch, k, hp, ops, None, mean, ops.ef_residual)
        ops = ops._replace(global_params=update.global_params, outer_state=update.outer_state)
      elif cfg.outer_overlap == "delayed":
        ops = ops._replace(in_flight=frag.put(ops.in_flight, algo._kinds, branch, mean, k, axis=0))
      else:
        ops = ops._replace(in_flight=eager.settle_local(frag, (algo._kinds, algo._outer_kinds), branch, k,
                                                        mean, ops.in_flight, cfg.replicas))
      return self._rebuild(state, ops)
    return self._program("settle", branch, state, fn)(state, gathered, k, hp)

  def _refresh_global(self, state, p: int):
    """Eager: θ_g[p] = the mean of every replica's own outer params (gathered)."""
    algo, cfg = self.algo, self.config
    branch, k = _branch(p, cfg.fragments)
    if ("take", branch) not in self._programs:
      self._programs[("take", branch)] = jax.jit(
          lambda fl, k: _flat(algo.fragments.take(jax.tree.leaves(fl), algo._kinds, branch, k, axis=1)))
    with jax.set_mesh(self.mesh):
      mine = self.own_rows(self._programs[("take", branch)](state.in_flight.outer_params, k))
    gathered = wait(self.link.gather(mine, f"outer params of fragment {p}"),
                    f"gathering the replicas' outer params of fragment {p}")

    def fn(state, gathered, k):
      frag, ops = algo.fragments, self._ops(state)
      like = frag.take(ops.in_flight.outer_params, algo._kinds, branch, k, axis=1)
      new_g = [jnp.mean(x.astype(y.dtype), axis=0).astype(y.dtype) for x, y in zip(gathered, like)]
      return self._rebuild(state, ops._replace(
          global_params=frag.put(ops.global_params, algo._kinds, branch, new_g, k, axis=0)))
    return self._program("refresh", branch, state, fn)(state, self._leaves_of(state, p, gathered), k)

  def _merge(self, state, p: int, hp):
    algo, cfg = self.algo, self.config
    branch, k = _branch(p, cfg.fragments)
    per_replica = cfg.outer_overlap == "eager"

    def fn(state, k, p, hp):
      ops = self._ops(state)
      how = drjax.map_fn(lambda row: row[p], state.participants)
      merged = algo._merge(branch, k, hp["alpha"], MergeOperands(
          global_params=ops.in_flight.outer_params if per_replica else ops.global_params,
          replica_params=ops.replica_params, participation=how), per_replica)
      return self._rebuild(state, ops, params=merged)
    return self._program("merge", branch, state, fn)(state, k, np.int32(p), hp)

  # ---- the step ------------------------------------------------------------------------------
  def step(self, state: DiLoCoState, batch, t: int, last: bool = False):
    """Inner step t of the local replicas, the due send (handed to the link) and merge.

    Returns ``(state, metrics)`` like :meth:`diloco_core.diloco.DiLoCo.step`, with this process's replicas only.
    ``last``: the run's last step with ``eval_replicas`` (α = 1 there, as in-step).
    """
    cfg, hp = self.config, self._hyperparams(last)
    start = time.time()
    state, loss, metrics = self._inner(state, batch, hp)
    is_send, p = sent_fragment(t, cfg.sync_every, cfg.fragments, cfg.fragment_order)
    if is_send:
      if p in self._in_flight:  # delayed / eager: the previous sync of p arrives now (H steps on)
        state = self._settle(state, p, t)
      state, flat = self._send(state, p, hp)
      flat = self.own_rows(flat)  # waits for the payload program
      self._in_flight[p] = _InFlight(t, self.link.gather(flat, f"fragment {p} @ step {t}"), time.time())
      if cfg.outer_overlap == "eager":
        self._stale_global.add(p)
    is_merge, q = merged_fragment(t, cfg.sync_every, cfg.fragments, cfg.overlap, cfg.fragment_order)
    if is_merge:
      if cfg.outer_overlap == "none" and q in self._in_flight:
        state = self._settle(state, q, t)
      state = self._merge(state, q, hp)
    jax.block_until_ready(loss)
    jax.block_until_ready(state.params)
    self._record({"kind": "compute", "step": t, "start": start, "end": time.time()})
    return state, {"loss": loss, "loss_metrics": metrics, "sent": is_send, "merged": is_merge}

  def _settle(self, state, p: int, t: int):
    """Waits for fragment p's payloads (recording the wait) and settles them into the state."""
    flight = self._in_flight.pop(p)
    waited = time.time()
    gathered = wait(flight.future, f"the all-reduce of fragment {p} sent at step {flight.step}")
    now = time.time()
    if now - waited > 1e-4:
      self._record({"kind": "wait", "step": t, "fragment": p, "start": waited, "end": now})
    self._record({"kind": "settle", "step": t, "fragment": p, "sent_at": flight.step, "time": now})
    return self._settle_program(state, p, self._leaves_of(state, p, gathered), self._hyperparams(False))

  def _leaves_of(self, state, p: int, gathered) -> list[jax.Array]:
    """Fragment p's gathered ``[M, n]`` buffer as its leaves, ``[M, ...]`` each (:func:`_split`)."""
    branch, k = _branch(p, self.config.fragments)
    if branch not in self._shapes:  # the leaves' shapes do not depend on k (a layer's slice)
      take = lambda params, k: self.algo.fragments.take(jax.tree.leaves(params), self.algo._kinds, branch, k, axis=1)
      self._shapes[branch] = jax.eval_shape(take, state.params, 0 if k is None else k)
    return self.place_replicated(_split(np.asarray(gathered), self._shapes[branch]))

  def settle(self, state, t: int):
    """Settles every fragment in flight (and, eager, refreshes θ_g): the state is then the SPMD
    state of step t. Called before eval rows, checkpoints and the end."""
    for p in sorted(self._in_flight, key=lambda q: self._in_flight[q].step):
      state = self._settle(state, p, t)
    for p in sorted(self._stale_global):
      state = self._refresh_global(state, p)
    self._stale_global.clear()
    return state

  # ---- records -------------------------------------------------------------------------------
  def _transferred(self, what: str, launched: float, finished: float) -> None:
    self._record({"kind": "transfer", "what": what, "launched": launched, "finished": finished})

  def _record(self, row: dict) -> None:
    self.trace.append(row)
    if self._trace_file is not None:
      self._trace_file.write(json.dumps(row) + "\n")
      self._trace_file.flush()

  def close(self) -> None:
    """Stops the link thread (after what it holds) and closes the trace file."""
    self.link.close()
    if self._trace_file is not None:
      self._trace_file.close()
      self._trace_file = None


def _branch(p: int, fragments: int) -> tuple[str, int | None]:
  """(``Fragments.switch``'s branch, its k) of fragment p: one program per branch, k traced."""
  if fragments == 1:
    return "all", None
  return ("other", None) if p == 0 else ("layer", np.int32(p - 1))


def _any_copy(x) -> np.ndarray:
  """A host copy of a replicated (possibly multi-process) array."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(x.addressable_shards[0].data)
  return np.asarray(x)
