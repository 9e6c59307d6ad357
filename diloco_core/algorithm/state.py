"""The DiLoCo training state as one pytree, and the named operands of its jitted step.

:class:`DiLoCoState` is what :class:`~diloco_core.algorithm.diloco.DiLoCo` initialises, steps,
checkpoints and evaluates; the named tuples carry one fragment's leaves into the send
(:class:`SendOperands`) and the merge (:class:`MergeOperands`) and back out
(:class:`OuterUpdate`), in place of positional one-letter arguments. How a replica took part
in a sync (``DiLoCoState.participants``) is :func:`participation_code`, for both runtimes; how a
replica rejoins (the heal of an elastic run, its checkpoint's fill and its in-step replay) is
:func:`heal_replicas`.

**The two heal rules for a replica's inner optimizer state** (its params always become the
global copy), named here once with the reason each applies:

* ``"own"``: a replica that was left out of a round but never stopped (a dropped or late
  contribution: ``drop_schedule``, a quorum's late process) keeps its own moments and step
  count; its merge replaces its params (the drop rule of docs/semantics.md). Every runtime and
  the syncer's tape player (:mod:`~diloco_core.runtime.tape_player`) apply it.
* ``"source"``: a replica that was lost and comes back (a replacement process, which starts
  with no state) takes a live peer's inner state (:func:`heal_replicas`): the elastic heal, its
  checkpoint's fill and their in-step replay. The tape player does not: its ``Joined`` replica
  keeps the inner state it had before its loss, which a simulated replica still holds and a
  real replacement would not; a tape with joins therefore differs from its run on real
  processes in the rejoined replica's first inner steps (tapes recorded from real runs hold no
  joins: :func:`~diloco_core.runtime.trace_tape.tape_from_trace` refuses heals).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

#: ``DiLoCoState.participants`` codes: the replica took part in the fragment's latest sync; it
#: was dropped (its merge heals it: the global copy replaces its fragment); nobody took part (the
#: sync was skipped: its merge leaves every replica alone).
PRESENT, DROPPED, SKIPPED = 1.0, 0.0, -1.0


def participation_code(present, replicas: int, xp=jnp):
  """How each replica takes part in a sync, as ``DiLoCoState.participants`` records it.

  Args:
    present: the [M] participation mask (1 present, 0 dropped), or None for everyone.
    replicas: M.
    xp: the array module (``jax.numpy`` in a program, ``numpy`` on the host).

  Returns:
    [M] float32: the mask (:data:`PRESENT`, :data:`DROPPED`), or :data:`SKIPPED` for every
    replica when nobody is present (the sync is skipped).

  Examples:
    >>> import numpy as np
    >>> participation_code(np.array([1.0, 0.0], np.float32), 2, np).tolist()
    [1.0, 0.0]
    >>> participation_code(np.zeros(2, np.float32), 2, np).tolist(), participation_code(None, 2).tolist()
    ([-1.0, -1.0], [1.0, 1.0])
  """
  present = xp.ones((replicas,), xp.float32) if present is None else present
  return xp.where(xp.sum(present) > 0, present, SKIPPED)


def heal_replicas(state, replicas, source_opt_state, missed: bool = False):
  """The heal rule: replicas ``replicas`` of a host ``state`` restart as a live peer would heal them.

  Their params become the global params (every fragment), their inner optimizer state the
  source replica's (its moments and step count) and their error-feedback residual zero. The
  elastic heal, the rows an elastic checkpoint fills and the in-step replay
  (``rejoin_schedule``) all use it.

  Args:
    state: a :class:`DiLoCoState` of host (numpy) arrays, replica fields with a leading axis.
    replicas: the rows (replica indices of ``state``) that rejoin.
    source_opt_state: the source replica's inner optimizer state (one row, no replica axis).
    missed: also count every fragment as missed for them (``participants`` :data:`DROPPED`:
      a merge still pending replaces their fragment by the global copy), as the elastic heal
      and checkpoint do; False leaves ``participants`` alone (the in-step replay).

  Returns:
    The state with those rows replaced (new arrays; ``state`` is not changed).

  Examples:
    >>> s = DiLoCoState(params={"w": np.zeros((2, 1))}, opt_state={"m": np.array([[1.0], [2.0]])},
    ...                 global_params={"w": np.full(1, 5.0)}, outer_state=None, ef_residual=None,
    ...                 step=np.int32(3), participants=np.ones((2, 1), np.float32), in_flight=None)
    >>> r = heal_replicas(s, [1], {"m": s.opt_state["m"][0]}, missed=True)
    >>> r.params["w"].tolist(), r.opt_state["m"].tolist(), r.participants.tolist()
    ([[0.0], [5.0]], [[1.0], [1.0]], [[1.0], [0.0]])
  """
  replicas = list(replicas)

  def put(x, value):
    x = np.array(x)
    x[replicas] = value
    return x
  return state.replace(
      params=jax.tree.map(put, state.params, state.global_params),
      opt_state=jax.tree.map(put, state.opt_state, source_opt_state),
      ef_residual=None if state.ef_residual is None else jax.tree.map(lambda x: put(x, 0), state.ef_residual),
      participants=put(state.participants, DROPPED) if missed else state.participants)


class OuterUpdate(NamedTuple):
  """Leaf lists a fragment's send updates: the global params, the outer optimizer state,
  the error-feedback residuals (None without error feedback) and what is in flight under
  ``outer_overlap`` (None for ``"none"``, see ``DiLoCoState.in_flight``)."""

  global_params: list
  outer_state: list
  ef_residual: list | None
  in_flight: Any = None


class SendOperands(NamedTuple):
  """Inputs of a fragment's send: the :class:`OuterUpdate` leaves, every replica's params
  (leading axis M) and the participation mask ([M] float32, or None for everyone)."""

  global_params: list
  outer_state: list
  replica_params: list
  ef_residual: list | None
  participation: jax.Array | None
  in_flight: Any = None


class MergeOperands(NamedTuple):
  """Inputs of a fragment's merge: the global params, every replica's params and how each
  replica took part in that fragment's latest sync ([M], see ``DiLoCoState.participants``)."""

  global_params: list
  replica_params: list
  participation: jax.Array


class DiLoCoState(struct.PyTreeNode):
  """The whole training state of DiLoCo / Streaming DiLoCo as one pytree.

  Attributes:
    params: every replica's params, leading axis M (the ``diloco`` placement).
    opt_state: every replica's inner optimizer state, leading axis M.
    global_params: the global copy θ_g (what is evaluated and exported).
    outer_state: the outer optimizer state (the Nesterov momentum v), shaped like θ_g;
      with P > 1 each non-parameter leaf (a count) has a leading axis P, one per fragment.
    ef_residual: every replica's error-feedback residual (leading axis M), or None.
    step: inner steps done (int32 scalar).
    participants: float32 [M, P]: entry (m, p) says how replica m took part in fragment
      p's latest sync (:func:`participation_code`): 1 present, 0 dropped (its merge heals m),
      -1 nobody was present (its merge leaves m alone). All ones unless :meth:`~diloco_core.algorithm.diloco.DiLoCo.step` gets a mask.
    in_flight: what ``outer_overlap`` keeps between two syncs of a fragment: None for
      ``"none"``; for ``"delayed"`` the average in flight (float32, shaped like θ_g); for
      ``"eager"`` an :class:`~diloco_core.algorithm.eager.EagerInFlight` per replica (leading axis
      M; θ_g is then the mean of the replicas' outer params, and ``outer_state`` is unused).
  """

  params: Any
  opt_state: Any
  global_params: Any
  outer_state: Any
  ef_residual: Any
  step: jax.Array
  participants: jax.Array
  in_flight: Any = None
