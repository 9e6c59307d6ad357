"""The elastic parts of the background runtime: lost replicas, and healing a replacement.

:class:`ElasticRuntime` is mixed into :class:`~diloco_core.runtime.background.Background` (``elastic``,
:mod:`diloco_core.runtime.elastic`). Its link runs every sync and log row as an agreement over the live
processes (:class:`~diloco_core.runtime.membership.Membership`); this module reads who is lost from
them, and heals a replacement:

* **the replacement** enters the agreements as soon as it is connected, and takes part in them
  with nothing on a thread while it builds and compiles its programs
  (:meth:`ElasticRuntime.warm_up`); then it says it is ready;
* **the leader** (the lowest process of the agreement the replacement joined at), at the start
  of the first step after a log row at which the replacement is ready (``heal_wait``: it may
  wait that long there for it), settles everything in flight (settling early changes no
  number), and sends the state after that log row (:func:`pack_heal`): the global params and
  the outer state of every fragment, its own first replica's inner optimizer state, the step;
  the trace records a ``heal`` row (step, the replacement's replicas, the source replica);
* **the replacement** (:meth:`ElasticRuntime.rejoin`) then starts from that state, healed by
  :func:`~diloco_core.algorithm.state.heal_replicas`: its replicas' params are the global
  params, their inner optimizer state the source replica's (its moments and step count, as
  torchft heals from a live peer), their error-feedback residual zero, and each fragment
  counts as missed (a merge still pending replaces its fragment by the global copy); it counts
  in the average from the next sync on.

The same event in the in-step runtime is ``rejoin_schedule``
(:meth:`~diloco_core.runtime.communication.InStep.rejoin_replicas`, the same rule): a
run replayed from its trace (:func:`diloco_core.run.drops.schedule_from_trace`,
:func:`diloco_core.run.drops.rejoins_from_trace`) follows the elastic run.

**Who writes the run's files** (:meth:`ElasticRuntime.writes_files`): the lowest process of
the last agreement that has run since the start: process 0, unless it was lost (possible
when the coordination service runs in a process of its own,
:mod:`diloco_core.launch.coordination_service`); a replacement never (it lacks the rows before its
heal). A process that becomes the writer at a log row takes ``metrics.jsonl`` over from its
own rows (every process holds them all).

**Checkpoints** (:meth:`ElasticRuntime.checkpoint_state`): no Orbax save over every process
(its barriers would wait for a lost one). At a checkpoint's log row every process sends its
replicas' rows through one agreement, and the writer writes the checkpoint alone. The replicas of the processes left out
(lost, or a replacement not healed yet) are written as their heal would make them
(:func:`~diloco_core.algorithm.state.heal_replicas`); the meta item names them
(``filled``, ``source``). A resume therefore starts every replica, and equals the run
replayed in-step with those replicas rejoining at the checkpoint's step (the trace's
``resumed`` row: :func:`~diloco_core.run.drops.rejoins_from_trace`).
"""

from __future__ import annotations

import io
import itertools
import time

import jax
import numpy as np

from diloco_core.runtime.background_programs import fragment_branch
from diloco_core.runtime.link import LostProcessError, wait
from diloco_core.devices.mesh import host_copy
from diloco_core.algorithm.state import DiLoCoState, heal_replicas


def pack_heal(global_params, outer_state, opt_state, step: int, keys: int) -> bytes:
  """The heal a leader sends: host arrays (the source replica's ``opt_state``, no replica axis).

  Examples:
    >>> data = pack_heal({"w": np.ones(2)}, {"v": np.zeros(2)}, {"m": np.full(2, 3.0)}, 8, 5)
    >>> g, o, s, step, keys = unpack_heal(data, {"w": 0}, {"v": 0}, {"m": 0})
    >>> g["w"].tolist(), s["m"].tolist(), step, keys
    ([1.0, 1.0], [3.0, 3.0], 8, 5)
  """
  arrays = {}
  for prefix, tree in (("g", global_params), ("o", outer_state), ("s", opt_state)):
    arrays.update({f"{prefix}{i}": np.asarray(x) for i, x in enumerate(jax.tree.leaves(tree))})
  buf = io.BytesIO()
  np.savez(buf, step=np.int64(step), keys=np.int64(keys), **arrays)
  return buf.getvalue()


def unpack_heal(data: bytes, like_global, like_outer, like_opt):
  """``(global_params, outer_state, opt_state, step, keys)`` of :func:`pack_heal`, shaped as the ``like`` trees."""
  z = np.load(io.BytesIO(data))
  tree = lambda like, p: jax.tree.unflatten(jax.tree.structure(like),
                                            [z[f"{p}{i}"] for i in range(len(jax.tree.leaves(like)))])
  return (tree(like_global, "g"), tree(like_outer, "o"), tree(like_opt, "s"), int(z["step"]), int(z["keys"]))


class ElasticRuntime:
  """Mixed into :class:`~diloco_core.runtime.background.Background`: who is lost, and healing.

  Args:
    min_replicas: an elastic run's least replicas present at a sync; None: not elastic.
    heal_every: a replacement is healed after a step that is a multiple of this.
    heal_wait: seconds the leader may wait there for a replacement still compiling.

  It uses only public names of the runtime it is mixed into: ``config``, ``link``,
  ``processes``, ``local``, ``offset``, ``replica_fields``, ``exchange_keys`` and its methods
  (``record``, ``own_rows``, ``place_state``, ``local_state``, ``place_replicated``,
  ``placed_hyperparams``, ``payload_leaves``, ``settle`` and the phase programs).
  """

  def __init__(self, min_replicas: int | None, heal_every: int = 1, heal_wait: float = 0.0):
    self.min_replicas, self.heal_every, self.heal_wait = min_replicas, heal_every, heal_wait
    self._unsent: list[tuple[int, float]] = []  # (sync step, share of the replicas that sent nothing)

  def absent_processes(self) -> tuple[int, ...]:
    """Elastic: the processes the last agreement left out (lost); otherwise none."""
    return tuple(r for r in range(self.processes) if self.link.last and r not in self.link.last.members)

  def absent_replicas(self) -> np.ndarray | None:
    """Elastic: the [M] mask of the replicas of lost processes (True: lost); None otherwise."""
    if self.min_replicas is None:
      return None
    lost = np.zeros(self.processes, bool)
    lost[list(self.absent_processes())] = True
    return np.repeat(lost, self.local)

  def replica_params(self, state: DiLoCoState):
    """The replicas' params the divergence watch reads: all; elastic: this process's own (no
    collective that a lost process would hold)."""
    if self.min_replicas is None:
      return state.params
    return jax.tree.map(lambda x: [s.data for s in x.addressable_shards], state.params)

  def record_membership(self, t: int) -> None:
    """Trace rows for the losses and joins the link's agreements saw since the last call
    (``lost``, ``joined``: the processes, the agreement, its time), under step ``t``."""
    while self.link.events:
      self.record({**self.link.events.pop(0), "step": t})

  def live_participation(self, gathered, present, sent_at: int, p: int, t: int):
    """Who took part in a settled sync: as planned; elastic, the replicas of the live processes.

    Args:
      gathered: what the link delivered (elastic: with its agreement).
      present: the planned [M] participation mask (simulated drops), or None for everyone.
      sent_at, p, t: the sync's step and fragment, and the step that settles it.

    Returns:
      ``(payloads, participation)``; elastic: the replicas of the processes the agreement left
      out are absent (counted for :meth:`take_unsent`).

    Raises:
      LostProcessError: elastic, fewer than ``min_replicas`` replicas took part.
    """
    if self.min_replicas is None:
      return gathered, present
    gathered, agreement = gathered
    live = np.repeat(agreement.present(self.processes), self.local)
    planned, present = (1.0 if present is None else present), live * (1.0 if present is None else present)
    self._unsent.append((sent_at, float(np.mean(planned) - np.mean(present))))  # the lost sent nothing
    self.record_membership(t)
    if live.sum() < self.min_replicas:
      raise LostProcessError(f"process(es) {list(self.absent_processes())} lost: {int(live.sum())} replica(s)"
                             f" took part in the sync of fragment {p} sent at step {sent_at}, fewer than"
                             f" `min_replicas` ({self.min_replicas})")
    return gathered, present

  def take_unsent(self) -> list[tuple[int, float]]:
    """The syncs settled since the last call, as ``(step, share)``: the share of the replicas
    the byte counters counted that sent nothing (lost, or a replacement not healed yet)."""
    unsent, self._unsent = [(s, f) for s, f in self._unsent if f > 0], []
    return unsent

  def _key_count(self) -> int:
    """The number of the next link exchange (a replacement continues the count)."""
    n = next(self.exchange_keys)
    self.exchange_keys = itertools.count(n)
    return n

  def writes_files(self) -> bool:
    """Whether this process writes the run's files now: process 0; elastic, the lowest process
    of the last agreement that is no replacement (see the module docstring)."""
    if self.min_replicas is None or self.link.last is None:
      return self.link.rank == 0
    if self.link.membership.rejoined:
      return False
    first = [r for r in self.link.last.members if r not in self.link.replaced]
    return bool(first) and first[0] == self.link.rank

  def checkpoint_state(self, state: DiLoCoState, t: int) -> tuple[DiLoCoState | None, dict]:
    """What the checkpoint of log row ``t`` (nothing in flight) saves on this process, and what
    its meta item adds: the state itself (every process writes its part); elastic: the whole
    state on the host of its only writer (:meth:`writes_files` after this agreement), and
    ``{"filled": [...], "source": s}`` (see the module docstring), None on the others."""
    if self.min_replicas is None:
      return state, {}
    fields = [(name, i, x) for name in self.replica_fields
              for i, x in enumerate(jax.tree.leaves(getattr(state, name)))]
    own = [np.ascontiguousarray(self.own_rows(x)) for _, _, x in fields]
    flat = np.concatenate([x.view(np.uint8).reshape(-1) for x in own])[None]  # bit for bit, any dtype
    rows, agreement = wait(self.link.gather(flat, f"checkpoint @ step {t}"), f"gathering the checkpoint of step {t}")
    m = self.local
    filled = [r * m + i for r in range(self.processes) if r not in agreement.members for i in range(m)]
    source = agreement.leader * m  # as a heal: the first replica of the lowest process present
    note = {"filled": filled, "source": source}
    self.record({"kind": "checkpoint", "step": t, **note})
    if not self.writes_files():
      return None, note
    full, start = {}, 0
    for (name, i, x), mine in zip(fields, own, strict=True):
      size = mine.nbytes
      parts = [np.frombuffer(rows[r, start:start + size].tobytes(), x.dtype).reshape(mine.shape)
               for r in range(self.processes)]
      full[name, i] = np.concatenate(parts)
      start += size
    host = {name: jax.tree.unflatten(jax.tree.structure(getattr(state, name)),
                                     [full[name, i] for n, i, _ in fields if n == name])
            for name in self.replica_fields if getattr(state, name) is not None}
    rest = {name: jax.tree.map(host_copy, getattr(state, name)) for name in state.__dataclass_fields__
            if name not in self.replica_fields}
    whole = state.replace(**host, **rest)  # the rows of those left out: as their heal would set them
    return heal_replicas(whole, filled, jax.tree.map(lambda x: x[source], whole.opt_state), missed=True), note

  def resumed_from(self, step: int, meta: dict) -> None:
    """Elastic, after a resume: the trace's ``resumed`` row (the checkpoint's step, the replicas it
    filled and their source), which the replay reads as a rejoin."""
    if self.min_replicas is not None:
      self.record({"kind": "resumed", "step": step, "replicas": meta.get("filled", []),
                    "source": meta.get("source", 0)})

  @property
  def rejoining(self) -> bool:
    """Whether this process is a replacement that must :meth:`rejoin` before its first step."""
    return self.link.membership is not None and self.link.membership.rejoined

  def rejoin_replicas(self, state: DiLoCoState, replicas, source: int) -> DiLoCoState:
    """``rejoin_schedule`` replays an elastic run in the in-step runtime only (the config refuses
    it here): raises a one-line ``ValueError``."""
    raise ValueError("`rejoin_schedule` replays an elastic run in the in-step runtime: use `communication`"
                     " in-step.")

  def heal_joiners(self, state: DiLoCoState, t: int) -> DiLoCoState:
    """The leader, at the start of step ``t`` when step t - 1 was a log row: the replacements
    waiting that are ready (compiled: :meth:`rejoin`) get the state after step t - 1 (with
    nothing in flight)."""
    membership = self.link.membership
    if membership is None or not membership.pending or (t - 1) % self.heal_every:
      return state
    pending = self._ready_joiners(membership, t)
    if not pending:
      return state
    state = self.settle(state, t - 1)
    first = lambda x: np.asarray(x.addressable_shards[0].data)[0]  # this process's first replica's row
    data = pack_heal(jax.tree.map(host_copy, state.global_params), jax.tree.map(host_copy, state.outer_state),
                     jax.tree.map(first, state.opt_state), t - 1, self._key_count())
    for r in pending:
      membership.send_heal(r, data)
    self.record({"kind": "heal", "step": t - 1, "processes": pending, "source": self.offset, "time": time.time(),
                  "replicas": [r * self.local + i for r in pending for i in range(self.local)]})
    return state

  def _ready_joiners(self, membership, t: int) -> list[int]:
    """The replacements waiting that are ready; with ``heal_wait``, waits up to that long for
    the others to be (the wait is a trace row, ``"for": "heal"``)."""
    start = time.time()
    ready = [r for r in sorted(membership.pending) if membership.ready(r)]
    while len(ready) < len(membership.pending) and time.time() - start < self.heal_wait:
      time.sleep(0.05)
      ready = [r for r in sorted(membership.pending) if membership.ready(r)]
    if time.time() - start > 0.05:
      self.record({"kind": "wait", "step": t - 1, "for": "heal", "start": start, "end": time.time()})
    return ready

  def warm_up(self, state: DiLoCoState, batch) -> None:
    """A replacement, before it says it is ready: runs each phase program it will run (an inner
    step, and for each fragment branch a send, a settle of zero payloads and a merge) once on a
    copy of its placeholder state, then drops the copy. It compiles them while the others train
    (its thread takes part in their agreements meanwhile), instead of after its heal, when every
    agreement would wait for it; no number of the run depends on it."""
    M, P, hp = self.config.replicas, self.config.fragments, self.placed_hyperparams(False)
    copy = self.local_state(state)  # fresh arrays: the programs donate their state
    copy, loss, _ = self.inner_program(copy, batch, hp)
    everyone = self.place_replicated(np.ones(M, np.float32))
    for p in sorted({fragment_branch(p, P)[0]: p for p in range(P)}.values()):  # one fragment per branch
      copy, flat = self.send_program(copy, p, hp)
      zeros = np.zeros((M, int(np.shape(flat)[-1])), np.float32)
      copy = self.settle_program(copy, p, self.payload_leaves(copy, p, zeros), hp, everyone)
      copy = self.merge_program(copy, p, hp)
    jax.block_until_ready((loss, copy))

  def rejoin(self, state: DiLoCoState, batch=None) -> tuple[DiLoCoState, int]:
    """A replacement: compiles its programs (:meth:`warm_up`, given a ``batch``) while it takes
    part in the agreements with nothing, says it is ready, waits for the leader's heal, then
    returns its state (see the module docstring) and the step it holds."""
    membership = self.link.membership
    if batch is not None:
      started = time.time()
      self.warm_up(state, batch)
      self.record({"kind": "warm-up", "start": started, "end": time.time()})
    membership.mark_ready()
    key, data = membership.heal()
    one = jax.tree.map(lambda x: np.asarray(x.addressable_shards[0].data)[0], state.opt_state)
    glob, outer, opt, step, keys = unpack_heal(data, state.global_params, state.outer_state, one)
    m, P = self.local, self.config.fragments
    rows = lambda tree, dtype=None: jax.tree.map(lambda x: np.empty((m, *np.shape(x)), dtype or x.dtype), tree)
    host = state.replace(params=rows(glob), opt_state=rows(opt), global_params=glob, outer_state=outer,
                         ef_residual=None if state.ef_residual is None else rows(glob, np.float32),
                         step=np.int32(step), participants=np.empty((m, P), np.float32))
    host = heal_replicas(host, range(m), opt, missed=True)  # every local replica rejoins
    self.exchange_keys = itertools.count(keys)
    self.record({"kind": "healed", "step": step, "first": key})
    return self.place_state(host), step
