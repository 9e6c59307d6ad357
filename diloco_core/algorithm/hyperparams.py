"""Hyperparameters as inputs of the compiled step, so that runs differing only in them share it.

A jitted step bakes every Python float it closes over into the program as a constant:
two runs that differ only in the outer learning rate would compile twice. Here the
hyperparameters travel as a dict of float32 scalars, an argument of the step, and the
optimizers may be *factories* ``hparams -> optax.GradientTransformation`` that build
themselves from it inside the trace. ``with_hyperparams`` of an algorithm
(:class:`~diloco_core.algorithm.base.AlgorithmBase`) returns a copy with other values that reuses
the compiled step.

Examples:
  >>> import optax
  >>> factory = lambda hp: optax.sgd(hp["lr"])
  >>> resolve_optimizer(factory, {"lr": 0.1}) is not None
  True
  >>> check_hyperparams(("alpha",), {"lr": 3e-3})
  {'lr': 0.003}
  >>> check_hyperparams(("alpha",), {"alpha": 1.0})
  Traceback (most recent call last):
  ...
  ValueError: hyperparams: names must be strings other than ['alpha'], got 'alpha'.
"""

from __future__ import annotations

from typing import Callable

import jax
import numpy as np
import optax

#: An optax optimizer, or a factory building one from the (traced) hyperparameters dict.
Optimizer = optax.GradientTransformation | Callable[[dict], optax.GradientTransformation]


def resolve_optimizer(optimizer: Optimizer, hparams: dict) -> optax.GradientTransformation:
  """``optimizer`` itself, or the optimizer its factory builds from ``hparams``."""
  if isinstance(optimizer, optax.GradientTransformation):
    return optimizer
  return optimizer(hparams)


def check_hyperparams(reserved, extra: dict | None) -> dict[str, float]:
  """Validates extra named hyperparameters: string names not in ``reserved``, finite reals.

  Returns:
    The same dict with float values (exactly the user's values, never rounded).
  """
  extra = dict(extra or {})
  for k, v in extra.items():
    if not isinstance(k, str) or k in reserved:
      raise ValueError(f"hyperparams: names must be strings other than {sorted(reserved)}, got {k!r}.")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not np.isfinite(v):
      raise ValueError(f"hyperparams[{k!r}] must be a finite number, got {v!r}.")
  return {k: float(v) for k, v in extra.items()}


def structure_key(tree) -> tuple:
  """What a compiled step depends on in ``tree``: its structure, shapes, dtypes, shardings."""
  leaves, treedef = jax.tree.flatten(tree)
  return (treedef, tuple((x.shape, x.dtype, getattr(x, "sharding", None)) for x in leaves))
