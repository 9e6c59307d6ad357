"""Accelerator benchmark: step time, TFLOP/s and MFU of plain, DP, DiLoCo and Streaming steps.

On one device, for the built-in transformer (default: the issue's 336M model, d_model 1024,
16 layers, 16 heads, d_ff 4096, vocab 32768, seq 1024, batch 4 per replica, AdamW):

- plain optax step (one model), DP M=2, DiLoCo M=2 and M=4 (H=10) and Streaming (M=2,
  P=5, τ=1, H=10): ms/step, tokens/s, TFLOP/s and MFU. Each timing covers a multiple of H
  steps, so the syncs are inside it. FLOPs are the analytic count
  (:func:`~diloco_core.flops_per_token`: 6N + attention) times the tokens of all M replicas;
  XLA's own count of the plain step is printed next to it.
- the ratio step / (M x plain step) (target <= 1.02);
- the compiled memory of the plain step with ``remat`` none and block;
- on a GPU, the cost of deterministic ops: the plain step re-timed in a child process with
  ``DILOCO_NONDETERMINISTIC=1`` (n/a elsewhere: CPU and TPU kernels are deterministic).

MFU is against the dense bf16 peak of the chip from :mod:`analysis.planning.hardware`, looked up by
``jax.devices()[0].device_kind`` (n/a on CPU or an unknown chip). Measured, never asserted.

Usage: python benchmarks/accelerator.py [--quick] [--json PATH] [--steps 20] [--d-model 1024 ...]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from diloco_core.devices.backend import configure_determinism  # noqa: E402

DETERMINISTIC = configure_determinism()  # before JAX starts its backend

import jax  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from analysis.planning.hardware import hardware_for_device_kind  # noqa: E402
from diloco_core import DataParallel, DiLoCo, DiLoCoConfig, ModelConfig, flops_per_token  # noqa: E402
from diloco_core import init_model, layer_mask, lm_loss  # noqa: E402
from diloco_core.devices.backend import resolve_model_config  # noqa: E402
from diloco_core.algorithm.phases import inner_update  # noqa: E402

SYNC_EVERY = 10
RUNS = ("plain", "dp2", "diloco2", "diloco4", "streaming2")


def model_config(args) -> ModelConfig:
  return resolve_model_config(ModelConfig(
      vocab_size=args.vocab, d_model=args.d_model, n_layers=args.layers, n_heads=args.heads,
      d_ff=args.d_ff, max_seq_len=args.seq, compute_dtype=args.compute_dtype,
      attention=args.attention, remat=args.remat))


def plain_step(loss_fn, opt):
  """One jitted AdamW step of one model (state donated), returning (state, loss)."""
  def step(state, tokens):
    params, opt_state, loss, _ = inner_update(loss_fn, opt, state[0], state[1], tokens)
    return (params, opt_state), loss
  return jax.jit(step, donate_argnums=0)


def build(name, loss_fn, opt, params, mask):
  """(M, step, state) of one run of :data:`RUNS`."""
  if name == "plain":
    return 1, plain_step(loss_fn, opt), (jax.tree.map(jax.numpy.copy, params), opt.init(params))
  M = int(name[-1])
  if name.startswith("dp"):
    algo = DataParallel(loss_fn, opt, DiLoCoConfig(algorithm="dp", replicas=M))
  elif name.startswith("diloco"):
    algo = DiLoCo(loss_fn, opt, DiLoCoConfig(replicas=M, sync_every=SYNC_EVERY), layer_mask=mask)
  else:
    algo = DiLoCo(loss_fn, opt, DiLoCoConfig(algorithm="streaming", replicas=M, sync_every=SYNC_EVERY,
                                             fragments=5, overlap=1), layer_mask=mask)
  return M, algo, algo.init(params)


def time_run(step, state, batches, steps, repeats):
  """Seconds per step: the best of ``repeats`` rounds of ``steps`` steps (after one warm-up)."""
  state, out = step(state, batches[0])
  jax.block_until_ready(out)
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    for i in range(steps):
      state, out = step(state, batches[i % len(batches)])
    jax.block_until_ready((state, out))
    best = min(best, (time.perf_counter() - t0) / steps)
  return best, state


def compiled_plain(cfg, args, opt):
  """XLA's FLOP count and memory of the plain step, compiled without running it."""
  apply_fn, params = init_model(cfg, 0)
  step = plain_step(lambda p, x: lm_loss(apply_fn, p, x), opt)
  tokens = jax.ShapeDtypeStruct((args.batch, args.seq + 1), jax.numpy.int32)
  compiled = step.lower((params, opt.init(params)), tokens).compile()
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  mem = compiled.memory_analysis()
  gib = lambda b: None if b is None else b / 2**30
  return {"xla_flops": float(cost.get("flops", float("nan"))) if cost else None,
          "temp_gib": gib(getattr(mem, "temp_size_in_bytes", None)),
          "argument_gib": gib(getattr(mem, "argument_size_in_bytes", None)),
          "output_gib": gib(getattr(mem, "output_size_in_bytes", None))}


def bench(args) -> dict:
  cfg = model_config(args)
  device = jax.devices()[0]
  spec = hardware_for_device_kind(device.device_kind)
  apply_fn, params = init_model(cfg, 0)
  loss_fn = lambda p, x: lm_loss(apply_fn, p, x)
  opt = optax.adamw(1e-4)
  flops_tok = flops_per_token(cfg, args.seq)
  rng = np.random.default_rng(0)
  result = {"device_kind": device.device_kind, "platform": device.platform,
            "peak_tflops": None if spec is None else spec.peak_flops / 1e12,
            "deterministic_ops": DETERMINISTIC if device.platform == "gpu" else "n/a", "model": dataclasses.asdict(cfg),
            "batch_per_replica": args.batch, "seq_len": args.seq, "steps": args.steps,
            "flops_per_token": flops_tok, "runs": {}}
  for name in args.runs:
    M, algo, state = build(name, loss_fn, opt, params, layer_mask(params))
    host = [rng.integers(0, cfg.vocab_size, size=(M, args.batch, args.seq + 1)).astype(np.int32)
            for _ in range(2)]
    if M == 1:
      step, batches = algo, [jax.device_put(x[0]) for x in host]
    else:
      step, batches = algo.step, [algo.place_batch(x) for x in host]
    seconds, state = time_run(step, state, batches, args.steps, args.repeats)
    del state
    tokens_s = M * args.batch * args.seq / seconds
    tflops = flops_tok * tokens_s / 1e12
    result["runs"][name] = {"replicas": M, "ms_per_step": 1e3 * seconds, "tokens_per_s": tokens_s,
                            "tflops": tflops,
                            "mfu": None if spec is None else tflops * 1e12 / spec.peak_flops}
  plain = result["runs"].get("plain")
  for r in result["runs"].values():
    r["step_over_M_plain"] = None if plain is None else r["ms_per_step"] / (r["replicas"] * plain["ms_per_step"])
  if args.memory:
    result["plain_compiled"] = {remat: compiled_plain(dataclasses.replace(cfg, remat=remat), args, opt)
                                for remat in ("none", "block")}
  return result


def nondeterministic_cost(argv, plain_ms) -> float | None:
  """On a GPU: plain step time without deterministic ops / with them (a child process)."""
  if jax.default_backend() != "gpu" or plain_ms is None or not DETERMINISTIC:
    return None
  path = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"accel_nondet_{os.getpid()}.json")
  env = dict(os.environ, DILOCO_NONDETERMINISTIC="1",
             XLA_FLAGS=os.environ["XLA_FLAGS"].replace("--xla_gpu_deterministic_ops=true", ""))
  subprocess.run([sys.executable, __file__, *argv, "--runs", "plain", "--no-memory", "--json", path,
                  "--no-determinism-cost"], env=env, check=True, stdout=subprocess.DEVNULL)
  with open(path) as f:
    child = json.load(f)
  return plain_ms / child["runs"]["plain"]["ms_per_step"]


def print_table(r: dict) -> None:
  fmt = lambda x, f: "n/a" if x is None else format(x, f)
  print(f"device: {r['device_kind']} ({r['platform']}), peak {fmt(r['peak_tflops'], '.0f')} TFLOP/s"
        f" dense bf16; deterministic ops: {r['deterministic_ops']}")
  m = r["model"]
  print(f"model: d={m['d_model']} L={m['n_layers']} h={m['n_heads']} d_ff={m['d_ff']} V={m['vocab_size']}"
        f" T={r['seq_len']} b={r['batch_per_replica']}/replica, {m['compute_dtype']}, attention"
        f" {m['attention']}, remat {m['remat']}; {r['flops_per_token']:.4g} FLOPs/token;"
        f" {r['steps']} timed steps (H={SYNC_EVERY})")
  print(f"{'run':12s} {'ms/step':>10s} {'tokens/s':>12s} {'TFLOP/s':>9s} {'MFU':>7s} {'step/(M x plain)':>17s}")
  for name, x in r["runs"].items():
    print(f"{name:12s} {x['ms_per_step']:10.2f} {x['tokens_per_s']:12,.0f} {x['tflops']:9.3f}"
          f" {fmt(x['mfu'], '.1%'):>7s} {fmt(x['step_over_M_plain'], '.3f'):>17s}")
  for remat, c in r.get("plain_compiled", {}).items():
    print(f"plain step, remat={remat}: XLA flops/step {fmt(c['xla_flops'], '.4g')} (counts a scanned"
          f" block once; analytic"
          f" {r['flops_per_token'] * r['batch_per_replica'] * r['seq_len']:.4g}); memory: temp"
          f" {fmt(c['temp_gib'], '.3f')} GiB, arguments {fmt(c['argument_gib'], '.3f')} GiB")
  print(f"deterministic ops cost (plain step, on / off): {fmt(r.get('deterministic_cost'), '.3f')}")


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--quick", action="store_true",
                 help="a tiny model for a CPU smoke run (under a minute on 2 CPU cores; no memory report)")
  p.add_argument("--d-model", type=int, default=1024)
  p.add_argument("--layers", type=int, default=16, help="a multiple of 4 (Streaming P=5)")
  p.add_argument("--heads", type=int, default=16)
  p.add_argument("--d-ff", type=int, default=4096)
  p.add_argument("--vocab", type=int, default=32768)
  p.add_argument("--seq", type=int, default=1024)
  p.add_argument("--batch", type=int, default=4, help="sequences per replica")
  p.add_argument("--steps", type=int, default=20, help="timed steps per round (a multiple of H=10)")
  p.add_argument("--repeats", type=int, default=2, help="timed rounds; the best is kept")
  p.add_argument("--compute-dtype", choices=("float32", "bfloat16"), default=None,
                 help="default: bfloat16 on GPU/TPU, float32 on CPU")
  p.add_argument("--attention", choices=("auto", "xla", "cudnn"), default="auto")
  p.add_argument("--remat", choices=("none", "block"), default="none")
  p.add_argument("--runs", nargs="+", choices=RUNS, default=list(RUNS))
  p.add_argument("--memory", action=argparse.BooleanOptionalAction, default=None,
                 help="the compiled-memory report of the plain step with and without remat (two more"
                      " compilations; default: on, off with --quick)")
  p.add_argument("--no-determinism-cost", dest="determinism_cost", action="store_false")
  p.add_argument("--json", default=None, help="write the results to this JSON file")
  args = p.parse_args(argv)
  if args.quick:
    args.d_model, args.layers, args.heads, args.d_ff, args.vocab, args.seq, args.batch = 32, 4, 2, 64, 64, 32, 2
    args.steps, args.repeats = 10, 1
  if args.memory is None:
    args.memory = not args.quick
  if args.steps % SYNC_EVERY or args.layers % 4:
    p.error(f"--steps must be a multiple of H={SYNC_EVERY} and --layers a multiple of 4 (P=5), got"
            f" {args.steps} and {args.layers}")
  return args


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  args = parse_args(argv)
  result = bench(args)
  if args.determinism_cost:
    plain = result["runs"].get("plain")
    result["deterministic_cost"] = nondeterministic_cost(argv, plain and plain["ms_per_step"])
  print_table(result)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(result, f, indent=2)


if __name__ == "__main__":
  main()
