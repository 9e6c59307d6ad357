"""The algorithm interface the training loop needs, and the one base class both algorithms share.

:class:`Algorithm` (a :class:`typing.Protocol`) is what :func:`diloco_core.train.train`, the
benchmarks and the tests use: ``init``, ``step`` (with an optional participation mask),
``lower`` (the step as a :class:`jax.stages.Lowered`: ``.compile()``, ``.cost_analysis()``,
``.as_text()``), ``eval_params``, ``bytes_sent``, ``finite_flags`` and
``with_hyperparams``. :class:`~diloco_core.DiLoCo` and :class:`~diloco_core.DataParallel`
implement it.

Why one base class. Both algorithms need the same three things around their step: where
their state and batches live (:class:`~diloco_core.devices.mesh.MeshPlacement`), the step's traced
hyperparameters (a dict of int32 / float32 scalars, so that runs differing only in them share
one compiled program), and the compiled step itself (built once per state structure, reused
by ``with_hyperparams`` copies). :class:`AlgorithmBase` holds all three in one place and
only calls *down* into the placement helpers; the subclasses write ``init``, the step body
(``_step_impl``), ``eval_params``, ``bytes_sent`` and ``finite_flags``. (Before, two mixins,
one for the hyperparameters and one for the mesh, called each other's methods.)

Examples:
  >>> import jax.numpy as jnp, optax
  >>> from diloco_core import DiLoCo, DiLoCoConfig
  >>> algo = DiLoCo(lambda w, x: jnp.sum((w - x) ** 2), optax.sgd(0.25), DiLoCoConfig(sync_every=1))
  >>> isinstance(algo, Algorithm)
  True
  >>> state = algo.init(jnp.zeros(()))
  >>> lowered = algo.lower(state, jnp.array([1.0, 3.0]))  # nothing runs, nothing is donated
  >>> type(lowered).__name__, type(lowered.compile()).__name__, algo.compiled_programs
  ('Lowered', 'Compiled', 0)
  >>> state, _ = algo.step(state, jnp.array([1.0, 3.0]))
  >>> algo.compiled_programs
  1
"""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

from diloco_core.algorithm.hyperparams import check_hyperparams, structure_key
from diloco_core.devices.mesh import MeshPlacement


@runtime_checkable
class Algorithm(Protocol):
  """What a training algorithm offers the loop (DP, DiLoCo, Streaming DiLoCo)."""

  config: Any
  mesh: Any

  def init(self, params) -> Any:
    """The initial state from the params pytree (builds the step for its structure)."""

  def step(self, state, batch, participation=None) -> tuple[Any, dict[str, jax.Array]]:
    """One step: ``(new state, {"loss": [M], "loss_metrics": {name: [M]}, "sent": bool,
    "merged": bool})``, all on device (``loss_metrics``: what else the loss function reports,
    :func:`loss_and_grad`)."""

  def lower(self, state, batch, participation=None) -> jax.stages.Lowered:
    """The step for these arguments, lowered (``.compile()``, ``.cost_analysis()``, ``.as_text()``)."""

  def eval_params(self, state) -> Any:
    """The params to evaluate and export."""

  def bytes_sent(self, t: int) -> float:
    """Bytes each replica puts on the wire after inner step ``t``."""

  def finite_flags(self, state) -> tuple[jax.Array | None, jax.Array]:
    """(per-replica all-finite [M], or None with one model; all-finite of the evaluated params)."""

  def with_hyperparams(self, **changes) -> "Algorithm":
    """A copy with other traced hyperparameter values that shares the compiled step."""

  def place_batch(self, batch) -> Any:
    """A host batch ``[M, b, ...]`` as global arrays on the mesh."""

  def place_replicated(self, x) -> Any:
    """A host value copied to every device of the mesh."""


def loss_and_grad(loss_fn, params, batch) -> tuple[jax.Array, dict[str, jax.Array], Any]:
  """The reported loss, the other reported metrics, and the gradient of one model's objective.

  ``loss_fn(params, batch)`` returns the objective (a scalar), or ``(objective, metrics)``
  with ``metrics`` a dict of scalars reported beside it (the trainer's MoE loss,
  :func:`diloco_core.model.transformer.train_loss`, returns ``{"loss": LM loss, "aux_loss": ...}``).
  The gradient is always that of the objective.

  Args:
    loss_fn: the loss function.
    params: the params pytree.
    batch: one model's batch.

  Returns:
    ``(loss, metrics, grads)``: ``loss`` is ``metrics["loss"]`` if the loss function reports
    one (e.g. the LM loss without the auxiliary terms), else the objective; ``metrics`` the
    other reported values (``{}`` for a scalar loss function). The algorithms' steps return
    them as ``"loss"`` and ``"loss_metrics"``.

  Examples:
    >>> import jax.numpy as jnp
    >>> fn = lambda w, x: (jnp.sum((w - x) ** 2) + 1.0, {"loss": jnp.sum((w - x) ** 2), "aux_loss": 1.0})
    >>> loss, metrics, grads = loss_and_grad(fn, jnp.zeros(()), jnp.float32(3.0))
    >>> float(loss), float(metrics["aux_loss"]), float(grads)
    (9.0, 1.0, -6.0)
  """

  def objective(p, x):
    out = loss_fn(p, x)
    value, metrics = out if isinstance(out, tuple) else (out, {})
    return value, {"loss": value, **metrics}

  (_, metrics), grads = jax.value_and_grad(objective, has_aux=True)(params, batch)
  loss = metrics.pop("loss")
  return loss, metrics, grads


def reported_loss(loss_fn):
  """``(params, batch) -> the reported loss`` of ``loss_fn`` (see :func:`loss_and_grad`): for
  evaluation, where an MoE's auxiliary terms do not count."""

  def fn(params, batch):
    out = loss_fn(params, batch)
    return out[1].get("loss", out[0]) if isinstance(out, tuple) else out

  return fn


@functools.partial(jax.jit, static_argnums=1)
def all_finite(tree, per_replica: bool) -> jax.Array:
  """Whether every inexact leaf of ``tree`` is finite: [M] along the leading axis, else [1]."""
  flags = [jnp.all(jnp.isfinite(x).reshape(x.shape[0], -1), axis=1) if per_replica
           else jnp.all(jnp.isfinite(x))[None]
           for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(flags), axis=0)


class AlgorithmBase(MeshPlacement):
  """Mesh placement, traced hyperparameters and the compiled step of an algorithm.

  The class names its config's traced fields (``config_hyperparams``: name -> ``"int32"``
  or ``"float32"``, read from the config's field metadata); the instance holds extra named
  hyperparameters (``extra_hyperparams``, float32) for optimizer factories. The subclass's
  ``init`` calls ``_compile_once(state, make_step)``; ``step`` and ``lower`` then pass the
  hyperparameters (and the participation mask, if any) to that one jitted step.
  """

  config_hyperparams: dict[str, str] = {}
  extra_hyperparams: dict[str, float]
  _step = None
  _step_key = None
  _hp_arrays = None

  def _init_hyperparams(self, extra: dict | None) -> None:
    self.extra_hyperparams = check_hyperparams(tuple(self.config_hyperparams), extra)

  @property
  def hyperparams(self) -> dict[str, float | int]:
    """The step's traced hyperparameters: the config's, then the extra ones."""
    cast = {"int32": int, "float32": float}
    conf = {k: cast[dtype](getattr(self.config, k)) for k, dtype in self.config_hyperparams.items()}
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
                             **check_hyperparams(tuple(self.config_hyperparams), extra)}
    new._hp_arrays = None
    return new

  def typed_hyperparams(self) -> dict[str, np.generic]:
    """The traced hyperparameters as the host scalars a step is given (both runtimes place these).

    Returns:
      :attr:`hyperparams`, each cast to its ``config_hyperparams`` dtype (int32 or float32;
      float32 for the extra ones).

    Examples:
      >>> import optax
      >>> from diloco_core import DiLoCo, DiLoCoConfig
      >>> algo = DiLoCo(lambda w, x: jnp.sum((w - x) ** 2), optax.sgd(0.1), DiLoCoConfig(replicas=2))
      >>> hp = algo.typed_hyperparams()
      >>> hp["sync_every"].dtype.name, hp["outer_lr"].dtype.name, float(hp["outer_lr"])
      ('int32', 'float32', 0.699999988079071)
    """
    dtypes = {k: np.dtype(self.config_hyperparams.get(k, "float32")) for k in self.hyperparams}
    return {k: dtypes[k].type(v) for k, v in self.hyperparams.items()}

  def _device_hyperparams(self) -> dict[str, jax.Array]:
    """The hyperparameters (:meth:`typed_hyperparams`) replicated on the mesh (made once)."""
    if self._hp_arrays is None:
      self._hp_arrays = self.place_replicated(self.typed_hyperparams())
    return self._hp_arrays

  def _compile_once(self, state, make_step) -> None:
    """Sets ``_step = make_step()`` unless a step for ``state``'s structure is already built."""
    key = structure_key(state)
    if self._step is None or self._step_key != key:
      self._step = make_step()
      self._step_key = key

  @property
  def program(self):
    """The jitted step (shared with :meth:`with_hyperparams` copies); None before ``init``."""
    return self._step

  @property
  def compiled_programs(self) -> int:
    """How many programs the jitted step has compiled so far (0 before the first step)."""
    return 0 if self._step is None else self._step._cache_size()

  def step_args(self, state, batch, participation=None) -> tuple:
    """The jitted step's arguments: ``(state, batch, hyperparameters[, participation])``.

    ``algo.lower(state, batch).compile()(*algo.step_args(state, batch))`` runs the program
    :meth:`step` runs (benchmarks time it so). The subclass may check ``participation``.
    """
    hp = self._device_hyperparams()
    if participation is None:
      return state, batch, hp
    return state, batch, hp, jnp.asarray(participation, jnp.float32)

  def step(self, state, batch, participation=None):
    """One step (jitted); see the subclass for ``participation``."""
    if self._step is None:
      raise RuntimeError("call init(params) before step().")
    self.check_step_inputs(batch, participation, state)
    with jax.set_mesh(self.mesh):
      return self._step(*self.step_args(state, batch, participation))

  def check_step_inputs(self, batch, participation=None, state=None) -> None:
    """Raises a one-line ``ValueError`` unless every leaf of ``batch`` has leading axis M,
    ``participation`` is None or M values each 1 (present) or 0 (dropped), and ``state`` (when
    given) was not donated to an earlier step (its buffers are then deleted).

    Examples:
      >>> import optax
      >>> from diloco_core import DiLoCo, DiLoCoConfig
      >>> algo = DiLoCo(lambda w, x: jnp.sum((w - x) ** 2), optax.sgd(0.25), DiLoCoConfig(replicas=2))
      >>> algo.check_step_inputs(jnp.zeros((3, 4)))
      Traceback (most recent call last):
      ...
      ValueError: DiLoCo.step: every batch leaf needs a leading axis of replicas=2 (one batch per replica), got shape (3, 4).
      >>> algo.check_step_inputs(jnp.zeros((2, 4)), participation=jnp.ones(3))
      Traceback (most recent call last):
      ...
      ValueError: DiLoCo.step: participation must have shape (replicas,) = (2,) (1 present, 0 dropped), got shape (3,).
      >>> algo.check_step_inputs(jnp.zeros((2, 4)), participation=np.array([np.nan, 1.0]))
      Traceback (most recent call last):
      ...
      ValueError: DiLoCo.step: participation must hold 1 (present) or 0 (dropped) for each replica, got [nan, 1.0].
    """
    M, who = self.config.replicas, f"{type(self).__name__}.step"
    for leaf in jax.tree.leaves(batch):
      shape = tuple(np.shape(leaf))
      if not shape or shape[0] != M:
        raise ValueError(f"{who}: every batch leaf needs a leading axis of replicas={M} (one batch per"
                         f" replica), got shape {shape}.")
    if participation is not None and tuple(np.shape(participation)) != (M,):
      raise ValueError(f"{who}: participation must have shape (replicas,) = ({M},) (1 present, 0"
                       f" dropped), got shape {tuple(np.shape(participation))}.")
    if participation is not None and not isinstance(participation, jax.core.Tracer):
      values = np.asarray(participation, dtype=np.float64)
      if not np.all((values == 0) | (values == 1)):
        raise ValueError(f"{who}: participation must hold 1 (present) or 0 (dropped) for each replica,"
                         f" got {values.tolist()}.")
    first = next(iter(jax.tree.leaves(state)), None) if state is not None else None
    if isinstance(first, jax.Array) and first.is_deleted():  # donation deletes every buffer at once
      raise ValueError(f"{who}: this state was donated to an earlier step (its buffers are deleted);"
                       " pass the state that step returned.")

  def lower(self, state, batch, participation=None) -> jax.stages.Lowered:
    """The step for these arguments as a :class:`jax.stages.Lowered` (nothing runs).

    ``.compile()`` gives the executable (``.as_text()``, ``.cost_analysis()``), the same
    program :meth:`step` runs; the state is not donated.
    """
    if self._step is None:
      raise RuntimeError("call init(params) before lower().")
    with jax.set_mesh(self.mesh):
      return self._step.lower(*self.step_args(state, batch, participation))
