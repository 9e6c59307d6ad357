"""Sharding benchmark: the same global work on 1 device and on 8 (fake CPU) devices.

Prints seconds per step of DiLoCo (M = 8, H = 50) on a one-device mesh and on meshes
(diloco=8, data=1), (diloco=4, data=2), (diloco=2, data=4), and the ratio to the one-device
time. On a real 8-chip host the ratio should approach 1/8; on fake CPU devices that share
two cores it stays near or above 1, and what it is for is catching regressions: an extra
all-gather or a replicated optimizer state shows up as a jump in the ratio. Not a test.

Usage: python benchmarks/mesh_scaling.py [--steps 30]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from diloco_core import DiLoCo, DiLoCoConfig, get_preset, init_model, lm_loss  # noqa: E402
from diloco_core.devices.mesh import make_mesh  # noqa: E402


def step_time(mesh_shape, steps, replicas=8, batch=8, seq=64, model="small"):
  cfg = get_preset(model)
  apply_fn, params = init_model(cfg, 0)
  algo = DiLoCo(lambda p, x: lm_loss(apply_fn, p, x), optax.adamw(1e-3),
                DiLoCoConfig(replicas=replicas, sync_every=50), mesh=make_mesh(mesh_shape))
  state = algo.init(params)
  rng = np.random.default_rng(0)
  batches = [algo.place_batch(rng.integers(0, cfg.vocab_size, (replicas, batch, seq + 1)).astype(np.int32))
             for _ in range(2)]
  state, m = algo.step(state, batches[0])
  jax.block_until_ready(m)
  t0 = time.perf_counter()
  for i in range(steps):
    state, m = algo.step(state, batches[i % 2])
  jax.block_until_ready((state, m))
  return (time.perf_counter() - t0) / steps


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=30)
  args = p.parse_args()
  print(f"devices: {jax.device_count()} x {jax.devices()[0].platform}; DiLoCo M=8, 8 x 64 tokens per replica")
  base = step_time(None, args.steps)
  print(f"{'mesh':24s} {'s/step':>9s} {'ratio to 1 device':>18s}")
  print(f"{'1 device':24s} {base:9.4f} {1.0:18.3f}")
  for shape in ({"diloco": 8, "data": 1}, {"diloco": 4, "data": 2}, {"diloco": 2, "data": 4}):
    t = step_time(shape, args.steps)
    name = f"diloco={shape['diloco']},data={shape['data']}"
    print(f"{name:24s} {t:9.4f} {t / base:18.3f}")


if __name__ == "__main__":
  main()
