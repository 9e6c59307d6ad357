"""The named sweeps behind the docs and notebooks, at two scales (a registry of configs).

Each sweep is a function of the scale (:data:`SCALES`) that returns a list of
``TrainConfig``; :func:`named_sweep` looks one up, :func:`analysis.sweeps.run_sweep` trains
it (or reads it from the cache). :func:`base_config` is the run every sweep varies around.
"""

from __future__ import annotations

from typing import Any

from analysis.sweeps import grid
from analysis.sweeps import with_values
from diloco_core.config import DiLoCoConfig
from diloco_core.validity import check_choice

#: The two sizes of the docs sweeps, ``"cpu"`` (what the docs build runs on 2 CPU cores)
#: and ``"accelerator"`` (a larger setting the notebooks pick on a TPU or GPU).
SCALES = ("cpu", "accelerator")


def base_config(scale: str = "cpu", **changes):
  """The run every docs sweep varies around.

  On ``"cpu"``: the ``tiny`` preset (L = 2) on the synthetic language with V = 16
  (order 2, 4 successors per context), M = 4 replicas × 8 sequences × 32 tokens,
  600 inner steps, peak inner LR 1e-2, DiLoCo with H = 24 and the default outer
  optimizer. Compilation, not training, dominates such a run (a few seconds each).
  On ``"accelerator"``: the ``base`` preset (7 M parameters, bfloat16 compute by the
  backend's default) on the trainer's default language, 16 × 64 tokens per replica,
  1,500 steps.

  Args:
    scale: one of :data:`SCALES`.
    **changes: fields to change (names as in :func:`~analysis.sweeps.grid`).

  Returns:
    A TrainConfig.
  """
  # Imported here: diloco_core.train pulls in JAX, which the docs configure first.
  from diloco_core.data import DataConfig
  from diloco_core.train import TrainConfig
  check_choice("scale", scale, SCALES)
  algo = DiLoCoConfig(algorithm="diloco", replicas=4, sync_every=24)
  if scale == "cpu":
    base = TrainConfig(
        algo=algo, data=DataConfig(vocab_size=16), model="tiny", batch_size=8, seq_len=32,
        steps=600, inner_lr=1e-2, eval_every=100, log_every=20, progress=False)
  else:
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


def methods_configs(scale: str = "cpu") -> list:
  """DP vs DiLoCo vs Streaming DiLoCo, one seed, on the larger model of the scale.

  CPU: the ``small`` preset (L = 4) on the V = 16 language, 400 steps (evaluated every
  20), M = 4, H = 20, Streaming with P = 5 (one fragment every 4 steps) and τ = 1. Accelerator: the ``base``
  preset (L = 8), 2,000 steps, H = 40, P = 5, τ = 1.
  """
  if scale == "cpu":
    base = base_config(scale, model="small", steps=400, sync_every=20, eval_every=20)
  else:
    base = base_config(scale, model="base", steps=2000, sync_every=40, eval_every=50)
  return [with_values(base, {"algorithm": "dp"}),
          with_values(base, {"algorithm": "diloco"}),
          with_values(base, {"algorithm": "streaming", "fragments": 5, "overlap": 1})]


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


@_register("non_iid")
def _non_iid(scale):
  """The three methods on i.i.d. and non-i.i.d. shards (tiny; Streaming P = 3, τ = 1; one seed)."""
  out = []
  for dist in ("iid", "non-iid"):
    for seed in seeds(scale)[:1]:
      out += _three_methods(base_config(scale, distribution=dist, seed=seed), fragments=3)
  return out


@_register("h_m")
def _h_m(scale):
  """DiLoCo over H ∈ {6, 24, 96} × M ∈ {2, 4, 8}, and DP for each M."""
  base = base_config(scale)
  dp = grid(base, {"algorithm": ["dp"], "replicas": [2, 4, 8], "seed": seeds(scale)})
  return dp + grid(base, replicas=[2, 4, 8], sync_every=[6, 24, 96], seed=seeds(scale))


@_register("outer_lr")
def _outer_lr(scale):
  """Outer LR η ∈ {0.1, 0.3, 0.7, 1.2} × inner LR ∈ {3e-3, 1e-2, 3e-2} (H = 24): inside and
  on both sides of MaxText's advice (0.3–0.9)."""
  base = base_config(scale)
  inner = [1e-3, 3e-3, 1e-2] if scale == "accelerator" else [3e-3, 1e-2, 3e-2]
  return grid(base, inner_lr=inner, outer_lr=[0.1, 0.3, 0.7, 1.2], seed=seeds(scale))


def streaming_base(scale: str = "cpu"):
  """Streaming sweeps need layers to split: ``tiny`` with L = 4 (P ∈ {1, 2, 3, 5}), H = 30."""
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


def named_sweep(name: str, scale: str = "cpu") -> list:
  """The configs of one docs sweep (see :data:`SWEEPS`) at a scale.

  Examples:
    >>> len(named_sweep("compression"))  # 9 (format, error feedback) pairs x 2 seeds
    18
  """
  check_choice("sweep", name, sorted(SWEEPS))
  return SWEEPS[name](scale)
