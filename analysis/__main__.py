"""Command line: ``python -m analysis {roofline,plan,simulate,hardware,models} --help``.

Examples::

  python -m analysis roofline --hardware v5p --model 8B --global-batch-tokens 4194304 --slices 4
  python -m analysis plan --model qwen3-8b --hardware v5p --slices 2 --chips-per-slice 64 \\
      --seq-len 4096 --global-batch-tokens 2097152 --mfu 0.5 --target 0.95 --link-gbps 100
  python -m analysis simulate --model 1B --method streaming --overlap 1 --bits 4 --target 0.95
  python -m analysis simulate --table
  python -m analysis experiments list
  python -m analysis experiments run claims        # train and store analysis/results/claims.json
  python -m analysis experiments verify claims --sample 2

Errors (unknown names, out-of-range values) print one line to stderr and exit with 2.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from analysis.planning import plan as plan_lib
from analysis.planning import roofline as rl
from analysis.planning.hardware import HARDWARE
from analysis.planning.hardware import get_hardware
from analysis.planning.models import MODELS
from analysis.planning.models import get_model
from analysis.planning.models import model_stats
from analysis.planning.models import model_table
from analysis import simulate_cli
from analysis.flag_names import as_flags, option_flags
from diloco_core.spec.wire_formats import DEFAULT_CHUNK
from diloco_core.spec.wire_formats import topk_bits_per_element
from diloco_core.spec.validity import check_choice
from diloco_core.spec.validity import check_int
from diloco_core.spec.validity import check_real
from diloco_core.spec.validity import check_schedule

_GBIT = 1e9 / 8  # bytes/s in one Gbit/s


class _Parser(argparse.ArgumentParser):
  """argparse with one-line errors (exit code 2, as argparse) and no abbreviated flags (an
  abbreviation could reach around a check)."""

  def __init__(self, *args, **kwargs):
    kwargs.setdefault("allow_abbrev", False)
    super().__init__(*args, **kwargs)

  def error(self, message):
    self.exit(2, f"error: {message} (see {self.prog} --help).\n")


def _fmt(x, unit=""):
  if x is None:
    return "-"
  if x == float("inf"):
    return "inf"
  return f"{x:,.4g}{unit}"


def _default_fragments(layers: int) -> int:
  """P = 1 + the smallest divisor of L that is >= 4 (fragment 0 holds the embeddings)."""
  return 1 + next(d for d in range(min(4, layers), layers + 1) if layers % d == 0)


def _roofline_table(a, hw, cfg, stats, step) -> pd.DataFrame:
  """The three methods' rows: the planner's bandwidth and memory, and the roofline's batches."""
  m, n, seq, bits = a.slices, a.chips_per_slice, stats.seq_len, a.bits
  h, tau = a.sync_every, a.overlap
  p = _default_fragments(cfg.n_layers) if a.fragments is None else a.fragments
  check_schedule(h, p, tau, num_layers=cfg.n_layers)
  cands = [("dp", 1, 1, 0), ("diloco", h, 1, 0), ("streaming", h, p, tau)]
  planned = plan_lib.candidate_table(cfg, hw, cands, slices=m, chips_per_slice=n,
                                     step_time=step, target=a.target, bits=bits,
                                     latency=a.latency)
  kw = dict(model=cfg, seq_len=seq, bits=bits)
  critical = [rl.dp_critical_batch_per_slice(hw, replicas=m, **kw),
              rl.diloco_critical_batch_per_slice(hw, h, replicas=m, **kw),
              rl.streaming_critical_batch_per_slice(hw, h, p, tau, replicas=m, **kw)]
  slices = [rl.max_slices(a.global_batch_tokens, hw, method=method, sync_every=h,
                          fragments=f, overlap=t, **kw) for method, h, f, t in cands]
  table = pd.DataFrame({"critical_tokens_per_slice": critical, "max_slices": slices,
                        "gbps_per_slice": planned["Gbit/s per slice"].to_numpy(),
                        "memory_gb_per_chip": planned["memory GB/chip"].to_numpy()},
                       index=list(planned.index))
  table["compute_bound"] = a.global_batch_tokens / m >= table["critical_tokens_per_slice"]
  return table


def _roofline(a) -> None:
  hw, cfg = get_hardware(a.hardware), get_model(a.model)
  for name in ("slices", "chips_per_slice"):
    check_int(name, getattr(a, name))
  check_real("mfu", a.mfu, low=0.0, high=1.0, low_open=True, high_open=False)
  check_real("--latency", a.latency, low=0.0)
  stats = model_stats(cfg, a.seq_len)
  plan_lib.check_global_batch(a.global_batch_tokens, stats.seq_len)
  if a.global_batch_tokens < a.slices * stats.seq_len:
    raise ValueError(f"--slices {a.slices}: each slice needs at least one sequence of the global batch"
                     f" (--global-batch-tokens {a.global_batch_tokens} / seq_len {stats.seq_len} ="
                     f" {a.global_batch_tokens // stats.seq_len} sequences); lower --slices.")
  seq, m, n = stats.seq_len, a.slices, a.chips_per_slice
  tokens_slice = a.global_batch_tokens / m
  tokens_chip = tokens_slice / n
  step = plan_lib.step_time(stats, hw, tokens_slice, n, a.mfu)
  ici = rl.dp_critical_batch_per_chip(hw, model=cfg, seq_len=seq, bits=a.bits)
  table = _roofline_table(a, hw, cfg, stats, step)
  print(f"{hw.name}: {hw.peak_flops:.3g} FLOP/s, HBM {hw.hbm_bytes / 1e9:.0f} GB at "
        f"{hw.hbm_bandwidth:.3g} B/s, ICI {hw.ici_bandwidth:.3g} B/s per chip and axis, "
        f"DCN {hw.dcn_bandwidth:.3g} B/s per chip ({hw.chips_per_host} chips per host)")
  print("critical intensity (FLOPs/byte): "
        f"HBM {rl.critical_intensity(hw.peak_flops, hw.hbm_bandwidth):,.0f}, "
        f"ICI {rl.critical_intensity(hw.peak_flops, hw.ici_bandwidth):,.0f}, "
        f"DCN {rl.critical_intensity(hw.peak_flops, hw.dcn_bandwidth):,.0f}")
  print(_hbm_note(hw))
  print(f"model {a.model}: {stats.total_params:,} parameters ({stats.active_params:,} active), "
        f"{stats.flops_per_token:.4g} FLOPs/token at seq_len {seq}")
  print(f"run: {a.global_batch_tokens:,} tokens over {m} slices x {n} chips = "
        f"{tokens_slice:,.0f} tokens/slice, {tokens_chip:,.1f} tokens/chip; "
        f"step time {step:.4g} s at MFU {a.mfu:g}")
  print(f"DP inside a slice (ICI, one axis): compute-bound above {ici:,.0f} tokens/chip -> "
        f"{'compute' if tokens_chip >= ici else 'communication'}-bound")
  print()
  print(f"Across slices (DCN), {a.bits:g}-bit payload, M={m}. critical_tokens_per_slice: "
        f"compute-bound above it; max_slices: largest M for this global batch; "
        f"gbps_per_slice: bandwidth for {a.target:.0%} utilization, each payload reduced "
        f"during its sending step's backward pass (closed form; for Streaming with tau >= 1, "
        f"the bandwidth that hides every transfer); memory_gb_per_chip: replica state "
        f"sharded over the slice (HBM "
        f"{hw.hbm_bytes / 1e9:.0f} GB).")
  print(table.to_string(formatters=dict(
      critical_tokens_per_slice=lambda v: f"{v:,.0f}", gbps_per_slice=_fmt,
      memory_gb_per_chip=lambda v: f"{v:,.2f}")))


def _payload(p) -> str:
  """The plan's wire in words: ``16-bit``, or the top-k setting and its bits per parameter."""
  if p.topk is None:
    return f"{p.bits:g}-bit"
  eff = topk_bits_per_element(k=p.topk, chunk=p.topk_chunk, name=plan_lib.wire_format(p.bits))
  return (f"top-{p.topk} of each {p.topk_chunk} at {p.bits:g} bits ({eff:.4g} bits per parameter,"
          f" DP dense at {p.bits:g} bits)")


def _plan(a) -> None:
  if a.topk is None and a.topk_chunk is not None:
    raise ValueError("--topk-chunk sets the chunk of a top-k payload: pass --topk too (or drop --topk-chunk).")
  a.topk_chunk = DEFAULT_CHUNK if a.topk_chunk is None else a.topk_chunk
  kw = {} if a.overlaps is None else dict(overlaps=a.overlaps)
  p = plan_lib.plan_run(a.model, a.hardware, slices=a.slices, chips_per_slice=a.chips_per_slice,
                        seq_len=a.seq_len, global_batch_tokens=a.global_batch_tokens,
                        link_gbps=a.link_gbps, mfu=a.mfu, target=a.target, bits=a.bits,
                        sync_every=a.sync_every, eager=a.eager, topk=a.topk,
                        topk_chunk=a.topk_chunk, min_sync_every=a.min_sync_every, **kw)
  print(f"model {a.model}: {p.params:,} parameters ({p.active_params:,} active), {p.layers} "
        f"layers; {p.hardware_name}, {p.slices} slices x {p.chips_per_slice} chips")
  print(f"run: {p.global_batch_tokens:,} tokens per step, {p.tokens_per_slice:,.0f} per slice, "
        f"seq_len {p.seq_len}; step time {p.step_time:.4g} s at MFU {p.mfu:g}; DP across "
        f"slices is compute-bound above {p.dp_critical_tokens:,.0f} tokens per slice")
  print(f"network per slice: link {p.link_gbps:,.4g} Gbit/s, in-pod DCN {p.dcn_gbps:,.4g} Gbit/s;"
        f" {_payload(p)} payload; Gbit/s per slice under each row's criterion: utilization = {p.target:.0%} of"
        f" the time computing, no wait = every transfer hidden behind its step's backward pass and tau steps")
  print()
  fmt = {"Gbit/s per slice": _fmt, "GB per sync": lambda v: f"{v:,.3g}",
         "memory GB/replica": lambda v: f"{v:,.0f}", "memory GB/chip": lambda v: f"{v:,.2f}"}
  print(p.table.drop(columns=["method"]).to_string(formatters=fmt))
  print()
  print(f"choice: {p.choice if p.choice is not None else 'none'}")
  print(f"reason: {p.reason}")
  if p.choice is not None:
    try:
      print("trainer options: " + " ".join(p.train_args()))
    except ValueError as e:  # a wire width the trainer does not have: the plan still holds
      print(f"trainer options: none ({e})")


def _hbm_note(hw) -> str:
  """Which HBM bandwidth the figures above use, and the measured one where the catalog has it.

  Examples:
    >>> print(_hbm_note(HARDWARE["v5p"]))
    HBM bandwidth: the spec sheet's (2.765e+12 B/s) is used above; none measured on this chip.
  """
  used = f"HBM bandwidth: the spec sheet's ({hw.hbm_bandwidth:.4g} B/s) is used above"
  if hw.hbm_bandwidth_achievable is None:
    return used + "; none measured on this chip."
  got = hw.hbm_for("achievable")
  return (f"{used}; achievable {got:.4g} B/s ({got / hw.hbm_bandwidth:.0%}, {hw.hbm_achievable_source}),"
          f" which puts the HBM knee at {rl.critical_intensity(hw.peak_flops, got):,.0f} FLOPs/byte.")


def _hardware(a) -> None:
  rows = {k: dict(name=h.name, peak_flops=h.peak_flops, hbm_gb=h.hbm_bytes / 1e9,
                  hbm_bw=h.hbm_bandwidth, hbm_bw_achievable=h.hbm_bandwidth_achievable, ici_bw=h.ici_bandwidth, dcn_bw_chip=h.dcn_bandwidth,
                  chips_per_host=h.chips_per_host) for k, h in HARDWARE.items()}
  print(pd.DataFrame.from_dict(rows, orient="index").to_string(float_format=lambda v: f"{v:.4g}"))


def _models(a) -> None:
  print(model_table(a.seq_len).to_string(float_format=lambda v: f"{v:.4g}"))


def _add_hardware_and_model(parser) -> None:
  parser.add_argument("--hardware", required=True,
                      help=f"chip: one of {sorted(HARDWARE)} (also ironwood, trillium)")
  parser.add_argument("--model", required=True,
                      help=f"model: one of {sorted(MODELS)}, or 8B, 70B, 405B, 30B-A3B")


def build_parser() -> argparse.ArgumentParser:
  p = _Parser(prog="python -m analysis",
              description="Roofline calculator and compute-utilization simulator for DP, "
                          "DiLoCo and Streaming DiLoCo.")
  sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)
  _add_roofline(sub)
  _add_plan(sub)
  simulate_cli.add_simulate(sub)
  h = sub.add_parser("hardware", help="list the hardware catalog",
                     description="The hardware catalog (per chip, bytes and bytes/s).")
  h.set_defaults(func=_hardware)
  m = sub.add_parser("models", help="list the model catalog",
                     description="The model catalog with parameter counts and FLOPs/token.")
  m.add_argument("--seq-len", type=int, default=None, help="context length (default: own)")
  m.set_defaults(func=_models)
  _add_experiments(sub)
  return p


def _experiments(a) -> None:
  import os
  if a.isa is not None:  # before JAX starts: XLA reads its flags once
    from analysis.lab.cpu_kind import ISA_LEVELS
    check_choice("--isa", a.isa.upper(), ISA_LEVELS)
    if a.scale != "cpu":
      raise ValueError("--isa: only with --scale cpu (it caps the instruction sets of XLA's CPU backend).")
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + f" --xla_cpu_max_isa={a.isa.upper()}").strip()
  if a.scale == "cpu":  # the docs build's environment (conf.py), which re-checks the results
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_force_host_platform_device_count" not in flags:
      os.environ["XLA_FLAGS"] = (flags + " --xla_force_host_platform_device_count=8").strip()
  # Imported here: the experiments train with JAX, which the other commands never start.
  from analysis.lab import experiments
  from analysis.lab import recheck
  from analysis.lab import stored
  from analysis.lab import storing
  names = list(experiments.SWEEPS) if a.all or a.action == "list" else a.names
  if not names:
    raise ValueError("experiments: name at least one experiment (one of "
                     f"{sorted(experiments.SWEEPS)}) or pass --all.")
  check_int("--workers", a.workers, low=1)
  for name in names:  # unknown names or scales: one line, before anything trains
    stored.path_of(name)
    runs = len(experiments.named_sweep(name, a.scale))
    if a.action == "verify" and not (isinstance(a.sample, int) and 1 <= a.sample <= runs):
      raise ValueError(f"--sample must be an integer in [1, {runs}] (runs of {name} trained again),"
                       f" got {a.sample!r}.")
  if a.action == "run":
    storing.check_writable(stored.RESULTS_DIR)  # before any training
  if a.action == "list":
    for name in names:
      try:
        e = stored.load(name, scale=a.scale)
        state = f"stored {e.provenance['date']}, code {e.provenance['code']}"
      except stored.StoredResultError as err:
        state = str(err).split(": ", 2)[-1]
      print(f"{name:15s} {len(experiments.named_sweep(name, a.scale)):4d} runs  {state}")
    return
  if a.action == "run":
    for name in names:
      path = storing.run_experiment(name, scale=a.scale, progress=not a.quiet, workers=a.workers,
                                   realization=None if a.isa is None else stored.realization_name(a.isa))
      print(f"{name}: stored {path}")
    return
  check_int("--sample", a.sample, low=1)
  if a.scale != "cpu":
    raise ValueError("experiments verify: only stored CPU experiments are re-checked (--scale cpu).")
  report = recheck.verify_all(names, workers=a.workers, k=a.sample, whole=a.whole_runs)
  for name in names:
    print(recheck.summary_line(report[report["experiment"] == name]))
  if a.json:
    report.assign(cpu=recheck.cpu_fingerprint()).to_json(a.json, orient="records", indent=1)


def _add_experiments(sub) -> None:
  e = sub.add_parser("experiments", help="train, store and re-check the docs' experiments",
                     description="The named experiments behind the docs (analysis.lab.experiments):"
                                 " `run` trains them and writes analysis/results/NAME.json with"
                                 " provenance; `verify` trains a fixed sample again and fails on"
                                 " any difference; `list` shows what is stored.")
  e.add_argument("action", choices=("run", "verify", "list"), help="what to do")
  e.add_argument("names", nargs="*", help="experiment names (see `list`)")
  e.add_argument("--all", action="store_true", help="every experiment")
  e.add_argument("--scale", default="cpu", help="cpu or accelerator (cpu)")
  e.add_argument("--sample", type=int, default=2, help="verify: runs trained again (2)")
  e.add_argument("--quiet", action="store_true", help="run: no progress bar")
  e.add_argument("--workers", type=int, default=1,
                 help="processes that train at once (1); the numbers do not depend on it")
  e.add_argument("--whole-runs", action="store_true",
                 help="verify: train every sampled run to its end, also those of the experiments"
                      " re-checked on their first steps by default (analysis.lab.recheck.PREFIX_ONLY)")
  e.add_argument("--json", default=None, metavar="FILE",
                 help="verify: also write the report (one record per run trained again) to FILE")
  e.add_argument("--isa", default=None,
                 help="run or verify as on a CPU with at most this instruction set (XLA's "
                      "--xla_cpu_max_isa: SSE4_2, AVX, AVX2, AVX512, ...); `run` stores a second "
                      "realization, analysis/results/NAME@ISA.json")
  e.set_defaults(func=_experiments)


def _add_roofline(sub) -> None:
  r = sub.add_parser("roofline", help="critical batches, max slices, bandwidth and memory",
                     description="Roofline numbers for one run: critical batch sizes, the "
                                 "largest number of slices, cross-slice bandwidth for a "
                                 "target utilization and memory per chip.")
  _add_hardware_and_model(r)
  r.add_argument("--global-batch-tokens", type=int, required=True,
                 help="tokens per step over all slices")
  r.add_argument("--slices", type=int, required=True, help="M, slices (replicas) over DCN")
  r.add_argument("--chips-per-slice", type=int, default=256, help="chips in one slice (256)")
  r.add_argument("--seq-len", type=int, default=None,
                 help="context length for attention FLOPs (default: the model's)")
  r.add_argument("--bits", type=float, default=16, help="bits per value on the wire (16)")
  r.add_argument("--sync-every", type=int, default=100, help="H, DiLoCo inner steps (100)")
  r.add_argument("--fragments", type=int, default=None,
                 help="P, Streaming fragments incl. fragment 0 (the embeddings); P must divide "
                      "H and P - 1 the layers (default: 1 + the smallest divisor of L >= 4)")
  r.add_argument("--overlap", type=int, default=1, help="tau, Streaming overlap steps (1)")
  r.add_argument("--mfu", type=float, default=1.0,
                 help="model FLOPs utilization used for the step time (1.0: peak)")
  r.add_argument("--target", type=float, default=0.95,
                 help="target compute utilization for the bandwidth column (0.95)")
  r.add_argument("--latency", type=float, default=0.0, help="seconds per transfer (0)")
  r.set_defaults(func=_roofline)


def _add_plan(sub) -> None:
  q = sub.add_parser("plan", help="candidate H, P, tau for a link, and a suggestion",
                     description="Plan a run across slices: for DP, DiLoCo and Streaming "
                                 "DiLoCo candidates (H, P, tau valid for the trainer), the "
                                 "bandwidth per slice and memory each needs, and the one "
                                 "suggested for the link (see analysis.planning.plan.plan_run).")
  _add_hardware_and_model(q)
  q.add_argument("--slices", type=int, required=True, help="M, slices (replicas) over the link")
  q.add_argument("--chips-per-slice", type=int, required=True, help="chips in one slice")
  q.add_argument("--seq-len", type=int, required=True, help="context length (attention FLOPs)")
  q.add_argument("--global-batch-tokens", type=int, required=True,
                 help="tokens per step over all slices")
  q.add_argument("--link-gbps", type=float, required=True,
                 help="the cross-slice link per slice, Gbit/s")
  q.add_argument("--mfu", type=float, default=0.5, help="model FLOPs utilization (0.5)")
  q.add_argument("--target", type=float, default=0.95,
                 help="compute utilization to plan for (0.95)")
  q.add_argument("--bits", type=float, default=16, help="bits per value on the wire (16)")
  q.add_argument("--sync-every", type=int, nargs="+", default=None,
                 help="H candidates (default: L + 1 and "
                      f"{' '.join(map(str, plan_lib.SYNC_EVERY_LADDER))})")
  q.add_argument("--overlaps", type=int, nargs="+", default=None,
                 help=f"tau candidates for Streaming (default: "
                      f"{' '.join(map(str, plan_lib.OVERLAPS))})")
  q.add_argument("--min-sync-every", type=int, default=plan_lib.MIN_SYNC_EVERY,
                 help="quality floor: no H below it is suggested while a candidate at or above it "
                      "fits (at one outer LR, a smaller H cost loss in the tuning sweep); 1: the "
                      f"smallest H the link carries ({plan_lib.MIN_SYNC_EVERY})")
  q.add_argument("--eager", action="store_true",
                 help="also consider DiLoCo with eager updates (outer_overlap='eager') at each H")
  q.add_argument("--topk", type=int, default=None,
                 help="DiLoCo/Streaming send the k largest entries of each chunk (SparseLoCo),"
                      " each value in --bits (default: dense)")
  q.add_argument("--topk-chunk", type=int, default=None,
                 help=f"elements per top-k chunk ({DEFAULT_CHUNK})")
  q.set_defaults(func=_plan)


def main(argv=None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  try:
    args.func(args)
  except (ValueError, OSError) as e:
    print(f"error: {as_flags(str(e), option_flags(parser))}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
