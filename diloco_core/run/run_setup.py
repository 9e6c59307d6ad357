"""A run set up: its data, model, program, runtime, first state, log and checkpoint writer.

:func:`set_up` does, in order, what :func:`~diloco_core.run.loop.train` needs before its first
step: the resume checks (:func:`check_resumable`, before anything is built), the data and the
model (:func:`build_model`; ``init_from``'s params,
:func:`init_params`), the compiled program (kept between runs,
:data:`~diloco_core.run.programs.PROGRAMS`), the runtime and its first state
(:func:`first_state`: a checkpoint's on ``resume``, a live peer's for an elastic replacement),
the disk-space check, ``out`` prepared (:func:`prepare_out`), the metrics log and the
checkpoint writer. It returns them as one :class:`SetUp`.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from typing import Any

from diloco_core import interrupts
from diloco_core.data import files
from diloco_core.data.sources import make_dataset
from diloco_core.devices.backend import resolve_model_config
from diloco_core.model.transformer import init_model, train_loss
from diloco_core.run.config import TrainConfig, effective_config
from diloco_core.run.metrics_log import MetricsLog
from diloco_core.run.programs import PROGRAMS
from diloco_core.runtime import communication
from diloco_core.spec.fields import must_match_fields
from diloco_core.store import checkpoint as ckpt
from diloco_core.store import params_io
from diloco_core.store import run_files
from diloco_core.store.disk_space import check_run_space


#: The file of the run's log rows under ``out``.
METRICS_FILE = "metrics.jsonl"


class RunWarning(UserWarning):
  """A run that goes ahead but may not mean what was asked (also listed in summary.json)."""


@dataclasses.dataclass
class SetUp:
  """A run set up by :func:`set_up`: what its steps, log rows and summary read."""

  cfg: TrainConfig
  data: Any
  model_cfg: Any
  algo: Any
  eval_fn: Any
  comm: Any
  eval_tokens: Any
  log: MetricsLog
  checkpoints: Any  # a CheckpointWriter, or None (no checkpoints here; elastic: another process)
  resumed: Any  # the restored checkpoint, or None
  first: int  # the first step this process trains
  data_identity: dict | None
  start: float = 0.0  # perf_counter() when the steps began
  compile_time: float | None = None  # seconds to the first step's result

  def evaluate(self, state) -> float:
    return float(self.eval_fn(self.algo.eval_params(state), self.eval_tokens))


def set_up(cfg: TrainConfig) -> tuple[SetUp, Any]:
  """The data, the model, the (possibly cached) program, the runtime and the first state (restored
  on ``resume``, sent by a peer to an elastic replacement), the log and the checkpoint writer."""
  # The data's fingerprint (file hashes) is only needed by checkpoints and resumes.
  data_identity = files.identity(cfg.data.source) if cfg.resume or cfg.checkpoint_every else None
  if cfg.resume:
    check_resumable(cfg, data_identity)
  for message in cfg.schedule_warnings():  # H > steps: run, but loudly (header and summary.json)
    warnings.warn(message, RunWarning, stacklevel=3)
  interrupts.check()
  M, b, T = cfg.algo.replicas, cfg.batch_size, cfg.seq_len
  data, model_cfg, params, loss_fn = build_model(cfg, communication.data_replicas(cfg))  # its shards only
  algo, eval_fn = PROGRAMS.get(cfg, loss_fn, params, model_cfg)  # reuses an earlier run's program
  # eval_replicas: the last step merges nothing (alpha = 1 keeps every replica's own params; the
  # global params do not depend on alpha), so each replica can be evaluated beside them.
  comm = communication.make_communication(cfg, algo, params, resumed=cfg.resume, data=data, eval_fn=eval_fn)
  state = comm.init(params)
  interrupts.check()
  state, resumed, first = first_state(cfg, comm, state, data)
  writes = comm.writes_files()  # who writes the run's files: the runtime says (process 0 at the start)
  if cfg.out is not None and writes:
    check_run_space(cfg, comm.global_state(state), params, first,  # before any step, not at a save
                    on_disk=len(ckpt.finalized_steps(cfg.out)) if cfg.resume else 0)
  eval_tokens = comm.place_replicated(data.eval_batch())
  drops = bool(cfg.drop_schedule or cfg.drop_prob)
  log = MetricsLog(M * b * T, drops, prepare_out(cfg, writes), None if resumed is None else resumed.meta["metrics"],
                   gather=comm.gather_rows)
  # elastic: process 0 writes the checkpoints alone (comm.checkpoint_state gathers them)
  checkpoints = (ckpt.CheckpointWriter(cfg.out, cfg.keep_checkpoints, alone=cfg.elastic)
                 if cfg.checkpoint_every and (not cfg.elastic or writes) else None)
  return SetUp(cfg, data, model_cfg, algo, eval_fn, comm, eval_tokens, log, checkpoints, resumed, first,
              data_identity), state


def build_model(cfg: TrainConfig, local_replicas=None) -> tuple[Any, Any, Any, Any]:
  """The run's data, its resolved model config, the initial params and the training loss: what
  every run trains, whichever runtime plays it (:func:`set_up`; a tape played outside ``train``:
  :func:`~diloco_core.run.tape_run.make_setup`).

  The data defines the vocabulary: synthetic, ``DataConfig.vocab_size``; text, 256 bytes; ``.npy``,
  ``cfg.vocab_size`` (ids must be below it) or the largest id + 1.

  Args:
    cfg: the run.
    local_replicas: the replicas whose batches this process reads (default: all M).

  Returns:
    ``(data, model_cfg, params, loss_fn)``; ``loss_fn(params, tokens)`` includes the MoE aux losses.
  """
  data = make_dataset(cfg.data, replicas=cfg.algo.replicas, batch_size=cfg.batch_size, seq_len=cfg.seq_len,
                      model_vocab_size=cfg.vocab_size, local_replicas=local_replicas)
  model_cfg = resolve_model_config(cfg.model_config(vocab_size=data.vocab_size))  # dtype, kernel
  interrupts.check()
  apply_fn, params = init_params(cfg, model_cfg)
  return data, model_cfg, params, lambda p, tokens: train_loss(apply_fn, p, tokens)


def first_state(cfg: TrainConfig, comm, state, data) -> tuple[Any, Any, int]:
  """(state, the restored checkpoint or None, the first step to train): the initial state, the
  newest checkpoint's on ``resume``, or an elastic replacement's, healed from a live peer."""
  resumed = None
  rejoining = comm.rejoining  # an elastic replacement: a live peer sends its state
  if cfg.resume and not rejoining:
    resumed = ckpt.restore_latest(cfg.out, comm.global_state(state), effective_config(dataclasses.asdict(cfg)),
                                  must_match_fields(type(cfg)), normalize=effective_config)
  if resumed is not None:
    if cfg.steps < resumed.step:
      raise ValueError(f"steps ({cfg.steps}) is below the checkpoint's step {resumed.step} in"
                       f" {resumed.path}; pass `steps` >= {resumed.step}.")
    state = comm.local_state(resumed.state)
    comm.resumed_from(resumed.step, resumed.meta)
  first = 1 if resumed is None else resumed.step + 1  # checkpoints fall on log rows: nothing pending
  if rejoining:
    state, healed = comm.rejoin(state, comm.place_batch(data.train_batch(0)))  # (compiles with any batch)
    first = healed + 1
  return state, resumed, first


def prepare_out(cfg: TrainConfig, writes: bool) -> str | None:
  """Creates ``out`` (clearing an old run on overwrite); returns the metrics path, or None when
  there is no ``out`` or this process does not write the run's files (``writes``: the runtime's
  :meth:`~diloco_core.runtime.communication.Runtime.writes_files`)."""
  if cfg.out is None or not writes:
    return None
  os.makedirs(cfg.out, exist_ok=True)
  if cfg.overwrite and not cfg.resume:  # starting over: nothing of the old run may mix in
    foreign = run_files.remove_run_files(cfg.out)
    if foreign:
      warnings.warn(f"`overwrite` kept {len(foreign)} file(s) no run wrote: {', '.join(foreign)}.",
                    RunWarning, stacklevel=3)
  return os.path.join(cfg.out, METRICS_FILE)


def check_resumable(cfg: TrainConfig, data_identity: dict | None) -> None:
  """Refuses, before anything is built, a resume whose checkpoint was written with other
  must-match options (compared on their effective values) or on other data (unless
  ``allow_data_change``). Reads the newest checkpoint's meta file only; damaged or missing
  checkpoints are left to :func:`~diloco_core.store.checkpoint.restore_latest`, which says why."""
  found = ckpt.newest_meta(cfg.out)
  if found is None:
    return
  path, meta = found
  ckpt.check_compatible(effective_config(meta.get("config", {})), effective_config(dataclasses.asdict(cfg)),
                        path, must_match_fields(type(cfg)))
  if "data_identity" not in meta or cfg.allow_data_change:  # older checkpoints did not record it
    return
  change = files.identity_change(meta["data_identity"], data_identity)
  if change is not None:
    raise ValueError(f"`resume`: the data changed since checkpoint {path} was written"
                     f" ({cfg.data.source}: {change}); restore it, or pass `allow_data_change` to"
                     " continue on the new data.")


def init_params(cfg: TrainConfig, model_cfg):
  """(apply_fn, params): the model at ``cfg.seed``, or loaded from ``cfg.init_from``."""
  apply_fn, params = init_model(model_cfg, cfg.seed)
  if cfg.init_from is not None and not cfg.resume:  # bootstrap: broadcast to replicas, fresh outer state
    try:
      params = params_io.load_params(cfg.init_from, like=params)
    except ValueError as e:
      raise ValueError(f"init_from: {e}") from None
  return apply_fn, params
