"""How a run's replicas communicate: the one object the training loop calls for it.

``communication`` (:data:`~diloco_core.spec.validity.COMMUNICATIONS`) picks the runtime:

* ``"in-step"`` (:class:`InStep`): every replica in one SPMD program; a fragment's all-reduce
  runs inside the step that sends it, and τ only moves its merge (what MaxText and the
  papers' simulations do);
* ``"background"`` (:class:`~diloco_core.runtime.background.Background`): the replicas split over
  the processes, each fragment's all-reduce on a communication thread while training goes on.

A run whose syncer is not at its defaults is played from its tape instead
(:class:`~diloco_core.runtime.tape_runtime.TapeRuntime`: a step is one committed round).

Each is a :class:`Runtime`: the loop's every call, listed there (``tests/test_layout.py``
checks that :mod:`diloco_core.run.loop` calls nothing else and that all three implement it all). The
numbers are the same. Both run the algorithm's phases
(:class:`~diloco_core.algorithm.phases.Phases`, read through the public names its docstring
lists): composed into one jitted step here, as separate programs around a link there.
"""

from __future__ import annotations

from typing import Any, Protocol

import jax
import jax.numpy as jnp
import numpy as np

from diloco_core.algorithm.state import heal_replicas
from diloco_core.runtime.background import Background
from diloco_core.runtime.quorum import QuorumRule
from diloco_core.devices.mesh import fetch, local_replicas, make_mesh, parse_mesh
from diloco_core.devices.processes import lock_step_writes
from diloco_core.runtime.tape_runtime import TapeRuntime


def data_replicas(cfg) -> tuple[int, ...]:
  """The replicas whose batches this process reads (the data's shards)."""
  if cfg.communication == "background":
    n, rank = jax.process_count(), jax.process_index()
    m = cfg.algo.replicas // n
    return tuple(range(rank * m, (rank + 1) * m))
  return local_replicas(make_mesh(parse_mesh(cfg.mesh)), cfg.algo.replicas)


class Runtime(Protocol):
  """What the training loop calls on a run's communication runtime: every name it uses."""

  name: str  #: ``"in-step"``, ``"background"`` or ``"tape"``
  #: An elastic replacement, which must :meth:`rejoin` before its first step (in-step: never).
  rejoining: bool
  #: Whether a step is one step of the run, every replica in lock step (False: one committed
  #: round of a syncer tape, :class:`~diloco_core.runtime.tape_runtime.TapeRuntime`).
  lock_step: bool

  def last_step(self, cfg) -> int:
    """The number of steps :meth:`step` takes for the run ``cfg``: ``cfg.steps`` in lock step,
    the tape's rounds otherwise."""

  def init(self, params) -> Any:
    """The initial state (this process's part of it)."""

  def place_batch(self, batch) -> Any:
    """A host batch ``[M, ...]`` (this process's replicas) placed for :meth:`step`."""

  def place_replicated(self, x) -> Any:
    """A host value placed whole on every device."""

  def step(self, state, batch, t: int, present=None, last: bool = False) -> tuple[Any, dict]:
    """Inner step t, the due send and merge: ``(state, metrics)`` (``present``: the replicas
    taking part in this step's sync, or None; ``last``: the last step with ``eval_replicas``)."""

  def settle(self, state, t: int) -> Any:
    """The state with nothing in flight (before an eval row, a checkpoint and the end)."""

  def global_state(self, state) -> Any:
    """The state as the SPMD run places it (what a checkpoint saves)."""

  def checkpoint_state(self, state, t: int) -> tuple[Any, dict]:
    """What checkpoint ``t`` saves on this process (None: this process writes nothing) and what
    its meta item adds (elastic: the replicas it filled)."""

  def resumed_from(self, step: int, meta: dict) -> None:
    """Called after a resume from checkpoint ``step`` (with its meta item)."""

  def rejoin(self, state, batch=None) -> tuple[Any, int]:
    """An elastic replacement (:attr:`rejoining`): ``(state, step)``, the state a live peer
    healed it with and the step it holds (``batch``: compiles its programs first)."""

  def rejoin_replicas(self, state, replicas, source: int) -> Any:
    """``rejoin_schedule`` (an elastic run replayed in-step): replicas ``replicas`` restart from
    the global params and replica ``source``'s inner state."""

  def writes_files(self) -> bool:
    """Whether this process writes the run's files now (metrics, checkpoints, summary, final
    params): process 0; elastic, the lowest process present since the start."""

  def local_state(self, state) -> Any:
    """A restored state in this runtime's placement."""

  def gather_rows(self, values: list) -> np.ndarray:
    """Queued per-replica values ``[M]`` (one per step) as ``[steps, M]`` on the host."""

  def host_replicas(self, state) -> Any:
    """Every replica's params on the host."""

  def eval_params(self, state) -> Any:
    """The params to evaluate (the global copy)."""

  def finite_flags(self, state) -> tuple[Any, Any]:
    """Whether each replica's params are all finite [M], and whether the global copy is."""

  def absent_replicas(self) -> np.ndarray | None:
    """An elastic run's [M] mask of the replicas lost (their losses are NaN); None otherwise."""

  def replica_params(self, state) -> Any:
    """The replicas' params the divergence watch reads (elastic: this process's own)."""

  def take_unsent(self) -> list[tuple[int, float]]:
    """Elastic: the syncs settled since the last call whose counted bytes a share of the
    replicas did not send, as ``(step, share)``."""

  def close(self) -> None:
    """Releases what the runtime holds (threads, files)."""


class InStep:
  """Every replica in the algorithm's one SPMD program (the default runtime).

  Args:
    algo: the run's algorithm (:class:`~diloco_core.DiLoCo` or :class:`~diloco_core.DataParallel`).
  """

  name = "in-step"
  rejoining = False  # one program runs every replica: no process to replace
  lock_step = True

  def last_step(self, cfg) -> int:
    return cfg.steps

  def __init__(self, algo):
    self.algo, self._last = algo, None
    self.config = algo.config

  def init(self, params):
    return self.algo.init(params)

  def place_batch(self, batch):
    return self.algo.place_batch(batch)

  def place_replicated(self, x):
    return self.algo.place_replicated(x)

  def step(self, state, batch, t: int, present=None, last: bool = False):
    """One step of every replica (``present``: the host participation mask, or None; ``last``:
    the run's last step with ``eval_replicas``, which merges nothing)."""
    algo = self.algo
    if last:  # α = 1 on the last step (eval_replicas): a copy sharing the compiled step
      self._last = self._last or self.algo.with_hyperparams(alpha=1.0)
      algo = self._last
    return algo.step(state, batch, None if present is None else self.algo.place_replicated(present))

  def settle(self, state, t: int):
    return state  # nothing is ever in flight between two steps

  def global_state(self, state):
    return state

  def checkpoint_state(self, state, t: int):
    return state, {}  # every process writes its part

  def resumed_from(self, step: int, meta: dict) -> None:
    pass  # no trace to record it in

  def rejoin(self, state, batch=None):
    """Never called (:attr:`rejoining` is False): an in-step run has no replacement process."""
    raise RuntimeError("the in-step runtime has no replacement process to heal (`rejoining` is False).")

  def writes_files(self) -> bool:
    return lock_step_writes()

  def local_state(self, state):
    return state

  def gather_rows(self, values: list) -> np.ndarray:
    """Queued per-replica values ``[M]`` (one per step) as a host array ``[steps, M]``."""
    return fetch(jnp.stack(values))

  def host_replicas(self, state):
    return jax.device_get(state.params)

  def eval_params(self, state):
    return self.algo.eval_params(state)

  def finite_flags(self, state):
    return self.algo.finite_flags(state)

  def absent_replicas(self):
    return None  # one program runs every replica: none is ever lost

  def replica_params(self, state):
    return state.params

  def take_unsent(self):
    return []  # every replica of the schedule sends

  def rejoin_replicas(self, state, replicas, source: int):
    """``rejoin_schedule``: replicas ``replicas`` restart from the global params, replica
    ``source``'s inner state and a zero residual (:func:`~diloco_core.algorithm.state.heal_replicas`,
    the elastic heal's rule; their ``participants`` stay as the replayed drops left them).

    Examples:
      >>> import optax
      >>> from diloco_core import DiLoCo, DiLoCoConfig
      >>> algo = DiLoCo(lambda w, x: jnp.sum((w - x) ** 2), optax.sgd(0.5), DiLoCoConfig(replicas=2, sync_every=2))
      >>> comm = InStep(algo)
      >>> state, _ = comm.step(comm.init(jnp.zeros(1)), comm.place_batch(jnp.array([[1.0], [3.0]])), 1)
      >>> state.params.tolist(), comm.rejoin_replicas(state, [1], source=0).params.tolist()  # θ_g = 0
      ([[1.0], [3.0]], [[1.0], [0.0]])
    """
    host = jax.device_get(state)
    new = heal_replicas(host, replicas, jax.tree.map(lambda x: np.asarray(x)[source], host.opt_state))
    return jax.tree.map(lambda n, o: jax.device_put(n, o.sharding) if isinstance(o, jax.Array) else n, new, state)

  def close(self) -> None:
    pass


def make_communication(cfg, algo, params, resumed: bool = False, data=None, eval_fn=None) -> Runtime:
  """The runtime of the run ``cfg``, for ``algo``: :class:`~diloco_core.runtime.tape_runtime.TapeRuntime`
  when its syncer plays a tape (which reads ``data`` and evaluates with ``eval_fn``), else the
  one ``cfg.communication`` names, :class:`InStep` or :class:`~diloco_core.runtime.background.Background`."""
  if cfg.syncer.plays_tape(cfg):
    return TapeRuntime(cfg, algo, data, eval_fn)
  if cfg.communication == "background":
    return Background(algo, params, mesh=cfg.mesh, out=cfg.out, resumed=resumed,
                      min_replicas=cfg.min_replicas if cfg.elastic else None, heal_every=cfg.log_every,
                      heal_wait=cfg.heal_wait,
                      quorum=QuorumRule.of(cfg, jax.process_count()) if cfg.elastic else None,
                      step_delay=dict(cfg.syncer.step_delay or ()).get(jax.process_index(), 0.0))
  return InStep(algo)
