"""Divergence: non-finite or exploding values, caught where they arise and never checkpointed.

The loop checks at its log cadence (one host sync per log row, as before):

* the training losses of every step since the last row (on device until then);
* the global params after every outer step: one fused reduction, ``max |θ_g|``, queued on
  device right after each step that sends a fragment and fetched with the losses;
* every replica's params and the global params at the row (:meth:`~diloco_core.algorithm.base.Algorithm.finite_flags`);
* the eval loss, and before every checkpoint the eval loss of the state to be saved.

A loss is *exploding* above ``LOSS_FACTOR`` times the initial eval loss (a uniform guess
over the vocabulary scores ln V; no training run comes near 100 ln V), and the global params
above ``PARAMS_FACTOR`` times their initial ``max |θ|`` (at least 1). The first of these in
step order names the quantity and the option to lower: the global params or the eval loss
after an outer step point at `outer_lr`, the training loss or a replica's params at
`inner_lr` (DP, with no outer step, always at `inner_lr`). Since a checkpoint is only
written after these checks pass, the newest checkpoint is finite.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from diloco_core.devices.mesh import fetch

#: A loss above this multiple of the initial eval loss has exploded.
LOSS_FACTOR = 100.0
#: Global params above this multiple of their initial largest magnitude (at least 1) have exploded.
PARAMS_FACTOR = 1e3


@jax.jit
def max_abs(tree) -> jax.Array:
  """``max |x|`` over the inexact leaves of ``tree`` (NaN if any is NaN), on device.

  Examples:
    >>> float(max_abs({"a": jnp.array([1.0, -3.0]), "n": jnp.arange(9)}))
    3.0
  """
  leaves = [jnp.max(jnp.abs(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.max(jnp.stack(leaves).astype(jnp.float32))


def _advice(option: str, last_checkpoint: str | None) -> str:
  """What to do after a divergence: `resume` is offered only when a checkpoint exists (and it
  continues with the same `option`, which resume requires to match).

  Examples:
    >>> _advice("outer_lr", None)
    'lower `outer_lr` and start over with `overwrite` (no checkpoint was written).'
  """
  if not last_checkpoint:
    return f"lower `{option}` and start over with `overwrite` (no checkpoint was written)."
  return (f"lower `{option}` and start over with `overwrite` (the newest finite checkpoint is"
          f" {last_checkpoint}; `resume` continues from it with the same `{option}`).")


def check_finite(algo, step_losses: np.ndarray, t: int, state, last_checkpoint: str | None,
                 loss_limit: float = math.inf) -> None:
  """Raises FloatingPointError naming the first bad step and replica (losses [n, M], params).

  The message names the option to lower in backticks (`inner_lr`, `outer_lr`).

  Examples:
    >>> check_finite(None, np.array([[2.0, np.inf]]), 3, None, None)
    Traceback (most recent call last):
    ...
    FloatingPointError: training loss at step 3 is inf on replica(s) [1]; lower `inner_lr` and start over with `overwrite` (no checkpoint was written).
  """
  bad_steps = np.flatnonzero(~np.all(np.isfinite(step_losses) & (step_losses <= loss_limit), axis=1))
  if bad_steps.size:
    i = int(bad_steps[0])
    row = step_losses[i]
    bad = [m for m, x in enumerate(row) if not (np.isfinite(x) and x <= loss_limit)]
    raise FloatingPointError(
        f"training loss at step {t - len(step_losses) + 1 + i} is {_show(row[bad[0]], loss_limit)} on"
        f" replica(s) {bad}; {_advice('inner_lr', last_checkpoint)}")
  replicas, glob = algo.finite_flags(state)
  if replicas is None:  # one model (DP)
    if not fetch(glob):
      raise FloatingPointError(f"non-finite params after step {t}; {_advice('inner_lr', last_checkpoint)}")
    return
  replicas, glob = fetch(replicas), fetch(glob)
  if not replicas.all():
    bad = [m for m, ok in enumerate(replicas) if not ok]
    raise FloatingPointError(f"non-finite params after step {t} on replica(s) {bad};"
                             f" {_advice('inner_lr', last_checkpoint)}")
  if not glob:
    raise FloatingPointError(f"non-finite global params after step {t}; {_advice('outer_lr', last_checkpoint)}")


def _show(x: float, limit: float) -> str:
  return f"{x:.3g}" if not np.isfinite(x) else f"{x:.3g} (above {limit:.3g}: exploding)"


class Watch:
  """The divergence checks of one run (see the module docstring).

  Args:
    runtime: the run's :class:`~diloco_core.runtime.communication.Runtime`; the watch calls its
      ``replica_params``, ``eval_params`` and ``finite_flags``.
    state: its state at the start (gives the initial ``max |θ|``).
    initial_eval: the eval loss at step 0.
    last_checkpoint: the checkpoint the run resumed from, or None.
    outer: whether the algorithm has an outer step (False for ``dp``: every blow-up then
      names `inner_lr`).
  """

  def __init__(self, runtime, state, initial_eval: float, last_checkpoint: str | None, outer: bool):
    self.runtime, self.last_checkpoint, self.outer = runtime, last_checkpoint, outer
    initial_eval = float(initial_eval)
    self.loss_limit = LOSS_FACTOR * max(initial_eval, 1.0) if math.isfinite(initial_eval) else math.inf
    self.params_limit = PARAMS_FACTOR * max(float(fetch(max_abs(runtime.eval_params(state)))), 1.0)
    self._pending: list[tuple[int, str, jax.Array]] = []

  def after_step(self, t: int, state, sent: bool, sends_next: bool) -> None:
    """Queues ``max |θ_g|`` after a step that sent a fragment, and the replicas' ``max |θ|``
    before it (which tells an inner blow-up from an outer one); no host sync."""
    if self.outer and sends_next:
      self._pending.append((t, "replicas", max_abs(self.runtime.replica_params(state))))  # this process's
    if self.outer and sent:
      self._pending.append((t, "global", max_abs(self.runtime.eval_params(state))))

  def check_row(self, t: int, step_losses: np.ndarray, state) -> None:
    """At a log row: the outer steps since the last row, then the losses and the params."""
    pending, self._pending = self._pending, []
    first_loss = np.flatnonzero(~np.all(np.isfinite(step_losses) & (step_losses <= self.loss_limit), axis=1))
    first_loss = t - len(step_losses) + 1 + int(first_loss[0]) if first_loss.size else None
    values = fetch([x for _, _, x in pending]) if pending else []
    for (s, what, _), x in zip(pending, values):
      if first_loss is not None and s >= first_loss:
        break
      if not (np.isfinite(x) and x <= self.params_limit):
        where = (f"global params after the outer step at step {s}" if what == "global"
                 else f"replica params after step {s}, before the outer step,")
        raise FloatingPointError(
            f"{where} hold {_show(float(x), self.params_limit)} values;"
            f" {_advice('outer_lr' if what == 'global' else 'inner_lr', self.last_checkpoint)}")
    check_finite(self.runtime, step_losses, t, state, self.last_checkpoint, self.loss_limit)

  def check_eval(self, t: int, eval_loss: float) -> None:
    """The eval loss of the global params at step ``t`` (its outer steps: `outer_lr`)."""
    if not (np.isfinite(eval_loss) and eval_loss <= self.loss_limit):
      option = "outer_lr" if self.outer else "inner_lr"
      what = "global params after the outer steps" if self.outer else "params"
      raise FloatingPointError(f"eval loss ({what}) at step {t} is {_show(eval_loss, self.loss_limit)};"
                               f" {_advice(option, self.last_checkpoint)}")

  def saved(self, path: str) -> None:
    self.last_checkpoint = path
