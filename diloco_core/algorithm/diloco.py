"""The model-agnostic DiLoCo / Streaming DiLoCo step, written with drjax.

The semantics (symbols, schedule, merge) are those of the semantics page (docs/semantics.md).

:class:`DiLoCo` takes any params pytree, a ``loss_fn(params, batch)``, an inner optax
optimizer and a :class:`~diloco_core.DiLoCoConfig`. One call of its jitted ``step`` does,
for inner step t (counting from 1):

1. every replica m takes one inner step on its own batch (``drjax.map_fn``; nothing
   crosses replicas);
2. if fragment p is due (:func:`~diloco_core.sent_fragment`), each replica computes
   :math:`\\Delta_m = \\theta_g[p] - \\theta_m[p]`, compresses it
   (:math:`Q`, optional error feedback), the replicas average in float32
   (``drjax.reduce_mean``: the only cross-replica collective, over one fragment), and the
   outer optimizer (default ``optax.sgd(η, μ, nesterov=True)``) updates
   :math:`\\theta_g[p]` and its slice of the outer state;
3. if the fragment sent at t − τ is due, every replica merges
   :math:`\\theta_m[p] \\leftarrow \\alpha\\,\\theta_m[p] + (1-\\alpha)\\,\\theta_g[p]`.

Send and merge run under :func:`jax.lax.cond` inside the same jitted function, and the
fragment is a traced index (:class:`~diloco_core.Fragments`), so there is one compiled
program for every step and every P.

Hyperparameters are inputs, not constants. H, τ, η, μ, α (and any named hyperparameter
of the optimizers, e.g. the inner learning rate) enter the compiled step as scalars, so
runs that differ only in them share one program:
:meth:`~diloco_core.algorithm.base.AlgorithmBase.with_hyperparams` returns a copy that
reuses the compiled step (a sweep over η compiles once). The optimizers may be given as
factories ``hparams -> optax.GradientTransformation`` for that purpose.

Fragments in flight. Because τ < H, fragment p is merged before it is sent again, and
:math:`\\theta_g[p]` only changes at p's sends; so at merge time :math:`\\theta_g[p]` still
holds exactly the value computed at the send. The in-flight set is therefore fully
described by ``(global_params, step)``, which the state holds (and checkpoints), and no
second copy of the model is kept (one would cost one model of memory for nothing). With replica drops (the ``participation`` mask of :meth:`DiLoCo.step`)
the state also holds, per replica and fragment, whether it took part in that fragment's
latest sync (``participants``, [M, P], sharded like the replicas so that reading it at the
merge needs no communication), so the merge knows whom to heal; a checkpoint holds that too.

Whole outer step overlapped (``outer_overlap="delayed"`` or ``"eager"``, arXiv 2502.12996):
each sync's average is applied at the next sync of the same fragment; what is in flight
(and, for eager, each replica's own outer params and state) is ``DiLoCoState.in_flight``,
and the eager math is :mod:`diloco_core.algorithm.eager`.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import drjax
import jax
import jax.numpy as jnp
import numpy as np
import optax

from diloco_core.wire import compression

from diloco_core.algorithm import eager
from diloco_core.algorithm.base import AlgorithmBase, all_finite
from diloco_core.algorithm.config import DiLoCoConfig
from diloco_core.spec.fields import traced_fields
from diloco_core.spec.validity import check_choice
from diloco_core.algorithm.fragments import LAYER, OTHER, SHARED, Fragments, leaf_paths
from diloco_core.algorithm.hyperparams import Optimizer, resolve_optimizer
from diloco_core.devices.mesh import make_mesh
from diloco_core.algorithm.optimizers import outer_optimizer_factory
from diloco_core.algorithm.phases import Phases
from diloco_core.algorithm.replica_loop import REPLICA_LOOPS
from diloco_core.spec.schedule import merged_fragment, sent_fragment
from diloco_core.algorithm.state import DiLoCoState, MergeOperands, OuterUpdate, SendOperands, participation_code

LossFn = Callable[[Any, Any], jax.Array]
#: The config fields that are traced inputs of the step rather than compiled-in constants
#: (none of them changes a shape), name -> dtype: H and τ (int32); η, μ, α, the outer Adam's
#: β2 and the error-feedback decay β (float32).
#: Read from :class:`~diloco_core.DiLoCoConfig`'s field metadata.
CONFIG_HYPERPARAMS = traced_fields(DiLoCoConfig)


def default_outer_optimizer(hparams: dict) -> optax.GradientTransformation:
  """The outer optimizer of the semantics page: ``optax.sgd(η, μ, nesterov=True)`` from ``hparams``."""
  return outer_optimizer_factory("nesterov")(hparams)


class DiLoCo(Phases, AlgorithmBase):
  """DiLoCo (P = 1) and Streaming DiLoCo (any P) for any params pytree.

  Args:
    loss_fn: ``loss_fn(params, batch) -> scalar``; ``batch`` is one replica's batch. It may
      also return ``(scalar, metrics)`` (:func:`~diloco_core.algorithm.base.loss_and_grad`).
    inner_optimizer: the optax optimizer each replica runs (AdamW in the papers).
    config: the outer-loop settings; ``algorithm`` must be ``"diloco"`` or ``"streaming"``.
    layer_mask: a pytree of bools shaped like the params marking the stacked-layer
      leaves (leading axis L). Needed when P > 1; everything else is fragment 0.
    outer_optimizer: defaults to the config's ``outer_optimizer``
      (:func:`~diloco_core.algorithm.optimizers.outer_optimizer_factory`; ``"nesterov"``:
      ``optax.sgd(outer_lr, outer_momentum, nesterov=True)``, :func:`default_outer_optimizer`)
      with its hyperparameters traced. Any optax optimizer (or
      factory ``hparams -> optimizer``) whose state holds params-shaped trees works;
      each fragment updates only its slice of them, and owns its own copy of the
      non-parameter state (a count, a schedule step), so a stateful outer optimizer acts
      on each fragment as if it were the whole model
      (:func:`~diloco_core.algorithm.fragments.per_fragment_state`).
    mesh: a mesh with a ``diloco`` axis (replicas) and a ``data`` axis (sequences within
      a replica), see :mod:`diloco_core.devices.mesh`; default: one device.
    hyperparams: extra named hyperparameters (floats) for optimizer factories, e.g.
      ``{"inner_lr": 3e-3}``; with H, τ, η, μ, α (:data:`CONFIG_HYPERPARAMS`) they form
      the dict (:attr:`~diloco_core.algorithm.base.AlgorithmBase.hyperparams`) the step
      receives as scalars (int32 for H and τ, float32 otherwise) and the factories are
      built from.
    replica_loop: how the replicas' inner steps run on the devices that hold them (one of
      :data:`~diloco_core.algorithm.replica_loop.REPLICA_LOOPS`): ``"vectorized"``
      (``drjax.map_fn``: one program whose every array has a leading replica axis) or
      ``"sequential"`` (one model's step per replica, in a loop, reading and writing its slice
      of the state in place: :func:`~diloco_core.algorithm.replica_loop.replicas_in_turn`; the
      replicas must share their devices, a ``diloco`` mesh axis of 1). The numbers are the same
      up to the order of float32 operations (``tests/test_replica_loop.py``); the speed differs
      by backend, and ``benchmarks/accelerator.py`` measures both.

  Examples:
    Two replicas minimising :math:`(w - x)^2` on their own targets; after one sync with
    η = 1, μ = 0 the global copy is the mean of the replicas (FedAvg):

    >>> cfg = DiLoCoConfig(replicas=2, sync_every=1, outer_lr=1.0, outer_momentum=0.0)
    >>> algo = DiLoCo(lambda w, x: jnp.sum((w - x) ** 2), optax.sgd(0.25), cfg)
    >>> state = algo.init(jnp.zeros(()))
    >>> state, metrics = algo.step(state, jnp.array([1.0, 3.0]))
    >>> state.params.tolist(), float(state.global_params)
    ([1.0, 1.0], 1.0)

    The same compiled step with another outer learning rate (η = 0.5: halfway to the mean);
    H, τ, μ and α can change the same way:

    >>> algo2 = algo.with_hyperparams(outer_lr=0.5)
    >>> state2, _ = algo2.step(algo2.init(jnp.zeros(())), jnp.array([1.0, 3.0]))
    >>> float(state2.global_params), algo2.program is algo.program, algo.compiled_programs
    (0.5, True, 1)

  """

  _initial_program = None  # the jitted initial state, built by init (shared by with_hyperparams copies)

  def __init__(self, loss_fn: LossFn, inner_optimizer: Optimizer, config: DiLoCoConfig, *,
               layer_mask: Any = None, outer_optimizer: Optimizer | None = None, mesh=None,
               hyperparams: dict[str, float] | None = None, replica_loop: str = "vectorized"):
    if config.algorithm not in ("diloco", "streaming"):
      raise ValueError(f"DiLoCo needs algorithm 'diloco' or 'streaming', got {config.algorithm!r};"
                       " use DataParallel for 'dp'.")
    self.config = config
    self.loss_fn = loss_fn
    self.inner_optimizer = inner_optimizer
    self.outer_optimizer = (outer_optimizer_factory(config.outer_optimizer) if outer_optimizer is None
                            else outer_optimizer)
    self._init_hyperparams(hyperparams)
    self.layer_mask = layer_mask
    self.mesh = make_mesh() if mesh is None else mesh
    check_choice("replica_loop", replica_loop, REPLICA_LOOPS)
    if replica_loop == "sequential" and self.mesh.shape["diloco"] > 1:
      raise ValueError(f"replica_loop 'sequential' needs the replicas on shared devices (a diloco mesh axis"
                       f" of 1), got {self.mesh.shape['diloco']} devices on it; use 'vectorized'.")
    self.replica_loop = replica_loop
    self.fragments: Fragments | None = None
    if config.outer_overlap == "eager":  # per-replica outer params and state
      self.replica_fields = DiLoCo.replica_fields + ("in_flight",)

  replica_fields = ("params", "opt_state", "ef_residual", "participants")
  config_hyperparams = CONFIG_HYPERPARAMS

  # ---- set-up ------------------------------------------------------------------------------
  def prepare(self, params) -> None:
    """Builds the fragment map and leaf kinds for params of this structure (``init`` does it
    too); what a runtime that runs the step's phases as separate programs
    (:mod:`diloco_core.runtime.background`) needs before its first program."""
    if self.fragments is None:
      self._build(params)

  def _build(self, params) -> None:
    cfg = self.config
    leaves, self._treedef = jax.tree.flatten(params)
    if self.layer_mask is None:
      is_layer = [False] * len(leaves)
    else:
      mask_leaves, mask_def = jax.tree.flatten(self.layer_mask)
      if mask_def != self._treedef:
        raise ValueError("layer_mask must have exactly the structure of the params pytree.")
      bad = [m for m in mask_leaves if not isinstance(m, (bool, np.bool_))]
      if bad:
        raise ValueError("layer_mask leaves must be Python bools (True: a layer leaf, stacked on"
                         f" a leading layer axis), got a {type(bad[0]).__name__}.")
      is_layer = [bool(m) for m in mask_leaves]
    self.fragments = Fragments(is_layer, [np.shape(x) for x in leaves], cfg.fragments,
                               cfg.fragment_pattern, paths=leaf_paths(params))
    self.leaf_kinds = [LAYER if m else OTHER for m in is_layer]
    kinds_tree = jax.tree.unflatten(self._treedef, self.leaf_kinds)
    outer_opt = resolve_optimizer(self.outer_optimizer, self.hyperparams)
    abstract = jax.eval_shape(outer_opt.init, params)
    self.outer_leaf_kinds = jax.tree.leaves(optax.tree_utils.tree_map_params(
        outer_opt, lambda _, kind: kind, abstract, kinds_tree,
        transform_non_params=lambda _: SHARED))
    bits = [sum(compression.wire_bits(int(np.prod(s)), cfg.compression, **cfg.wire)
                for s in self.fragments.leaf_shapes(p)) for p in range(cfg.fragments)]
    self.fragment_bytes = [b / 8 for b in bits]

  def init(self, params) -> DiLoCoState:
    """The initial state: every replica and the global copy start from ``params``.

    Compiles nothing if this object (or the one it was copied from by
    :meth:`~diloco_core.algorithm.base.AlgorithmBase.with_hyperparams`) already holds a
    step for params of this structure.
    """
    cfg = self.config
    state = self._place_state(self._initial_on_device(params, cfg.replicas))

    def make_step():
      self._build(params)
      return self._jit_step(drjax.program(diloco=cfg.replicas)(self._step_impl), state)

    self._compile_once(state, make_step)
    return state

  def _initial_on_device(self, params, replicas: int) -> DiLoCoState:
    """:meth:`initial_state` built by one jitted program on the default device.

    The same arrays (zeros, copies and broadcasts are exact) from one program to load or
    compile instead of one per leaf shape. The hyperparameters are its inputs, so the copies
    :meth:`with_hyperparams` makes share it.
    """
    if self._initial_program is None:
      self._initial_program = jax.jit(lambda p, hp, m: self.initial_state(p, m, hp=hp), static_argnums=2)
    return self._initial_program(params, self.typed_hyperparams(), replicas)

  # ---- the step ------------------------------------------------------------------------------
  def step(self, state: DiLoCoState, batch, participation=None
           ) -> tuple[DiLoCoState, dict[str, jax.Array]]:
    """One inner step on every replica, then the due send and merge (jitted).

    Args:
      state: the current state (donated: do not reuse it after the call).
      batch: a pytree whose leaves have a leading axis M (one batch per replica).
      participation: optional float32 [M] mask of the replicas that take part in the sync
        sent at this step (1 present, 0 dropped; ignored when nothing is sent). Dropped
        replicas are left out of the average (it is renormalised over the present ones)
        and healed at that fragment's merge: their fragment is *replaced* by the new
        global one (α does not apply to them). If nobody is present, the fragment's outer
        update is skipped and its merge leaves every replica alone. None (the default)
        means everyone and runs exactly the unmasked computation; an all-ones mask gives
        the same numbers bit for bit (one more compiled program).

    Returns:
      The new state and metrics ``{"loss": [M] per-replica train loss before the update,
      "loss_metrics": {name: [M]} what else the loss function reports (e.g. an MoE's
      ``"aux_loss"``; ``{}`` for a scalar loss), "sent": bool, "merged": bool}``, all on device.

    Examples:
      Replica 1 misses the first sync (η = 1, μ = 0): the global copy is replica 0's
      params alone, and replica 1 is then replaced by it:

      >>> cfg = DiLoCoConfig(replicas=2, sync_every=1, outer_lr=1.0, outer_momentum=0.0)
      >>> algo = DiLoCo(lambda w, x: jnp.sum((w - x) ** 2), optax.sgd(0.25), cfg)
      >>> state = algo.init(jnp.zeros(()))
      >>> state, _ = algo.step(state, jnp.array([1.0, 3.0]), jnp.array([1.0, 0.0]))
      >>> float(state.global_params), state.params.tolist(), state.participants.tolist()
      (0.5, [0.5, 0.5], [[1.0], [0.0]])
    """
    if participation is not None and self.config.outer_overlap != "none":
      raise ValueError(f"participation (replica drops) is not supported with outer_overlap="
                       f"{self.config.outer_overlap!r}; use outer_overlap='none'.")
    return super().step(state, batch, participation)

  def _step_impl(self, state: DiLoCoState, batch, hp, participation=None):
    cfg = self.config  # only its structural fields: H, τ, η, μ, α, β2, β come in ``hp`` (traced)
    params, opt_state, loss, metrics = self.inner_steps(hp, state.params, state.opt_state, batch)
    t = state.step + 1

    g = jax.tree.leaves(state.global_params)
    outer = jax.tree.leaves(state.outer_state)
    r = jax.tree.leaves(params)
    ef = None if state.ef_residual is None else jax.tree.leaves(state.ef_residual)
    fl = eager.leaves(state.in_flight)

    h, tau = hp["sync_every"], hp["overlap"]
    is_send, p_send = sent_fragment(t, h, cfg.fragments, cfg.fragment_order)
    # A sync that nobody takes part in is skipped: no outer update for that fragment.
    is_update = is_send if participation is None else is_send & (jnp.sum(participation) > 0)
    g, outer, ef, fl = jax.lax.cond(
        is_update,
        lambda ops: self.fragments.switch(p_send, lambda b, k: self.send(b, k, hp, ops)),
        lambda ops: OuterUpdate(ops.global_params, ops.outer_state, ops.ef_residual, ops.in_flight),
        SendOperands(global_params=g, outer_state=outer, replica_params=r, ef_residual=ef,
                     participation=participation, in_flight=fl))
    # How each replica took part in each fragment's latest sync (its merge heals the dropped
    # ones). Per replica, so the merge reads it without communication.
    code = participation_code(participation, cfg.replicas)
    participants = drjax.map_fn(
        lambda row, c: jnp.where(is_send, row.at[p_send].set(c), row), (state.participants, code))

    is_merge, p_merge = merged_fragment(t, h, cfg.fragments, tau, cfg.fragment_order)
    how = drjax.map_fn(lambda row: row[p_merge], participants)
    towards, per_replica = self.merge_towards(g, fl)  # eager: each replica's own outer params
    r = jax.lax.cond(
        is_merge,
        lambda ops: self.fragments.switch(
            p_merge, lambda b, k: self.merge(b, k, hp["alpha"], ops, per_replica)),
        lambda ops: ops.replica_params,
        MergeOperands(global_params=towards, replica_params=r, participation=how))

    unflat = functools.partial(jax.tree.unflatten, self._treedef)
    new_state = DiLoCoState(
        params=unflat(r), opt_state=opt_state, global_params=unflat(g),
        outer_state=jax.tree.unflatten(jax.tree.structure(state.outer_state), outer),
        ef_residual=None if ef is None else unflat(ef), step=t, participants=participants,
        in_flight=eager.unflatten_like(state.in_flight, fl))
    return new_state, {"loss": loss, "loss_metrics": metrics, "sent": is_send,
                       "merged": is_merge}

  # ---- accounting and views ------------------------------------------------------------------
  def bytes_sent(self, t: int) -> float:
    """Bytes each replica puts on the wire after inner step t (0 when nothing is sent)."""
    cfg = self.config
    is_send, p = sent_fragment(t, cfg.sync_every, cfg.fragments, cfg.fragment_order)
    return self.fragment_bytes[p] if is_send else 0.0

  @staticmethod
  def eval_params(state: DiLoCoState):
    """The params to evaluate and export: the global copy θ_g."""
    return state.global_params

  @staticmethod
  def finite_flags(state: DiLoCoState) -> tuple[jax.Array, jax.Array]:
    """(whether each replica's params are all finite [M], whether θ_g is), on device."""
    return all_finite(state.params, True), all_finite(state.global_params, False)[0]
