"""The tape runtime: a run played from its syncer's tape, one committed round per step.

With a non-default syncer (``TrainConfig.syncer``, P = 1, τ = 0) the replicas do not advance in
lock step: a tape (:func:`~diloco_core.runtime.tape_player.tape_for`, the run's speeds and
link) says when each replica sends, which contributions each round holds and when each
replica merges. :class:`TapeRuntime` is the :class:`~diloco_core.runtime.communication.Runtime`
that plays it (:func:`~diloco_core.runtime.communication.make_communication` makes it from the
run's config, as it makes the other runtimes from ``communication``): the loop's set-up
(:func:`~diloco_core.run.run_setup.set_up`) builds its data, model and algorithm as for any run,
and its steps are **rounds** (:attr:`~TapeRuntime.lock_step` False): :meth:`~TapeRuntime.step`
``t`` plays the tape's events up to its t-th commit
(:meth:`~diloco_core.runtime.tape_player.TapePlay.play_round`), :meth:`~TapeRuntime.last_step`
is the tape's number of rounds, and :meth:`~TapeRuntime.settle` at the last one plays the
events after it and leaves the play's result in the state (its ``result``, a
:class:`~diloco_core.runtime.tape_player.TapeResult`). The run's files are written by
:func:`~diloco_core.run.tape_run.play_rounds`.

What a lock-step run does and a tape run cannot (a checkpoint, a resume, a rejoin, a mesh) is
refused before anything is built
(:func:`~diloco_core.runtime.option_checks.check_playable`); those members of the protocol
raise here, as :meth:`InStep.rejoin <diloco_core.runtime.communication.InStep.rejoin>` does.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from diloco_core.devices.processes import lock_step_writes
from diloco_core.runtime.tape_player import TapePlay, TapeSetup, tape_for
from diloco_core.spec.tape import commit_ticks

__all__ = ["TapeRuntime"]


def _refuse(what: str):
  raise RuntimeError(f"a run played from a syncer tape has no {what} (refused by check_playable before the run).")


class TapeRuntime:
  """The run's syncer tape, played round by round (module docstring).

  Args:
    cfg: the run (a :class:`~diloco_core.run.config.TrainConfig` whose ``syncer`` plays a tape).
    algo: its algorithm object (the phases the play drives).
    data: its data (each replica's batch at its own local step, the eval batch).
    eval_fn: ``eval_fn(params, tokens)``, the jitted eval loss.
  """

  name = "tape"
  rejoining = False  # one process plays every replica
  lock_step = False  # a step is one committed round of the tape

  def __init__(self, cfg, algo, data, eval_fn):
    m, opts = cfg.algo.replicas, cfg.syncer
    self.cfg, self.algo, self.data, self.eval_fn = cfg, algo, data, eval_fn
    self.syncer = opts.syncer_config(m)
    self.tape = tape_for(cfg, self.syncer, opts.replica_speeds(m), latency=opts.latency, transfer=opts.transfer)

  def last_step(self, cfg) -> int:
    """The tape's number of committed rounds."""
    return len(commit_ticks(self.tape))

  def init(self, params) -> TapePlay:
    return TapePlay(self.cfg, self.syncer, self.tape, TapeSetup(self.data, params, self.eval_fn, self.algo))

  def place_batch(self, batch):
    return batch  # unused: the play reads each replica's batch at its own local step

  def place_replicated(self, x):
    return jnp.asarray(x)

  def step(self, state, batch, t: int, present=None, last: bool = False) -> tuple[Any, dict]:
    """Plays round ``t`` (the events up to the tape's t-th commit); its metrics are the round's
    version, members and the local steps played by then, all replicas together."""
    state.play_round()
    if len(state.marks) != t:
      raise ValueError(f"tape: round {t} asked for, but round {len(state.marks)} was played (rounds go 1, 2, ...).")
    version, played, _ = state.marks[-1]
    return state, {"version": version, "members": state.members[-1], "local_steps": played}

  def settle(self, state, t: int):
    """After the last round (``t`` = :meth:`last_step`): the tape's remaining events played and
    the play's :class:`~diloco_core.runtime.tape_player.TapeResult` in ``state.result``."""
    if not state.rounds_left() and state.result is None:
      state.finish()
    return state

  def global_state(self, state):
    return state.versions[state.version]  # the global params: what the run writes in the end

  def checkpoint_state(self, state, t: int):
    _refuse("checkpoint")

  def resumed_from(self, step: int, meta: dict) -> None:
    _refuse("resume")

  def rejoin(self, state, batch=None):
    _refuse("replacement process")

  def rejoin_replicas(self, state, replicas, source: int):
    _refuse("rejoin schedule")

  def writes_files(self) -> bool:
    return lock_step_writes()

  def local_state(self, state):
    _refuse("restored state")

  def gather_rows(self, values: list) -> np.ndarray:
    return np.asarray(jax.device_get(values))

  def host_replicas(self, state):
    return jax.device_get(state.params)

  def eval_params(self, state):
    return state.versions[state.version]

  def finite_flags(self, state):
    replicas = jnp.stack([jnp.all(jnp.isfinite(x), axis=tuple(range(1, x.ndim))) for x in jax.tree.leaves(state.params)])
    whole = jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(self.eval_params(state))])
    return jnp.all(replicas, axis=0), jnp.all(whole)

  def absent_replicas(self):
    return None  # a lost replica is an event of the tape, not a process gone

  def replica_params(self, state):
    return state.params

  def take_unsent(self):
    return []  # the play counts the contributions sent

  def close(self) -> None:
    pass
