"""The optimizer choices of the command line: inner (AdamW, Muon) and outer (Nesterov, SGD, Adam).

Every optimizer here is a *factory* ``hp -> optax.GradientTransformation`` reading its
hyperparameters from the traced dict of the step (:mod:`diloco_core.algorithm.hyperparams`), so runs
that differ only in a learning rate, a momentum or a weight decay share one compiled program.
Only the names (``inner_optimizer``, ``outer_optimizer``), the schedule's shape and whether
to clip are compiled in.

Inner optimizers (each replica, every step; learning rate :math:`\\gamma_t`: linear warmup,
then cosine decay to 10% of ``inner_lr``):

* ``adamw``: ``optax.adamw(γ_t, b1=0.9, b2=0.95, weight_decay=λ)``, the papers' choice;
* ``muon``: ``optax.contrib.muon`` (MuLoCo, arXiv 2505.23725, puts it inside DiLoCo). The
  hidden matrices of the blocks are orthogonalized (Newton–Schulz, 5 steps, Nesterov
  momentum β = ``muon_momentum``), every other leaf (embeddings, norms, head, router) takes
  AdamW's update with the same b1, b2 and, as optax's ``muon`` does, Nesterov momentum. Updates are rescaled to AdamW's RMS
  (``consistent_rms=0.2``: :math:`0.2\\sqrt{\\max(\\text{fan-in}, \\text{fan-out})}`, Liu et
  al. 2025, arXiv 2502.16982), so ``inner_lr`` and ``weight_decay`` mean the same as for
  AdamW and one learning rate serves both parts.

Outer optimizers (the global copy, once per sync of a fragment, on its pseudo-gradient
:math:`\\Delta`; learning rate η = ``outer_lr``, μ = ``outer_momentum``):

* ``nesterov``: ``optax.sgd(η, momentum=μ, nesterov=True)``, the default and the papers';
* ``sgd``: ``optax.sgd(η, momentum=μ)``, heavy-ball momentum (μ = 0: plain SGD, as torchft's
  tests use);
* ``adam``: ``optax.adam(η, b1=μ, b2=outer_beta2, eps=1e-8)``. Its step count is per fragment
  (:func:`~diloco_core.algorithm.fragments.per_fragment_state`).

Examples:
  One outer step of each on :math:`\\Delta = 2` from θ = 0 (η = 0.5, μ = 0.9): Nesterov moves
  by η(1 + μ)Δ, heavy-ball by ηΔ, Adam by η (the sign of Δ, bias-corrected):

  >>> import jax.numpy as jnp
  >>> hp = {"outer_lr": 0.5, "outer_momentum": 0.9, "outer_beta2": 0.99}
  >>> steps = {}
  >>> for name in OUTER_OPTIMIZERS:
  ...   opt = outer_optimizer_factory(name)(hp)
  ...   u, _ = opt.update(jnp.float32(2.0), opt.init(jnp.float32(0.0)), jnp.float32(0.0))
  ...   steps[name] = round(float(u), 6)
  >>> steps
  {'nesterov': -1.9, 'sgd': -1.0, 'adam': -0.5}
"""

from __future__ import annotations

from typing import Any, Callable

import optax
from optax import contrib

from diloco_core.spec.validity import INNER_OPTIMIZERS, OUTER_OPTIMIZERS, check_choice

END_LR_FRACTION = 0.1  # the cosine decay ends at this fraction of the peak learning rate
#: AdamW's moment decays (inner AdamW, and the AdamW part of Muon).
ADAM_BETAS = (0.9, 0.95)
#: Muon's update RMS matched to AdamW's (arXiv 2502.16982).
MUON_CONSISTENT_RMS = 0.2
#: Newton–Schulz iterations of Muon.
MUON_NS_STEPS = 5
#: Adam's epsilon in the outer ``adam`` optimizer.
OUTER_ADAM_EPS = 1e-8

__all__ = ["ADAM_BETAS", "END_LR_FRACTION", "INNER_OPTIMIZERS", "OUTER_OPTIMIZERS",
           "inner_optimizer_factory", "outer_optimizer_factory"]


def outer_optimizer_factory(name: str) -> Callable[[dict], optax.GradientTransformation]:
  """``hp -> outer optimizer`` for ``name`` (one of :data:`~diloco_core.spec.validity.OUTER_OPTIMIZERS`).

  Reads ``hp["outer_lr"]`` (η), ``hp["outer_momentum"]`` (μ; β1 for ``adam``) and, for
  ``adam``, ``hp["outer_beta2"]``; all may be traced scalars.

  Args:
    name: ``"nesterov"``, ``"sgd"`` or ``"adam"``.

  Returns:
    The factory (see the module docstring for each rule).
  """
  check_choice("outer_optimizer", name, OUTER_OPTIMIZERS)

  def factory(hp):
    lr, mu = hp["outer_lr"], hp["outer_momentum"]
    if name == "adam":
      return optax.adam(lr, b1=mu, b2=hp["outer_beta2"], eps=OUTER_ADAM_EPS)
    return optax.sgd(lr, momentum=mu, nesterov=name == "nesterov")

  return factory


def inner_schedule(lr, steps: int, warmup: int):
  """Linear warmup from 0 over ``warmup`` steps, then cosine decay to 10% of ``lr`` at ``steps``.

  Equal to ``optax.warmup_cosine_decay_schedule(0, lr, warmup, steps, end_value=0.1 lr)``,
  written out because that one branches in Python on the (here traced) peak value.
  """
  return optax.join_schedules(
      [optax.linear_schedule(0.0, lr, warmup),
       optax.cosine_decay_schedule(lr, steps - warmup, alpha=END_LR_FRACTION)], [warmup])


def inner_optimizer_factory(steps: int, warmup: int, clip: bool, name: str = "adamw",
                            muon_dimensions: Any = None):
  """``hp -> inner optimizer``: AdamW or Muon, warmup + cosine schedule, global-norm clipping.

  Only the schedule's shape (``steps``, ``warmup``), whether to clip and the optimizer's
  name are fixed; the peak learning rate ``hp["inner_lr"]``, ``hp["weight_decay"]``,
  ``hp["grad_clip"]`` and (Muon) ``hp["muon_momentum"]`` are read from the hyperparameters
  dict, traced inside the step, so runs that differ only in them share one compiled program.

  Args:
    steps: the run's inner steps (the schedule's length).
    warmup: linear warmup steps.
    clip: clip the gradients' global norm to ``hp["grad_clip"]`` first.
    name: ``"adamw"`` or ``"muon"`` (:data:`~diloco_core.spec.validity.INNER_OPTIMIZERS`).
    muon_dimensions: Muon only: for each params leaf, its
      ``optax.contrib.MuonDimensionNumbers`` (orthogonalized) or None (AdamW's update), or a
      callable ``params -> that tree``; None: every 2-D leaf is orthogonalized (optax's rule).
      The trainer passes :func:`diloco_core.model.transformer.muon_dimensions`.

  Returns:
    The factory.

  Examples:
    >>> import jax.numpy as jnp
    >>> opt = inner_optimizer_factory(10, 2, clip=True)({"inner_lr": 1.0, "weight_decay": 0.0,
    ...                                                 "grad_clip": 1.0})
    >>> updates, _ = opt.update(jnp.ones(1), opt.init(jnp.zeros(1)), jnp.zeros(1))
    >>> float(updates[0])  # step 0 of the warmup: learning rate 0
    -0.0
  """
  check_choice("inner_optimizer", name, INNER_OPTIMIZERS)
  b1, b2 = ADAM_BETAS

  def factory(hp):
    schedule = inner_schedule(hp["inner_lr"], steps, warmup)
    if name == "muon":
      opt = contrib.muon(schedule, ns_steps=MUON_NS_STEPS, beta=hp["muon_momentum"],
                         weight_decay=hp["weight_decay"], adam_b1=b1, adam_b2=b2,
                         adam_weight_decay=hp["weight_decay"],
                         muon_weight_dimension_numbers=muon_dimensions,
                         consistent_rms=MUON_CONSISTENT_RMS)
    else:
      opt = optax.adamw(schedule, b1=b1, b2=b2, weight_decay=hp["weight_decay"])
    return optax.chain(optax.clip_by_global_norm(hp["grad_clip"]), opt) if clip else opt

  return factory
