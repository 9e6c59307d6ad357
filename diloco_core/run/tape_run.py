"""``train`` with a non-default syncer: the run played from its tape, written as a run is.

:func:`~diloco_core.run.loop.train` calls :func:`play_run` when ``TrainConfig.syncer`` is not at
its defaults (:meth:`~diloco_core.run.syncer_options.SyncerOptions.is_default`): the tape of
the run's syncer on replicas of speeds ``syncer.speeds``
(:func:`~diloco_core.run.tape_play.tape_for`, equal total local steps :math:`M \\times`
``steps``), played by :func:`~diloco_core.run.tape_play.play_tape`. (A tape a real elastic run
recorded, ``syncer.tape``, is not played here: ``train`` runs it in lock step with its drops,
:func:`~diloco_core.run.syncer_options.check_tape`.)

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

from diloco_core.run.tape_play import make_setup, play_tape, speed_ticks, tape_for
from diloco_core.spec.model_config import param_count
from diloco_core.spec.tape import Committed
from diloco_core.store import checkpoint as ckpt
from diloco_core.store import params_io

__all__ = ["commit_ticks", "play_run"]


def commit_ticks(tape) -> list[int]:
  """The tick of each :class:`~diloco_core.spec.tape.Committed` event of ``tape``, in tape order."""
  return [e.tick for e in tape if isinstance(e, Committed)]


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


def play_run(cfg, writes: bool = True) -> tuple[list[dict], dict, object]:
  """Plays ``cfg``'s run from its syncer's tape and writes its files under ``cfg.out`` (prepared by
  :func:`~diloco_core.run.loop.train`).

  Args:
    cfg: a validated :class:`~diloco_core.run.config.TrainConfig` whose ``syncer`` is not at its defaults.
    writes: whether this process writes the run's files (the runtime's rule,
      :func:`~diloco_core.runtime.communication.lock_step_writes`).

  Returns:
    ``(rows, summary, params)``: one row (a dict) per committed round (module docstring), the
    summary (as ``summary.json``), the final global params.
  """
  start = time.perf_counter()
  m, opts = cfg.algo.replicas, cfg.syncer
  syncer = opts.syncer_config(m)
  speeds = opts.replica_speeds(m)
  setup = make_setup(cfg)
  data, model_cfg = setup[0], setup[1]
  tape = tape_for(cfg, syncer, speeds, latency=opts.latency, transfer=opts.transfer)
  result = play_tape(cfg, syncer, tape, setup=setup)
  wall = time.perf_counter() - start
  rows = _rows(cfg, result, wall)
  final_params = None
  out = cfg.out if writes else None
  if out is not None:  # train() prepared it (created; an old run cleared on overwrite)
    with open(os.path.join(out, "metrics.jsonl"), "w") as f:
      f.writelines(json.dumps(r, allow_nan=False) + "\n" for r in rows[1:])  # the step-0 row is not in the file
    final_params = params_io.export_params(result.params, os.path.join(out, ckpt.FINAL_PARAMS))
  tokens = result.local_steps * cfg.batch_size * cfg.seq_len
  floor = data.loss_floor
  summary = {
      "algorithm": cfg.algo.algorithm, "final_eval_loss": result.eval_loss, "loss_floor": floor,
      "gap_to_floor": None if floor is None else result.eval_loss - floor,
      "final_replica_eval_losses": None, "final_replica_eval_loss": None,
      "total_bytes_per_replica": result.bytes_sent / m, "peak_bytes_per_step": result.payload_bytes,
      "wall_time_s": wall, "compile_time_s": None, "tokens": tokens, "tokens_per_s": tokens / max(wall, 1e-9),
      "params": param_count(model_cfg), "active_params": param_count(model_cfg, active=True), "final_aux_loss": None,
      "compute_dtype": model_cfg.compute_dtype, "attention": model_cfg.attention, "data": data.describe(),
      "config": dataclasses.asdict(cfg), "final_params": final_params, "resumed_from": None,
      "warnings": cfg.schedule_warnings(),
      "tape": {"step_ticks": list(speed_ticks(tuple(speeds))), "inner_steps": list(syncer.inner_steps_of(
          cfg.algo.sync_every, m)), "rounds": result.rounds, "local_steps": result.local_steps,
               "contributions": result.contributions, "members": result.members,
               "ticks": commit_ticks(result.tape)[-1] if result.rounds else 0},
  }
  if out is not None:
    with open(os.path.join(out, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2)
  return rows, summary, result.params
