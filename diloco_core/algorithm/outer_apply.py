"""How a committed round of the syncer rule moves θ_g: merged or sequential, with (Delayed) Nesterov.

Pure functions on pytrees (the rule: :mod:`~diloco_core.spec.syncer`). A round's
members :math:`\\Delta_1, \\dots, \\Delta_n` (pseudo-gradients, in the tape's arrival order) are
applied by :func:`apply_round`:

* ``"merged"``: one outer step on their weighted mean (:func:`weighted_mean`: the float32 mean
  of the trainer for uniform weights, else :math:`\\sum_i w_i \\Delta_i` summed in member order),
  or on their radial-directional mean (:func:`radial_directional_mean`);
* ``"sequential"``: one outer step per member, in member order (Liu et al. 2024, asynchronous
  Local-SGD, arXiv 2401.09135).

The outer step is any ``step(params, state, grad) -> (params, state)``: the trainer's optax outer
optimizers through :func:`optax_step`, or Delayed Nesterov (:func:`delayed_nesterov_step`, Liu et
al.'s Algorithm 3, written as the HALoS authors' code implements it, utnslab/halos
``src/halos/opt.py``): with buffer N, momentum activation :math:`c \\in [0, 1/N]`, learning rate
η, momentum β and :math:`t` the contributions applied before,

.. math::

   A \\leftarrow A + g_t; \\quad
   \\begin{cases}
   m \\leftarrow \\beta m + A / N, \\;
   \\theta \\leftarrow \\theta - \\eta\\bigl((1 - cN + c)\\,\\beta m + g_t / N\\bigr), \\;
   A \\leftarrow 0 & (t + 1) \\bmod N = 0 \\\\
   \\theta \\leftarrow \\theta - \\eta\\,(c\\,\\beta m + g_t / N) & \\text{otherwise.}
   \\end{cases}

Every contribution moves θ by its own :math:`g_t / N` at once; the momentum is updated once per
N contributions, on their mean, and c spreads that many shares of :math:`\\beta m` over the
steps in between (c = 0: all of it at the N-th). N = 1 is the trainer's Nesterov, bit for bit
(:math:`v \\leftarrow \\mu v + \\Delta,\\ \\theta \\leftarrow \\theta - \\eta(\\Delta + \\mu v)`); with
c = 0, the N contributions of a window (t = kN, ..., kN + N - 1) make exactly one Nesterov step on
their mean (to rounding).

**Why sequential Nesterov amplifies** (Liu et al.'s Eq. 4–5): n equal contributions g applied
in turn from :math:`m = 0` move θ by :math:`\\eta g \\sum_{k=1}^{n} (1 + \\beta \\sum_{j<k}
\\beta^j)`; at n = 4, β = 0.9 that is 12.1441 ηg against 1.9 ηg for one step on their mean,
6.39 times as far (pinned exactly, in rationals, by ``tests/test_syncer.py``).

The leaves may be JAX or numpy arrays, or Python numbers (``fractions.Fraction`` gives the
exact arithmetic of the tests) everywhere but in the uniform mean and the radial-directional
mean. ``DelayedNesterovState.count`` is a Python int: the position in the buffer is host-side
(the tape's), so a jitted caller closes over it.

The trainer's tape player (:mod:`~diloco_core.runtime.tape_player`) applies its rounds with :func:`apply_round`.

Examples:
  Two contributions of 1 and 3 from θ = 0 (η = 1, β = 0.5): merged, one Nesterov step on their
  mean 2 moves θ by 2 (1 + β) = 3; sequential, 1 (1 + β) = 1.5, then (m = 0.5 + 3) 3 + 0.5 · 3.5 =
  4.75, in all 6.25:

  >>> from fractions import Fraction
  >>> step = functools.partial(delayed_nesterov_step, lr=1, beta=Fraction(1, 2))
  >>> theta, g = Fraction(0), [Fraction(1), Fraction(3)]
  >>> apply_round(theta, delayed_nesterov_init(theta), g, step, weights=(Fraction(1, 2),) * 2)[0]
  Fraction(-3, 1)
  >>> apply_round(theta, delayed_nesterov_init(theta), g, step, apply="sequential")[0]
  Fraction(-25, 4)
"""

from __future__ import annotations

import functools
import numbers
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import optax

from diloco_core.spec.syncer import APPLY_MODES
from diloco_core.spec.validity import check_choice

__all__ = ["DelayedNesterovState", "apply_round", "delayed_nesterov_init", "delayed_nesterov_step",
           "optax_step", "radial_directional_mean", "weighted_mean"]

#: ``step(params, state, grad) -> (params, state)``: one outer step.
OuterStep = Callable[[Any, Any, Any], tuple[Any, Any]]


class DelayedNesterovState(NamedTuple):
  """Delayed Nesterov's state: the momentum m, the buffer's sum A, and t, contributions applied."""

  momentum: Any
  accumulated: Any
  count: int


def _zeros_like(x):
  return type(x)(0) if isinstance(x, numbers.Number) else jnp.zeros_like(x)


def delayed_nesterov_init(params) -> DelayedNesterovState:
  """m = 0, A = 0, t = 0, shaped like ``params`` (float32 arrays for float32 params)."""
  zeros = jax.tree.map(_zeros_like, params)
  return DelayedNesterovState(zeros, zeros, 0)


def delayed_nesterov_step(params, state: DelayedNesterovState, grad, *, lr, beta, buffer: int = 1,
                          activation: float = 0.0) -> tuple[Any, DelayedNesterovState]:
  """One contribution's Delayed Nesterov step (the module docstring's rule).

  Args:
    params: θ.
    state: its :class:`DelayedNesterovState`.
    grad: the contribution :math:`g_t` (a pseudo-gradient, or a weighted mean of several).
    lr: η (a number or a traced scalar).
    beta: β, the momentum (a number or a traced scalar).
    buffer: N >= 1 (1: Nesterov).
    activation: c in :math:`[0, 1/N]`.

  Returns:
    ``(params, state)`` after it.
  """
  n, t = buffer, state.count
  g_share = grad if n == 1 else jax.tree.map(lambda g: g / n, grad)
  if (t + 1) % n:
    if activation:
      theta = jax.tree.map(lambda p, g, m: p - lr * (activation * beta * m + g), params, g_share, state.momentum)
    else:  # c = 0: the momentum waits for the N-th contribution
      theta = jax.tree.map(lambda p, g: p - lr * g, params, g_share)
    acc = jax.tree.map(lambda a, g: a + g, state.accumulated, grad)
    return theta, DelayedNesterovState(state.momentum, acc, t + 1)
  mean = grad if n == 1 else jax.tree.map(lambda a, g: (a + g) / n, state.accumulated, grad)
  momentum = jax.tree.map(lambda m, d: beta * m + d, state.momentum, mean)
  coef = beta if not activation else (1 - activation * n + activation) * beta  # c = 0: all of βm now
  theta = jax.tree.map(lambda p, g, m: p - lr * (g + coef * m), params, g_share, momentum)
  accumulated = state.accumulated if n == 1 else jax.tree.map(_zeros_like, grad)  # A <- 0
  return theta, DelayedNesterovState(momentum, accumulated, t + 1)


def optax_step(optimizer: optax.GradientTransformation) -> OuterStep:
  """An optax outer optimizer (the trainer's ``nesterov``, ``sgd``, ``adam``) as an outer step.

  Examples:
    >>> step = optax_step(optax.sgd(0.5))
    >>> float(step(jnp.float32(1.0), optax.sgd(0.5).init(jnp.float32(1.0)), jnp.float32(2.0))[0])
    0.0
  """
  def step(params, state, grad):
    updates, state = optimizer.update(grad, state, params)
    return optax.apply_updates(params, updates), state
  return step


def weighted_mean(contributions, weights=None):
  """:math:`\\sum_i w_i \\Delta_i` summed in member order, or for ``weights=None`` the float32 mean
  over a stacked replica axis, the trainer's reduction (``jnp.mean(x, axis=0)``) bit for bit.

  Args:
    contributions: a sequence of pytrees of one structure.
    weights: one weight per contribution (summing to 1; :func:`~diloco_core.spec.syncer.round_weights`),
      or None (uniform).

  Returns:
    A pytree of that structure.

  Examples:
    >>> weighted_mean([jnp.array([1.0, 2.0]), jnp.array([3.0, 6.0])]).tolist()
    [2.0, 4.0]
    >>> weighted_mean([jnp.array([1.0, 2.0]), jnp.array([3.0, 6.0])], (0.75, 0.25)).tolist()
    [1.5, 3.0]
  """
  if weights is None:
    return jax.tree.map(lambda *xs: jnp.mean(jnp.stack(xs), axis=0), *contributions)
  if len(weights) != len(contributions):
    raise ValueError(f"weights must be one per contribution ({len(contributions)}), got {len(weights)}.")

  def leaf(*xs):
    total = weights[0] * xs[0]
    for w, x in zip(weights[1:], xs[1:]):
      total = total + w * x
    return total

  return jax.tree.map(leaf, *contributions)


def radial_directional_mean(contributions, weights=None):
  """The radial-directional mean of each leaf: the weighted mean norm along the weighted mean
  direction (Decoupled DiLoCo, arXiv 2604.21428, as its public reimplementations state it),

  .. math::

     \\Bigl(\\sum_i w_i \\lVert\\Delta_i\\rVert\\Bigr)\\,
     \\varphi\\Bigl(\\sum_i w_i\\, \\varphi(\\Delta_i)\\Bigr), \\qquad
     \\varphi(x) = x / \\lVert x\\rVert,\\ \\varphi(0) = 0,

  per leaf (tensor). Unlike the mean, it keeps the norm of near-orthogonal contributions.

  Args:
    contributions: a sequence of pytrees of float arrays.
    weights: weights summing to 1, or None (uniform).

  Returns:
    A pytree of that structure.

  Examples:
    Two orthogonal contributions of norms 3 and 4: norm 3.5 along the diagonal (the mean, (1.5,
    2), has norm 2.5):

    >>> [round(float(x), 6) for x in radial_directional_mean([jnp.array([3.0, 0.0]), jnp.array([0.0, 4.0])])]
    [2.474874, 2.474874]
  """
  n = len(contributions)
  ws = [1.0 / n] * n if weights is None else list(weights)

  def unit(x):
    norm = jnp.sqrt(jnp.sum(x * x))
    return jnp.where(norm > 0, x / jnp.where(norm > 0, norm, 1), 0).astype(x.dtype), norm

  def leaf(*xs):
    parts = [unit(x) for x in xs]
    radius = sum(w * r for w, (_, r) in zip(ws, parts))
    direction = weighted_mean([d for d, _ in parts], ws)
    return (radius * unit(direction)[0]).astype(xs[0].dtype)

  return jax.tree.map(leaf, *contributions)


def apply_round(params, state, contributions, step: OuterStep, *, apply: str = "merged",
                weights=None, radial: bool = False):
  """One committed round's outer update: merged (one step) or sequential (one step per member).

  Args:
    params: θ_g (of the fragment).
    state: the outer step's state.
    contributions: the members' pseudo-gradients, in the tape's member order.
    step: the outer step (:func:`delayed_nesterov_step` with its knobs bound, :func:`optax_step`).
    apply: ``"merged"`` or ``"sequential"``.
    weights: :func:`~diloco_core.spec.syncer.round_weights` of the round (None: uniform). Merged:
      the mean's weights; sequential: each member's factor.
    radial: merged only: the radial-directional mean instead of the weighted mean.

  Returns:
    ``(params, state)`` after the round.
  """
  check_choice("apply", apply, APPLY_MODES)
  if apply == "merged":
    mean = radial_directional_mean(contributions, weights) if radial else weighted_mean(contributions, weights)
    return step(params, state, mean)
  if radial:
    raise ValueError("radial=True averages a round's contributions, and apply='sequential' averages none:"
                     " use apply='merged' or drop radial.")
  for i, grad in enumerate(contributions):
    if weights is not None:
      grad = jax.tree.map(lambda g, w=weights[i]: w * g, grad)
    params, state = step(params, state, grad)
  return params, state
