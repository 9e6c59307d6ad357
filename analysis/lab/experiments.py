"""The named sweeps behind the docs and notebooks, at two scales (a registry of configs).

Each sweep is a function of the scale (:data:`SCALES`) that returns a list of
``TrainConfig``; :func:`named_sweep` looks one up, :func:`analysis.lab.sweeps.run_sweep` trains
it (or reads it from the cache). :func:`base_config` is the run every sweep varies around.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from analysis.lab.sweeps import grid
from analysis.lab.sweeps import with_values
from diloco_core.algorithm.config import DiLoCoConfig
from diloco_core.spec.validity import check_choice

#: The two sizes of the docs sweeps, ``"cpu"`` (what the docs build runs on 2 CPU cores)
#: and ``"accelerator"`` (a larger setting the notebooks pick on a TPU or GPU).
SCALES = ("cpu", "accelerator")


def base_config(scale: str = "cpu", **changes):
  """The run every docs sweep and the claims experiment vary around.

  On ``"cpu"``: the ``mini`` preset (L = 2, d = 32, about 21,000 parameters) on the synthetic
  language with V = 8 (order 2, 4 successors per context), M = 4 replicas × 8 sequences × 32
  tokens, 1,200 inner steps (about 1.2 M tokens: some 60 tokens per parameter, so that DP ends
  within about 2% of the data's entropy floor), peak inner LR 2e-2, DiLoCo with H = 24 (50 outer
  steps), η = 0.5 and μ = 0.9. A run takes about 20 s on 2 CPU cores. Why this model and LR:
  in a probe on 5 seeds, the narrower ``tiny`` at 1e-2 (or 3e-2) left some seeds on a slow
  path to the floor for the whole run, so that the seed noise of a paired difference between
  two DiLoCo variants was as large as the effects the sweeps look for; ``mini`` at 2e-2
  converged on every seed (the noise now measured is on the claims and tuning pages).
  On ``"accelerator"``: the ``base`` preset (7 M parameters, bfloat16 compute by the
  backend's default) on the trainer's default language, 16 × 64 tokens per replica,
  1,500 steps.

  Args:
    scale: one of :data:`SCALES`.
    **changes: fields to change (names as in :func:`~analysis.lab.sweeps.grid`).

  Returns:
    A TrainConfig.
  """
  # Imported here: diloco_core.train pulls in JAX, which the docs configure first.
  from diloco_core.data.sources import DataConfig
  from diloco_core.train import TrainConfig
  check_choice("scale", scale, SCALES)
  if scale == "cpu":
    algo = DiLoCoConfig(algorithm="diloco", replicas=4, sync_every=24, outer_lr=0.5)
    base = TrainConfig(
        algo=algo, data=DataConfig(vocab_size=8), model="mini", batch_size=8, seq_len=32,
        steps=1200, inner_lr=2e-2, eval_every=100, log_every=20, progress=False)
  else:
    algo = DiLoCoConfig(algorithm="diloco", replicas=4, sync_every=24)
    base = TrainConfig(
        algo=algo, model="base", batch_size=16, seq_len=64, steps=1500, inner_lr=3e-3,
        eval_every=100, log_every=20, progress=False)
  return with_values(base, changes) if changes else base


def seeds(scale: str, minimum: int = 0) -> list[int]:
  """Model seeds per configuration: two on CPU (what the docs build can afford on 2 cores:
  a mean and a spread), three on an accelerator (a median and a spread), and at least
  ``minimum`` at either scale.

  Examples:
    >>> seeds("cpu"), seeds("cpu", minimum=3)
    ([0, 1], [0, 1, 2])
  """
  check_choice("scale", scale, SCALES)
  return list(range(max(2 if scale == "cpu" else 3, minimum)))


#: Seeds of every arm of the claims experiment (paired: the same seeds in every arm).
CLAIM_SEEDS = 8
#: Inner steps of the claims runs and of the H × M and outer-LR sweeps: twice the other sweeps'
#: 1,200, so that DiLoCo, which converges more slowly than DP per step, is near convergence too
#: (100 outer steps at H = 24). At 1,200 steps a seed of M = 2 or H = 96 was still on a slow
#: path to the floor, which made those two sweeps' seed noise as large as their effects.
CLAIM_STEPS = 2400


def long_base(scale: str = "cpu"):
  """:func:`base_config` with :data:`CLAIM_STEPS` steps on CPU (as is on an accelerator): the
  base of the claims and of the H × M and outer-LR sweeps."""
  return base_config(scale, steps=CLAIM_STEPS) if scale == "cpu" else base_config(scale)


def methods_configs(scale: str = "cpu") -> list:
  """DP vs DiLoCo vs Streaming DiLoCo, one seed: the main job's runs (``make demo``).

  CPU: exactly what ``python -m diloco_core.compare`` trains on CPU
  (:func:`diloco_core.run.main_job.default_configs`): the ``small`` preset on the V = 16 language,
  M = 4 × 8 sequences × 32 tokens, 1,500 steps, H = 30 (50 outer steps), Streaming P = 5, τ = 1.
  Accelerator: the ``base`` preset (L = 8), 3,000 steps, H = 30, P = 5, τ = 1.
  """
  from diloco_core.run import main_job
  from diloco_core.devices.backend import default_demo_steps
  if scale == "cpu":
    runs = main_job.default_configs(steps=default_demo_steps("cpu"))
  else:
    runs = main_job.default_configs(steps=default_demo_steps("gpu"), model="base", seq_len=64)
  return [dataclasses.replace(c, out=None, progress=False, overwrite=False) for c in runs.values()]


def claims_arms(scale: str = "cpu") -> dict[str, Any]:
  """The arms of the claims experiment (docs/claims.md), by name; each is trained with
  :data:`CLAIM_SEEDS` seeds. Around :func:`base_config` with :data:`CLAIM_STEPS` steps on CPU
  (DiLoCo, M = 4, H = 24, η = 0.5):

  ``dp``; ``diloco``; ``replica`` (``diloco`` with ``eval_replicas``: the last step merges
  nothing, so replica 0 can be evaluated beside the global params); ``streaming`` (P = 3,
  τ = 0) and ``tau1`` / ``tau5`` (τ = 1, 5 with α = 0.5); ``e3m0`` (4-bit pseudo-gradients);
  ``h6`` / ``h12`` / ``h48``; ``m1`` / ``m2`` (M = 1, 2 at DP's global batch of 32 sequences);
  ``delayed`` / ``eager`` (whole outer step overlapped); ``eta_h{12,48}_{η}``, the outer-LR
  grid η ∈ {0.1, 0.3, 0.5, 0.7, 0.9, 1.2} at H = 12 and H = 48.
  """
  base = long_base(scale)
  b = base.batch_size * base.algo.replicas  # DP's global batch, kept fixed over M
  arms = {
      "dp": {"algorithm": "dp"},
      "diloco": {},
      "replica": {"eval_replicas": True},
      "streaming": {"fragments": 3, "overlap": 0},
      "tau1": {"fragments": 3, "overlap": 1, "alpha": 0.5},
      "tau5": {"fragments": 3, "overlap": 5, "alpha": 0.5},
      "e3m0": {"compression": "e3m0"},
      "h6": {"sync_every": 6}, "h12": {"sync_every": 12}, "h48": {"sync_every": 48},
      "m1": {"replicas": 1, "batch_size": b}, "m2": {"replicas": 2, "batch_size": b // 2},
      "delayed": {"outer_overlap": "delayed"}, "eager": {"outer_overlap": "eager"},
  }
  for h in (12, 48):
    for eta in (0.1, 0.3, 0.5, 0.7, 0.9, 1.2):
      arms[f"eta_h{h}_{eta:g}"] = {"sync_every": h, "outer_lr": eta}
  return {name: with_values(base, changes) if changes else base for name, changes in arms.items()}


def claims_configs(scale: str = "cpu") -> list:
  """Every run of the claims experiment: each distinct arm config × :data:`CLAIM_SEEDS` seeds
  (arms with the same config, e.g. ``h12`` and ``eta_h12_0.5``, are one set of runs)."""
  out, seen = [], set()
  for cfg in claims_arms(scale).values():
    marker = repr(cfg)
    if marker in seen:
      continue
    seen.add(marker)
    out += grid(cfg, seed=list(range(CLAIM_SEEDS)))
  return out


def _three_methods(base, fragments: int, overlap: int = 1) -> list:
  return [with_values(base, {"algorithm": "dp"}), base,
          with_values(base, {"algorithm": "streaming", "fragments": fragments, "overlap": overlap})]


#: The docs sweeps by name, each a function of the scale that returns its configs.
SWEEPS: dict[str, Any] = {}


def _register(name):
  def deco(fn):
    SWEEPS[name] = fn
    return fn
  return deco


@_register("methods")
def _methods(scale):
  return methods_configs(scale)


@_register("claims")
def _claims(scale):
  return claims_configs(scale)


@_register("non_iid")
def _non_iid(scale):
  """The three methods on i.i.d. and non-i.i.d. shards (mini; Streaming P = 3, τ = 1; one seed)."""
  out = []
  for dist in ("iid", "non-iid"):
    for seed in seeds(scale)[:1]:
      out += _three_methods(base_config(scale, distribution=dist, seed=seed), fragments=3)
  return out


@_register("h_m")
def _h_m(scale):
  """DiLoCo over H ∈ {6, 24, 96} × M ∈ {2, 4, 8}, and DP for each M (:data:`CLAIM_STEPS` on CPU)."""
  base = long_base(scale)
  dp = grid(base, {"algorithm": ["dp"], "replicas": [2, 4, 8], "seed": seeds(scale)})
  return dp + grid(base, replicas=[2, 4, 8], sync_every=[6, 24, 96], seed=seeds(scale))


@_register("outer_lr")
def _outer_lr(scale):
  """Outer LR η ∈ {0.1, 0.3, 0.7, 1.2} (inside and on both sides of MaxText's advice, 0.3–0.9)
  × the base run's inner LR halved, as is, and doubled (H = 24; :data:`CLAIM_STEPS` on CPU)."""
  base = long_base(scale)
  inner = [base.inner_lr * f for f in (0.5, 1.0, 2.0)]
  return grid(base, inner_lr=inner, outer_lr=[0.1, 0.3, 0.7, 1.2], seed=seeds(scale))


def streaming_base(scale: str = "cpu"):
  """Streaming sweeps need layers to split: ``mini`` with L = 4 (P ∈ {1, 2, 3, 5}), H = 30."""
  if scale == "cpu":
    return base_config(scale, n_layers=4, sync_every=30)
  return base_config(scale, sync_every=30)  # small: L = 4 already


@_register("streaming")
def _streaming(scale):
  """P ∈ {1, 2, 3, 5} (strided, and sequential for P = 3); τ ∈ {0, 1, 5, 10} × α ∈ {0, 0.5} at P = 5."""
  base = streaming_base(scale)
  out = grid(base, fragments=[1, 2, 3, 5], seed=seeds(scale))
  out += grid(base, fragments=[3], fragment_pattern=["sequential"], seed=seeds(scale))
  for cfg in grid(base, fragments=[5], overlap=[0, 1, 5, 10], alpha=[0.0, 0.5],
                  seed=seeds(scale)):
    if cfg not in out:
      out.append(cfg)
  return out


@_register("heuristic_hp")
def _heuristic_hp(scale):
  """MaxText's "H = P = L + 1" against other (H, P) with L = 4, τ = 0, and DP."""
  base = streaming_base(scale)
  pairs = [(5, 1), (5, 5), (10, 1), (10, 2), (10, 5), (30, 5)]
  out = grid(base, {"algorithm": ["dp"], "seed": seeds(scale)})
  for h, p in pairs:
    out += grid(base, sync_every=[h], fragments=[p], seed=seeds(scale))
  return out


@_register("compression")
def _compression(scale):
  """Wire formats none / bf16 / fp8 / fp4 / e3m0, with and without error feedback (H = 24)."""
  base = base_config(scale)
  out = []
  for fmt in ("none", "bf16", "fp8", "fp4", "e3m0"):
    for ef in ((False,) if fmt == "none" else (False, True)):
      out += grid(base, compression=[fmt], error_feedback=[ef], seed=seeds(scale))
  return out


@_register("outer_overlap")
def _outer_overlap(scale):
  """Whole-outer-step overlap none / delayed / eager × M ∈ {2, 4} × H ∈ {10, 50} (DiLoCo),
  three seeds at either scale (the eager-vs-none gap is compared with the seed spread)."""
  return grid(base_config(scale), outer_overlap=["none", "delayed", "eager"], replicas=[2, 4],
              sync_every=[10, 50], seed=seeds(scale, minimum=3))


#: Seeds of the ``overlap_eta`` experiment: the same seeds in every arm (paired); five make a paired
#: 95% interval half as wide as three do (t(0.975, 4)/√5 against t(0.975, 2)/√3), in 60 runs.
OVERLAP_SEEDS = 5
#: The outer LRs of the ``overlap_eta`` grid (at the base run's μ = 0.9); the μ = 0 control runs
#: at the last (no overlap's tuned η, :func:`base_config`).
OVERLAP_ETAS = (0.1, 0.3, 0.5)
#: The whole-outer-step overlap modes (``--outer-overlap``), in the order the pages show them.
OVERLAP_MODES = ("none", "delayed", "eager")


def overlap_grid(mode: str, momentum: float = 0.9) -> str:
  """The common start of the names of one mode's arms of :func:`overlap_eta_arms` at one outer
  momentum (its outer-LR grid, :func:`analysis.lab.claims.eta_arms`).

  Examples:
    >>> overlap_grid("eager"), overlap_grid("delayed", momentum=0.0)
    ('eager_eta_', 'delayed_mu0_eta_')
  """
  return f"{mode}{'' if momentum == 0.9 else f'_mu{momentum:g}'}_eta_"


def overlap_arm(mode: str, eta: float, momentum: float = 0.9) -> str:
  """The name of an arm of :func:`overlap_eta_arms`: :func:`overlap_grid`, then η.

  Examples:
    >>> overlap_arm("eager", 0.3), overlap_arm("delayed", 0.5, momentum=0.0)
    ('eager_eta_0.3', 'delayed_mu0_eta_0.5')
  """
  return f"{overlap_grid(mode, momentum)}{eta:g}"


def overlap_eta_arms(scale: str = "cpu") -> dict[str, Any]:
  """The arms of the ``overlap_eta`` experiment by name (:func:`overlap_arm`): each overlap mode
  (:data:`OVERLAP_MODES`) at every outer LR of :data:`OVERLAP_ETAS` with the base run's outer
  momentum μ = 0.9, so that each mode can be compared at its own best η (no mode held to another
  mode's tuning); and each mode with μ = 0 at η = 0.5, a control:
  a one-sync-delayed outer step is stable on a quadratic for η·λ < 1 without momentum but only
  below about 0.25 with μ = 0.9 (:func:`analysis.lab.delay_stability.stability_limit`), so at
  no overlap's η the delayed mode should train without momentum and not with it.

  Around :func:`base_config` (M = 4, 1,200 steps) with H = 30, the eager-updates paper's H
  (40 outer steps).
  """
  base = base_config(scale, sync_every=30)
  arms = {}
  for mode in OVERLAP_MODES:
    for eta in OVERLAP_ETAS:
      arms[overlap_arm(mode, eta)] = with_values(base, {"outer_overlap": mode, "outer_lr": eta})
    arms[overlap_arm(mode, OVERLAP_ETAS[-1], 0.0)] = with_values(
        base, {"outer_overlap": mode, "outer_lr": OVERLAP_ETAS[-1], "outer_momentum": 0.0})
  return arms


@_register("overlap_eta")
def _overlap_eta(scale):
  """:func:`overlap_eta_arms` × :data:`OVERLAP_SEEDS` paired seeds."""
  out = []
  for cfg in overlap_eta_arms(scale).values():
    out += grid(cfg, seed=list(range(OVERLAP_SEEDS)))
  return out


#: Seeds of the two paired comparisons of the methods of 2025-26 (the ``inner_optimizer`` and
#: ``sparse`` experiments): the same seeds in every arm, so each difference is taken seed by seed.
PAIRED_SEEDS = 6
#: The top-k setting of the ``sparse`` experiment on the ``mini`` preset: 8 of every 256
#: entries (3.1%, SparseLoCo's 1-3% range; the preset's tensors are smaller than 4,096).
SPARSE_TOPK, SPARSE_CHUNK = 8, 256


@_register("inner_optimizer")
def _inner_optimizer(scale):
  """AdamW vs Muon inside (MuLoCo, arXiv 2505.23725), for DP and DiLoCo at equal steps and the
  same inner LR (Muon at AdamW's update RMS), :data:`PAIRED_SEEDS` paired seeds."""
  return grid(base_config(scale), algorithm=["dp", "diloco"], inner_optimizer=["adamw", "muon"],
              seed=list(range(PAIRED_SEEDS)))


def sparse_arms(scale: str = "cpu") -> dict[str, Any]:
  """The arms of the ``sparse`` experiment by name, around :func:`base_config` (DiLoCo, H = 24):
  ``dense`` (float32), ``e3m0+EF`` (4-bit, error feedback), ``topk`` and ``topk+EF`` (top-8 of
  256 with e3m0 values), and ``sparseloco`` (``topk+EF`` with the residual decayed by β = 0.95
  and an outer SGD without momentum at η = 1, SparseLoCo's recipe: the decayed residual in
  place of the outer momentum)."""
  base = base_config(scale)
  topk = {"topk": SPARSE_TOPK, "topk_chunk": SPARSE_CHUNK, "compression": "e3m0"}
  arms = {
      "dense": {},
      "e3m0+EF": {"compression": "e3m0", "error_feedback": True},
      "topk": topk,
      "topk+EF": {**topk, "error_feedback": True},
      "sparseloco": {**topk, "error_feedback": True, "error_feedback_decay": 0.95,
                     "outer_optimizer": "sgd", "outer_momentum": 0.0, "outer_lr": 1.0},
  }
  return {name: with_values(base, changes) if changes else base for name, changes in arms.items()}


@_register("sparse")
def _sparse(scale):
  """:func:`sparse_arms` × :data:`PAIRED_SEEDS` paired seeds."""
  out = []
  for cfg in sparse_arms(scale).values():
    out += grid(cfg, seed=list(range(PAIRED_SEEDS)))
  return out


@_register("stragglers")
def _stragglers(scale):
  """One replica two times slower, the syncer's settings at equal total local steps
  (:mod:`analysis.lab.straggler_arms`) × its paired seeds; ``K=4`` is ``sync``'s runs."""
  from analysis.lab.straggler_arms import STRAGGLER_SEEDS, straggler_arms  # here: it imports the trainer's config
  out, seen = [], set()
  for cfg in straggler_arms(base_config(scale)).values():
    if repr(cfg) not in seen:
      seen.add(repr(cfg))
      out += grid(cfg, seed=list(range(STRAGGLER_SEEDS)))
  return out


def named_sweep(name: str, scale: str = "cpu") -> list:
  """The configs of one docs sweep (see :data:`SWEEPS`) at a scale.

  Examples:
    >>> len(named_sweep("compression"))  # 9 (format, error feedback) pairs x 2 seeds
    18
  """
  check_choice("sweep", name, sorted(SWEEPS))
  return SWEEPS[name](scale)
