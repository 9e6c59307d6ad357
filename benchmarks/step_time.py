"""Step-time benchmark: plain optax loop vs DP vs DiLoCo, measured in one run.

Prints tokens/s of each and the ratio (DiLoCo step time) / (M x plain step time), whose
target is <= 1.05: DiLoCo's M replicas should cost no more than M independent models.
Also prints Streaming's compile time and step time for P in {2, 5, 9, 13, 25} on a
24-layer model (targets: compile(P=25) / compile(P=2) <= 1.5, streaming step <= 1.05 x
vanilla step at the same H). Not a test: the numbers are measured, never asserted.

Usage: python benchmarks/step_time.py [--steps 100] [--quick]
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import sys
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from diloco_core import DataParallel, DiLoCo, DiLoCoConfig, get_preset, init_model, layer_mask, lm_loss  # noqa: E402
from diloco_core.diloco import inner_update  # noqa: E402


def _time(step, state, batches, steps):
  """Seconds per step after a warm-up step (compile excluded), and the compile+first step time."""
  t0 = time.perf_counter()
  state, out = step(state, batches[0])
  jax.block_until_ready(out)
  first = time.perf_counter() - t0
  t0 = time.perf_counter()
  for i in range(steps):
    state, out = step(state, batches[(i + 1) % len(batches)])
  jax.block_until_ready((state, out))
  return (time.perf_counter() - t0) / steps, first


def bench_algorithms(model: str, batch: int, seq: int, steps: int, replicas_list=(2, 4), sync_every=50):
  cfg = get_preset(model)
  apply_fn, params = init_model(cfg, 0)
  loss_fn = lambda p, x: lm_loss(apply_fn, p, x)
  opt = optax.adamw(1e-3)
  rng = np.random.default_rng(0)
  tokens = lambda *shape: jnp.asarray(rng.integers(0, cfg.vocab_size, size=shape), jnp.int32)

  plain = jax.jit(lambda s, x: (lambda p, o, l: ((p, o), l))(*inner_update(loss_fn, opt, s[0], s[1], x)))
  xs = [tokens(batch, seq + 1) for _ in range(4)]
  plain_t, _ = _time(plain, (jax.tree.map(jnp.copy, params), opt.init(params)), xs, steps)
  rows = [("plain optax loop (1 model)", 1, plain_t, batch * seq / plain_t, None)]
  for M in replicas_list:
    xs = [tokens(M, batch, seq + 1) for _ in range(4)]
    dp = DataParallel(loss_fn, opt, DiLoCoConfig(algorithm="dp", replicas=M))
    dp_t, _ = _time(dp.step, dp.init(params), xs, steps)
    rows.append((f"DP M={M}", M, dp_t, M * batch * seq / dp_t, dp_t / (M * plain_t)))
    dl = DiLoCo(loss_fn, opt, DiLoCoConfig(replicas=M, sync_every=sync_every))
    dl_t, _ = _time(dl.step, dl.init(params), xs, steps)
    rows.append((f"DiLoCo M={M} H={sync_every}", M, dl_t, M * batch * seq / dl_t, dl_t / (M * plain_t)))
  return rows


def bench_streaming_compile(steps: int, fragments=(2, 5, 9, 13, 25), layers=24, replicas=2, quick=False):
  cfg = dataclasses.replace(get_preset("tiny"), n_layers=layers)
  apply_fn, params = init_model(cfg, 0)
  loss_fn = lambda p, x: lm_loss(apply_fn, p, x)
  opt = optax.adamw(1e-3)
  H = int(np.lcm.reduce(fragments))  # a multiple of every P (5850 for the default list)
  rng = np.random.default_rng(0)
  xs = [jnp.asarray(rng.integers(0, cfg.vocab_size, size=(replicas, 8, 33)), jnp.int32) for _ in range(4)]
  rows = []
  base = DiLoCo(loss_fn, opt, DiLoCoConfig(replicas=replicas, sync_every=H))
  van_t, van_c = _time(base.step, base.init(params), xs, steps)
  rows.append(("vanilla P=1", van_c, van_t))
  for P in fragments:
    algo = DiLoCo(loss_fn, opt, DiLoCoConfig(algorithm="streaming", replicas=replicas, sync_every=H,
                                             fragments=P), layer_mask=layer_mask(params))
    t, c = _time(algo.step, algo.init(params), xs, steps)
    rows.append((f"streaming P={P}", c, t))
  return rows


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=100)
  p.add_argument("--model", default="small")
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq", type=int, default=64)
  args = p.parse_args()
  print(f"devices: {jax.devices()[0].platform} x {jax.device_count()}")
  print(f"\n== step time, model={args.model}, per-replica batch {args.batch} x {args.seq} tokens ==")
  print(f"{'run':32s} {'s/step':>10s} {'tokens/s':>12s} {'step/(M x plain)':>18s}")
  for name, M, t, tps, ratio in bench_algorithms(args.model, args.batch, args.seq, args.steps):
    print(f"{name:32s} {t:10.5f} {tps:12,.0f} {'' if ratio is None else f'{ratio:18.3f}'}")
  print("\n== streaming: compile time and step time vs P (24 layers, tiny width, M=2) ==")
  rows = bench_streaming_compile(args.steps)
  print(f"{'run':20s} {'compile+1st (s)':>16s} {'s/step':>10s}")
  for name, c, t in rows:
    print(f"{name:20s} {c:16.3f} {t:10.5f}")
  comp = {n: c for n, c, _ in rows}
  step = {n: t for n, _, t in rows}
  print(f"compile(P=25) / compile(P=2) = {comp['streaming P=25'] / comp['streaming P=2']:.3f}  (target <= 1.5)")
  worst = max(step[n] for n in step if n.startswith("streaming"))
  print(f"max streaming step / vanilla step = {worst / step['vanilla P=1']:.3f}  (target <= 1.05)")


if __name__ == "__main__":
  main()
