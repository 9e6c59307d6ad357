"""The phases of a DiLoCo step: the public contract between the algorithm and its runtimes.

A step of :class:`~diloco_core.algorithm.diloco.DiLoCo` is the inner step of every replica, then, for
the fragment due, :meth:`Phases.pseudo_gradients` (each replica's payload, local),
:meth:`Phases.average` (the only cross-replica collective) and :meth:`Phases.outer_step`
(the fragment's outer step, local to the global copy), which :meth:`Phases.send` composes;
τ steps later, :meth:`Phases.merge` (the blend with α). The in-step runtime composes them
into one jitted step (:meth:`~diloco_core.algorithm.diloco.DiLoCo.step`); the background runtime
(:class:`~diloco_core.runtime.background.Background`) runs them as separate programs with its link
in place of :meth:`Phases.average`. A change to a phase is made here, once, for both.
"""

from __future__ import annotations

import drjax
import jax
import jax.numpy as jnp
import optax

from diloco_core.wire import compression

from diloco_core.algorithm import eager
from diloco_core.algorithm.hyperparams import resolve_optimizer
from diloco_core.wire.reduce_scatter import requantize_mean
from diloco_core.algorithm.state import MergeOperands, OuterUpdate, SendOperands


class Phases:
  """The phases of :class:`~diloco_core.algorithm.diloco.DiLoCo` (a base class of it).

  A phase takes one fragment's ``branch`` and traced ``k``
  (:meth:`~diloco_core.algorithm.fragments.Fragments.switch`; ``"all", None`` when P = 1), the
  hyperparameters and flat leaf lists (:class:`~diloco_core.algorithm.state.SendOperands`,
  :class:`~diloco_core.algorithm.state.MergeOperands`); it selects the fragment's leaves with
  ``leaf_kinds`` and ``outer_leaf_kinds`` (each flat leaf's kind: a stacked layer, another
  leaf, or per-fragment optimizer state) and runs inside ``drjax.program(diloco=M)``. It
  reads ``config``, ``fragments`` and ``outer_optimizer`` of the algorithm.

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

  def send(self, branch, k, hp, ops: SendOperands) -> OuterUpdate:
    """Phase: the whole outer update of one fragment, as the in-step program runs it.

    Three phases, in this order: each replica's wire payload (:meth:`pseudo_gradients`,
    local), their average (:meth:`average`, the only cross-replica collective) and the
    fragment's outer step on its own slice of the outer state (:meth:`outer_step`, local to
    the global copy). ``ops.participation`` ([M] float, or None for everyone) masks out
    dropped replicas.

    Args:
      branch: the fragment's branch (:meth:`~diloco_core.algorithm.fragments.Fragments.switch`).
      k: the traced layer-fragment index (None for ``"all"`` and ``"other"``).
      hp: the hyperparameters (traced scalars).
      ops: the operands, flat leaf lists.

    Returns:
      The fragment's :class:`~diloco_core.algorithm.state.OuterUpdate` (see the class docstring).
    """
    frag = self.fragments
    sent, ef = self.pseudo_gradients(branch, k, hp, ops)
    delta = self.average(sent, ops.participation)
    if ef is not None:
      ef = frag.put(ops.ef_residual, self.leaf_kinds, branch, ef, k, axis=1)
    return self.outer_step(branch, k, hp, ops, sent, delta, ef)

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

    With a participation mask, the mean over the present replicas only: the others are
    zeroed (``where``, not a product, so a dropped replica's non-finite Δ cannot leak in)
    and the mean rescaled by M / count, which is exactly 1 with everyone present (then
    bit-identical to the unmasked mean). With ``reduction="reduce-scatter"`` the mean is then
    re-quantized to the wire format (:func:`~diloco_core.wire.reduce_scatter.requantize_mean`). The
    background runtime computes the same mean after its link (the same reduction, in replica
    order), or its link does (reduce-scatter).

    Args:
      sent: the payload leaves of :meth:`pseudo_gradients`.
      present: the [M] participation mask, or None for everyone.

    Returns:
      The averaged leaves (no replica axis); see the class docstring.
    """
    if present is None:
      mean = drjax.reduce_mean(sent)
    else:
      on = present > 0
      kept = drjax.map_fn(lambda s, o: [jnp.where(o, x, 0.0) for x in s], (sent, on))
      scale = self.config.replicas / jnp.maximum(jnp.sum(present), 1.0)
      mean = [x * scale for x in drjax.reduce_mean(kept)]
    return requantize_mean(mean, self.config)

  def outer_step(self, branch, k, hp, ops: SendOperands, sent: list, delta: list, ef) -> OuterUpdate:
    """Phase: the fragment's outer step on θ_g[p] and its own slice of the outer state.

    The outer state is per fragment (:func:`~diloco_core.algorithm.fragments.per_fragment_state`); the
    step follows ``outer_overlap``: the average now (``"none"``), the previous sync's
    (``"delayed"``), or each replica's eager gradient on its own outer params (``"eager"``).

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
    cfg, frag = self.config, self.fragments
    g, outer, fl = ops.global_params, ops.outer_state, ops.in_flight
    g_sub = frag.take(g, self.leaf_kinds, branch, k, axis=0)
    outer_step = self.fragment_outer_step(hp, g_sub)
    if cfg.outer_overlap == "eager":
      fl, new_g = eager.send(frag, (self.leaf_kinds, self.outer_leaf_kinds), branch, k, outer_step,
                             sent, delta, fl)
      return OuterUpdate(frag.put(g, self.leaf_kinds, branch, new_g, k, axis=0), outer, ef, fl)
    if cfg.outer_overlap == "delayed":  # apply the previous sync's average, send this one's
      applied = frag.take(fl, self.leaf_kinds, branch, k, axis=0)
      fl = frag.put(fl, self.leaf_kinds, branch, delta, k, axis=0)
      delta = applied
    new_g, new_outer = outer_step(delta, frag.take(outer, self.outer_leaf_kinds, branch, k, axis=0), g_sub)
    g = frag.put(g, self.leaf_kinds, branch, new_g, k, axis=0)
    outer = frag.put(outer, self.outer_leaf_kinds, branch, new_outer, k, axis=0)
    return OuterUpdate(g, outer, ef, fl)

  def fragment_outer_step(self, hp, g_sub: list):
    """The outer optimizer as a function of one fragment's slices.

    Args:
      hp: the hyperparameters the outer optimizer is built from.
      g_sub: the fragment's global-param leaves (their shapes fix the state's structure).

    Returns:
      ``outer_step(grad, outer-state leaves, params leaves) -> (params, outer-state leaves)``,
      one optimizer step (used by :meth:`outer_step` and by eager overlap per replica).
    """
    outer_opt = resolve_optimizer(self.outer_optimizer, hp)
    sub_def = jax.tree.structure(jax.eval_shape(outer_opt.init, g_sub))

    def outer_step(grad, o_sub, g_sub):
      updates, new_outer = outer_opt.update(grad, jax.tree.unflatten(sub_def, o_sub), g_sub)
      return optax.apply_updates(g_sub, updates), jax.tree.leaves(new_outer)

    return outer_step

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
