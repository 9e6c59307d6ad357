"""The run config: everything one training run needs, its checks and the output-directory policy.

:class:`TrainConfig` holds the outer loop (``algo``, a :class:`~diloco_core.DiLoCoConfig`),
the data (``data``, a :class:`~diloco_core.DataConfig`) and the model, inner optimizer, run,
checkpoint and device options. Each field says in its metadata (:mod:`diloco_core.spec.fields`)
whether it is a traced input of the step, compiled in, checked on resume, or changes no
number; the command line (:mod:`diloco_core.run.cli`) is built from the same metadata.

:meth:`TrainConfig.validate` checks the options alone (no file system, no device); what the
disk and the devices allow is checked by :func:`diloco_core.run.preflight.preflight`, once,
before anything compiles. Errors name options by their field in backticks (``\\`out\\```); the
command line rewrites those to its flags (``--out``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from diloco_core.spec import validity as v
from diloco_core.runtime.option_checks import HEARTBEAT_S as ELASTIC_HEARTBEAT_S, check_background, check_elastic
from diloco_core.algorithm.config import DiLoCoConfig
from diloco_core.data.sources import DataConfig
from diloco_core.spec.fields import field
from diloco_core.spec.mesh_shape import parse_mesh
from diloco_core.run.syncer_options import SyncerOptions
from diloco_core.spec.model_config import (ATTENTIONS, COMPUTE_DTYPES, POSITIONS, PRESETS, REMATS, ModelConfig,
                                           check_preset, get_preset, param_count)


def parse_drop_schedule(text: str | None) -> tuple:
  """Parses ``"4:1,8:0"`` (step:replica, comma-separated) into ``((4, 1), (8, 0))``.

  Examples:
    >>> parse_drop_schedule("4:1, 8:0")
    ((4, 1), (8, 0))
    >>> parse_drop_schedule("4-1")
    Traceback (most recent call last):
    ...
    ValueError: `drop_schedule` entry '4-1' must look like step:replica, e.g. 4:1,8:0.
  """
  return _parse_schedule(text, "drop_schedule", ("step", "replica"), "4:1,8:0")


def parse_rejoin_schedule(text: str | None) -> tuple:
  """Parses ``"12:2:0"`` (step:replica:source, comma-separated) into ``((12, 2, 0),)``.

  Examples:
    >>> parse_rejoin_schedule("12:2:0")
    ((12, 2, 0),)
  """
  return _parse_schedule(text, "rejoin_schedule", ("step", "replica", "source"), "12:2:0")


def _parse_schedule(text: str | None, name: str, parts: tuple[str, ...], example: str) -> tuple:
  if text is None or not text.strip():
    return ()
  out = []
  for part in text.split(","):
    try:
      values = tuple(int(x) for x in part.strip().split(":"))
      if len(values) != len(parts):
        raise ValueError
      out.append(values)
    except ValueError:
      raise ValueError(f"`{name}` entry {part.strip()!r} must look like {':'.join(parts)}, e.g. {example}.") from None
  return tuple(out)


_M, _D, _R, _C = "model", "data", "run", "checkpoints"
INNER_OPTIMIZERS = v.INNER_OPTIMIZERS
COMMUNICATIONS = v.COMMUNICATIONS


@dataclasses.dataclass(frozen=True)
class TrainConfig:
  """Everything one training run needs (the outer loop in ``algo``, the data in ``data``).

  Symbols are those of the semantics page (docs/semantics.md). The inner learning rate,
  weight decay, clipping threshold and Muon's momentum are traced inputs of the step
  (float32): runs that differ only in them share one compiled program.
  """

  algo: DiLoCoConfig = field(default_factory=DiLoCoConfig)
  # The trainer's default language: V = 32, order 2, 4 successors per context; the `small`
  # model gets within a few hundredths of a nat of its floor in 600 steps on a laptop CPU.
  data: DataConfig = field(default_factory=lambda: DataConfig(vocab_size=32))
  # The syncer rule's knobs: at their defaults the lock step below; else train plays a tape.
  syncer: SyncerOptions = field(default_factory=SyncerOptions)
  model: str = field("small", flag="model", group=_M, must_match=True,
                     help=f"model preset: one of {sorted(PRESETS)}")
  n_layers: int | None = field(None, flag="layers", group=_M, must_match=True, parse=int, symbol="L",
                               help="override the preset's number of layers (Streaming needs (P-1) | L)")
  vocab_size: int | None = field(
      None, flag="vocab-size", group=_M, must_match=True, parse=int,
      help=".npy data: the model's vocabulary; ids must be below it (default: largest id + 1)")
  positions: str | None = field(None, flag="positions", group=_M, must_match=True,
                                help=f"override the preset's positions: {' or '.join(POSITIONS)}")
  compute_dtype: str | None = field(
      None, flag="compute-dtype", group=_M,
      help="dtype the model computes in (params, optimizer and outer states stay float32): one of"
           f" {COMPUTE_DTYPES}; default: bfloat16 on GPU/TPU, float32 on CPU (env DILOCO_COMPUTE_DTYPE"
           " overrides the default)")
  attention: str = field(
      "auto", flag="attention", group=_M,
      help=f"attention kernel, one of {ATTENTIONS}; auto: cuDNN on a GPU in bfloat16 with head dim a"
           " multiple of 8 and <= 128, else XLA; flash: the Pallas flash kernel (TPU only)")
  remat: str = field(
      "none", flag="remat", group=_M,
      help=f"one of {REMATS}; block: recompute each transformer block in the backward pass (least"
           " memory, about one more forward); dots: keep the weight matmuls' outputs, recompute the"
           " rest (identical gradients either way)")
  loss_chunk: int = field(
      0, flag="loss-chunk", group=_M, parse=int,
      help="tokens per chunk of the output head fused with the cross-entropy (the float32 logits are"
           " never held whole; 0: the whole logits at once)")
  num_experts: int | None = field(
      None, flag="experts", group=_M, must_match=True, parse=int, symbol="E",
      help="override the preset's experts per layer (1: dense MLP; E > 1: a mixture of experts)")
  experts_per_token: int | None = field(
      None, flag="experts-per-token", group=_M, must_match=True, parse=int, symbol="k",
      help="override the preset's experts each token is routed to (top-k, 1 <= k <= E)")
  aux_loss_coef: float = field(
      ModelConfig.aux_loss_coef, flag="aux-loss-coef", group=_M, must_match=True,
      help="MoE models: weight of the load-balancing loss E·Σ_e f_e·P_e in the objective (reported as aux_loss)")
  z_loss_coef: float = field(
      ModelConfig.z_loss_coef, flag="z-loss-coef", group=_M, must_match=True,
      help="MoE models: weight of the router z-loss mean(logsumexp(router logits)²) in the objective (0: off)")
  nondeterministic: bool = field(
      False, flag="nondeterministic", group="devices", result=False,
      help="on a GPU, keep XLA's faster non-deterministic kernels (reused programs, resume and drops"
           " are then not bit-exact; same as DILOCO_NONDETERMINISTIC=1)")
  batch_size: int = field(16, flag="batch-size", group=_D, must_match=True, program=True, symbol="b",
                          help="sequences per replica per step (DP's global batch is M·b)")
  seq_len: int = field(64, flag="seq-len", group=_D, must_match=True, program=True, symbol="T",
                       help="tokens per sequence")
  steps: int = field(600, flag="steps", group=_R, program=True, help="inner steps")
  inner_optimizer: str = field(
      "adamw", flag="inner-optimizer", group=_M, must_match=True, program=True,
      help=f"each replica's optimizer: one of {INNER_OPTIMIZERS} (muon: MuLoCo's, arXiv 2505.23725)")
  inner_lr: float = field(3e-3, flag="inner-lr", group=_M, must_match=True, traced="float32",
                          help="peak inner learning rate (AdamW's, and Muon's at AdamW's update RMS)")
  muon_momentum: float = field(0.95, flag="muon-momentum", group=_M, must_match=True,
                               traced="float32", symbol="β",
                               help="inner muon only: Nesterov momentum of Muon, in [0, 1)")
  warmup_steps: int | None = field(
      None, flag="warmup-steps", group=_M, must_match=True, parse=int,
      help="linear warmup steps before cosine decay to 10% of the peak (default: min(50, steps // 10))")
  weight_decay: float = field(0.1, flag="weight-decay", group=_M, must_match=True, traced="float32",
                              help="decoupled weight decay (AdamW; Muon and its AdamW part)")
  grad_clip: float = field(1.0, flag="grad-clip", group=_M, must_match=True, traced="float32",
                           help="global-norm gradient clip (0 disables)")
  eval_every: int = field(50, flag="eval-every", group=_R,
                          help="steps between evaluations of the global params (and at 0, end)")
  eval_replicas: bool = field(
      False, flag="eval-replicas", group=_R,
      help="DiLoCo/Streaming: the last step merges nothing, and the summary also holds each replica's"
           " own eval loss then (final_replica_eval_losses), to compare one replica with the global params")
  log_every: int = field(10, flag="log-every", group=_R,
                         help="steps between metric fetches from the device / log rows")
  seed: int = field(0, flag="seed", group=_R, must_match=True,
                    help="model initialisation seed (the data seed is data.seed)")
  out: str | None = field(None, flag="out", group=_R, result=False,
                          help="output directory for metrics.jsonl and summary.json (none: no files)")
  overwrite: bool = field(False, flag="overwrite", group=_R, result=False,
                          help="allow the output directory to hold a finished run")
  progress: bool = field(True, flag="no-progress", group=_R, result=False, help="hide the progress bar")
  mesh: str | None = field(
      None, flag="mesh", group="devices", program=True,
      help="device mesh 'diloco=D,data=B' (D*B = devices, D | M, B | batch); default: one device")
  communication: str = field(
      "in-step", flag="communication", group="devices", result=False,
      help="in-step: every replica in one SPMD program, a fragment's all-reduce inside the step"
           " that sends it; background: the replicas split over the processes, each fragment's"
           " all-reduce on a communication thread while training goes on (merged at t + τ; delayed /"
           " eager: at the next send). Where it runs, not what it computes: the same numbers as in-step on"
           " the same mesh (bit for bit on CPU; M > 2 with a compressed format within background.TOLERANCE)")
  checkpoint_every: int = field(
      0, flag="checkpoint-every", group=_C,
      help="save <out>/checkpoints/<step> every N steps (a multiple of the log interval; 0: never)")
  keep_checkpoints: int = field(3, flag="keep-checkpoints", group=_C, help="keep the newest k checkpoints")
  resume: bool = field(False, flag="resume", group=_C,
                       help="continue the run in the output directory from its newest valid checkpoint")
  allow_data_change: bool = field(
      False, flag="allow-data-change", group=_C, result=False,
      help="with --resume: continue although the data file(s) changed since the checkpoint was"
           " written (the run then no longer continues the checkpointed trajectory)")
  init_from: str | None = field(
      None, flag="init-from", group=_C,
      help="start from a plain params checkpoint (e.g. a DP run's <out>/final_params):"
           " broadcast to the replicas, fresh outer state")
  drop_schedule: tuple = field((), flag="drop-schedule", group=_C, parse=parse_drop_schedule,
                               help="simulated replica drops 'step:replica,...' at sync steps (0-based replicas)")
  drop_prob: float = field(
      0.0, flag="drop-prob", group=_C,
      help="simulated drops: each replica misses each sync with this probability (seeded by the model seed)")
  rejoin_schedule: tuple = field(
      (), flag="rejoin-schedule", group=_C, parse=parse_rejoin_schedule,
      help="replays an elastic run's rejoins (in-step): 'step:replica:source,...': after that step"
           " the replica restarts from the global params, the source replica's inner optimizer"
           " state and a zero residual (drops.rejoins_from_trace reads them from a trace)")
  elastic: bool = field(
      False, flag="elastic", group=_C,
      help="several processes, communication background: a process that dies or is cut off is left"
           " out of every sync from the first one that cannot include it (after"
           f" {ELASTIC_HEARTBEAT_S} s without its heartbeat), and the others go on: the outer average is"
           " over the replicas present, as with --drop-schedule; its checkpoints (one process"
           " writes them: 0, or the lowest left when it was lost under launch --own-coordinator) hold a"
           " lost replica as its heal would set it")
  min_replicas: int = field(
      1, flag="min-replicas", group=_C,
      help="elastic: the run stops (one line, the lost processes) when fewer replicas than this"
           " take part in a sync")
  heal_wait: float = field(
      0.0, flag="heal-wait", group=_C,
      help="elastic: seconds the others may wait, at a log row, for a replacement that is still"
           " compiling before they heal it (0: never wait; it is healed at the first log row"
           " after it is ready)")

  def validate(self) -> None:
    """Raises a one-line ``ValueError`` for any invalid option, before anything compiles.

    The options alone: no file is read and no device is asked. What the disk and the devices
    allow (``out``, ``init_from``, the mesh, the memory, the processes) is checked by
    :func:`diloco_core.run.preflight.preflight`, after this.

    Examples:
      >>> TrainConfig(model="tiny", out="/nonexistent/run", init_from="/nonexistent/p").validate()
      >>> TrainConfig(positions="alibi").validate()
      Traceback (most recent call last):
      ...
      ValueError: positions must be one of ('rope', 'learned'), got 'alibi'.
    """
    for name in ("batch_size", "seq_len", "steps", "eval_every", "log_every"):
      v.check_int(name, getattr(self, name))
    if self.warmup_steps is not None and (
        not v.is_int(self.warmup_steps) or not 0 <= self.warmup_steps < self.steps):
      raise ValueError(f"warmup_steps must be an integer in [0, `steps`={self.steps}), got {self.warmup_steps!r}.")
    v.check_real("inner_lr", self.inner_lr, low=0.0, low_open=True)
    v.check_real("weight_decay", self.weight_decay, low=0.0)
    v.check_choice("`inner_optimizer`", self.inner_optimizer, INNER_OPTIMIZERS)
    muon_default = TrainConfig.__dataclass_fields__["muon_momentum"].default
    v.check_real("muon_momentum (β)", self.muon_momentum, low=0.0, high=1.0)
    if self.inner_optimizer != "muon" and self.muon_momentum != muon_default:
      raise ValueError(f"`muon_momentum` {self.muon_momentum!r} is Muon's momentum, and"
                       f" inner_optimizer={self.inner_optimizer!r} has none: pass `inner_optimizer`"
                       " muon or drop `muon_momentum`.")
    v.check_real("grad_clip", self.grad_clip, low=0.0)
    check_preset(self.model)
    if self.n_layers is not None:
      v.check_int("n_layers", self.n_layers)
    self._validate_experts()
    if self.vocab_size is not None and (not v.is_int(self.vocab_size) or self.vocab_size < 2):
      raise ValueError(f"vocab_size must be None or an integer >= 2, got {self.vocab_size!r}.")
    if self.positions is not None:
      v.check_choice("positions", self.positions, POSITIONS)
    if self.compute_dtype is not None:
      v.check_choice("compute_dtype", self.compute_dtype, COMPUTE_DTYPES)
    v.check_choice("`communication`", self.communication, COMMUNICATIONS)
    if self.communication == "background":
      check_background(self)
    check_elastic(self)
    v.check_choice("attention", self.attention, ATTENTIONS)
    v.check_choice("remat", self.remat, REMATS)
    if not v.is_int(self.loss_chunk) or self.loss_chunk < 0:
      raise ValueError(f"loss_chunk must be an integer >= 0 (0: the whole logits), got {self.loss_chunk!r}.")
    for name in ("aux_loss_coef", "z_loss_coef"):
      v.check_real(f"`{name}`", getattr(self, name), low=0.0)  # the CLI names the flag
    v.check_bool("nondeterministic", self.nondeterministic)
    self.algo.validate(num_layers=self.model_config().n_layers)
    parse_mesh(self.mesh)  # its form; whether the devices hold it is the pre-flight's
    self._validate_checkpointing()
    self._validate_drops()
    self._validate_eval_replicas()
    self.syncer.validate(self)  # the defaults: nothing; else what the tape player can play

  def _validate_experts(self) -> None:
    """E and k: positive integers (overrides or the preset's) with k <= E."""
    preset = get_preset(self.model)
    E = preset.num_experts if self.num_experts is None else v.check_int("`num_experts` (E)", self.num_experts)
    k = (preset.experts_per_token if self.experts_per_token is None
         else v.check_int("`experts_per_token` (k)", self.experts_per_token))
    if k > E:
      whose = lambda name: "" if getattr(self, name) is not None else f", the {self.model} preset's"
      raise ValueError(
          f"`experts_per_token` (k={k}{whose('experts_per_token')}) must be <= `num_experts`"
          f" (E={E}{whose('num_experts')}): a token is routed to k of the E experts; pass"
          f" `experts_per_token` {f'in [1, {E}]' if E > 1 else '1'} or `num_experts` >= {k}.")

  def _validate_eval_replicas(self) -> None:
    v.check_bool("eval_replicas", self.eval_replicas)
    if not self.eval_replicas:
      return
    if self.algo.algorithm == "dp":
      raise ValueError("eval_replicas compares each replica with the global params; algorithm 'dp' has"
                       " one model: use `algorithm` diloco or streaming.")
    if self.algo.outer_overlap != "none":
      raise ValueError(f"eval_replicas is not supported with `outer_overlap` {self.algo.outer_overlap!r};"
                       " use outer_overlap='none'.")
    if self.checkpoint_every or self.resume:
      raise ValueError("eval_replicas leaves the replicas unmerged after the last step, which a"
                       " checkpoint must not hold: drop `checkpoint_every` / `resume` or `eval_replicas`.")

  def _validate_checkpointing(self) -> None:
    ce = v.check_int("checkpoint_every", self.checkpoint_every, low=0, what=" (0: no checkpoints)")
    if ce and self.out is None:
      raise ValueError("checkpoint_every needs `out`: checkpoints go to <out>/checkpoints/<step>.")
    if ce % self.log_every:
      raise ValueError(
          f"checkpoint_every ({ce}) must be a multiple of `log_every` ({self.log_every}) so every"
          f" checkpoint falls on a log row; e.g. `checkpoint_every`={-(-ce // self.log_every) * self.log_every}.")
    v.check_int("keep_checkpoints", self.keep_checkpoints)
    v.check_bool("resume", self.resume)
    if self.resume and self.out is None:
      raise ValueError("resume needs `out`: the directory of the run to continue.")
    v.check_bool("allow_data_change", self.allow_data_change)
    if self.allow_data_change and not self.resume:
      raise ValueError("`allow_data_change` only applies to `resume` (a new run reads the data as it is):"
                       " drop `allow_data_change`.")
    if self.init_from is not None and (not isinstance(self.init_from, str) or not self.init_from):
      raise ValueError(f"init_from must be a path to a params checkpoint directory, got {self.init_from!r}.")

  def _validate_drops(self) -> None:
    p = self.drop_prob
    if not v.is_real(p) or not 0 <= p < 1:
      raise ValueError(f"drop_prob must be a number in [0, 1), got {p!r}.")
    if (self.drop_schedule or p) and self.algo.algorithm == "dp":
      raise ValueError("drop_schedule / drop_prob simulate replicas missing a DiLoCo sync; algorithm"
                       " 'dp' has none to miss: use `algorithm` diloco or streaming.")
    M, dh = self.algo.replicas, self.algo.sync_interval
    if (self.drop_schedule or p) and self.algo.outer_overlap != "none":
      raise ValueError(f"drop_schedule / drop_prob are not supported with outer_overlap="
                       f"{self.algo.outer_overlap!r}; use outer_overlap='none'.")
    for entry in self.drop_schedule:
      if (not isinstance(entry, (tuple, list)) or len(entry) != 2 or not all(v.is_int(x) for x in entry)):
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
    for entry in self.rejoin_schedule:
      if (not isinstance(entry, (tuple, list)) or len(entry) != 3 or not all(v.is_int(x) for x in entry)
          or not 1 <= entry[0] <= self.steps or not (0 <= entry[1] < M and 0 <= entry[2] < M) or entry[1] == entry[2]):
        raise ValueError(f"rejoin_schedule entries must be (step, replica, source) with step in [1, steps="
                         f"{self.steps}] and two different replicas in [0, replicas={M}), got {entry!r}.")
    if self.rejoin_schedule and (self.communication != "in-step" or self.algo.algorithm == "dp"):
      raise ValueError("`rejoin_schedule` replays an elastic run in the in-step runtime: use `communication`"
                       " in-step and algorithm diloco or streaming.")

  def schedule_warnings(self) -> list[str]:
    """Warnings for a schedule that never syncs everything (H > steps: a fragment never sent).

    Examples:
      >>> TrainConfig(steps=20).schedule_warnings()
      ['sync_every (H=50) > steps (20): the global params are never updated (fragment(s) [0] never sent), so the final eval loss and final_params are those of the initial model; lower `sync_every` to at most 20 or raise `steps` to at least 50.']
    """
    a = self.algo
    if a.algorithm == "dp" or self.steps >= a.sync_every:
      return []
    dh = a.sync_every // a.fragments
    never = [p for p in range(a.fragments) if (p + 1) * dh > self.steps]
    what = ("the global params are never updated" if len(never) == a.fragments
            else "part of the global params is never updated")
    return [f"sync_every (H={a.sync_every}) > steps ({self.steps}): {what} (fragment(s) {never} never"
            f" sent), so the final eval loss and final_params are those of the initial model"
            f"{'' if len(never) == a.fragments else ' for those fragments'}; lower `sync_every` to at"
            f" most {self.steps} or raise `steps` to at least {a.sync_every}."]

  @property
  def warmup(self) -> int:
    """Warmup steps: ``warmup_steps``, or min(50, steps // 10) when it is None."""
    return min(50, self.steps // 10) if self.warmup_steps is None else self.warmup_steps

  def planned_param_count(self) -> int:
    """The model's parameter count before any data is read (the up-front checks' N): the
    vocabulary is ``vocab_size``, else the built-in data's (a file's is only known later)."""
    return param_count(self.model_config(vocab_size=self.vocab_size or self.data.vocab_size))

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
    for name in ("num_experts", "experts_per_token"):
      if getattr(self, name) is not None:
        changes[name] = getattr(self, name)
    changes.update(compute_dtype=self.compute_dtype, attention=self.attention, remat=self.remat,
                   loss_chunk=self.loss_chunk,
                   aux_loss_coef=self.aux_loss_coef, z_loss_coef=self.z_loss_coef)
    return dataclasses.replace(base, **changes)


#: Model fields whose None means "the preset's value": a resumed run is compared with its
#: checkpoint on their effective values (``--experts 8`` on a preset with E = 8 is the same run).
PRESET_OVERRIDES = ("n_layers", "positions", "num_experts", "experts_per_token")


def effective_config(config: dict) -> dict:
  """A run's config as a dict (``dataclasses.asdict``) with every None override of
  :data:`PRESET_OVERRIDES` replaced by its preset's value (unknown presets are left as they are).

  Examples:
    >>> effective_config({"model": "moe-small", "num_experts": None})["num_experts"]
    8
  """
  out = dict(config)
  if out.get("model") not in PRESETS:
    return out
  preset = get_preset(out["model"])
  for name in PRESET_OVERRIDES:
    if out.get(name) is None:
      out[name] = getattr(preset, name)
  return out
