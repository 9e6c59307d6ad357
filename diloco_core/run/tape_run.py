"""``train`` with a non-default syncer: the run's rounds stepped and its files written.

When ``TrainConfig.syncer`` is not at its defaults
(:meth:`~diloco_core.run.syncer_options.SyncerOptions.is_default`), the run's set-up
(:func:`~diloco_core.run.run_setup.set_up`, as for every run) makes its runtime a
:class:`~diloco_core.runtime.tape_runtime.TapeRuntime`: the tape of the run's syncer on
replicas of speeds ``syncer.speeds`` (:func:`~diloco_core.runtime.tape_player.tape_for`, equal
total local steps :math:`M \\times` ``steps``), whose steps are committed rounds. Its runtime
says so (``lock_step`` False) and :func:`~diloco_core.run.loop.train` hands the run to
:func:`play_rounds`, which steps it round by round (a progress bar over the rounds) and writes
its files. (A tape a real elastic run recorded, ``syncer.tape``, is not played here: ``train``
runs it in lock step with its drops, :func:`~diloco_core.run.syncer_options.check_tape`.)

What differs from a lock-step run's files: ``metrics.jsonl`` has **one row per committed
round** (``step`` is the round's version; ``local_steps`` the inner steps played by then, all
replicas together; ``tokens`` theirs; ``train_loss`` / ``replica_loss`` the means of the steps
played since the previous row, null for a replica that played none; ``eval_loss`` the round's
version's; ``members`` the round's replicas in member order; ``tick`` the simulated time of the
commit, in ticks of the tape (the :class:`~diloco_core.spec.tape.Committed` event's; the fastest
replica's step is ``min(summary["tape"]["step_ticks"])`` ticks); bytes per replica as the mean
over the M replicas of the contributions sent; ``wall_time_s`` the whole play's). ``log_every``
and ``eval_every`` do not apply: every round is a row, every version is evaluated. ``summary.json`` has the usual keys (no
compile time, no per-replica eval) and a ``tape`` item: its step ticks, rounds, local steps,
contributions, the rounds' members and the tick of the last commit (``ticks``). No checkpoint is written (refused up front).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time

import numpy as np
from tqdm.auto import tqdm

from diloco_core import interrupts
from diloco_core.run.programs import PROGRAMS
from diloco_core.run.run_setup import SetUp, build_model
from diloco_core.runtime.tape_player import TapeSetup, speed_ticks
from diloco_core.spec.model_config import param_count
from diloco_core.spec.tape import commit_ticks
from diloco_core.store import checkpoint as ckpt
from diloco_core.store import params_io

__all__ = ["make_setup", "play_rounds"]


def make_setup(cfg) -> TapeSetup:
  """The run's data, initial params, jitted eval loss and algorithm object, built as
  :func:`~diloco_core.run.run_setup.set_up` builds them: for a tape played outside ``train``
  (:func:`~diloco_core.runtime.tape_player.play_tape`)."""
  data, model_cfg, params, loss_fn = build_model(cfg)
  algo, eval_fn = PROGRAMS.get(cfg, loss_fn, params, model_cfg)
  return TapeSetup(data, params, eval_fn, algo)


def _rows(cfg, result, wall: float) -> list[dict]:
  m, per_step = cfg.algo.replicas, cfg.batch_size * cfg.seq_len
  ticks = commit_ticks(result.tape)
  if len(ticks) != len(result.round_marks):
    raise AssertionError(f"{len(ticks)} commits on the tape, {len(result.round_marks)} rounds played.")
  rows = [{"step": 0, "local_steps": 0, "train_loss": None, "replica_loss": None,
           "eval_loss": result.version_eval_losses[0][1], "tokens": 0, "bytes_sent": 0.0, "total_bytes_sent": 0.0,
           "members": [], "tick": 0, "wall_time_s": 0.0}]
  done, sent = 0, 0
  evals = dict(result.version_eval_losses)
  for (version, played, contributions), members, tick in zip(result.round_marks, result.members, ticks):
    mine = [[x for r, _, x in result.step_losses[done:played] if r == k] for k in range(m)]
    means = [float(np.mean(x)) if x else None for x in mine]
    seen = [x for x in means if x is not None]
    rows.append({"step": version, "local_steps": played, "train_loss": float(np.mean(seen)) if seen else None,
                 "replica_loss": means, "eval_loss": evals[version], "tokens": played * per_step,
                 "bytes_sent": (contributions - sent) * result.payload_bytes / m,
                 "total_bytes_sent": contributions * result.payload_bytes / m, "members": members,
                 "tick": tick, "wall_time_s": wall})
    done, sent = played, contributions
  return rows


def play_rounds(run: SetUp, state) -> tuple[list[dict], dict, object]:
  """Steps a run whose runtime plays a tape (``run.comm``, not in lock step) round by round,
  then writes its files under ``cfg.out`` (prepared by the set-up) where this process writes them.

  Args:
    run: the run set up by :func:`~diloco_core.run.run_setup.set_up`.
    state: its first state (the runtime's play).

  Returns:
    ``(rows, summary, params)``: one row (a dict) per committed round (module docstring), the
    summary (as ``summary.json``), the final global params.
  """
  cfg, comm = run.cfg, run.comm
  m = cfg.algo.replicas
  start = time.perf_counter()
  last = comm.last_step(cfg)
  bar = tqdm(total=last, disable=not (cfg.progress and comm.writes_files()),
             desc=f"{cfg.algo.algorithm} tape ({run.model_cfg.compute_dtype})", unit="round")
  done = 0
  try:
    for t in range(1, last + 1):
      interrupts.check()  # a stop request (SIGINT / SIGTERM under the command line) ends the play here
      state, metrics = comm.step(state, None, t)
      done = t
      bar.update(1)
      bar.set_postfix(version=metrics["version"], local_steps=metrics["local_steps"])
    state = comm.settle(state, last)
  except KeyboardInterrupt:  # one line, what to do next (a tape run keeps no checkpoint)
    raise interrupts.Interrupted(done, cfg.out, None) from None
  finally:
    bar.close()
    run.log.close()  # its rows are the rounds', written below
    comm.close()
  result = state.result
  wall = time.perf_counter() - start
  rows = _rows(cfg, result, wall)
  final_params = None
  out = cfg.out if comm.writes_files() else None
  if out is not None:
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps(r, allow_nan=False) + "\n" for r in rows[1:])  # the step-0 row is not in the file
    final_params = params_io.export_params(result.params, os.path.join(out, ckpt.FINAL_PARAMS))
  tokens = result.local_steps * cfg.batch_size * cfg.seq_len
  floor, model_cfg, syncer = run.data.loss_floor, run.model_cfg, cfg.syncer.syncer_config(m)
  summary = {
      "algorithm": cfg.algo.algorithm, "final_eval_loss": result.eval_loss, "loss_floor": floor,
      "gap_to_floor": None if floor is None else result.eval_loss - floor,
      "final_replica_eval_losses": None, "final_replica_eval_loss": None,
      "total_bytes_per_replica": result.bytes_sent / m, "peak_bytes_per_step": result.payload_bytes,
      "wall_time_s": wall, "compile_time_s": None, "tokens": tokens, "tokens_per_s": tokens / max(wall, 1e-9),
      "params": param_count(model_cfg), "active_params": param_count(model_cfg, active=True), "final_aux_loss": None,
      "compute_dtype": model_cfg.compute_dtype, "attention": model_cfg.attention, "data": run.data.describe(),
      "config": dataclasses.asdict(cfg), "final_params": final_params, "resumed_from": None,
      "warnings": cfg.schedule_warnings(),
      "tape": {"step_ticks": list(speed_ticks(tuple(cfg.syncer.replica_speeds(m)))),
               "inner_steps": list(syncer.inner_steps_of(cfg.algo.sync_every, m)), "rounds": result.rounds,
               "local_steps": result.local_steps, "contributions": result.contributions, "members": result.members,
               "ticks": commit_ticks(result.tape)[-1] if result.rounds else 0},
  }
  if out is not None:
    with open(os.path.join(out, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2)
  return rows, summary, result.params
