"""Accelerator benchmark: the plain step's MFU lever by lever, and DP / DiLoCo / Streaming against M plain steps.

Two parts, on the first device JAX finds (a TPU or GPU; ``--quick`` runs a tiny model on a CPU):

1. **Levers** (the default model: d_model 1024, 16 layers, d_ff 4096, V 32,768, T 1024;
   336M parameters): the plain AdamW step of one model, timed once per row, each row adding
   one lever to the one before: the Pallas flash attention, the ``dots`` remat policy, the
   fused head and loss (``loss_chunk``), the batch that fills the chip, a head dimension of
   128 (8 heads instead of 16: the same parameters and FLOPs), and no remat. ms/step,
   tokens/s, TFLOP/s and MFU (analytic FLOPs, :func:`~diloco_core.flops_per_token`: 6N plus
   attention; recomputation not counted).
2. **Methods** (the same shape with ``--method-layers`` layers, default 4, so that M = 4
   replicas' state fits one chip; the last lever row's settings): plain, DP M=2, DiLoCo M=2
   and M=4, Streaming M=2 (P=5, τ=1), H=10, and DiLoCo M=2 with ``replica_loop="sequential"``;
   each timing covers a multiple of H steps (the syncs are inside it), and the ratio
   step / (M × plain step) says what DiLoCo costs beyond M independent models.

**Memory.** Every run reads the device's memory (``memory_stats()["bytes_limit"]``) and takes
the first setting, in its order of preference, whose compiled program fits
(:func:`diloco_core.devices.fit.first_fit`: the memory model of
:mod:`diloco_core.spec.activations` and :mod:`diloco_core.spec.footprint` skips clear misses,
XLA's ``memory_analysis()`` of the compiled program decides). It prints what it chose; a run
that fits in no setting is one line (bytes needed, bytes the device has, the flag that would
make it fit) and the others still run. The results are written after every run.

**Stored.** ``--store`` (what ``make bench-accel`` passes) writes them with their provenance
(device kind, JAX, jaxlib and libtpu versions, git commit, date, the command) to
``analysis/results/accelerator/<device>.json``, which the performance page shows; ``--trace
DIR`` also writes a ``jax.profiler`` trace of the plain step and of DiLoCo M=2 (H steps each;
their Perfetto JSON as ``DIR/plain.json.gz`` and ``DIR/diloco2.json.gz``, and with ``--store`` in
``analysis/results/accelerator/traces/``) and prints where DiLoCo's extra device time goes, by
kind of XLA operation.
Measured, never asserted.

Usage: python benchmarks/accelerator.py [--quick] [--store] [--json PATH] [--trace DIR] [--steps 10]
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import glob
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from diloco_core.devices.backend import configure_determinism  # noqa: E402

DETERMINISTIC = configure_determinism()  # before JAX starts its backend

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax import nnx  # noqa: E402

from analysis.lab.stored import content_hash  # noqa: E402
from analysis.planning.hardware import hardware_for_device_kind  # noqa: E402
from diloco_core import DataParallel, DiLoCo, DiLoCoConfig, ModelConfig, flops_per_token  # noqa: E402
from diloco_core import layer_mask, lm_loss  # noqa: E402
from diloco_core.algorithm.phases import inner_update  # noqa: E402
from diloco_core.devices.backend import resolve_model_config  # noqa: E402
from diloco_core.devices.fit import device_memory, first_fit  # noqa: E402
from diloco_core.model.transformer import Transformer, init_model, split_params  # noqa: E402
from diloco_core.spec.activations import step_activation_bytes  # noqa: E402
from diloco_core.spec.footprint import replica_state_bytes  # noqa: E402
from diloco_core.spec.model_config import param_count  # noqa: E402

SYNC_EVERY = 10
STORE_DIR = os.path.join(ROOT, "analysis", "results", "accelerator")  # analysis.lab.accelerator reads it
#: Per-replica batches tried, largest first, where a row lets the batch fill the chip.
FILL_BATCHES = (16, 12, 8, 4, 2, 1)
#: The lever rows: a label and what changes against the row before (``batch`` None: fill the chip).
LEVERS = (
    ("before: XLA attention, remat block, batch 4", dict(n_heads=16, attention="xla", remat="block", batch=4, loss_chunk=0)),
    ("+ Pallas flash attention", dict(attention="flash")),
    ("+ remat dots (keep the matmuls' outputs)", dict(remat="dots")),
    ("+ head fused with the loss (2,048-token chunks)", dict(loss_chunk=2048)),
    ("+ the batch that fills the chip", dict(batch=None)),
    ("+ 8 heads (head dim d/8: 128 at d = 1024; same N, FLOPs)", dict(n_heads=8)),
    ("no remat (the batch that fills the chip)", dict(remat="none")),
)
#: The methods part's runs: name -> (algorithm, M, replica loop).
METHODS = {"plain": ("plain", 1, None), "dp2": ("dp", 2, None), "diloco2": ("diloco", 2, "vectorized"),
           "diloco2-sequential": ("diloco", 2, "sequential"), "diloco4": ("diloco", 4, "vectorized"),
           "streaming2": ("streaming", 2, "vectorized")}


def provenance(argv: list[str], script: str = "benchmarks/accelerator.py") -> dict:
  """Who measured what, where: device, versions, commit, date and the command (``python script argv``)."""
  def version(name):
    try:
      return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
      return None
  if os.environ.get("DILOCO_GIT_COMMIT"):  # a copy of the tree (a remote machine): the caller says which commit
    commit, dirty = os.environ["DILOCO_GIT_COMMIT"], None
  else:
    try:
      commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
      dirty = bool(subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                                  capture_output=True, text=True, check=True).stdout.strip())
    except (OSError, subprocess.CalledProcessError):
      commit, dirty = None, None
  device = jax.devices()[0]
  return {"device_kind": device.device_kind, "platform": device.platform, "device_count": jax.device_count(),
          "jax": jax.__version__, "jaxlib": version("jaxlib"),
          "libtpu": version("libtpu") or version("libtpu-nightly"),
          "git_commit": commit, "git_dirty": dirty, "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
          "command": shlex.join(["python", script, *argv]), "host_cpu": platform.processor() or platform.machine()}


def write_json(path: str, result: dict) -> None:
  """Writes ``result`` and its hash (:func:`analysis.lab.stored.content_hash`: the page refuses an
  edited file) to ``path``, through a temporary file: a reader never sees half of it."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump({**result, "sha256": content_hash(result)}, f, indent=1)
  os.replace(tmp, path)


def store_path(device_kind: str) -> str:
  """``analysis/results/accelerator/<device kind, lower case, spaces as dashes>.json``.

  Examples:
    >>> os.path.basename(store_path("TPU v5 lite"))
    'tpu-v5-lite.json'
  """
  return os.path.join(STORE_DIR, device_kind.lower().replace(" ", "-").replace("/", "-") + ".json")


def apply_fn_of(cfg: ModelConfig):
  """The model's apply function without materializing its params (the graph of an abstract model)."""
  graphdef, _ = split_params(nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0))))
  return lambda p, tokens, **kw: nnx.merge(graphdef, p)(tokens, **kw)


def timed(run, state, batch, steps: int, repeats: int) -> tuple[float, object]:
  """Seconds per step: the best of ``repeats`` rounds of ``steps`` steps, after one warm-up step."""
  state, out = run(state, batch)
  jax.block_until_ready(out)
  best = float("inf")
  for _ in range(repeats):
    t0 = time.perf_counter()
    for _ in range(steps):
      state, out = run(state, batch)
    jax.block_until_ready((state, out))
    best = min(best, (time.perf_counter() - t0) / steps)
  return best, state


class Bench:
  """One benchmark run: the device, its memory and peak, the results so far and where they go."""

  def __init__(self, args, argv):
    self.args = args
    self.device = jax.devices()[0]
    spec = hardware_for_device_kind(self.device.device_kind)
    self.peak = None if spec is None else spec.peak_flops
    self.limit = device_memory(self.device)
    self.rng = np.random.default_rng(0)
    self.result = {"provenance": provenance(argv), "peak_tflops": None if self.peak is None else self.peak / 1e12,
                   "memory_limit_bytes": self.limit, "seq_len": args.seq,
                   "lever_model": dataclasses.asdict(self.model()), "levers": [], "methods": {}}
    self.paths = [p for p in (args.json, store_path(self.device.device_kind) if args.store else None) if p]

  def save(self) -> None:
    for path in self.paths:
      write_json(path, self.result)

  def model(self, **changes) -> ModelConfig:
    a = self.args
    base = dict(vocab_size=a.vocab, d_model=a.d_model, n_layers=a.layers, n_heads=a.heads, d_ff=a.d_ff,
                max_seq_len=a.seq, compute_dtype=a.compute_dtype)
    return resolve_model_config(ModelConfig(**{**base, **changes}))

  def tokens(self, shape) -> jax.Array:
    return self.rng.integers(0, self.args.vocab, size=(*shape, self.args.seq + 1)).astype(np.int32)

  def measure(self, cfg: ModelConfig, batch: int, seconds: float, replicas: int = 1) -> dict:
    tokens_s = replicas * batch * self.args.seq / seconds
    tflops = flops_per_token(cfg, self.args.seq) * tokens_s / 1e12
    return {"ms_per_step": 1e3 * seconds, "tokens_per_s": tokens_s, "tflops": tflops,
            "mfu": None if self.peak is None else tflops * 1e12 / self.peak}

  # ---- part 1: the plain step, lever by lever ------------------------------------------------
  def plain_row(self, label: str, settings: dict) -> dict:
    a, opt = self.args, optax.adamw(1e-4)
    row = {"lever": label, **{k: v for k, v in settings.items() if k != "batch"}}
    batches = FILL_BATCHES if settings["batch"] is None else (settings["batch"],)
    try:
      cfg = self.model(**{k: v for k, v in settings.items() if k != "batch"})
    except ValueError as e:  # e.g. flash attention off a TPU
      return {**row, "skipped": str(e)}
    n = param_count(cfg)
    params = init_model(cfg, 0)[1]
    state = (params, opt.init(params))
    apply_fn = apply_fn_of(cfg)
    step = jax.jit(lambda s, x: (lambda o: ((o[0], o[1]), o[2]))(
        inner_update(lambda p, t: lm_loss(apply_fn, p, t), opt, s[0], s[1], x)), donate_argnums=0)
    state_bytes = sum(replica_state_bytes(n, outer=False).values())
    fit = first_fit(batches, estimate=lambda b: state_bytes + step_activation_bytes(cfg, b, a.seq).total,
                    compile_fn=lambda b: step.lower(state, jax.ShapeDtypeStruct((b, a.seq + 1), jnp.int32)).compile(),
                    limit=self.limit, describe=lambda b: f"batch {b}")
    row["fit"] = fit.tried
    if fit.choice is None:
      return {**row, "skipped": self.refusal(label, fit, "lower --seq or --layers, or set remat block")}
    batch = fit.choice
    seconds, state = timed(fit.compiled, state, jnp.asarray(self.tokens((batch,))), a.steps, a.repeats)
    del state
    return {**row, "batch": batch, "params": n, "memory_model_bytes": fit.estimate,
            "compiled_bytes": fit.measured, **self.measure(cfg, batch, seconds)}

  def refusal(self, what: str, fit, hint: str) -> str:
    limit = "no limit" if self.limit is None else f"{self.limit / 2**30:.2f} GiB"
    return f"{what}: does not fit the device ({limit}): {'; '.join(fit.tried)}; {hint}"

  # ---- part 2: DP, DiLoCo and Streaming against M plain steps ------------------------------
  def algorithm(self, name: str, cfg: ModelConfig, params):
    kind, M, loop = METHODS[name]
    loss_fn = lambda p, x: lm_loss(apply_fn_of(cfg), p, x)
    opt = optax.adamw(1e-4)
    if kind == "dp":
      return DataParallel(loss_fn, opt, DiLoCoConfig(algorithm="dp", replicas=M))
    streaming = dict(algorithm="streaming", fragments=5, overlap=1) if kind == "streaming" else {}
    return DiLoCo(loss_fn, opt, DiLoCoConfig(replicas=M, sync_every=SYNC_EVERY, **streaming),
                  layer_mask=layer_mask(params), replica_loop=loop)

  def method_bytes(self, name: str, cfg: ModelConfig, batch: int) -> float:
    kind, M, loop = METHODS[name]
    s = replica_state_bytes(param_count(cfg), outer=kind in ("diloco", "streaming"))
    state = M * (s["params"] + s["grads"] + s["optimizer"]) + s["outer_params"] + s["outer_momentum"]
    if kind in ("plain", "dp"):
      state = s["params"] + s["optimizer"] + M * s["grads"]
    live = 1 if loop == "sequential" else M
    return state + live * step_activation_bytes(cfg, batch, self.args.seq).total

  def methods(self, cfg: ModelConfig) -> None:
    a = self.args
    params = init_model(cfg, 0)[1]
    # One per-replica batch for every run (the ratios compare like with like): the largest the
    # biggest run fits, by the memory model (each run's compiled program is checked below).
    fitting = [b for b in FILL_BATCHES if self.limit is None
               or self.method_bytes("diloco4", cfg, b) <= 0.9 * self.limit] or [1]
    batch = a.method_batch or fitting[0]
    self.result["methods_model"] = {**dataclasses.asdict(cfg), "batch_per_replica": batch,
                                    "params": param_count(cfg), "sync_every": SYNC_EVERY}
    print(f"\nmethods: {cfg.n_layers} layers ({param_count(cfg) / 1e6:.0f}M params), {cfg.n_heads} heads,"
          f" attention {cfg.attention}, remat {cfg.remat}, loss_chunk {cfg.loss_chunk}, batch {batch}/replica,"
          f" H={SYNC_EVERY}, {a.method_steps} timed steps", flush=True)
    for name in a.methods:
      M = METHODS[name][1]
      try:
        if name == "plain":
          opt = optax.adamw(1e-4)
          apply_fn = apply_fn_of(cfg)
          state = (jax.tree.map(jnp.copy, params), opt.init(params))
          step = jax.jit(lambda s, x: (lambda o: ((o[0], o[1]), o[2]))(
              inner_update(lambda p, t: lm_loss(apply_fn, p, t), opt, s[0], s[1], x)), donate_argnums=0)
          x = jnp.asarray(self.tokens((batch,)))
          compile_fn = lambda _: step.lower(state, x).compile()
        else:
          algo = self.algorithm(name, cfg, params)
          state = algo.init(params)
          x = algo.place_batch(self.tokens((M, batch)))
          def compile_fn(_, algo=algo, state=state, x=x):
            with jax.set_mesh(algo.mesh):
              return algo.program.lower(*algo.step_args(state, x)).compile()
        fit = first_fit([batch], estimate=lambda b: self.method_bytes(name, cfg, b), compile_fn=compile_fn,
                        limit=self.limit, describe=lambda b: f"{name} batch {b}")
        if fit.choice is None:
          line = self.refusal(name, fit, "lower --method-layers or --method-batch")
          self.result["methods"][name] = {"skipped": line}
          print(line, flush=True)
          continue
        if name == "plain":
          run = fit.compiled
        else:
          hp = algo.step_args(state, x)[2:]
          run = lambda s, b: (lambda o: (o[0], o[1]["loss"]))(fit.compiled(s, b, *hp))
        seconds, state = timed(run, state, x, a.method_steps, a.repeats)
        if a.trace and name in ("plain", "diloco2"):
          with jax.profiler.trace(os.path.join(a.trace, name), create_perfetto_trace=True):
            state, out = run(state, x)
            for _ in range(SYNC_EVERY - 1):
              state, out = run(state, x)
            jax.block_until_ready((state, out))
          self.keep_trace(name)
        del state
      except Exception as e:  # one run's failure (an out-of-memory at run time) must not end the others
        line = f"{name}: failed: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
        self.result["methods"][name] = {"skipped": line}
        print(line, flush=True)
        continue
      rec = {"replicas": M, "replica_loop": METHODS[name][2], "memory_model_bytes": fit.estimate,
             "compiled_bytes": fit.measured, **self.measure(cfg, batch, seconds, M)}
      plain = rec["ms_per_step"] if name == "plain" else self.result["methods"].get("plain", {}).get("ms_per_step")
      rec["step_over_M_plain"] = None if plain is None else rec["ms_per_step"] / (M * plain)
      self.result["methods"][name] = rec
      self.save()
      print(f"{name:20s} {rec['ms_per_step']:9.2f} ms/step  {rec['tokens_per_s']:10,.0f} tok/s  MFU"
            f" {fmt(rec['mfu'], '.1%'):>6s}  step/(M x plain) {fmt(rec['step_over_M_plain'], '.3f')}", flush=True)

  def keep_trace(self, name: str) -> None:
    """The newest Perfetto trace of run ``name`` as ``<--trace>/<name>.json.gz`` (one flat file, to
    copy off a remote machine), and with ``--store`` beside the stored results
    (``traces/<device>-<name>.json.gz``, what the performance page's breakdown reads). Once both
    runs are traced, prints where DiLoCo's extra time goes (:func:`print_breakdown`)."""
    found = sorted(glob.glob(os.path.join(self.args.trace, name, "**", "perfetto_trace.json.gz"), recursive=True),
                   key=os.path.getmtime)
    if not found:
      return
    dests = [os.path.join(self.args.trace, f"{name}.json.gz")]
    if self.args.store:
      stem = os.path.splitext(os.path.basename(store_path(self.device.device_kind)))[0]
      os.makedirs(os.path.join(STORE_DIR, "traces"), exist_ok=True)
      dests.append(os.path.join(STORE_DIR, "traces", f"{stem}-{name}.json.gz"))
    for dest in dests:
      shutil.copyfile(found[-1], f"{dest}.tmp{os.getpid()}")
      os.replace(f"{dest}.tmp{os.getpid()}", dest)  # replaces a stored trace even where it is read-only
    if name == "diloco2" and os.path.exists(os.path.join(self.args.trace, "plain.json.gz")):
      print_breakdown(self.args.trace)

  def run(self) -> dict:
    a = self.args
    kind = self.device.device_kind
    print(f"device: {kind} ({self.device.platform}), peak {fmt(self.result['peak_tflops'], '.0f')} TFLOP/s dense"
          f" bf16, memory {fmt(self.limit and self.limit / 2**30, '.2f')} GiB; {a.steps} timed steps per row",
          flush=True)
    settings = {}
    for label, changes in (LEVERS if a.levers else ()):
      before, settings = settings, {**settings, **changes}
      row = self.plain_row(label, settings)
      self.result["levers"].append(row)
      self.save()
      if "skipped" in row:
        if "fit" not in row:  # not on this backend (flash off a TPU): the next rows go on without it
          settings = {**settings, **{k: before[k] for k in changes if k in before}}
        print(f"{label:52s} {row['skipped']}", flush=True)
        continue
      print(f"{label:52s} batch {row['batch']:2d}  {row['ms_per_step']:8.1f} ms  {row['tflops']:7.2f} TFLOP/s"
            f"  MFU {fmt(row['mfu'], '.1%'):>6s}  memory: model {row['memory_model_bytes'] / 2**30:.2f} GiB,"
            f" compiled {row['compiled_bytes']['peak'] / 2**30:.2f} GiB", flush=True)
    best = dict(n_heads=a.heads, attention=a.attention, remat=a.remat, loss_chunk=a.loss_chunk)
    if a.methods:
      try:
        cfg = self.model(**{**best, "n_layers": a.method_layers})
      except ValueError as e:
        self.result["methods"]["all"] = {"skipped": str(e)}
        print(f"methods: {e}", flush=True)
      else:
        self.methods(cfg)
    self.save()
    return self.result


def print_breakdown(folder: str) -> None:
  """Device milliseconds per step by kind of XLA operation of the plain step and DiLoCo M = 2, and
  DiLoCo's difference to two plain steps (:func:`analysis.lab.accelerator.methods_breakdown` of
  ``folder``'s ``plain.json.gz`` and ``diloco2.json.gz``), printed as a table."""
  from analysis.lab.accelerator import AcceleratorResultError, methods_breakdown  # pylint: disable=import-outside-toplevel
  try:
    bd = methods_breakdown(os.path.join(folder, "plain.json.gz"), os.path.join(folder, "diloco2.json.gz"), 0.05)
  except AcceleratorResultError as e:  # a CPU's trace has no device track
    print(f"no breakdown by operation: {e}", flush=True)
    return
  print("device ms per step by kind of operation (the traces):")
  print(bd.round(3).to_string(), flush=True)


def fmt(x, spec: str) -> str:
  return "n/a" if x is None else format(x, spec)


def parse_args(argv):
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--quick", action="store_true",
                 help="a tiny model for a CPU smoke run (under a minute on 2 CPU cores)")
  p.add_argument("--d-model", type=int, default=1024)
  p.add_argument("--layers", type=int, default=16, help="layers of the levers' model")
  p.add_argument("--heads", type=int, default=8, help="heads of the methods' model (the levers try 16, then 8)")
  p.add_argument("--d-ff", type=int, default=4096)
  p.add_argument("--vocab", type=int, default=32768)
  p.add_argument("--seq", type=int, default=1024)
  p.add_argument("--steps", type=int, default=8, help="timed steps per round of a lever row")
  p.add_argument("--repeats", type=int, default=2, help="timed rounds; the best is kept")
  p.add_argument("--compute-dtype", choices=("float32", "bfloat16"), default=None,
                 help="default: bfloat16 on GPU/TPU, float32 on CPU")
  p.add_argument("--attention", choices=("auto", "xla", "cudnn", "flash"), default=None,
                 help="the methods' attention (default: flash on a TPU, auto elsewhere)")
  p.add_argument("--remat", choices=("none", "dots", "block"), default="dots", help="the methods' remat")
  p.add_argument("--loss-chunk", type=int, default=2048, help="the methods' fused-loss chunk (0: off)")
  p.add_argument("--method-layers", type=int, default=4, help="layers of the methods' model (a multiple of 4: P=5)")
  p.add_argument("--method-batch", type=int, default=None, help="per-replica batch of the methods (default: the"
                 " largest that DiLoCo M=4 fits)")
  p.add_argument("--method-steps", type=int, default=20, help="timed steps per round of a method (a multiple of H=10)")
  p.add_argument("--methods", nargs="*", choices=tuple(METHODS), default=list(METHODS))
  p.add_argument("--no-levers", dest="levers", action="store_false", help="skip part 1")
  p.add_argument("--json", default=None, help="also write the results to this JSON file")
  p.add_argument("--store", action="store_true", help="write them to analysis/results/accelerator/<device>.json")
  p.add_argument("--trace", default=None, help="write jax.profiler traces of plain and diloco2 under this directory")
  args = p.parse_args(argv)
  if args.quick:
    args.d_model, args.layers, args.heads, args.d_ff, args.vocab, args.seq = 32, 4, 2, 64, 64, 32
    args.steps, args.repeats, args.method_steps, args.method_layers = 4, 1, 10, 4
  if args.attention is None:
    args.attention = "flash" if jax.default_backend() == "tpu" else "auto"
  if args.method_steps % SYNC_EVERY or args.method_layers % 4:
    p.error(f"--method-steps must be a multiple of H={SYNC_EVERY} and --method-layers a multiple of 4 (P=5),"
            f" got {args.method_steps} and {args.method_layers}")
  return args


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  Bench(parse_args(argv), argv).run()


if __name__ == "__main__":
  main()
