"""The training loop, metrics, the Python API ``train(config)`` and the CLI.

``python -m diloco_core.train --algorithm diloco --replicas 4 --sync-every 50 --out runs/x``
trains the built-in transformer on the built-in data (or a local file) and writes
``metrics.jsonl`` (one row per logged step) and ``summary.json`` to ``--out``.

Metrics stay on device and are fetched once every ``log_every`` steps (one host sync per
log line, not per step); the progress bar updates at the same cadence.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import os
import shutil
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pandas as pd
from tqdm.auto import tqdm

from diloco_core import checkpoint as ckpt
from diloco_core.config import ALGORITHMS, COMPRESSIONS, FRAGMENT_PATTERNS, DiLoCoConfig
from diloco_core.data import DataConfig, make_dataset
from diloco_core.diloco import DiLoCo
from diloco_core.dp import DataParallel
from diloco_core.mesh import check_mesh, fetch, initialize_distributed, make_mesh, parse_mesh
from diloco_core.model import init_model, layer_mask, lm_loss
from diloco_core.model_config import PRESETS, get_preset, param_count
from diloco_core.schedule import sent_fragment


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything one training run needs (the outer loop in ``algo``, the data in ``data``)."""

  algo: DiLoCoConfig = dataclasses.field(default_factory=DiLoCoConfig)
  # The trainer's default language: V = 32, order 2, 4 successors per context; the `small`
  # model gets within a few hundredths of a nat of its floor in 600 steps on a laptop CPU.
  data: DataConfig = dataclasses.field(default_factory=lambda: DataConfig(vocab_size=32))
  model: str = "small"  # preset name (see diloco_core.PRESETS)
  n_layers: int | None = None  # override the preset's L (Streaming needs (P-1) | L)
  vocab_size: int | None = None  # .npy data: the model's vocabulary (default: largest id + 1)
  positions: str | None = None  # override the preset's "rope" / "learned"
  batch_size: int = 16  # b, sequences per replica per step (DP's global batch is M·b)
  seq_len: int = 64  # T, tokens per sequence
  steps: int = 600  # inner steps
  inner_lr: float = 3e-3  # peak AdamW learning rate
  warmup_steps: int | None = None  # linear warmup, then cosine to 10% of peak; None: min(50, steps // 10)
  weight_decay: float = 0.1  # AdamW decoupled weight decay
  grad_clip: float = 1.0  # global-norm gradient clipping (0 disables)
  eval_every: int = 50  # evaluate the global params every this many steps (and at 0, end)
  log_every: int = 10  # fetch metrics from the device every this many steps
  seed: int = 0  # model-initialisation seed (the data seed is data.seed)
  out: str | None = None  # output directory for metrics.jsonl / summary.json (None: no files)
  overwrite: bool = False  # allow writing into a directory that already holds a run
  progress: bool = True  # show a tqdm progress bar
  mesh: str | None = None  # device mesh, e.g. "diloco=2,data=4" (product = devices); None: one device
  checkpoint_every: int = 0  # save <out>/checkpoints/<step> every this many steps (a multiple of log_every; 0: never)
  keep_checkpoints: int = 3  # keep the newest k checkpoints
  resume: bool = False  # continue from the newest valid checkpoint in <out>/checkpoints
  init_from: str | None = None  # start from a plain params checkpoint (e.g. a DP run's <out>/final_params)
  drop_schedule: tuple = ()  # simulated replica drops: ((step, replica), ...), steps with a sync
  drop_prob: float = 0.0  # simulated drops: each replica misses each sync with this probability (seeded)

  def validate(self) -> None:
    """Raises a one-line ``ValueError`` for any invalid option, before anything compiles."""
    for name in ("batch_size", "seq_len", "steps", "eval_every", "log_every"):
      v = getattr(self, name)
      if not isinstance(v, int) or isinstance(v, bool) or v < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {v!r}.")
    if self.warmup_steps is not None and (
        not isinstance(self.warmup_steps, int) or not 0 <= self.warmup_steps < self.steps):
      raise ValueError(f"warmup_steps must be an integer in [0, steps={self.steps}), got {self.warmup_steps!r}.")
    for name in ("inner_lr", "weight_decay", "grad_clip"):
      v = getattr(self, name)
      if not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0 or (name == "inner_lr" and v == 0):
        raise ValueError(f"{name} must be a finite number {'> 0' if name == 'inner_lr' else '>= 0'}, got {v!r}.")
    if self.model not in PRESETS:
      raise ValueError(f"model must be one of {sorted(PRESETS)}, got {self.model!r}.")
    if self.n_layers is not None and (not isinstance(self.n_layers, int) or self.n_layers < 1):
      raise ValueError(f"n_layers must be an integer >= 1, got {self.n_layers!r}.")
    if self.vocab_size is not None and (not isinstance(self.vocab_size, int) or self.vocab_size < 2):
      raise ValueError(f"vocab_size must be None or an integer >= 2, got {self.vocab_size!r}.")
    if self.positions not in (None, "rope", "learned"):
      raise ValueError(f"positions must be 'rope' or 'learned', got {self.positions!r}.")
    self.algo.validate(num_layers=self.model_config().n_layers)
    if self.mesh is not None:
      check_mesh(parse_mesh(self.mesh), replicas=self.algo.replicas, batch_size=self.batch_size)
    self._validate_checkpointing()
    if self.out is not None:
      _check_out_dir(self.out, self.overwrite, self.resume)

  def _validate_checkpointing(self) -> None:
    ce = self.checkpoint_every
    if not isinstance(ce, int) or isinstance(ce, bool) or ce < 0:
      raise ValueError(f"checkpoint_every must be an integer >= 0 (0: no checkpoints), got {ce!r}.")
    if ce and self.out is None:
      raise ValueError("checkpoint_every needs --out: checkpoints go to <out>/checkpoints/<step>.")
    if ce % self.log_every:
      raise ValueError(
          f"checkpoint_every ({ce}) must be a multiple of log_every ({self.log_every}) so every"
          f" checkpoint falls on a log row; e.g. --checkpoint-every {-(-ce // self.log_every) * self.log_every}.")
    k = self.keep_checkpoints
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
      raise ValueError(f"keep_checkpoints must be an integer >= 1, got {k!r}.")
    if not isinstance(self.resume, bool):
      raise ValueError(f"resume must be True or False, got {self.resume!r}.")
    if self.resume and self.out is None:
      raise ValueError("resume needs --out: the directory of the run to continue.")
    if self.init_from is not None and (not isinstance(self.init_from, str) or not self.init_from):
      raise ValueError(f"init_from must be a path to a params checkpoint directory, got {self.init_from!r}.")
    p = self.drop_prob
    if not isinstance(p, (int, float)) or isinstance(p, bool) or not 0 <= p < 1:
      raise ValueError(f"drop_prob must be a number in [0, 1), got {p!r}.")
    if (self.drop_schedule or p) and self.algo.algorithm == "dp":
      raise ValueError("drop_schedule / drop_prob simulate replicas missing a DiLoCo sync; algorithm"
                       " 'dp' has none to miss: use --algorithm diloco or streaming.")
    M, dh = self.algo.replicas, self.algo.sync_interval
    for entry in self.drop_schedule:
      if (not isinstance(entry, (tuple, list)) or len(entry) != 2
          or not all(isinstance(x, int) and not isinstance(x, bool) for x in entry)):
        raise ValueError(f"drop_schedule entries must be (step, replica) integer pairs, got {entry!r}.")
      s, r = entry
      if not 0 <= r < M:
        raise ValueError(f"drop_schedule: replica {r} (at step {s}) is not in [0, replicas={M}).")
      if not 1 <= s <= self.steps:
        raise ValueError(f"drop_schedule: step {s} is not in [1, steps={self.steps}].")
      if s % dh:
        raise ValueError(
            f"drop_schedule: no sync after step {s} (syncs every H/P = {dh} steps); use a multiple"
            f" of {dh}, e.g. {max(dh, s - s % dh)}.")

  @property
  def warmup(self) -> int:
    """Warmup steps: ``warmup_steps``, or min(50, steps // 10) when it is None."""
    return min(50, self.steps // 10) if self.warmup_steps is None else self.warmup_steps

  def model_config(self, vocab_size: int | None = None):
    """The model shape of this run (preset + overrides; built for ``seq_len``)."""
    base = get_preset(self.model)
    changes: dict[str, Any] = {"max_seq_len": max(base.max_seq_len, self.seq_len)}
    if self.n_layers is not None:
      changes["n_layers"] = self.n_layers
    if self.positions is not None:
      changes["positions"] = self.positions
    if vocab_size is not None:
      changes["vocab_size"] = vocab_size
    return dataclasses.replace(base, **changes)


def _check_out_dir(out: str, overwrite: bool, resume: bool = False) -> None:
  if os.path.exists(out) and not os.path.isdir(out):
    raise ValueError(f"out={out!r} is a file; give a directory path.")
  if os.path.isdir(out):
    if not os.access(out, os.W_OK):
      raise ValueError(f"out={out!r} is not writable; choose another directory.")
    if overwrite or resume:
      return
    if os.path.exists(os.path.join(out, "summary.json")):
      raise ValueError(f"out={out!r} already holds a finished run; pass --overwrite, --resume (with more"
                       " --steps), or choose another directory.")
    if ckpt.finalized_steps(out):
      raise ValueError(f"out={out!r} holds checkpoints of an unfinished run; pass --resume to continue"
                       " it, --overwrite to start over, or choose another directory.")
    if os.path.exists(os.path.join(out, "metrics.jsonl")):
      raise ValueError(f"out={out!r} holds metrics.jsonl of an unfinished run (no checkpoint); pass"
                       " --overwrite to start over or choose another directory.")
  else:
    parent = os.path.dirname(os.path.abspath(out))
    while not os.path.exists(parent):
      parent = os.path.dirname(parent)
    if not os.access(parent, os.W_OK):
      raise ValueError(f"out={out!r} cannot be created ({parent!r} is not writable).")


#: TrainConfig fields that are traced inputs of the inner optimizer (not compiled in).
INNER_HYPERPARAMS = ("inner_lr", "weight_decay", "grad_clip")
END_LR_FRACTION = 0.1  # the cosine decay ends at this fraction of the peak learning rate


def inner_hyperparams(cfg: TrainConfig) -> dict[str, float]:
  """The inner optimizer's hyperparameters of ``cfg`` (fed to the step as float32 scalars)."""
  return {k: float(getattr(cfg, k)) for k in INNER_HYPERPARAMS}


def inner_optimizer_factory(steps: int, warmup: int, clip: bool):
  """``hp -> AdamW`` with linear warmup, cosine decay to 10% of the peak, global-norm clipping.

  Only the schedule's shape (``steps``, ``warmup``) and whether to clip are fixed; the peak
  learning rate ``hp["inner_lr"]``, ``hp["weight_decay"]`` and ``hp["grad_clip"]`` are read
  from the hyperparameters dict, traced inside the step, so runs that differ only in them
  share one compiled program (:mod:`diloco_core.hyperparams`).
  """

  def factory(hp):
    lr = hp["inner_lr"]
    # optax.warmup_cosine_decay_schedule(0, lr, warmup, steps, end_value=0.1 lr), written
    # out because that one branches in Python on the (here traced) peak value.
    schedule = optax.join_schedules(
        [optax.linear_schedule(0.0, lr, warmup),
         optax.cosine_decay_schedule(lr, steps - warmup, alpha=END_LR_FRACTION)], [warmup])
    adamw = optax.adamw(schedule, b1=0.9, b2=0.95, weight_decay=hp["weight_decay"])
    return optax.chain(optax.clip_by_global_norm(hp["grad_clip"]), adamw) if clip else adamw

  return factory


# Compiled programs kept for the next train() call in this process: program key -> (algorithm,
# jitted eval loss). A sweep over H, τ, η, μ, α or the learning rate compiles once.
_PROGRAMS: "collections.OrderedDict[str, tuple]" = collections.OrderedDict()
PROGRAM_CACHE_SIZE = 4


def program_key(cfg: TrainConfig, model_cfg) -> str:
  """What the compiled step of ``cfg`` depends on: every option but the traced hyperparameters.

  Examples:
    >>> a = TrainConfig(inner_lr=1e-3, algo=DiLoCoConfig(outer_lr=0.5))
    >>> b = TrainConfig(inner_lr=3e-3, algo=DiLoCoConfig(outer_lr=0.9), seed=7)
    >>> program_key(a, a.model_config()) == program_key(b, b.model_config())
    True
  """
  algo = {k: v for k, v in dataclasses.asdict(cfg.algo).items() if k not in DiLoCo.config_hyperparams}
  return json.dumps({"algo": algo, "model": dataclasses.asdict(model_cfg), "batch_size": cfg.batch_size,
                     "seq_len": cfg.seq_len, "steps": cfg.steps, "warmup": cfg.warmup,
                     "clip": bool(cfg.grad_clip), "mesh": cfg.mesh}, sort_keys=True, default=str)


def clear_program_cache() -> None:
  """Forgets the compiled programs :func:`train` keeps for later runs in this process."""
  _PROGRAMS.clear()


def make_algorithm(cfg: TrainConfig, loss_fn, params):
  """A new DataParallel or DiLoCo object for ``cfg.algo`` (``params`` gives the layer mask)."""
  hp = inner_hyperparams(cfg)
  opt = inner_optimizer_factory(cfg.steps, cfg.warmup, bool(cfg.grad_clip))
  mesh = make_mesh(parse_mesh(cfg.mesh))
  if cfg.algo.algorithm == "dp":
    return DataParallel(loss_fn, opt, cfg.algo, mesh=mesh, hyperparams=hp)
  return DiLoCo(loss_fn, opt, cfg.algo, layer_mask=layer_mask(params), mesh=mesh, hyperparams=hp)


def _program(cfg: TrainConfig, loss_fn, params, model_cfg):
  """(algorithm, jitted eval loss) for ``cfg``: those of an earlier run of the same program
  (:func:`program_key`), with this run's hyperparameters, or new ones that are kept."""
  key = program_key(cfg, model_cfg)
  if key in _PROGRAMS:
    _PROGRAMS.move_to_end(key)
    algo, eval_fn = _PROGRAMS[key]
    outer = {k: getattr(cfg.algo, k) for k in algo.config_hyperparams}
    return algo.with_hyperparams(**outer, **inner_hyperparams(cfg)), eval_fn
  _PROGRAMS[key] = make_algorithm(cfg, loss_fn, params), jax.jit(loss_fn)
  while len(_PROGRAMS) > PROGRAM_CACHE_SIZE:
    _PROGRAMS.popitem(last=False)
  return _PROGRAMS[key]


@dataclasses.dataclass
class TrainResult:
  """What :func:`train` returns."""

  metrics: pd.DataFrame  # one row per logged step (same as metrics.jsonl)
  summary: dict  # same as summary.json
  params: Any  # the final global params
  state: Any  # the final training state (DiLoCoState / DPState)


def train(cfg: TrainConfig) -> TrainResult:
  """Trains one run and returns its metrics, summary and final params.

  Args:
    cfg: the run. Every option is validated before any compilation.

  Returns:
    A :class:`TrainResult`; when ``cfg.out`` is set, ``metrics.jsonl`` and
    ``summary.json`` hold the same numbers.
  """
  cfg.validate()
  M, b, T = cfg.algo.replicas, cfg.batch_size, cfg.seq_len
  # The data defines the vocabulary: synthetic -> DataConfig.vocab_size, text -> 256 bytes,
  # .npy -> cfg.vocab_size (ids must be below it) or the largest id + 1.
  data = make_dataset(cfg.data, replicas=M, batch_size=b, seq_len=T, model_vocab_size=cfg.vocab_size)
  model_cfg = cfg.model_config(vocab_size=data.vocab_size)
  apply_fn, params = init_model(model_cfg, cfg.seed)
  if cfg.init_from is not None and not cfg.resume:  # bootstrap: broadcast to replicas, fresh outer state
    try:
      params = ckpt.load_params(cfg.init_from, like=params)
    except ValueError as e:
      raise ValueError(f"init_from: {e}") from None
  loss_fn = lambda p, tokens: lm_loss(apply_fn, p, tokens)
  algo, eval_fn = _program(cfg, loss_fn, params, model_cfg)  # reuses an earlier run's program
  state = algo.init(params)
  resumed = ckpt.restore_latest(cfg.out, state, _config_dict(cfg)) if cfg.resume else None
  if resumed is not None:
    if cfg.steps < resumed.step:
      raise ValueError(f"steps ({cfg.steps}) is below the checkpoint's step {resumed.step} in"
                       f" {resumed.path}; pass --steps >= {resumed.step}.")
    state = resumed.state
  eval_tokens = algo.place_replicated(data.eval_batch())

  writer = jax.process_index() == 0  # in multi-process runs only process 0 writes files
  if cfg.out is not None and writer:
    os.makedirs(cfg.out, exist_ok=True)
    if cfg.overwrite and not cfg.resume:  # starting over: nothing of the old run may mix in
      for name in (ckpt.CHECKPOINTS, ckpt.FINAL_PARAMS):
        shutil.rmtree(os.path.join(cfg.out, name), ignore_errors=True)
      if os.path.exists(os.path.join(cfg.out, "summary.json")):
        os.remove(os.path.join(cfg.out, "summary.json"))
    metrics_file = _open_metrics(cfg.out, None if resumed is None else resumed.meta["metrics"]["rows"])
  else:
    metrics_file = None
  checkpoints = ckpt.CheckpointWriter(cfg.out, cfg.keep_checkpoints) if cfg.checkpoint_every else None
  last_checkpoint = None if resumed is None else resumed.path

  rows: list[dict] = []
  pending: list = []
  syncs: list = []  # with drops: [step, present replicas] of each sync since the last row
  tokens_per_step = M * b * T
  total_bytes, peak_bytes, since_log_bytes = 0.0, 0.0, 0.0
  first = 1
  if resumed is not None:  # checkpoints fall on log rows: nothing is pending
    rows = resumed.meta["metrics"]["rows"]
    total_bytes = resumed.meta["metrics"]["total_bytes_sent"]
    peak_bytes = resumed.meta["metrics"]["peak_bytes_per_step"]
    first = resumed.step + 1
  start = time.perf_counter()
  compile_time = None
  bar = tqdm(total=cfg.steps, initial=first - 1, disable=not (cfg.progress and writer),
             desc=cfg.algo.algorithm, unit="step")
  if resumed is None:
    last_eval = float(eval_fn(algo.eval_params(state), eval_tokens))
    rows.append(_row(0, None, last_eval, 0, 0.0, 0.0, 0.0))
  try:
    for t in range(first, cfg.steps + 1):
      batch = algo.place_batch(data.train_batch(t - 1))
      present = participation(cfg, t)
      if present is None:
        state, m = algo.step(state, batch)
      else:
        state, m = algo.step(state, batch, algo.place_replicated(present))
        if sent_fragment(t, cfg.algo.sync_every, cfg.algo.fragments)[0]:
          syncs.append([t, [i for i in range(M) if present[i]]])
      if compile_time is None:
        jax.block_until_ready(m["loss"])
        compile_time = time.perf_counter() - start
      pending.append(m["loss"])
      sent = algo.bytes_sent(t)
      peak_bytes = max(peak_bytes, sent)  # what one present replica puts on the wire
      if present is not None:
        sent *= float(np.mean(present))  # a dropped replica sends nothing: the mean over replicas
      total_bytes += sent
      since_log_bytes += sent
      do_eval = t % cfg.eval_every == 0 or t == cfg.steps
      if t % cfg.log_every == 0 or do_eval:
        step_losses = fetch(jnp.stack(pending))
        _check_finite(step_losses, t, state, last_checkpoint)
        losses = step_losses.mean(axis=0)
        pending = []
        eval_loss = float(eval_fn(algo.eval_params(state), eval_tokens)) if do_eval else None
        wall = time.perf_counter() - start
        rows.append(_row(t, losses, eval_loss, t * tokens_per_step, since_log_bytes, total_bytes, wall))
        if cfg.drop_schedule or cfg.drop_prob:
          rows[-1]["participants"], syncs = syncs, []
        since_log_bytes = 0.0
        if metrics_file is not None:
          metrics_file.write(json.dumps(rows[-1]) + "\n")
          metrics_file.flush()
        if checkpoints is not None and (t % cfg.checkpoint_every == 0 or t == cfg.steps):
          last_checkpoint = checkpoints.save(t, state, _checkpoint_meta(cfg, t, rows, total_bytes, peak_bytes))
        bar.update(t - bar.n)
        tok_s = (t - 1) * tokens_per_step / max(wall - compile_time, 1e-9) if t > 1 else 0.0
        bar.set_postfix(loss=f"{losses.mean():.3f}", tok_s=f"{tok_s:,.0f}")
  finally:
    bar.close()
    if metrics_file is not None:
      metrics_file.close()
    if checkpoints is not None:
      checkpoints.close()
  final_params = None
  if cfg.out is not None:  # a plain checkpoint of the global params: diloco_core.load_params(path)
    final_params = ckpt.export_params(algo.eval_params(state), os.path.join(cfg.out, ckpt.FINAL_PARAMS))
  wall = time.perf_counter() - start
  compile_time = 0.0 if compile_time is None else compile_time  # resumed at the last step: no step ran
  metrics = pd.DataFrame(rows)
  final_eval = float(metrics["eval_loss"].dropna().iloc[-1])
  floor = data.loss_floor
  summary = {
      "algorithm": cfg.algo.algorithm,
      "final_eval_loss": final_eval,
      "loss_floor": floor,
      "gap_to_floor": None if floor is None else final_eval - floor,
      "total_bytes_per_replica": total_bytes,
      "peak_bytes_per_step": peak_bytes,
      "wall_time_s": wall,
      "compile_time_s": compile_time,
      "tokens": cfg.steps * tokens_per_step,
      "tokens_per_s": max(cfg.steps - first, 0) * tokens_per_step / max(wall - compile_time, 1e-9),
      "params": param_count(model_cfg),
      "data": data.describe(),
      "config": _config_dict(cfg),
      "final_params": final_params,
      "resumed_from": None if resumed is None else resumed.path,
  }
  if cfg.out is not None and writer:
    with open(os.path.join(cfg.out, "summary.json"), "w") as f:
      json.dump(summary, f, indent=2)
  return TrainResult(metrics=metrics, summary=summary, params=algo.eval_params(state), state=state)


def _row(t, losses, eval_loss, tokens, step_bytes, total_bytes, wall) -> dict:
  return {
      "step": t,
      "train_loss": None if losses is None else float(np.mean(losses)),
      "replica_loss": None if losses is None else [float(x) for x in losses],
      "eval_loss": eval_loss,
      "tokens": tokens,
      "bytes_sent": step_bytes,  # per replica (mean over replicas), since the previous row
      "total_bytes_sent": total_bytes,  # per replica (mean over replicas), since the start
      "wall_time_s": wall,
  }


def _config_dict(cfg: TrainConfig) -> dict:
  return dataclasses.asdict(cfg)


_DROP_STREAM = 0x64726F70  # "drop": keeps the drop draws apart from every other use of the seed


def participation(cfg: TrainConfig, t: int) -> np.ndarray | None:
  """Which replicas take part in the sync after step ``t`` (simulated drops), or None.

  A pure function of ``(cfg, t)`` (``--drop-prob`` draws from ``(seed, t)``), so a resumed
  run drops exactly the same replicas as an uninterrupted one.

  Args:
    cfg: the run (``drop_schedule``, ``drop_prob``, ``seed``).
    t: the inner step just done (1-based).

  Returns:
    None when no drops are configured, else a float32 [M] mask (1 present, 0 dropped;
    all ones at steps without a sync).

  Examples:
    >>> cfg = TrainConfig(algo=DiLoCoConfig(replicas=3, sync_every=4), steps=8, drop_schedule=((4, 1),))
    >>> participation(cfg, 4).tolist(), participation(cfg, 8).tolist()
    ([1.0, 0.0, 1.0], [1.0, 1.0, 1.0])
  """
  if not cfg.drop_schedule and not cfg.drop_prob:
    return None
  present = np.ones(cfg.algo.replicas, np.float32)
  if not sent_fragment(t, cfg.algo.sync_every, cfg.algo.fragments)[0]:
    return present
  for step, replica in cfg.drop_schedule:
    if step == t:
      present[replica] = 0.0
  if cfg.drop_prob:
    u = np.random.default_rng([_DROP_STREAM, cfg.seed, t]).random(cfg.algo.replicas)
    present[u < cfg.drop_prob] = 0.0
  return present


def parse_drop_schedule(text: str | None) -> tuple:
  """Parses ``"4:1,8:0"`` (step:replica, comma-separated) into ``((4, 1), (8, 0))``.

  Examples:
    >>> parse_drop_schedule("4:1, 8:0")
    ((4, 1), (8, 0))
    >>> parse_drop_schedule("4-1")
    Traceback (most recent call last):
    ...
    ValueError: drop_schedule entry '4-1' must look like step:replica, e.g. --drop-schedule 4:1,8:0.
  """
  if text is None or not text.strip():
    return ()
  out = []
  for part in text.split(","):
    step, sep, replica = part.strip().partition(":")
    try:
      if not sep:
        raise ValueError
      out.append((int(step), int(replica)))
    except ValueError:
      raise ValueError(f"drop_schedule entry {part.strip()!r} must look like step:replica,"
                       " e.g. --drop-schedule 4:1,8:0.") from None
  return tuple(out)


@jax.jit
def _finite_flags(state):
  """(per-replica all-finite [M] or [1], global all-finite) of a DiLoCoState / DPState."""
  def all_finite(tree, axis0):
    flags = [jnp.all(jnp.isfinite(x).reshape(x.shape[0], -1), axis=1) if axis0 else jnp.all(jnp.isfinite(x))[None]
             for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
    return jnp.all(jnp.stack(flags), axis=0)
  if hasattr(state, "global_params"):
    return all_finite(state.params, True), all_finite(state.global_params, False)[0]
  return all_finite(state.params, False), all_finite(state.params, False)[0]


def _check_finite(step_losses: np.ndarray, t: int, state, last_checkpoint: str | None) -> None:
  """Raises FloatingPointError naming the first bad step and replica (losses [n, M], params)."""
  keep = f" (the last good checkpoint, {last_checkpoint}, is intact)" if last_checkpoint else ""
  bad_steps = np.flatnonzero(~np.all(np.isfinite(step_losses), axis=1))
  if bad_steps.size:
    i = int(bad_steps[0])
    bad = [m for m, x in enumerate(step_losses[i]) if not np.isfinite(x)]
    raise FloatingPointError(
        f"non-finite training loss at step {t - len(step_losses) + 1 + i} on replica(s) {bad};"
        f" lower --inner-lr{keep}.")
  replicas, glob = (fetch(x) for x in _finite_flags(state))
  if not hasattr(state, "global_params"):  # DP: one model
    if not glob:
      raise FloatingPointError(f"non-finite params after step {t}; lower --inner-lr{keep}.")
    return
  if not replicas.all():
    bad = [m for m, ok in enumerate(replicas) if not ok]
    raise FloatingPointError(f"non-finite params after step {t} on replica(s) {bad}; lower --inner-lr{keep}.")
  if not glob:
    raise FloatingPointError(f"non-finite global params after step {t}; lower --outer-lr{keep}.")


def _checkpoint_meta(cfg: TrainConfig, t: int, rows: list, total_bytes: float, peak_bytes: float) -> dict:
  """Everything but the arrays that a resumed run needs to continue exactly."""
  return {
      "algorithm": cfg.algo.algorithm,
      "config": _config_dict(cfg),
      "data_position": [t] * cfg.algo.replicas,  # batches are a pure function of (seed, replica, step)
      "seeds": {"model_init": cfg.seed, "data": cfg.data.seed, "drops": cfg.seed},  # no other RNG state
      "metrics": {"rows": rows, "total_bytes_sent": total_bytes, "peak_bytes_per_step": peak_bytes},
  }


def _open_metrics(out: str, rows: list | None):
  """metrics.jsonl for writing; on resume, rewritten (atomically) to the checkpoint's rows first."""
  path = os.path.join(out, "metrics.jsonl")
  if rows is None:
    return open(path, "w")
  with open(path + ".tmp", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows[1:])  # the step-0 row is not in the file
  os.replace(path + ".tmp", path)
  return open(path, "a")


# ---- CLI ------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
  d, a = TrainConfig(), DiLoCoConfig()
  dd = d.data
  p = argparse.ArgumentParser(
      prog="python -m diloco_core.train",
      description="Train the built-in transformer with DP, DiLoCo or Streaming DiLoCo.",
      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  g = p.add_argument_group("algorithm (symbols as in SPEC.md)")
  g.add_argument("--algorithm", default=a.algorithm, help=f"one of {ALGORITHMS}")
  g.add_argument("--replicas", type=int, default=a.replicas, help="M: replicas, each on its own data shard")
  g.add_argument("--sync-every", type=int, default=a.sync_every, help="H: inner steps between two syncs of the same parameters")
  g.add_argument("--outer-lr", type=float, default=a.outer_lr, help="η: outer Nesterov SGD learning rate")
  g.add_argument("--outer-momentum", type=float, default=a.outer_momentum, help="μ: outer Nesterov momentum, in [0, 1)")
  g.add_argument("--fragments", type=int, default=a.fragments, help="P: fragments synced in turn every H/P steps (streaming)")
  g.add_argument("--fragment-pattern", default=a.fragment_pattern, help=f"layers to fragments: one of {FRAGMENT_PATTERNS}")
  g.add_argument("--overlap", type=int, default=a.overlap, help="τ: steps between sending a fragment and merging it, 0 <= τ < H")
  g.add_argument("--alpha", type=float, default=a.alpha, help="α: merge blend, local <- α·local + (1-α)·global")
  g.add_argument("--compression", default=a.compression, help=f"pseudo-gradient wire format: one of {COMPRESSIONS}")
  g.add_argument("--error-feedback", action="store_true", help="keep and resend each replica's compression residual")
  g.add_argument("--compression-block", type=int, default=None, help="elements per quantization scale (default: one scale per tensor)")
  g = p.add_argument_group("model and inner optimizer")
  g.add_argument("--model", default=d.model, help=f"model preset: one of {sorted(PRESETS)}")
  g.add_argument("--layers", type=int, default=None, help="override the preset's number of layers L")
  g.add_argument("--vocab-size", type=int, default=None, help=".npy data: the model's vocabulary; ids must be below it (default: largest id + 1)")
  g.add_argument("--positions", default=None, help="override the preset's positions: rope or learned")
  g.add_argument("--inner-lr", type=float, default=d.inner_lr, help="peak AdamW learning rate")
  g.add_argument("--warmup-steps", type=int, default=d.warmup_steps, help="linear warmup steps before cosine decay (default: min(50, steps // 10))")
  g.add_argument("--weight-decay", type=float, default=d.weight_decay, help="AdamW weight decay")
  g.add_argument("--grad-clip", type=float, default=d.grad_clip, help="global-norm gradient clip (0 disables)")
  g = p.add_argument_group("data")
  g.add_argument("--data", default=dd.source, help="'synthetic', or a local .txt (UTF-8, byte tokens) or .npy (token ids) file")
  g.add_argument("--distribution", default=dd.distribution, help="iid or non-iid replica shards")
  g.add_argument("--data-seed", type=int, default=dd.seed, help="seed of the synthetic source and of the sampling")
  g.add_argument("--data-vocab", type=int, default=dd.vocab_size, help="synthetic: vocabulary size V")
  g.add_argument("--data-order", type=int, default=dd.order, help="synthetic: Markov order k")
  g.add_argument("--data-branching", type=int, default=dd.branching, help="synthetic: allowed next tokens per context")
  g.add_argument("--batch-size", type=int, default=d.batch_size, help="b: sequences per replica per step")
  g.add_argument("--seq-len", type=int, default=d.seq_len, help="T: tokens per sequence")
  g = p.add_argument_group("run")
  g.add_argument("--steps", type=int, default=d.steps, help="inner steps")
  g.add_argument("--eval-every", type=int, default=d.eval_every, help="steps between evaluations of the global params")
  g.add_argument("--log-every", type=int, default=d.log_every, help="steps between metric fetches / log rows")
  g.add_argument("--seed", type=int, default=d.seed, help="model initialisation seed")
  g.add_argument("--out", default=None, help="output directory for metrics.jsonl and summary.json")
  g.add_argument("--overwrite", action="store_true", help="allow --out to hold a finished run")
  g.add_argument("--no-progress", action="store_true", help="hide the progress bar")
  g = p.add_argument_group("checkpoints and failures")
  g.add_argument("--checkpoint-every", type=int, default=d.checkpoint_every, help="save <out>/checkpoints/<step> every N steps (a multiple of --log-every; 0: never)")
  g.add_argument("--keep-checkpoints", type=int, default=d.keep_checkpoints, help="keep the newest k checkpoints")
  g.add_argument("--resume", action="store_true", help="continue the run in --out from its newest valid checkpoint")
  g.add_argument("--init-from", default=None, help="start from a plain params checkpoint (e.g. a DP run's <out>/final_params): broadcast to the replicas, fresh outer state")
  g.add_argument("--drop-schedule", default=None, help="simulated replica drops 'step:replica,...' at sync steps (0-based replicas)")
  g.add_argument("--drop-prob", type=float, default=d.drop_prob, help="simulated drops: each replica misses each sync with this probability (seeded by --seed)")
  g = p.add_argument_group("devices and processes")
  g.add_argument("--mesh", default=None, help="device mesh 'diloco=D,data=B' (D*B = devices, D | M, B | batch); default: one device")
  g.add_argument("--coordinator", default=None, help="multi-process: host:port of process 0 (or JAX_COORDINATOR_ADDRESS)")
  g.add_argument("--num-processes", type=int, default=None, help="multi-process: number of processes (or JAX_NUM_PROCESSES)")
  g.add_argument("--process-id", type=int, default=None, help="multi-process: this process's id (or JAX_PROCESS_ID)")
  return p


def config_from_args(args: argparse.Namespace) -> TrainConfig:
  algo = DiLoCoConfig(
      algorithm=args.algorithm, replicas=args.replicas, sync_every=args.sync_every,
      outer_lr=args.outer_lr, outer_momentum=args.outer_momentum, fragments=args.fragments,
      fragment_pattern=args.fragment_pattern, overlap=args.overlap, alpha=args.alpha,
      compression=args.compression, error_feedback=args.error_feedback,
      compression_block=args.compression_block)
  data = DataConfig(source=args.data, distribution=args.distribution, seed=args.data_seed,
                    vocab_size=args.data_vocab, order=args.data_order, branching=args.data_branching)
  return TrainConfig(
      algo=algo, data=data, model=args.model, n_layers=args.layers, vocab_size=args.vocab_size, positions=args.positions,
      batch_size=args.batch_size, seq_len=args.seq_len, steps=args.steps, inner_lr=args.inner_lr,
      warmup_steps=args.warmup_steps, weight_decay=args.weight_decay, grad_clip=args.grad_clip,
      eval_every=args.eval_every, log_every=args.log_every, seed=args.seed, out=args.out,
      overwrite=args.overwrite, progress=not args.no_progress, mesh=args.mesh,
      checkpoint_every=args.checkpoint_every, keep_checkpoints=args.keep_checkpoints, resume=args.resume,
      init_from=args.init_from, drop_schedule=parse_drop_schedule(args.drop_schedule), drop_prob=args.drop_prob)


def main(argv: list[str] | None = None) -> int:
  """CLI entry point: one-line errors on stderr and exit code 2 for bad input."""
  parser = build_parser()
  parser.error = lambda message: parser.exit(2, f"error: {message} (see --help).\n")
  try:
    args = parser.parse_args(argv)
  except SystemExit as e:  # --help (0) or a malformed flag (2, one line above)
    return int(e.code or 0)
  try:
    initialize_distributed(args.coordinator, args.num_processes, args.process_id)
    cfg = config_from_args(args)
    cfg.validate()
    result = train(cfg)
  except (ValueError, OSError, FloatingPointError) as e:
    print(f"error: {' '.join(str(e).split())}", file=sys.stderr)
    return 2
  s = result.summary
  floor = "n/a" if s["loss_floor"] is None else f"{s['loss_floor']:.4f}"
  print(f"{s['algorithm']}: final eval loss {s['final_eval_loss']:.4f} (floor {floor}), "
        f"{s['total_bytes_per_replica'] / 1e6:.2f} MB sent per replica, {s['wall_time_s']:.1f} s")
  return 0


if __name__ == "__main__":
  sys.exit(main())
