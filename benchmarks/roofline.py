"""The roofline, measured: achieved FLOP/s on this chip across arithmetic intensity.

bfloat16 matmuls ``[m, k] @ [k, k]`` with ``m`` from 1 (a matrix-vector product, about 1 FLOP
per byte) up to ``k`` (about k/3 FLOPs per byte: compute-bound), plus an elementwise ``x + 1``
over a large bfloat16 array (a quarter FLOP per byte) for the memory ceiling. The FLOPs and
bytes of every point are the calculator's own (:func:`analysis.planning.op_cost.matmul_cost`,
:func:`~analysis.planning.op_cost.elementwise_cost`); each time is the best of ``--repeats``
rounds of ``--iters`` back-to-back calls. Results go to ``analysis/results/accelerator/
<device>-roofline.json`` with ``--store`` (provenance as ``benchmarks/accelerator.py`` writes
it); the roofline page plots them on the calculator's roofline of the same chip.

    python benchmarks/roofline.py --store          # about a minute on a TPU v5e
    python benchmarks/roofline.py --quick          # small shapes: a CPU smoke run
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import jax
import jax.numpy as jnp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from accelerator import provenance, store_path, write_json  # noqa: E402  (the benchmarks' one writer)

from analysis.planning.op_cost import elementwise_cost, matmul_cost  # noqa: E402


def best_seconds(fn, args, iters: int, repeats: int) -> float:
  """Seconds per call: the best of ``repeats`` rounds of ``iters`` calls, after a warm-up call."""
  jax.block_until_ready(fn(*args))
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(iters):
      out = fn(*args)
    jax.block_until_ready(out)
    best = min(best, (time.perf_counter() - t0) / iters)
  return best


def point(kind: str, shape: dict, flops: float, num_bytes: float, seconds: float) -> dict:
  return {"kind": kind, **shape, "flops": flops, "bytes": num_bytes, "seconds": seconds,
          "intensity": flops / num_bytes, "flops_per_s": flops / seconds, "bytes_per_s": num_bytes / seconds}


def measure(args) -> list[dict]:
  key = jax.random.PRNGKey(0)
  k = args.k
  b = jax.random.normal(key, (k, k), jnp.bfloat16)
  matmul = jax.jit(lambda a, b: a @ b)
  points = []
  m = 1
  while m <= k:
    a = jax.random.normal(key, (m, k), jnp.bfloat16)
    seconds = best_seconds(matmul, (a, b), args.iters, args.repeats)
    points.append(point("matmul", {"m": m, "k": k, "n": k}, *matmul_cost(m, k, k), seconds))
    print(f"matmul [{m:5d}, {k}] @ [{k}, {k}]  intensity {points[-1]['intensity']:8.1f}  "
          f"{points[-1]['flops_per_s'] / 1e12:8.2f} TFLOP/s", flush=True)
    m *= 2
  x = jnp.zeros((args.elements,), jnp.bfloat16)
  add = jax.jit(lambda x: x + 1)
  seconds = best_seconds(add, (x,), args.iters, args.repeats)
  points.append(point("elementwise", {"size": args.elements}, *elementwise_cost(args.elements), seconds))
  print(f"x + 1 over {args.elements:,} bfloat16  {points[-1]['bytes_per_s'] / 1e9:8.1f} GB/s", flush=True)
  return points


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--k", type=int, default=8192, help="the matmuls' inner and output size (m doubles from 1 to k)")
  p.add_argument("--elements", type=int, default=2**29, help="elements of the elementwise x + 1 (bfloat16)")
  p.add_argument("--iters", type=int, default=20, help="calls per timed round")
  p.add_argument("--repeats", type=int, default=3, help="timed rounds; the best is kept")
  p.add_argument("--quick", action="store_true", help="small shapes: a CPU smoke run in seconds")
  p.add_argument("--json", default=None, help="also write the results to this JSON file")
  p.add_argument("--store", action="store_true", help="write them to analysis/results/accelerator/<device>-roofline.json")
  args = p.parse_args(argv)
  if args.quick:
    args.k, args.elements, args.iters, args.repeats = 256, 2**16, 3, 1
  for name in ("k", "elements", "iters", "repeats"):
    if getattr(args, name) < 1:
      p.error(f"--{name} must be a positive integer, got {getattr(args, name)}")
  return args


def main(argv=None) -> dict:
  argv = sys.argv[1:] if argv is None else argv
  args = parse_args(argv)
  device = jax.devices()[0]
  print(f"device: {device.device_kind} ({device.platform})", flush=True)
  result = {"provenance": provenance(argv, "benchmarks/roofline.py"),
            "points": measure(args)}
  paths = [p for p in (args.json, store_path(device.device_kind).replace(".json", "-roofline.json")
                       if args.store else None) if p]
  for path in paths:
    write_json(path, result)
    print(f"wrote {path}", flush=True)
  return result


if __name__ == "__main__":
  main()
