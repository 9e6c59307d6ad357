"""The data-parallel baseline: one model, gradients averaged over M replicas every step.

Each replica computes the gradient of its own batch (``drjax.map_fn``), the gradients are
averaged (``drjax.reduce_mean``, the all-reduce that DiLoCo exists to avoid), and one
inner-optimizer update is applied to the single model. With equal per-replica batches
this is exactly training one model on the global batch of M·b sequences.
"""

from __future__ import annotations

import functools
from typing import Any

import drjax
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import struct

from diloco_core.algorithm.base import AlgorithmBase, all_finite, loss_and_grad
from diloco_core.algorithm.config import DiLoCoConfig
from diloco_core.algorithm.hyperparams import Optimizer, resolve_optimizer
from diloco_core.devices.mesh import make_mesh


class DPState(struct.PyTreeNode):
  """Params, inner optimizer state and step count of the single DP model."""

  params: Any
  opt_state: Any
  step: jax.Array


class DataParallel(AlgorithmBase):
  """Synchronous data parallelism with the same interface as :class:`~diloco_core.DiLoCo`.

  Args:
    loss_fn: ``loss_fn(params, batch) -> scalar`` for one replica's batch, or
      ``(scalar, metrics)`` (:func:`~diloco_core.algorithm.base.loss_and_grad`).
    inner_optimizer: the optax optimizer of the single model, or a factory
      ``hparams -> optimizer`` (see :mod:`diloco_core.algorithm.hyperparams`).
    config: only ``replicas`` is used.
    mesh: a mesh with a ``diloco`` axis (replicas) and a ``data`` axis; default: one device.
    hyperparams: named hyperparameters (floats) the factory receives as traced float32
      scalars; :meth:`~diloco_core.algorithm.base.AlgorithmBase.with_hyperparams`
      changes them without recompiling. (DP traces none of the config's outer fields.)

  Examples:
    >>> dp = DataParallel(lambda w, x: jnp.sum((w - x) ** 2), optax.sgd(0.25),
    ...                   DiLoCoConfig(algorithm="dp", replicas=2))
    >>> state = dp.init(jnp.zeros(()))
    >>> state, metrics = dp.step(state, jnp.array([1.0, 3.0]))
    >>> float(state.params)  # w - 0.25 * mean(2 (w - x)) = 0 + 0.5 * 2
    1.0
  """

  _initial_program = None  # the jitted initial state, built by init (shared by with_hyperparams copies)

  def __init__(self, loss_fn, inner_optimizer: Optimizer, config: DiLoCoConfig, mesh=None,
               hyperparams: dict[str, float] | None = None):
    self.config = config
    self.mesh = make_mesh() if mesh is None else mesh
    self.loss_fn = loss_fn
    self.inner_optimizer = inner_optimizer
    self._init_hyperparams(hyperparams)
    self.grad_bytes = 0.0

  def init(self, params) -> DPState:
    """The initial state of the single model."""
    # DP all-reduces float32 gradients: every element of the model, every step.
    self.grad_bytes = float(sum(np.size(x) for x in jax.tree.leaves(params)) * 4)
    if self._initial_program is None:  # one program (copies and zeros: exact), hyperparameters its inputs
      self._initial_program = jax.jit(lambda p, hp: DPState(
          params=jax.tree.map(lambda x: jnp.array(x, copy=True), p),  # the state is donated
          opt_state=resolve_optimizer(self.inner_optimizer, hp).init(p), step=jnp.zeros((), jnp.int32)))
    state = self._place_state(self._initial_program(params, self.typed_hyperparams()))
    self._compile_once(state, lambda: self._jit_step(
        drjax.program(diloco=self.config.replicas)(self._step_impl), state))
    return state

  def _step_impl(self, state: DPState, batch, hp):
    grad_fn = functools.partial(loss_and_grad, self.loss_fn)
    loss, metrics, grads = drjax.map_fn(grad_fn, (drjax.broadcast(state.params), batch))
    grads = drjax.reduce_mean(grads)
    opt = resolve_optimizer(self.inner_optimizer, hp)
    updates, opt_state = opt.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    true = jnp.ones((), bool)
    return DPState(params, opt_state, state.step + 1), {"loss": loss, "loss_metrics": metrics,
                                                     "sent": true, "merged": true}

  def step(self, state: DPState, batch, participation=None):
    """One synchronous step on the global batch (leaves of ``batch`` have leading axis M).

    Args:
      state: the current state (donated).
      batch: a pytree whose leaves have a leading axis M (one batch per replica).
      participation: None, or an all-ones [M] mask: every replica takes part in every
        all-reduce (DP has no sync to miss; any other mask is a ``ValueError``).

    Examples:
      >>> dp = DataParallel(lambda w, x: jnp.sum((w - x) ** 2), optax.sgd(0.25),
      ...                   DiLoCoConfig(algorithm="dp", replicas=2))
      >>> state = dp.init(jnp.zeros(()))
      >>> dp.step(state, jnp.array([1.0, 3.0]), np.array([1.0, 0.0]))
      Traceback (most recent call last):
      ...
      ValueError: DataParallel: participation must be None or all ones (DP has no sync to miss), got [1.0, 0.0].
    """
    return super().step(state, batch, participation)

  def step_args(self, state, batch, participation=None) -> tuple:
    """``(state, batch, hyperparameters)``: an all-ones ``participation`` is dropped."""
    if participation is not None:
      mask = np.asarray(jax.device_get(participation), np.float32)
      if mask.shape != (self.config.replicas,) or not np.all(mask == 1.0):
        raise ValueError("DataParallel: participation must be None or all ones (DP has no sync to"
                         f" miss), got {mask.tolist()}.")
    return super().step_args(state, batch, None)

  def bytes_sent(self, t: int) -> float:
    """Bytes each replica sends per step: the full float32 gradient."""
    return self.grad_bytes if t > 0 else 0.0

  @staticmethod
  def eval_params(state: DPState):
    """The params to evaluate and export: the single model."""
    return state.params

  @staticmethod
  def finite_flags(state: DPState) -> tuple[None, jax.Array]:
    """(None: one model, no replicas of its own; whether its params are all finite)."""
    return None, all_finite(state.params, False)[0]
