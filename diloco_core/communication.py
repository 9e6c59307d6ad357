"""How a run's replicas communicate: the one object the training loop calls for it.

``communication`` (:data:`~diloco_core.validity.COMMUNICATIONS`) picks the runtime:

* ``"in-step"`` (:class:`InStep`): every replica in one SPMD program; a fragment's all-reduce
  runs inside the step that sends it, and τ only moves its merge (what MaxText and the
  papers' simulations do);
* ``"background"`` (:class:`~diloco_core.background.Background`): the replicas split over
  the processes, each fragment's all-reduce on a communication thread while training goes on.

Both give the loop the same calls: ``init``, ``step``, ``settle`` (before an eval row, a
checkpoint and the end: nothing may be in flight), the placements, the state as the SPMD
placement (``global_state``, for checkpoints) and back (``local_state``, on resume), the
gathers of per-replica values for the log, and ``close``. The numbers are the same.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp
import numpy as np

from diloco_core.background import Background
from diloco_core.mesh import fetch, local_replicas, make_mesh, parse_mesh


def data_replicas(cfg) -> tuple[int, ...]:
  """The replicas whose batches this process reads (the data's shards)."""
  if cfg.communication == "background":
    n, rank = jax.process_count(), jax.process_index()
    m = cfg.algo.replicas // n
    return tuple(range(rank * m, (rank + 1) * m))
  return local_replicas(make_mesh(parse_mesh(cfg.mesh)), cfg.algo.replicas)


class InStep:
  """Every replica in the algorithm's one SPMD program (the default runtime).

  Args:
    algo: the run's algorithm (:class:`~diloco_core.DiLoCo` or :class:`~diloco_core.DataParallel`).
  """

  name = "in-step"

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

  def close(self) -> None:
    pass


class InBackground(InStep):
  """The loop's calls on a :class:`~diloco_core.background.Background` runtime."""

  name = "background"

  def __init__(self, algo, params, cfg, resumed: bool):
    super().__init__(algo)
    self.runtime = Background(algo, params, mesh=cfg.mesh, out=cfg.out, resumed=resumed)
    self._keys = itertools.count()

  def init(self, params):
    return self.runtime.init(params)

  def place_batch(self, batch):
    return self.runtime.place_batch(batch)

  def place_replicated(self, x):
    return self.runtime.place_replicated(x)

  def step(self, state, batch, t: int, present=None, last: bool = False):
    return self.runtime.step(state, batch, t, last)

  def settle(self, state, t: int):
    return self.runtime.settle(state, t)

  def global_state(self, state):
    return self.runtime.global_state(state)

  def local_state(self, state):
    return self.runtime.local_state(state)

  def gather_rows(self, values: list) -> np.ndarray:
    local = np.stack([self.runtime.own_rows(v) for v in values])  # [steps, M / N]
    every = self.runtime.link.exchange(f"rows/{next(self._keys)}", local)  # [N, steps, M / N]
    return np.concatenate(list(every), axis=1)

  def host_replicas(self, state):
    return self.runtime.host_replicas(state)

  def finite_flags(self, state):
    replicas, glob = self.algo.finite_flags(state)
    every = self.runtime.link.exchange(f"flags/{next(self._keys)}", self.runtime.own_rows(replicas))
    return jnp.asarray(every.reshape(-1)), glob

  def close(self) -> None:
    self.runtime.close()


def make_communication(cfg, algo, params, resumed: bool = False):
  """The runtime ``cfg.communication`` names, for ``algo`` (:class:`InStep` or :class:`InBackground`)."""
  if cfg.communication == "background":
    return InBackground(algo, params, cfg, resumed)
  return InStep(algo)
