"""Whole-outer-step overlap: the delayed and eager outer gradients of arXiv 2502.12996.

The rules are those of the semantics page (docs/semantics.md, "Overlapping a whole outer
step"). For one fragment at its k-th sync, with :math:`\\Delta_m^{(k)}` what replica m puts
on the wire and :math:`\\Delta^{(k)}` their mean:

* ``"delayed"``: the shared outer step applies :math:`\\Delta^{(k-1)}` (in flight since the
  previous sync of the fragment) and :math:`\\Delta^{(k)}` goes in flight;
* ``"eager"``: replica m applies, to its own outer params and outer state,

  .. math::
     \\tilde\\Delta_m^{(k)} = \\frac{\\Delta_m^{(k)}}{M} + o_m,
     \\qquad o_m = \\Delta^{(k-1)} - \\frac{\\Delta_m^{(k-1)}}{M},

  and keeps :math:`o_m \\leftarrow \\Delta^{(k)} - \\Delta_m^{(k)} / M` (the others' part of
  the average, in flight) for the next sync.

The functions here work on lists of leaves (one fragment's slices), with a leading replica
axis M where the name says ``per replica``; they are called inside the drjax program of
:class:`~diloco_core.DiLoCo`.

Examples:
  Two replicas, one leaf: replica 0 sent 1, replica 1 sent 3 (mean 2); before, they had
  sent 0 and 2 (mean 1), so the others' delayed parts are 1 - 0/2 = 1 and 1 - 2/2 = 0:

  >>> import jax.numpy as jnp
  >>> two = [eager_gradient([jnp.float32(s)], [jnp.float32(2.0)], [jnp.float32(o)], replicas=2)
  ...        for s, o in ((1.0, 1.0), (3.0, 0.0))]
  >>> [(float(g[0]), float(o[0])) for g, o in two]
  [(1.5, 1.5), (1.5, 0.5)]
"""

from __future__ import annotations

from typing import Any, NamedTuple

import drjax
import jax

from diloco_core.spec.validity import OUTER_OVERLAPS  # noqa: F401 (the values of outer_overlap)


class EagerInFlight(NamedTuple):
  """The per-replica state of ``outer_overlap="eager"``, every leaf with a leading axis M:
  ``others``, the others' part of the average in flight, :math:`\\Delta - \\Delta_m / M`
  (float32, shaped like the params); ``outer_params``, the replica's own outer params
  :math:`\\theta_{g,m}`; ``outer_state``, the replica's own outer optimizer state."""

  others: Any
  outer_params: Any
  outer_state: Any


def eager_gradient(sent: list, mean: list, others: list, replicas: int) -> tuple[list, list]:
  """One replica's eager outer gradient and its new others' part (lists of leaves).

  Args:
    sent: what this replica put on the wire this sync, :math:`\\Delta_m^{(k)}`.
    mean: the average of what every replica sent, :math:`\\Delta^{(k)}`.
    others: this replica's others' part of the previous sync's average, :math:`o_m`.
    replicas: M.

  Returns:
    ``(gradient, new_others)``: :math:`\\Delta_m^{(k)} / M + o_m` and
    :math:`\\Delta^{(k)} - \\Delta_m^{(k)} / M`. With M = 1 and ``others`` zero the
    gradient is ``sent`` and the new others' part zero, exactly.
  """
  grad = [s / replicas + o for s, o in zip(sent, others)]
  new_others = [m - s / replicas for s, m in zip(sent, mean)]
  return grad, new_others


def before_mean(frag, kinds: tuple, branch, k, outer_step, sent: list, fl: EagerInFlight,
                replicas: int) -> EagerInFlight:
  """The eager send of one fragment before this sync's average is known (inside a drjax program).

  Every replica takes ``outer_step(gradient, outer state leaves, params leaves)`` on its own
  outer params with :func:`eager_gradient`, with the others' part :math:`o_m` of the
  *previous* average, and keeps ``sent`` in its others' slot until this sync's average
  arrives (:func:`after_mean`). θ_g is not computed here (it is the mean over every replica,
  :meth:`~diloco_core.algorithm.outer_phases.OuterStepPhases.replicas_mean`).

  Args:
    frag: the ``Fragments`` of the params.
    kinds: ``(param kinds, outer-state kinds)`` of the leaves, for ``frag.take`` / ``put``.
    branch, k: the fragment, as given by ``Fragments.switch``.
    outer_step: one outer optimizer step on a fragment's slices -> (params, state leaves).
    sent: per replica, what each replica put on the wire (the fragment's leaves).
    fl: the in-flight state (leaf lists).
    replicas: M.

  Returns:
    The new in-flight state.
  """
  kinds, okinds = kinds
  others = frag.take(fl.others, kinds, branch, k, axis=1)
  mine = frag.take(fl.outer_params, kinds, branch, k, axis=1)
  mine_state = frag.take(fl.outer_state, okinds, branch, k, axis=1)

  def per_replica(s_m, o_m, g_m, st_m):
    grad, _ = eager_gradient(s_m, s_m, o_m, replicas)  # the new others' part waits for the average
    return outer_step(grad, st_m, g_m)

  new_mine, new_state = drjax.map_fn(per_replica, (sent, others, mine, mine_state))
  return EagerInFlight(frag.put(fl.others, kinds, branch, sent, k, axis=1),
                       frag.put(fl.outer_params, kinds, branch, new_mine, k, axis=1),
                       frag.put(fl.outer_state, okinds, branch, new_state, k, axis=1))


def after_mean(frag, kinds: tuple, branch, k, mean: list, fl: EagerInFlight,
               replicas: int) -> EagerInFlight:
  r"""The average of an eager sync is known: each replica's others' slot, which held what it
  sent (:func:`before_mean`), becomes :math:`\Delta - \Delta_m / M` (:func:`eager_gradient`).

  Args:
    frag: the ``Fragments`` of the params.
    kinds: ``(param kinds, outer-state kinds)`` of the leaves.
    branch, k: the fragment, as given by ``Fragments.switch``.
    mean: the average (the fragment's leaves, no replica axis).
    fl: the in-flight state (leaf lists).
    replicas: M.

  Returns:
    The new in-flight state.
  """
  kinds, _ = kinds
  stored = frag.take(fl.others, kinds, branch, k, axis=1)

  def per_replica(s_m, mean):
    return eager_gradient(s_m, mean, s_m, replicas)[1]

  new_others = drjax.map_fn(per_replica, (stored, drjax.broadcast(mean)))
  return fl._replace(others=frag.put(fl.others, kinds, branch, new_others, k, axis=1))


def leaves(in_flight):
  """The state's ``in_flight`` as leaf lists (an :class:`EagerInFlight` of lists for eager)."""
  if in_flight is None:
    return None
  if isinstance(in_flight, EagerInFlight):
    return EagerInFlight(*map(jax.tree.leaves, in_flight))
  return jax.tree.leaves(in_flight)


def unflatten_like(old, fl):
  """Leaf lists ``fl`` (from :func:`leaves`) back in the structure of ``old``."""
  if old is None:
    return None
  if isinstance(old, EagerInFlight):
    return EagerInFlight(*(jax.tree.unflatten(jax.tree.structure(o), f) for o, f in zip(old, fl)))
  return jax.tree.unflatten(jax.tree.structure(old), fl)
