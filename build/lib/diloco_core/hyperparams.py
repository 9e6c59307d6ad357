"""Hyperparameters as inputs of the compiled step, so that runs differing only in them share it.

A jitted step bakes every Python float it closes over into the program as a constant:
two runs that differ only in the outer learning rate would compile twice. Here the
hyperparameters travel as a dict of float32 scalars, an argument of the step, and the
optimizers may be *factories* ``hparams -> optax.GradientTransformation`` that build
themselves from it inside the trace. :meth:`TracedHyperparams.with_hyperparams` returns
a copy of a trainer with other values that reuses the compiled step.

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

import copy
import dataclasses
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


class TracedHyperparams:
  """Mixin: the hyperparameters dict of a trainer, its device copy, and cheap copies.

  The class names the fields of its ``config`` that are hyperparameters
  (``config_hyperparams``); the instance holds extra ones (``extra_hyperparams``). The
  subclass passes ``self._device_hyperparams()`` to its jitted step and builds the step
  once per state structure (``_compile_once``).
  """

  config_hyperparams: tuple[str, ...] = ()
  integer_hyperparams: tuple[str, ...] = ()  # of those, the ones passed as int32
  extra_hyperparams: dict[str, float]
  _step = None
  _step_key = None
  _hp_arrays = None

  @property
  def hyperparams(self) -> dict[str, float | int]:
    """The step's traced hyperparameters: the config's, then the extra ones."""
    cfg = self.config
    conf = {k: int(getattr(cfg, k)) if k in self.integer_hyperparams else float(getattr(cfg, k))
            for k in self.config_hyperparams}
    return {**conf, **self.extra_hyperparams}

  def with_hyperparams(self, **changes: float):
    """A copy with other hyperparameter values that shares the compiled step.

    Args:
      **changes: new values of the config's hyperparameters (validated like the config)
        or of the extra ``hyperparams`` given at construction.

    Returns:
      A copy; its ``init`` compiles nothing when the params have the structure and
      shapes this object was initialised with. Its ``step`` also accepts a state of
      this object (e.g. to change a learning rate in the middle of a run; a new H or τ
      in the middle of a DiLoCo run is only meaningful at a step with no fragment in
      flight, since the schedule of the fragments already sent changes with them).
    """
    allowed = sorted(self.hyperparams)
    unknown = sorted(set(changes) - set(allowed))
    if unknown:
      raise ValueError(f"with_hyperparams: unknown hyperparameter(s) {unknown}; allowed: {allowed}.")
    in_config = {k: v for k, v in changes.items() if k in self.config_hyperparams}
    extra = {k: v for k, v in changes.items() if k not in self.config_hyperparams}
    new = copy.copy(self)
    new.config = dataclasses.replace(self.config, **in_config)  # validates
    new.extra_hyperparams = {**self.extra_hyperparams,
                             **check_hyperparams(self.config_hyperparams, extra)}
    new._hp_arrays = None
    return new

  def _device_hyperparams(self) -> dict[str, jax.Array]:
    """The hyperparameters as int32 / float32 scalars replicated on the mesh (made once)."""
    if self._hp_arrays is None:
      self._hp_arrays = self.place_replicated(
          {k: np.int32(v) if k in self.integer_hyperparams else np.float32(v)
           for k, v in self.hyperparams.items()})
    return self._hp_arrays

  def _compile_once(self, state, make_step) -> None:
    """Sets ``_step = make_step()`` unless a step for ``state``'s structure is already built."""
    key = structure_key(state)
    if self._step is None or self._step_key != key:
      self._step = make_step()
      self._step_key = key
