"""The phases of a DiLoCo step as separate programs, for the background runtime.

:class:`PhasePrograms` compiles the phases of :class:`~diloco_core.algorithm.phases.Phases` as local
programs over the run's mesh, with no collective in any of them (the link moves the data):
``inner`` (one inner step of the local replicas), ``send`` (the payloads, flattened into one
float32 buffer; delayed: the outer step with the average in flight; eager: each replica's
outer step with its others' part), ``settle`` (the mean of the gathered payloads and what
the SPMD send does with it), ``refresh`` (eager: θ_g from every replica's own outer params)
and ``merge``. Each program composes the phases (the rules are written there once, for both
runtimes); :class:`~diloco_core.runtime.background.Background` runs them around its link.
"""

from __future__ import annotations

from typing import Any

import drjax
import jax
import jax.numpy as jnp
import numpy as np

from diloco_core.algorithm import eager
from diloco_core.algorithm.phases import present_mean
from diloco_core.devices.mesh import replica_sharding, replicated
from diloco_core.algorithm.state import SKIPPED, DiLoCoState, MergeOperands, SendOperands


def flat_buffer(leaves: list) -> jax.Array:
  """Per-replica leaves ``[m, ...]`` as one float32 ``[m, n]`` buffer (the link packs it to the wire format, :mod:`~diloco_core.wire.packing`)."""
  return jnp.concatenate([x.reshape(x.shape[0], -1).astype(jnp.float32) for x in leaves], axis=1)


def split_buffer(flat: np.ndarray, like: list) -> list[np.ndarray]:
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


def fragment_branch(p: int, fragments: int) -> tuple[str, int | None]:
  """(``Fragments.switch``'s branch, its k) of fragment p: one program per branch, k traced."""
  if fragments == 1:
    return "all", None
  return ("other", None) if p == 0 else ("layer", np.int32(p - 1))


def local_mean(leaves: list) -> list:
  """The mean over the replica axis of gathered ``[M, ...]`` leaves, in replica order (the
  reduction the SPMD program computes; no collective: every process holds every row)."""
  return [jnp.mean(x, axis=0) for x in leaves]


class PhasePrograms:
  """The phase programs of one process (a base class of :class:`~diloco_core.runtime.background.Background`).

  Reads ``algo``, ``config`` and ``mesh`` of the runtime; each program is built once per
  fragment branch, donates the state and keeps its shardings.
  """

  def __init__(self) -> None:
    self._programs: dict[tuple, Any] = {}

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
    ``"merge"``; with drops ``"send-masked"``, ``"settle-masked"``, ``"skip"``) for ``branch``
    (``""`` for inner and skip; ``"all"`` when P = 1), built by an earlier
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

  def inner_program(self, state, batch, hp):
    """One inner step of the local replicas (:meth:`~diloco_core.algorithm.phases.Phases.inner_steps`):
    ``(state, loss, metrics)``."""
    def fn(state, batch, hp):
      params, opt_state, loss, metrics = self.algo.inner_steps(hp, state.params, state.opt_state, batch)
      return state.replace(params=params, opt_state=opt_state, step=state.step + 1), loss, metrics
    return self._program("inner", "", state, fn, ("replica", "replica"))(state, batch, hp)

  def send_program(self, state, p: int, hp, present=None):
    """The local payloads of fragment p and what the sync does before their average is known
    (:meth:`~diloco_core.algorithm.outer_phases.OuterStepPhases.before_mean`). With ``present`` (the [M]
    participation code, sharded along ``diloco``; simulated drops) the dropped replicas keep
    their residual, and every replica's ``participants[p]`` records how it took part."""
    algo, cfg = self.algo, self.config
    branch, k = fragment_branch(p, cfg.fragments)

    def fn(state, k, hp, present, p):
      ops = self._ops(state)
      if present is not None:
        ops = ops._replace(participation=present)
        state = state.replace(participants=drjax.map_fn(lambda row, c: row.at[p].set(c),
                                                        (state.participants, present)))
      ops, sent = algo.payloads(branch, k, hp, ops)
      ops = algo.before_mean(branch, k, hp, ops, sent)
      return self._rebuild(state, ops._replace(participation=None)), flat_buffer(sent)
    name = "send" if present is None else "send-masked"
    return self._program(name, branch, state, fn, ("replica",))(state, k, hp, present, np.int32(p))

  def skip_program(self, state, p: int):
    """A sync of fragment p that nobody takes part in: only ``participants[p]`` changes
    (:data:`~diloco_core.algorithm.state.SKIPPED`, so that its merge leaves every replica alone),
    as in the in-step step."""
    def fn(state, p):
      return state.replace(participants=drjax.map_fn(lambda row: row.at[p].set(SKIPPED), state.participants))
    return self._program("skip", "", state, fn)(state, np.int32(p))

  def settle_program(self, state, p: int, gathered, hp, present=None):
    """Fragment p's gathered payloads into the state: their mean
    (:func:`~diloco_core.algorithm.phases.present_mean` over the replicas ``present`` marks,
    replicated [M], when given) and what the sync does with it
    (:meth:`~diloco_core.algorithm.outer_phases.OuterStepPhases.after_mean`)."""
    algo, cfg = self.algo, self.config
    branch, k = fragment_branch(p, cfg.fragments)

    def fn(state, gathered, k, hp, present):
      if cfg.reduction == "reduce-scatter":  # the link delivered the mean, [1, ...] each
        mean = [x[0] for x in gathered]
      else:  # float32 payloads, [M, ...] each
        mean = present_mean(gathered, present, cfg.replicas, local_mean)
      return self._rebuild(state, algo.after_mean(branch, k, hp, self._ops(state), mean))
    name = "settle" if present is None else "settle-masked"
    return self._program(name, branch, state, fn)(state, gathered, k, hp, present)

  def own_outer_params_program(self, state, p: int) -> jax.Array:
    """Eager: the local replicas' own outer params of fragment p as one flat buffer ``[M, n]``."""
    branch, k = fragment_branch(p, self.config.fragments)
    if ("take", branch) not in self._programs:
      self._programs[("take", branch)] = jax.jit(
          lambda fl, k: flat_buffer(self.algo.fragment_of(jax.tree.leaves(fl), branch, k, axis=1)))
    with jax.set_mesh(self.mesh):
      return self._programs[("take", branch)](state.in_flight.outer_params, k)

  def refresh_program(self, state, p: int, gathered):
    """Eager: θ_g[p], the mean of every replica's own outer params (``gathered``: their leaves,
    ``[M, ...]`` each, replicated; :meth:`~diloco_core.algorithm.outer_phases.OuterStepPhases.replicas_mean`)."""
    algo = self.algo
    branch, k = fragment_branch(p, self.config.fragments)

    def fn(state, gathered, k):
      return self._rebuild(state, algo.replicas_mean(branch, k, self._ops(state), gathered, local_mean))
    return self._program("refresh", branch, state, fn)(state, gathered, k)

  def merge_program(self, state, p: int, hp):
    """Fragment p's merge (:meth:`~diloco_core.algorithm.phases.Phases.merge`), as each replica
    took part in its latest sync."""
    algo, cfg = self.algo, self.config
    branch, k = fragment_branch(p, cfg.fragments)

    def fn(state, k, p, hp):
      ops = self._ops(state)
      how = drjax.map_fn(lambda row: row[p], state.participants)
      towards, per_replica = algo.merge_towards(ops.global_params, ops.in_flight)
      merged = algo.merge(branch, k, hp["alpha"], MergeOperands(
          global_params=towards, replica_params=ops.replica_params, participation=how), per_replica)
      return self._rebuild(state, ops, params=merged)
    return self._program("merge", branch, state, fn)(state, k, np.int32(p), hp)
