"""How a step runs its replicas' inner steps on the devices that hold them: vectorized, or in turn.

``"vectorized"`` is ``drjax.map_fn``: one program whose every array has a leading replica axis
M. ``"sequential"`` (:func:`replicas_in_turn`) runs one model's step per replica in a loop over
the stacked state, in place; the replicas must share their devices (a ``diloco`` mesh axis of
1). The numbers are the same up to the order of float32 operations; which is faster depends on
the backend and the shapes (``benchmarks/accelerator.py`` measures both).
"""

from __future__ import annotations

import drjax
import jax
import jax.numpy as jnp

#: How a step runs the replicas' inner steps (the ``replica_loop`` argument of
#: :class:`~diloco_core.algorithm.diloco.DiLoCo`).
REPLICA_LOOPS = ("vectorized", "sequential")


def replicas_in_turn(update, params, opt_state, batch):
  """``drjax.map_fn(update, (params, opt_state, batch))`` as a loop over the replicas, in place.

  Replica m's slice of the stacked state is read, stepped by ``update`` (the program of one
  model) and written back into the loop's carry (``dynamic_update_slice``, which XLA does in
  place), so no second copy of the M replicas' state is made. The numbers are those of the
  vectorized map; what differs is the program: one model's step, M times, instead of one step
  whose every array has a leading axis M (``DiLoCo(..., replica_loop="sequential")``).

  Args:
    update: ``(params, opt_state, batch) -> (params, opt_state, loss, metrics)`` of one replica.
    params, opt_state, batch: every replica's, leading axis M.

  Returns:
    ``(params, opt_state, loss, metrics)``, each with the leading axis M.

  Examples:
    >>> step = lambda p, o, b: (p - 0.5 * b, o + 1, jnp.sum(b), {"b": b})
    >>> p, o, loss, m = replicas_in_turn(step, jnp.ones(3), jnp.zeros(3), jnp.arange(3.0))
    >>> p.tolist(), o.tolist(), loss.tolist(), m["b"].tolist()
    ([1.0, 0.5, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 2.0], [0.0, 1.0, 2.0])
  """
  m = jax.tree.leaves(params)[0].shape[0]
  take = lambda tree, i: jax.tree.map(lambda x: jax.lax.dynamic_index_in_dim(x, i, keepdims=False), tree)
  shapes = jax.eval_shape(update, *take((params, opt_state, batch), 0))
  outs = jax.tree.map(lambda s: jnp.zeros((m, *s.shape), s.dtype), (shapes[2], shapes[3]))

  def one(i, carry):
    p, o, out = carry
    new_p, new_o, loss, metrics = update(*take((p, o, batch), i))
    put = lambda tree, new: jax.tree.map(lambda x, y: jax.lax.dynamic_update_index_in_dim(x, y, i, 0), tree, new)
    return put(p, new_p), put(o, new_o), put(out, (loss, metrics))

  params, opt_state, (loss, metrics) = jax.lax.fori_loop(0, m, one, (params, opt_state, outs))
  return params, opt_state, loss, metrics


def map_replicas(loop: str, update, params, opt_state, batch):
  """``update`` on every replica's slice, the way ``loop`` (one of :data:`REPLICA_LOOPS`) says.

  Returns:
    ``(params, opt_state, loss, metrics)``, each with the leading axis M.
  """
  if loop == "sequential":
    return replicas_in_turn(update, params, opt_state, batch)
  return drjax.map_fn(update, (params, opt_state, batch))
