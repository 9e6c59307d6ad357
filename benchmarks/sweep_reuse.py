"""Sweep benchmark: runs that differ only in hyperparameters share one compiled step.

Trains the same small grids twice in one process: over H, the outer learning rate η and
the outer momentum μ, then over the inner learning rate, τ and α (Streaming), once with the
program cache of :func:`diloco_core.train.train` (the hyperparameters are traced inputs,
so the grid compiles once) and once with the cache cleared before every run (each run
compiles, as it would if H, τ, η, μ, α and the learning rate were baked-in constants). JAX's
persistent compilation cache is off in both. Prints seconds per run, compile seconds per
run and the ratios measured in this run; the target is a compile-time ratio well below
1 / 2. Not a test: the numbers are measured, never asserted.

Usage: python benchmarks/sweep_reuse.py [--steps 40]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("TQDM_DISABLE", "1")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from diloco_core import DataConfig, DiLoCoConfig  # noqa: E402
from diloco_core.train import TrainConfig, clear_program_cache, train  # noqa: E402


def grids(steps: int):
  """Two grids of runs differing only in hyperparameters."""
  base = TrainConfig(model="tiny", steps=steps, batch_size=4, seq_len=32, eval_every=steps,
                     log_every=10, progress=False, data=DataConfig(vocab_size=32))
  diloco = [dataclasses.replace(base, algo=DiLoCoConfig(sync_every=h, outer_lr=lr,
                                                        outer_momentum=mu))
            for h in (5, 10) for lr in (0.5, 0.9) for mu in (0.0, 0.9)]
  stream = [dataclasses.replace(base, inner_lr=ilr, algo=DiLoCoConfig(
      algorithm="streaming", sync_every=10, fragments=2, overlap=tau, alpha=a))
            for ilr in (1e-3, 3e-3) for tau in (0, 1) for a in (0.0, 0.5)]
  return {"DiLoCo: H x eta x mu (8 runs)": diloco,
          "Streaming: inner LR x tau x alpha (8 runs)": stream}


def run_grid(configs, reuse: bool):
  """(seconds per run, compile seconds per run, final losses) for one pass over the grid."""
  clear_program_cache()
  total, compile_s, losses = 0.0, 0.0, []
  for cfg in configs:
    if not reuse:
      clear_program_cache()
    t0 = time.perf_counter()
    res = train(cfg)
    total += time.perf_counter() - t0
    compile_s += res.summary["compile_time_s"]
    losses.append(res.summary["final_eval_loss"])
  n = len(configs)
  return total / n, compile_s / n, losses


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=40)
  args = p.parse_args()
  print(f"{'grid':40s} {'mode':>10s} {'s/run':>8s} {'compile s/run':>14s}")
  for name, configs in grids(args.steps).items():
    cold = run_grid(configs, reuse=False)
    warm = run_grid(configs, reuse=True)
    for mode, r in (("recompile", cold), ("shared", warm)):
      print(f"{name:40s} {mode:>10s} {r[0]:8.2f} {r[1]:14.2f}")
    same = cold[2] == warm[2]
    print(f"  shared / recompile: time per run {warm[0] / cold[0]:.3f}, compile per run"
          f" {warm[1] / cold[1]:.3f}; final losses identical: {same}")


if __name__ == "__main__":
  main()
