"""The phases of a DiLoCo outer step: before and after its average, under whole-step overlap.

A sync of one fragment is, after its payloads and their average
(:class:`~diloco_core.algorithm.phases.Phases`), :meth:`OuterStepPhases.before_mean` (what each
replica does before the average is known) and :meth:`OuterStepPhases.after_mean` (what it does
with the average); under ``outer_overlap="eager"`` :meth:`OuterStepPhases.replicas_mean` then
sets the fragment's global params. With ``outer_overlap="none"`` this is the outer optimizer
step on the average; ``"delayed"`` and ``"eager"`` overlap a whole outer step with the next
period (arXiv 2502.12996; the rules are :mod:`~diloco_core.algorithm.eager`'s and the
semantics page's). :meth:`OuterStepPhases.merge_towards` says what the replicas are blended
towards. :meth:`OuterStepPhases.round_outer_step` is the outer step of one committed round of
the syncer rule (the tape player's, around :func:`~diloco_core.algorithm.outer_apply.apply_round`). A base class of :class:`~diloco_core.algorithm.phases.Phases`, kept beside
:mod:`~diloco_core.algorithm.eager`: it reads ``config``, ``fragments``, ``leaf_kinds``,
``outer_leaf_kinds`` and ``outer_optimizer`` of the algorithm.
"""

from __future__ import annotations

import functools

import jax
import optax

from diloco_core.algorithm import eager
from diloco_core.algorithm.hyperparams import resolve_optimizer
from diloco_core.algorithm.outer_apply import delayed_nesterov_init, delayed_nesterov_step, optax_step
from diloco_core.algorithm.state import SendOperands


class OuterStepPhases:
  """The outer-step phases of :class:`~diloco_core.algorithm.diloco.DiLoCo` (see the module docstring)."""

  def before_mean(self, branch, k, hp, ops: SendOperands, sent: list) -> SendOperands:
    """Phase: what a sync of the fragment does before its average is known (local to each replica).

    ``outer_overlap="none"``: nothing; ``"delayed"``: the outer step with the previous sync's
    average (in flight since); ``"eager"``: each replica's outer step on its own outer params
    (:func:`~diloco_core.algorithm.eager.before_mean`).

    Args:
      branch: the fragment's branch (:meth:`~diloco_core.algorithm.fragments.Fragments.switch`).
      k: the traced layer-fragment index.
      hp: the hyperparameters (the outer optimizer's are read).
      ops: the operands.
      sent: this sync's payloads (leading axis M; read by eager overlap only).

    Returns:
      The operands after it.
    """
    cfg, frag = self.config, self.fragments
    if cfg.outer_overlap == "delayed":
      return self._outer_apply(branch, k, hp, ops, frag.take(ops.in_flight, self.leaf_kinds, branch, k, axis=0))
    if cfg.outer_overlap == "eager":
      outer_step = self.fragment_outer_step(hp, frag.take(ops.global_params, self.leaf_kinds, branch, k, axis=0))
      return ops._replace(in_flight=eager.before_mean(frag, (self.leaf_kinds, self.outer_leaf_kinds), branch, k,
                                                      outer_step, sent, ops.in_flight, cfg.replicas))
    return ops

  def after_mean(self, branch, k, hp, ops: SendOperands, mean: list) -> SendOperands:
    """Phase: what a sync of the fragment does with its average (:meth:`~diloco_core.algorithm.phases.Phases.average`).

    ``outer_overlap="none"``: the outer step with it; ``"delayed"``: it goes in flight, for
    the fragment's next sync; ``"eager"``: each replica keeps the others' part of it
    (:func:`~diloco_core.algorithm.eager.after_mean`).

    Args:
      branch: the fragment's branch (:meth:`~diloco_core.algorithm.fragments.Fragments.switch`).
      k: the traced layer-fragment index.
      hp: the hyperparameters (the outer optimizer's are read).
      ops: the operands (after :meth:`before_mean`).
      mean: the average (no replica axis).

    Returns:
      The operands after it.
    """
    cfg, frag = self.config, self.fragments
    if cfg.outer_overlap == "none":
      return self._outer_apply(branch, k, hp, ops, mean)
    if cfg.outer_overlap == "delayed":
      return ops._replace(in_flight=frag.put(ops.in_flight, self.leaf_kinds, branch, mean, k, axis=0))
    return ops._replace(in_flight=eager.after_mean(frag, (self.leaf_kinds, self.outer_leaf_kinds), branch, k,
                                                   mean, ops.in_flight, cfg.replicas))

  def replicas_mean(self, branch, k, ops: SendOperands, own: list, reduce_mean) -> SendOperands:
    """Phase (eager overlap): θ_g[p], the mean of the replicas' own outer params of the fragment.

    Args:
      branch: the fragment's branch (:meth:`~diloco_core.algorithm.fragments.Fragments.switch`).
      k: the traced layer-fragment index.
      ops: the operands.
      own: every replica's outer params of the fragment (leading axis M).
      reduce_mean: the mean over the replica axis (as for :func:`~diloco_core.algorithm.phases.present_mean`).

    Returns:
      The operands with the fragment's new global params.
    """
    frag = self.fragments
    like = frag.take(ops.global_params, self.leaf_kinds, branch, k, axis=0)
    new_g = [x.astype(y.dtype) for x, y in zip(reduce_mean([x.astype(y.dtype) for x, y in zip(own, like)]), like)]
    return ops._replace(global_params=frag.put(ops.global_params, self.leaf_kinds, branch, new_g, k, axis=0))

  def _outer_apply(self, branch, k, hp, ops: SendOperands, delta: list) -> SendOperands:
    """The outer optimizer step of θ_g[p] and its own slice of the outer state with ``delta``
    (the outer state is per fragment, :func:`~diloco_core.algorithm.fragments.per_fragment_state`)."""
    frag = self.fragments
    g_sub = frag.take(ops.global_params, self.leaf_kinds, branch, k, axis=0)
    o_sub = frag.take(ops.outer_state, self.outer_leaf_kinds, branch, k, axis=0)
    new_g, new_outer = self.fragment_outer_step(hp, g_sub)(delta, o_sub, g_sub)
    return ops._replace(global_params=frag.put(ops.global_params, self.leaf_kinds, branch, new_g, k, axis=0),
                        outer_state=frag.put(ops.outer_state, self.outer_leaf_kinds, branch, new_outer, k, axis=0))

  def fragment_outer_step(self, hp, g_sub: list):
    """The outer optimizer as a function of one fragment's slices.

    Args:
      hp: the hyperparameters the outer optimizer is built from.
      g_sub: the fragment's global-param leaves (their shapes fix the state's structure).

    Returns:
      ``outer_step(grad, outer-state leaves, params leaves) -> (params, outer-state leaves)``,
      one optimizer step (of θ_g, or under eager overlap of each replica's own outer params).
    """
    outer_opt = resolve_optimizer(self.outer_optimizer, hp)
    sub_def = jax.tree.structure(jax.eval_shape(outer_opt.init, g_sub))

    def outer_step(grad, o_sub, g_sub):
      updates, new_outer = outer_opt.update(grad, jax.tree.unflatten(sub_def, o_sub), g_sub)
      return optax.apply_updates(g_sub, updates), jax.tree.leaves(new_outer)

    return outer_step

  def round_outer_step(self, hp, buffer: int = 1, activation: float = 0.0):
    """Phase: the outer step of a committed round of the syncer rule, on the whole model (P = 1).

    With buffer N = 1, the run's outer optimizer (Nesterov: Delayed Nesterov's N = 1, bit for
    bit); otherwise Delayed Nesterov with buffer N and momentum activation c, at the run's
    :math:`\\eta` and :math:`\\mu` (:func:`~diloco_core.algorithm.outer_apply.delayed_nesterov_step`).
    A round applies it through :func:`~diloco_core.algorithm.outer_apply.apply_round` (merged or
    sequential, weighted).

    Args:
      hp: the hyperparameters (the outer optimizer's, ``outer_lr``, ``outer_momentum``).
      buffer: N >= 1.
      activation: c in :math:`[0, 1/N]`.

    Returns:
      ``(init, step)``: ``init(params)`` the outer state, ``step(params, state, grad) ->
      (params, state)`` one outer step (N > 1: its count is host-side, so it runs op by op).
    """
    if buffer == 1:
      opt = resolve_optimizer(self.outer_optimizer, hp)
      return opt.init, optax_step(opt)
    return delayed_nesterov_init, functools.partial(delayed_nesterov_step, lr=hp["outer_lr"], beta=hp["outer_momentum"],
                                                    buffer=buffer, activation=activation)

  def merge_towards(self, global_params: list, in_flight) -> tuple[list, bool]:
    """What a merge blends the replicas towards.

    Args:
      global_params: the global params' leaves.
      in_flight: the state's ``in_flight`` leaves (:func:`~diloco_core.algorithm.eager.leaves`).

    Returns:
      ``(leaves, per_replica)``: the global params, or under eager overlap each replica's own
      outer params (then ``per_replica`` is True), for :meth:`~diloco_core.algorithm.phases.Phases.merge`.
    """
    if self.config.outer_overlap == "eager":
      return in_flight.outer_params, True
    return global_params, False
