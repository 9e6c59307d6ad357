"""The phases of a DiLoCo step: the public contract between the algorithm and its runtimes.

A step of :class:`~diloco_core.algorithm.diloco.DiLoCo` is :meth:`Phases.inner_steps`, then, for
the fragment due, :meth:`Phases.payloads` (each replica's, local), :meth:`Phases.average` (the
only cross-replica collective, :func:`present_mean`), :meth:`~diloco_core.algorithm.outer_phases.OuterStepPhases.before_mean` and
:meth:`~diloco_core.algorithm.outer_phases.OuterStepPhases.after_mean` (the outer update before and once its average is known,
:mod:`~diloco_core.algorithm.outer_phases`), which
:meth:`Phases.send` composes; τ steps later, :meth:`Phases.merge`. The in-step runtime composes
them into one jitted step (:meth:`~diloco_core.algorithm.diloco.DiLoCo.step`); the background
runtime (:class:`~diloco_core.runtime.background.Background`) runs them as separate programs with
its link in place of the collective. A change to a phase is made here, once, for both.
"""

from __future__ import annotations

import drjax
import jax
import jax.numpy as jnp
import optax

from diloco_core.wire import compression

from diloco_core.algorithm import eager
from diloco_core.algorithm.outer_phases import OuterStepPhases
from diloco_core.algorithm.base import loss_and_grad
from diloco_core.algorithm.fragments import per_fragment_state
from diloco_core.algorithm.hyperparams import resolve_optimizer
from diloco_core.algorithm.replica_loop import map_replicas
from diloco_core.wire.reduce_scatter import requantize_mean
from diloco_core.algorithm.state import DiLoCoState, MergeOperands, OuterUpdate, SendOperands


def inner_update(loss_fn, optimizer: optax.GradientTransformation, params, opt_state, batch):
  """One optimizer step of one model on one batch; returns (params, opt_state, loss, metrics).

  ``loss`` and ``metrics`` (what else the loss function reports, ``{}`` for a scalar loss
  function) as :func:`~diloco_core.algorithm.base.loss_and_grad` returns them.
  """
  loss, metrics, grads = loss_and_grad(loss_fn, params, batch)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state, loss, metrics


def present_mean(sent: list, present, replicas: int, reduce_mean) -> list:
  """The float32 mean of per-replica leaves over the replicas present (the rule both runtimes use).

  With a participation mask, the absent replicas' leaves are zeroed (``where``, not a product,
  so a dropped replica's non-finite Δ cannot leak in) and the mean is rescaled by
  M / count, which is exactly 1 with everyone present (then bit-identical to the unmasked mean).

  Args:
    sent: leaves with a leading replica axis M.
    present: the [M] participation mask (1 present, 0 absent), or None for everyone.
    replicas: M.
    reduce_mean: the mean over the replica axis of a list of leaves: ``drjax.reduce_mean`` in
      the SPMD program, the mean of the gathered payloads in the background runtime.

  Returns:
    The mean leaves, without the replica axis.

  Examples:
    >>> mean = lambda xs: [x.mean(axis=0) for x in xs]
    >>> [float(x) for x in present_mean([jnp.array([1.0, 3.0, jnp.nan])], jnp.array([1.0, 1.0, 0.0]), 3, mean)]
    [2.0]
  """
  if present is None:
    return reduce_mean(sent)
  on = present > 0
  kept = [jnp.where(on.reshape(-1, *[1] * (x.ndim - 1)), x, 0.0) for x in sent]
  scale = replicas / jnp.maximum(jnp.sum(present), 1.0)
  return [x * scale for x in reduce_mean(kept)]


class Phases(OuterStepPhases):
  """The phases of :class:`~diloco_core.algorithm.diloco.DiLoCo` (a base class of it).

  A phase takes one fragment's ``branch`` and traced ``k``
  (:meth:`~diloco_core.algorithm.fragments.Fragments.switch`; ``"all", None`` when P = 1), the
  hyperparameters and flat leaf lists (:class:`~diloco_core.algorithm.state.SendOperands`,
  :class:`~diloco_core.algorithm.state.MergeOperands`); it selects the fragment's leaves with
  ``leaf_kinds`` and ``outer_leaf_kinds`` (each flat leaf's kind: a stacked layer, another
  leaf, or per-fragment optimizer state) and runs inside ``drjax.program(diloco=M)``. It
  reads ``config``, ``fragments``, ``leaf_kinds``, ``outer_leaf_kinds``, ``loss_fn``,
  ``inner_optimizer``, ``outer_optimizer``, ``hyperparams`` and ``replica_loop`` of the algorithm.

  Runtimes read the algorithm through these public names only (``tests/test_layout.py``
  checks every module outside ``algorithm/`` against this list):

  * ``config``: the :class:`~diloco_core.DiLoCoConfig` (its structural fields);
  * ``hyperparams``, ``config_hyperparams``, ``typed_hyperparams``: the traced hyperparameters,
    their dtypes, and both as the host scalars a step is given;
  * ``replica_fields``: the fields of the state with a leading replica axis M;
  * ``prepare``: builds the fragment map for params of this structure;
  * ``initial_state``, ``inner_steps``, ``payloads``, ``before_mean``, ``after_mean``,
    ``replicas_mean``, ``merge_towards``, ``merge``, ``round_outer_step``: the phases
    (:func:`present_mean` is the average; ``round_outer_step``, a committed round's outer step
    of the syncer rule);
  * ``fragment_of``: one fragment's slices of flat leaves (a payload's shapes);
  * ``init``, ``step``, ``with_hyperparams``, ``place_batch``, ``place_replicated``,
    ``eval_params``, ``bytes_sent``, ``finite_flags``: the
    :class:`~diloco_core.algorithm.base.Algorithm` protocol (the in-step runtime and the loop).

  Examples:
    Two replicas that reached 0.5 and 1.5 from θ_g = 0, one sync (η = 1, μ = 0), then the
    merge with α = 0.5, phase by phase:

    >>> import drjax, jax, jax.numpy as jnp, optax
    >>> from diloco_core import DiLoCo, DiLoCoConfig
    >>> cfg = DiLoCoConfig(replicas=2, sync_every=1, outer_lr=1.0, outer_momentum=0.0)
    >>> algo = DiLoCo(lambda w, x: jnp.sum((w - x) ** 2), optax.sgd(0.25), cfg)
    >>> state = algo.init(jnp.zeros(()))
    >>> from diloco_core.algorithm.state import MergeOperands, SendOperands
    >>> run, hp = drjax.program(diloco=2), algo.hyperparams
    >>> ops = SendOperands(global_params=[jnp.zeros(())], outer_state=jax.tree.leaves(state.outer_state),
    ...                    replica_params=[jnp.array([0.5, 1.5])], ef_residual=None, participation=None)
    >>> sent, _ = run(lambda o: algo.pseudo_gradients("all", None, hp, o))(ops)  # Δ_m = θ_g - θ_m
    >>> mean = run(lambda s: algo.average(s, None))(sent)
    >>> new = run(lambda o, s, d: algo.outer_step("all", None, hp, o, s, d, None))(ops, sent, mean)
    >>> sent[0].tolist(), float(mean[0]), float(new.global_params[0])  # θ_g - η Δ, η = 1
    ([-0.5, -1.5], -1.0, 1.0)
    >>> merged = run(lambda o: algo.merge("all", None, jnp.float32(0.5), o))(MergeOperands(
    ...     global_params=new.global_params, replica_params=ops.replica_params, participation=jnp.ones(2)))
    >>> merged[0].tolist()  # α θ_m + (1 - α) θ_g, α = 0.5
    [0.75, 1.25]
  """

  def initial_state(self, params, replicas: int, xp=jnp, hp=None) -> DiLoCoState:
    """The initial state of ``replicas`` replicas: each of them and the global copy are ``params``.

    Args:
      params: the params pytree.
      replicas: how many replicas the state holds (M in-step; this process's M / N in the
        background runtime).
      xp: the array module of the leaves: ``jax.numpy`` (on device) or ``numpy`` (on the
        host, for a runtime that places them itself).
      hp: the hyperparameters the optimizers are built with (default: ``hyperparams``).

    Returns:
      The unplaced :class:`~diloco_core.algorithm.state.DiLoCoState` (error-feedback residual,
      in-flight average and eager per-replica state zero; everyone took part in every sync).

    Examples:
      >>> import optax
      >>> from diloco_core import DiLoCo, DiLoCoConfig
      >>> algo = DiLoCo(lambda w, x: jnp.sum((w - x) ** 2), optax.sgd(0.25), DiLoCoConfig(replicas=2))
      >>> state = algo.initial_state(jnp.ones(3), 2)
      >>> state.params.shape, state.participants.tolist(), state.ef_residual
      ((2, 3), [[1.0], [1.0]], None)
    """
    cfg, hp = self.config, self.hyperparams if hp is None else hp
    stack = lambda tree: jax.tree.map(lambda x: xp.broadcast_to(xp.asarray(x), (replicas, *xp.shape(x))), tree)
    zeros = lambda tree: jax.tree.map(lambda x: xp.zeros(xp.shape(x), xp.float32), tree)
    params = jax.tree.map(lambda x: xp.array(x, copy=True), params)  # the state is donated
    outer_state = jax.tree.map(xp.asarray, per_fragment_state(resolve_optimizer(self.outer_optimizer, hp),
                                                              params, cfg.fragments))
    in_flight = {"none": None, "delayed": zeros(params)}.get(cfg.outer_overlap)
    if cfg.outer_overlap == "eager":
      in_flight = eager.EagerInFlight(zeros(stack(params)), stack(params), stack(outer_state))
    return DiLoCoState(
        params=stack(params), opt_state=stack(resolve_optimizer(self.inner_optimizer, hp).init(params)),
        global_params=params, outer_state=outer_state,
        ef_residual=zeros(stack(params)) if cfg.error_feedback else None, step=xp.zeros((), xp.int32),
        participants=xp.ones((replicas, cfg.fragments), xp.float32), in_flight=in_flight)

  def inner_steps(self, hp, params, opt_state, batch, active=None):
    """Phase: one inner step of every replica on its own batch (nothing crosses replicas).

    Args:
      hp: the hyperparameters the inner optimizer is built from.
      params, opt_state, batch: every replica's, leading axis M.
      active: [M] bool, or None for every replica: a replica not active keeps its params and
        inner optimizer state, exactly (``where``; its batch row is read but changes nothing),
        as the tape player runs only the replicas whose period is under way.

    Returns:
      ``(params, opt_state, loss, metrics)``, each per replica (:func:`inner_update`).
    """
    update = lambda p, o, b: inner_update(self.loss_fn, resolve_optimizer(self.inner_optimizer, hp), p, o, b)
    new_params, new_opt, loss, metrics = map_replicas(self.replica_loop, update, params, opt_state, batch)
    if active is None:
      return new_params, new_opt, loss, metrics
    keep = lambda n, x: jnp.where(active.reshape(-1, *[1] * (x.ndim - 1)), n, x)
    return jax.tree.map(keep, new_params, params), jax.tree.map(keep, new_opt, opt_state), loss, metrics

  def fragment_of(self, leaves: list, branch, k, axis: int) -> list:
    """One fragment's slices of flat param-shaped leaves.

    Args:
      leaves: the flat leaves (params, or anything shaped like them).
      branch, k: the fragment (:meth:`~diloco_core.algorithm.fragments.Fragments.switch`).
      axis: the layer axis (1 with a replica axis in front).

    Returns:
      The fragment's leaves.
    """
    return self.fragments.take(leaves, self.leaf_kinds, branch, k, axis=axis)

  def send(self, branch, k, hp, ops: SendOperands) -> OuterUpdate:
    """Phase: the whole outer update of one fragment, as the in-step program runs it.

    Three phases, in this order: each replica's wire payload (:meth:`payloads`, local), their
    average (:meth:`average`, the only cross-replica collective) and the fragment's outer
    step (:meth:`outer_step`). ``ops.participation`` ([M] float, or None for everyone) masks
    out dropped replicas.

    Args:
      branch, k, hp, ops: the fragment (:meth:`~diloco_core.algorithm.fragments.Fragments.switch`;
        k None for ``"all"`` and ``"other"``), the traced hyperparameters, the flat operands.

    Returns:
      The fragment's :class:`~diloco_core.algorithm.state.OuterUpdate` (see the class docstring).
    """
    ops, sent = self.payloads(branch, k, hp, ops)
    delta = self.average(sent, ops.participation)
    return self.outer_step(branch, k, hp, ops, sent, delta, ops.ef_residual)

  def payloads(self, branch, k, hp, ops: SendOperands) -> tuple[SendOperands, list]:
    """Phase: :meth:`pseudo_gradients`, with the new error-feedback residual put in the operands.

    Args:
      branch, k, hp, ops: as for :meth:`pseudo_gradients`.

    Returns:
      ``(ops, sent)``: the operands with the fragment's new residual (unchanged without error
      feedback) and the payload leaves (leading axis M).
    """
    sent, ef = self.pseudo_gradients(branch, k, hp, ops)
    if ef is not None:
      ops = ops._replace(ef_residual=self.fragments.put(ops.ef_residual, self.leaf_kinds, branch, ef, k, axis=1))
    return ops, sent

  def pseudo_gradients(self, branch, k, hp, ops: SendOperands) -> tuple[list, list | None]:
    """Phase: what each replica puts on the wire for one fragment, :math:`Q(\\Delta_m + \\beta e_m)`.

    :math:`\\Delta_m = \\theta_g[p] - \\theta_m[p]` (against each replica's own outer params
    under eager overlap), through the wire format and error feedback. Nothing crosses replicas.

    Args:
      branch: the fragment's branch (:meth:`~diloco_core.algorithm.fragments.Fragments.switch`).
      k: the traced layer-fragment index.
      hp: the hyperparameters (``error_feedback_decay`` is read).
      ops: the operands (``ops.participation``: a dropped replica keeps its residual).

    Returns:
      ``(sent, residual)``: the payload leaves (leading axis M) and the new error-feedback
      residual leaves (None without error feedback); see the class docstring.
    """
    cfg, frag = self.config, self.fragments
    g_sub = frag.take(ops.global_params, self.leaf_kinds, branch, k, axis=0)
    r_sub = frag.take(ops.replica_params, self.leaf_kinds, branch, k, axis=1)
    e_sub = (frag.take(ops.ef_residual, self.leaf_kinds, branch, k, axis=1)
             if ops.ef_residual is not None else None)

    def pseudo_gradient(g_m, r_m, e_m):
      delta = [(a - b).astype(jnp.float32) for a, b in zip(g_m, r_m)]
      if e_m is None:
        return compression.quantize_tree(delta, cfg.compression, **cfg.wire), None
      return compression.error_feedback(delta, e_m, cfg.compression, **cfg.wire,
                                        decay=hp["error_feedback_decay"])

    # Δ_m is taken against the params the replica started from: its own outer params (eager).
    start = (frag.take(ops.in_flight.outer_params, self.leaf_kinds, branch, k, axis=1)
             if cfg.outer_overlap == "eager" else drjax.broadcast(g_sub))
    sent, e_new = drjax.map_fn(pseudo_gradient, (start, r_sub, e_sub))
    if ops.participation is not None and e_sub is not None:
      e_new = drjax.map_fn(lambda a, b, o: [jnp.where(o, x, y) for x, y in zip(a, b)],
                           (e_new, e_sub, ops.participation > 0))
    return sent, e_new

  def average(self, sent: list, present) -> list:
    """Phase: the float32 mean of what the replicas sent, the only cross-replica collective.

    The mean over the present replicas (:func:`present_mean`, ``drjax.reduce_mean``); with
    ``reduction="reduce-scatter"`` it is then re-quantized to the wire format
    (:func:`~diloco_core.wire.reduce_scatter.requantize_mean`). The background runtime computes
    the same mean after its link (the same reduction, in replica order), or its link does
    (reduce-scatter).

    Args:
      sent: the payload leaves of :meth:`pseudo_gradients`.
      present: the [M] participation mask, or None for everyone.

    Returns:
      The averaged leaves (no replica axis); see the class docstring.
    """
    return requantize_mean(present_mean(sent, present, self.config.replicas, drjax.reduce_mean), self.config)

  def outer_step(self, branch, k, hp, ops: SendOperands, sent: list, delta: list, ef) -> OuterUpdate:
    """Phase: the fragment's whole outer update, :meth:`~diloco_core.algorithm.outer_phases.OuterStepPhases.before_mean` then :meth:`~diloco_core.algorithm.outer_phases.OuterStepPhases.after_mean`.

    Under ``outer_overlap="eager"``, θ_g[p] is then the mean of the replicas' own outer params
    (:meth:`~diloco_core.algorithm.outer_phases.OuterStepPhases.replicas_mean`).

    Args:
      branch: the fragment's branch (:meth:`~diloco_core.algorithm.fragments.Fragments.switch`).
      k: the traced layer-fragment index.
      hp: the hyperparameters (the outer optimizer's are read).
      ops: the operands (global params, outer state, in flight).
      sent: the payloads (:meth:`pseudo_gradients`; read by eager overlap only).
      delta: their average (:meth:`average`).
      ef: the new error-feedback residual leaves, passed through (or None).

    Returns:
      The fragment's :class:`~diloco_core.algorithm.state.OuterUpdate`; see the class docstring.
    """
    ops = self.after_mean(branch, k, hp, self.before_mean(branch, k, hp, ops, sent), delta)
    if self.config.outer_overlap == "eager":
      own = self.fragment_of(ops.in_flight.outer_params, branch, k, axis=1)
      ops = self.replicas_mean(branch, k, ops, own, drjax.reduce_mean)
    return OuterUpdate(ops.global_params, ops.outer_state, ef, ops.in_flight)

  def merge(self, branch, k, alpha, ops: MergeOperands, per_replica: bool = False) -> list:
    """Phase: blends one fragment of every replica towards the global copy.

    :math:`\\theta_m[p] \\leftarrow \\alpha\\,\\theta_m[p] + (1-\\alpha)\\,\\theta_g[p]`.
    ``ops.participation`` ([M], placed) is how each replica took part in that fragment's sync
    (see ``DiLoCoState.participants``): present ones blend, dropped ones are replaced by the
    global copy (healed), and if nobody took part nothing changes.

    Args:
      branch: the fragment's branch (:meth:`~diloco_core.algorithm.fragments.Fragments.switch`).
      k: the traced layer-fragment index.
      alpha: α (a traced scalar).
      ops: the global params, every replica's params and the participation.
      per_replica: the global leaves have a replica axis (each replica's own outer params,
        eager overlap).

    Returns:
      The new replica param leaves; see the class docstring.
    """
    frag = self.fragments
    g, r, how = ops
    g_sub = frag.take(g, self.leaf_kinds, branch, k, axis=int(per_replica))
    r_sub = frag.take(r, self.leaf_kinds, branch, k, axis=1)

    def blend(loc, glob, h):
      # where(True, x, ·) is x bit for bit: with everyone present this is the plain blend.
      out = []
      for a, b in zip(loc, glob):
        al = alpha.astype(a.dtype)
        out.append(jnp.where(h > 0, (al * a + (1 - al) * b).astype(a.dtype),
                             jnp.where(h == 0, b.astype(a.dtype), a)))
      return out

    merged = drjax.map_fn(blend, (r_sub, g_sub if per_replica else drjax.broadcast(g_sub), how))
    return frag.put(r, self.leaf_kinds, branch, merged, k, axis=1)
