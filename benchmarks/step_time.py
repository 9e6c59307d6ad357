"""Step-time benchmark: plain optax loop vs DP vs DiLoCo, measured in one run.

Prints tokens/s of each and the ratio (DiLoCo step time) / (M x plain step time), whose
target is <= 1.05: DiLoCo's M replicas should cost no more than M independent models.
Also prints the time per token of the ``moe-small`` MoE against the dense ``small`` (about
the same active params), and Streaming's compile time and step time for P in {2, 5, 9, 13, 25} on a
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
from diloco_core.algorithm.phases import inner_update  # noqa: E402
from diloco_core.model.transformer import train_loss  # noqa: E402
from diloco_core.spec.model_config import flops_per_token, param_count  # noqa: E402


def bench_algorithms(model: str, batch: int, seq: int, steps: int, replicas_list=(2, 4), sync_every=50,
                     repeats=3):
  """Seconds per step of each run: the minimum over ``repeats`` interleaved rounds."""
  cfg = get_preset(model)
  apply_fn, params = init_model(cfg, 0)
  loss_fn = lambda p, x: lm_loss(apply_fn, p, x)
  opt = optax.adamw(1e-3)
  rng = np.random.default_rng(0)
  tokens = lambda *shape: rng.integers(0, cfg.vocab_size, size=shape).astype(np.int32)

  plain = jax.jit(lambda s, x: (lambda p, o, l, _: ((p, o), l))(*inner_update(loss_fn, opt, s[0], s[1], x)),
                  donate_argnums=0)
  runs = {"plain optax loop (1 model)": (1, plain, (jax.tree.map(jnp.copy, params), opt.init(params)),
                                         [jnp.asarray(tokens(batch, seq + 1)) for _ in range(4)])}
  for M in replicas_list:
    for name, algo in ((f"DP M={M}", DataParallel(loss_fn, opt, DiLoCoConfig(algorithm="dp", replicas=M))),
                       (f"DiLoCo M={M} H={sync_every}",
                        DiLoCo(loss_fn, opt, DiLoCoConfig(replicas=M, sync_every=sync_every)))):
      state = algo.init(params)
      runs[name] = (M, algo.step, state, [algo.place_batch(tokens(M, batch, seq + 1)) for _ in range(4)])
  best = _best_times(runs, steps, repeats)
  plain_t = best["plain optax loop (1 model)"]
  return [(name, M, best[name], M * batch * seq / best[name], None if M == 1 else best[name] / (M * plain_t))
          for name, (M, *_rest) in runs.items()]


def bench_moe(batch: int, seq: int, steps: int, repeats=3):
  """The plain optax loop on ``small`` and on ``moe-small`` (8 experts, top-2, about the same
  active params): seconds per step, tokens/s and analytic FLOPs per token of each."""
  rng = np.random.default_rng(0)
  runs = {}
  for model in ("small", "moe-small"):
    cfg = get_preset(model)
    apply_fn, params = init_model(cfg, 0)
    loss_fn = functools.partial(train_loss, apply_fn)
    opt = optax.adamw(1e-3)
    step = jax.jit(lambda s, x, loss_fn=loss_fn, opt=opt:
                   (lambda p, o, l, _: ((p, o), l))(*inner_update(loss_fn, opt, s[0], s[1], x)),
                   donate_argnums=0)
    xs = [jnp.asarray(rng.integers(0, cfg.vocab_size, size=(batch, seq + 1)).astype(np.int32))
          for _ in range(4)]
    runs[model] = (cfg, step, (jax.tree.map(jnp.copy, params), opt.init(params)), xs)
  best = _best_times(runs, steps, repeats)
  return [(name, param_count(cfg), param_count(cfg, active=True), flops_per_token(cfg, seq), best[name],
           batch * seq / best[name]) for name, (cfg, *_rest) in runs.items()]


def _best_times(runs: dict, steps: int, repeats: int) -> dict:
  """Seconds per step of each run ``name -> (tag, step, state, batches)``: the minimum over
  ``repeats`` interleaved rounds (each run's state is carried from round to round)."""
  best = {name: float("inf") for name in runs}
  for _ in range(repeats):
    for name, (tag, step, state, xs) in runs.items():
      t, state = _time_state(step, state, xs, steps)
      runs[name] = (tag, step, state, xs)
      best[name] = min(best[name], t)
  return best


def _time_state(step, state, batches, steps):
  state, out = step(state, batches[0])
  jax.block_until_ready(out)
  t0 = time.perf_counter()
  for i in range(steps):
    state, out = step(state, batches[(i + 1) % len(batches)])
  jax.block_until_ready((state, out))
  return (time.perf_counter() - t0) / steps, state


def bench_streaming_compile(steps: int, fragments=(2, 5, 9, 13, 25), layers=24, replicas=2, repeats=3):
  """Compile time (trace + lower + XLA compile) and step time per P, on one 24-layer model.

  Step times are the minimum over ``repeats`` interleaved rounds (vanilla, P=2, ..., P=25,
  then again), so that load from other processes hits every setting alike.
  """
  cfg = dataclasses.replace(get_preset("small"), n_layers=layers)  # width 64, 24 layers
  apply_fn, params = init_model(cfg, 0)
  loss_fn = lambda p, x: lm_loss(apply_fn, p, x)
  opt = optax.adamw(1e-3)
  H = int(np.lcm.reduce(fragments))  # a multiple of every P (5850 for the default list)
  rng = np.random.default_rng(0)
  host = [rng.integers(0, cfg.vocab_size, size=(replicas, 8, 33)).astype(np.int32) for _ in range(4)]
  runs = {"vanilla P=1": DiLoCoConfig(replicas=replicas, sync_every=H)}
  for P in fragments:
    runs[f"streaming P={P}"] = DiLoCoConfig(algorithm="streaming", replicas=replicas, sync_every=H, fragments=P)
  compiled, states, compile_s = {}, {}, {}
  for name, c in runs.items():
    algo = DiLoCo(loss_fn, opt, c, layer_mask=layer_mask(params))
    state = algo.init(params)
    xs = [algo.place_batch(x) for x in host]
    t0 = time.perf_counter()
    exe = algo.lower(state, xs[0]).compile()
    compile_s[name] = time.perf_counter() - t0
    compiled[name], states[name] = (lambda s, b, exe=exe, algo=algo: exe(*algo.step_args(s, b)), xs), state
  best = {name: float("inf") for name in runs}
  for _ in range(repeats):
    for name, (exe, xs) in compiled.items():
      t, states[name] = _time_state(exe, states[name], xs, steps)
      best[name] = min(best[name], t)
  return [(name, compile_s[name], best[name]) for name in runs]


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=30)
  p.add_argument("--model", default="small")
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--seq", type=int, default=64)
  args = p.parse_args()
  print(f"devices: {jax.devices()[0].platform} x {jax.device_count()}")
  print(f"\n== step time, model={args.model}, per-replica batch {args.batch} x {args.seq} tokens ==")
  print(f"{'run':32s} {'s/step':>10s} {'tokens/s':>12s} {'step/(M x plain)':>18s}")
  for name, M, t, tps, ratio in bench_algorithms(args.model, args.batch, args.seq, args.steps):
    print(f"{name:32s} {t:10.5f} {tps:12,.0f} {'' if ratio is None else f'{ratio:18.3f}'}")
  print(f"\n== MoE vs dense, plain optax loop, batch {args.batch} x {args.seq} tokens ==")
  print(f"{'model':12s} {'params':>10s} {'active':>10s} {'FLOPs/token':>12s} {'s/step':>10s} {'tokens/s':>12s}")
  moe = bench_moe(args.batch, args.seq, args.steps)
  for name, total, active, flops, t, tps in moe:
    print(f"{name:12s} {total:10,d} {active:10,d} {flops:12.4g} {t:10.5f} {tps:12,.0f}")
  (_, _, _, f_dense, t_dense, _), (_, _, _, f_moe, t_moe, _) = moe
  print(f"moe-small / small time per token = {t_moe / t_dense:.3f} (active FLOPs ratio {f_moe / f_dense:.3f};"
        " the dense dispatch computes every expert)")
  print("\n== streaming: compile time and step time vs P (24 layers of width 64, M=2, no send in the timed steps' H) ==")
  rows = bench_streaming_compile(args.steps)
  print(f"{'run':20s} {'compile (s)':>12s} {'s/step (min)':>13s}")
  for name, c, t in rows:
    print(f"{name:20s} {c:12.3f} {t:13.5f}")
  comp = {n: c for n, c, _ in rows}
  step = {n: t for n, _, t in rows}
  print(f"compile(P=25) / compile(P=2) = {comp['streaming P=25'] / comp['streaming P=2']:.3f}  (target <= 1.5)")
  worst = max(step[n] for n in step if n.startswith("streaming"))
  print(f"max streaming step / vanilla step = {worst / step['vanilla P=1']:.3f}  (target <= 1.05)")


if __name__ == "__main__":
  main()
