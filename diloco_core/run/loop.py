"""The training loop: ``train(config)`` sets a run up, runs it and summarizes it.

Metrics stay on device and are fetched once every ``log_every`` steps (one host sync per log
row, not per step); the progress bar updates at the same cadence. :class:`~diloco_core.run.metrics_log.MetricsLog` keeps
the rows, the byte counters and ``metrics.jsonl``; a run with ``out`` also writes
``summary.json`` and ``final_params/``, and with ``checkpoint_every`` its checkpoints. Every run
is set up the same way (:func:`~diloco_core.run.run_setup.set_up`, which makes its runtime); a
runtime whose steps are not the run's lock steps (a syncer's tape, one committed round per step:
:class:`~diloco_core.runtime.tape_runtime.TapeRuntime`) is stepped by
:func:`~diloco_core.run.tape_run.play_rounds`.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
import warnings
from typing import Any

import jax
import numpy as np
from tqdm.auto import tqdm

from diloco_core.store import checkpoint as ckpt
from diloco_core.data import files
from diloco_core import interrupts
from diloco_core.interrupts import Interrupted  # noqa: F401 (re-exported: the command line catches it)
from diloco_core.store import solo_write
from diloco_core.run.divergence import Watch, check_finite  # noqa: F401 (check_finite: re-exported)
from diloco_core.store.disk_space import disk_full, full_disk_message
from diloco_core.run.metrics_log import MetricsLog, RunFileError
from diloco_core.run.drops import participation
from diloco_core.runtime.elastic import replica_means
from diloco_core.spec.model_config import param_count
from diloco_core.devices.processes import lost_process, stop_agreed
from diloco_core.run.config import TrainConfig
from diloco_core.run.run_setup import METRICS_FILE, RunWarning, SetUp, prepare_out, set_up  # noqa: F401 (re-exported)
from diloco_core.run.preflight import preflight
from diloco_core.run.syncer_options import tape_drops
from diloco_core.run.tape_run import play_rounds
from diloco_core.runtime.trace_tape import record_tape
from diloco_core.spec.schedule import sent_fragment
from diloco_core.store.tree_io import one_line


@dataclasses.dataclass
class TrainResult:
  """What :func:`train` returns.

  ``metrics`` is a pandas DataFrame of ``rows``, built when it is first read (the command line
  prints the summary and never imports pandas).
  """

  rows: list  # one dict per logged step (the rows of metrics.jsonl)
  summary: dict  # same as summary.json
  params: Any  # the final global params
  state: Any  # the final training state (DiLoCoState / DPState)

  @functools.cached_property
  def metrics(self):
    """One row per logged step (same as metrics.jsonl), as a ``pandas.DataFrame``."""
    import pandas as pd  # pylint: disable=import-outside-toplevel
    return pd.DataFrame(self.rows)


def _last_logged(rows: list, key: str) -> float | None:
  """The last value of ``key`` that a row logged (None and NaN skipped); None when none did.

  Examples:
    >>> _last_logged([{"eval_loss": 3.0}, {"eval_loss": None}, {"eval_loss": 2.5}, {}], "eval_loss")
    2.5
    >>> _last_logged([{"eval_loss": float("nan")}], "eval_loss") is None
    True
  """
  values = [r[key] for r in rows if r.get(key) is not None and r[key] == r[key]]
  return float(values[-1]) if values else None


def _finish_advice(watch: Watch) -> str:
  """How a run that trained every step but could not write its last files finishes them."""
  last = watch.last_checkpoint if watch.last_checkpoint and os.path.isdir(watch.last_checkpoint) else None
  return (f"its last checkpoint {last} holds the result; free space, then run again with `resume`" if last
          else "no checkpoint holds the result (set `checkpoint_every` to keep one)")


def _checkpoint_meta(cfg: TrainConfig, t: int, log: MetricsLog, data_identity: dict | None = None) -> dict:
  """Everything but the arrays that a resumed run needs to continue exactly."""
  return {
      "algorithm": cfg.algo.algorithm,
      "config": dataclasses.asdict(cfg),
      "data_identity": data_identity,  # files.identity of the data source (None: synthetic)
      "data_position": [t] * cfg.algo.replicas,  # batches are a pure function of (seed, replica, step)
      "seeds": {"model_init": cfg.seed, "data": cfg.data.seed, "drops": cfg.seed},  # no other RNG state
      "metrics": log.checkpoint_item(),
  }


def _writes_files(cfg: TrainConfig, comm, log: MetricsLog) -> bool:
  """Whether this process writes the run's files now (``comm.writes_files``); an elastic run's
  process that has just become the writer (the one before it was lost) first takes
  ``metrics.jsonl`` over from its own rows (:meth:`MetricsLog.take_over`)."""
  writes = comm.writes_files()
  if writes and cfg.out is not None and log.path is None:
    log.take_over(os.path.join(cfg.out, METRICS_FILE))
  return writes


def train(cfg: TrainConfig, *, until: int | None = None) -> TrainResult:
  """Trains one run and returns its metrics, summary and final params.

  Read top to bottom: the checks, then :func:`~diloco_core.run.run_setup.set_up` (data, model,
  program, state), ``_steps`` (each step by ``_step``, each log row by ``_row``) and ``_finish``
  (final params, summary, tape).

  Args:
    cfg: the run. Every option is validated before any compilation.
    until: stop after this step of the run (its schedule still that of ``cfg.steps``), with
      only its log rows: the first steps of a long run, as the docs build re-checks one
      (:data:`analysis.lab.recheck.PREFIX_ONLY`). None: the whole run.

  Returns:
    A :class:`TrainResult`; when ``cfg.out`` is set, ``metrics.jsonl`` and
    ``summary.json`` hold the same numbers. With ``until`` below ``cfg.steps``: its ``rows``
    only (``summary``, ``params`` and ``state`` None; no summary or final params written).

  Raises:
    ValueError: ``until`` is not a step of the run, or the run plays a syncer tape.
  """
  cfg.validate()
  if until is not None and (isinstance(until, bool) or not isinstance(until, int) or not 1 <= until <= cfg.steps):
    raise ValueError(f"until must be a step of the run, an integer in 1..{cfg.steps} (steps), got {until!r}.")
  if until is not None and cfg.syncer.plays_tape(cfg):
    raise ValueError("until: a run played from a syncer tape trains whole (its rounds are the tape's); pass until=None.")
  preflight(cfg)  # the disk and the devices, once
  if cfg.syncer.tape is not None:  # a recorded tape: this run with its drops (checked by validate)
    cfg = dataclasses.replace(cfg, drop_schedule=tape_drops(cfg))
  run, state = set_up(cfg)
  if not run.comm.lock_step:  # the syncer rule's tape (P = 1, τ = 0): its steps are committed rounds
    rows, summary, params = play_rounds(run, state)
    return TrainResult(rows=rows, summary=summary, params=params, state=None)
  last = cfg.steps if until is None else until
  state, host_replicas, watch = _steps(run, state, last)
  if last < cfg.steps:  # the first steps only: their rows
    return TrainResult(rows=run.log.rows, summary=None, params=None, state=None)
  return _finish(run, state, host_replicas, watch)


def _steps(run: SetUp, state, last: int) -> tuple[Any, Any, Watch]:
  """Steps ``run.first`` to ``last`` (``cfg.steps`` but for a run's first steps); a stop, a lost process, a file that cannot be written
  or data that changed end the run with one line that says what was kept and how to go on.

  Returns:
    (the final state, every replica's params on the host for ``eval_replicas`` or None, the
    :class:`~diloco_core.run.divergence.Watch` that followed the run).
  """
  cfg, log = run.cfg, run.log
  run.start = time.perf_counter()
  bar = tqdm(total=cfg.steps, initial=run.first - 1, disable=not (cfg.progress and run.comm.writes_files()),
             desc=f"{cfg.algo.algorithm} ({run.model_cfg.compute_dtype})", unit="step")
  if run.resumed is None:
    log.start(run.evaluate(state))
  watch = Watch(run.comm, state, log.rows[0]["eval_loss"], None if run.resumed is None else run.resumed.path,
                outer=cfg.algo.algorithm != "dp")
  done = run.first - 1
  try:
    for t in range(run.first, last + 1):
      state = _step(run, state, t, watch, bar)
      done = t
    # eval_replicas: every replica's params on the host, gathered while the link is open
    host_replicas = run.comm.host_replicas(state) if cfg.eval_replicas and last == cfg.steps else None
  except KeyboardInterrupt:  # Ctrl-C, or SIGTERM under the command line: one line, what to do next
    raise Interrupted(done, cfg.out, watch.last_checkpoint) from None
  except (ConnectionError, jax.errors.JaxRuntimeError, ValueError) as e:  # another process lost? nothing here is damaged
    lost = lost_process(e)
    if lost is None:
      raise
    where = (f"the last intact checkpoint is {watch.last_checkpoint}: run again with `resume`"
             if watch.last_checkpoint else "no checkpoint was written: start over with `overwrite`")
    raise ConnectionError(f"{lost}; the run stopped after step {done}: {where}.") from None
  except RunFileError as e:  # what was written stays; the checkpoints, if any are left, go on
    last = watch.last_checkpoint if watch.last_checkpoint and os.path.isdir(watch.last_checkpoint) else None
    where = f"fix that, then continue with `resume` (from {last})" if last else "fix that, then start over with `overwrite`"
    raise RunFileError(f"{e}; the run stopped after step {done}: {where}.") from None
  except files.DataChangedError as e:  # the run stops; its checkpoints are those of the old data
    where = (f"continue with `resume` (from {watch.last_checkpoint})" if watch.last_checkpoint
             else "start over with `overwrite`")
    what = str(e).removesuffix("; restore it.")
    raise files.DataChangedError(f"{what}; the run stopped after step {done}: restore it and {where}.") from None
  finally:
    bar.close()
    log.close()
    if run.checkpoints is not None:
      run.checkpoints.close()
    run.comm.close()
  return state, host_replicas, watch


def _step(run: SetUp, state, t: int, watch: Watch, bar) -> Any:
  """Step ``t``: the runtime's step, its losses and bytes logged, a log row when one is due
  (:func:`_row`), and the rejoins a replayed elastic run holds at ``t``."""
  cfg, comm, log = run.cfg, run.comm, run.log
  interrupts.check()  # a stop request (SIGINT / SIGTERM under the CLI) ends the run here
  if stop_agreed(t):  # several processes: every one stops before the same step
    raise KeyboardInterrupt
  batch = comm.place_batch(run.data.train_batch(t - 1))
  present = participation(cfg, t)
  state, m = comm.step(state, batch, t, present, last=t == cfg.steps and cfg.eval_replicas)
  if run.compile_time is None:
    jax.block_until_ready(m["loss"])
    run.compile_time = time.perf_counter() - run.start
  synced = present is not None and sent_fragment(t, cfg.algo.sync_every, cfg.algo.fragments)[0]
  log.step(t, m["loss"], run.algo.bytes_sent(t), present, synced, m["loss_metrics"].get("aux_loss"))
  watch.after_step(t, state, *(sent_fragment(u, cfg.algo.sync_every, cfg.algo.fragments)[0] for u in (t, t + 1)))
  do_eval = t % cfg.eval_every == 0 or t == cfg.steps
  if t % cfg.log_every == 0 or do_eval:
    state = _row(run, state, t, do_eval, watch, bar)
  rejoins = [(r, src) for s, r, src in cfg.rejoin_schedule if s == t]  # a replayed elastic rejoin
  for source in sorted({src for _, src in rejoins}):
    state = comm.rejoin_replicas(state, [r for r, src in rejoins if src == source], source)
  return state


def _row(run: SetUp, state, t: int, do_eval: bool, watch: Watch, bar) -> Any:
  """The log row of step ``t``: the losses checked, the eval (and checkpoint) of a settled state,
  the row written, the progress bar moved. Returns the state (settled when evaluated or saved)."""
  cfg, comm, log = run.cfg, run.comm, run.log
  store = getattr(run.data, "store", None)  # file data: checked for changes at every log row
  if store is not None:
    store.check_unchanged()
  save = bool(cfg.checkpoint_every) and (t % cfg.checkpoint_every == 0 or t == cfg.steps)
  if do_eval or save:  # evaluated and saved states hold no fragment in flight (= the SPMD state)
    state = comm.settle(state, t)
  step_losses = log.fetch_losses()
  absent = comm.absent_replicas()  # elastic: lost replicas have no losses (NaN) to check
  watch.check_row(t, step_losses if absent is None else np.where(absent & np.isnan(step_losses), 0.0, step_losses),
                  state)
  losses = step_losses.mean(axis=0) if absent is None else replica_means(step_losses)
  eval_loss = run.evaluate(state) if do_eval or save else None  # never checkpoint a diverged state
  if eval_loss is not None:
    watch.check_eval(t, eval_loss)
  for s, share in comm.take_unsent():  # elastic: what the lost did not send is not counted
    log.uncount(run.algo.bytes_sent(s) * share)
  wall = time.perf_counter() - run.start
  _writes_files(cfg, comm, log)  # elastic: process 0 may have been lost
  log.row(t, losses, eval_loss if do_eval else None, wall, log.fetch_aux())
  if save:
    saved, note = comm.checkpoint_state(state, t)  # None: another process writes it
    meta = {**_checkpoint_meta(cfg, t, log, run.data_identity), **note}
    if saved is not None and run.checkpoints is None:  # elastic: the writer after process 0
      run.checkpoints = solo_write.CheckpointWriter(cfg.out, cfg.keep_checkpoints)
    watch.saved(ckpt.step_dir(cfg.out, t) if saved is None else run.checkpoints.save(t, saved, meta))
  bar.update(t - bar.n)
  tok_s = (t - 1) * log.tokens_per_step / max(wall - run.compile_time, 1e-9) if t > 1 else 0.0
  bar.set_postfix(loss=f"{np.nanmean(losses):.3f}", tok_s=f"{tok_s:,.0f}")
  return state


def _finish(run: SetUp, state, host_replicas, watch: Watch) -> TrainResult:
  """The final params exported, the summary computed and written, an elastic run's tape recorded."""
  cfg, comm, log = run.cfg, run.comm, run.log
  final_params = None
  writer = _writes_files(cfg, comm, log)
  log.close()  # a writer that took the rows over just now
  if cfg.out is not None and (writer or not cfg.elastic):  # plain params: diloco_core.load_params(path)
    try:  # elastic: the writer alone (a lost process would never reach Orbax's barriers)
      params_out, params_path = run.algo.eval_params(comm.global_state(state)), os.path.join(cfg.out, ckpt.FINAL_PARAMS)
      final_params = solo_write.export_final_params(params_out, params_path, alone=cfg.elastic)
    except OSError as e:
      raise RunFileError(f"{e}; the run trained all {cfg.steps} steps: {_finish_advice(watch)}.") from None
  summary = _summary(run, host_replicas, final_params)
  if cfg.out is not None and writer:
    try:
      with open(os.path.join(cfg.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
    except OSError as e:
      why = full_disk_message(cfg.out) if disk_full(e) else one_line(e)
      raise RunFileError(f"{cfg.out}/summary.json could not be written ({why}); the run trained all"
                         f" {cfg.steps} steps: {_finish_advice(watch)}.") from None
    if cfg.communication == "background" and cfg.elastic:  # an elastic run records its tape
      why = record_tape(cfg.out, jax.process_index(), cfg.algo.replicas, cfg.algo.sync_every, jax.process_count())
      if why is not None and cfg.syncer.quorum is not None:  # (a quorum run says why it has none)
        warnings.warn(why, RunWarning, stacklevel=3)
  return TrainResult(rows=log.rows, summary=summary, params=run.algo.eval_params(state),
                     state=comm.global_state(state))


def _summary(run: SetUp, host_replicas, final_params) -> dict:
  """``summary.json``: the run's results, counts, times and config."""
  cfg, log, model_cfg = run.cfg, run.log, run.model_cfg
  wall = time.perf_counter() - run.start
  compile_time = 0.0 if run.compile_time is None else run.compile_time  # resumed at the last step: no step ran
  final_eval = _last_logged(log.rows, "eval_loss")
  replica_losses = None
  if cfg.eval_replicas:
    replica_losses = [float(run.eval_fn(run.comm.place_replicated(jax.tree.map(lambda x: x[m], host_replicas)),
                                        run.eval_tokens))
                      for m in range(cfg.algo.replicas)]
  floor = run.data.loss_floor
  tokens_per_step = log.tokens_per_step
  return {
      "algorithm": cfg.algo.algorithm,
      "final_eval_loss": final_eval,
      "loss_floor": floor,
      "gap_to_floor": None if floor is None else final_eval - floor,
      # eval_replicas: each replica's own params after the last step (which merged nothing)
      "final_replica_eval_losses": replica_losses,
      "final_replica_eval_loss": None if replica_losses is None else replica_losses[0],
      "total_bytes_per_replica": log.total_bytes,
      "peak_bytes_per_step": log.peak_bytes,
      "wall_time_s": wall,
      "compile_time_s": compile_time,
      "tokens": cfg.steps * tokens_per_step,
      "tokens_per_s": max(cfg.steps - run.first, 0) * tokens_per_step / max(wall - compile_time, 1e-9),
      "params": param_count(model_cfg),
      "active_params": param_count(model_cfg, active=True),
      # MoE: the auxiliary loss term (weighted balance + z-losses) of the last logged steps
      "final_aux_loss": _last_logged(log.rows, "aux_loss"),
      "compute_dtype": model_cfg.compute_dtype,
      "attention": model_cfg.attention,
      "data": run.data.describe(),
      "config": dataclasses.asdict(cfg),
      "final_params": final_params,
      "resumed_from": None if run.resumed is None else run.resumed.path,
      "warnings": cfg.schedule_warnings(),
  }
