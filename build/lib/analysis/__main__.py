"""Command line: ``python -m analysis {roofline,plan,simulate,hardware,models} --help``.

Examples::

  python -m analysis roofline --hardware v5p --model 8B --global-batch-tokens 4194304 --slices 4
  python -m analysis plan --model qwen3-8b --hardware v5p --slices 2 --chips-per-slice 64 \\
      --seq-len 4096 --global-batch-tokens 2097152 --mfu 0.5 --target 0.95 --link-gbps 100
  python -m analysis simulate --model 1B --method streaming --overlap 1 --bits 4 --target 0.95
  python -m analysis simulate --table

Errors (unknown names, out-of-range values) print one line to stderr and exit with 2.
"""

from __future__ import annotations

import argparse
import sys
import time

import pandas as pd

from analysis import plan as plan_lib
from analysis import roofline as rl
from analysis import simulate as sim
from analysis.hardware import HARDWARE
from analysis.hardware import get_hardware
from analysis.models import MODELS
from analysis.models import get_model
from analysis.models import model_stats
from analysis.models import model_table

_GBIT = 1e9 / 8  # bytes/s in one Gbit/s


class _Parser(argparse.ArgumentParser):
  """argparse with one-line errors (exit code 2, as argparse)."""

  def error(self, message):
    self.exit(2, f"{self.prog}: error: {message}\n")


def _fmt(x, unit=""):
  if x is None:
    return "-"
  if x == float("inf"):
    return "inf"
  return f"{x:,.4g}{unit}"


def _default_fragments(layers: int) -> int:
  """P = 1 + the smallest divisor of L that is >= 4 (fragment 0 holds the embeddings)."""
  return 1 + next(d for d in range(min(4, layers), layers + 1) if layers % d == 0)


def _roofline(a) -> None:
  hw = get_hardware(a.hardware)
  cfg = get_model(a.model)
  stats = model_stats(cfg, a.seq_len)
  seq = stats.seq_len
  m, n = a.slices, a.chips_per_slice
  if m < 1 or n < 1:
    raise ValueError(f"--slices and --chips-per-slice must be >= 1, got {m} and {n}.")
  if a.global_batch_tokens <= 0:
    raise ValueError(f"--global-batch-tokens must be > 0, got {a.global_batch_tokens}.")
  if not 0 < a.mfu <= 1:
    raise ValueError(f"--mfu must be in (0, 1], got {a.mfu}.")
  h, tau = a.sync_every, a.overlap
  p = _default_fragments(cfg.n_layers) if a.fragments is None else a.fragments
  tokens_slice = a.global_batch_tokens / m
  tokens_chip = tokens_slice / n
  step = rl.t_math(stats.flops_per_token * tokens_slice, n * hw.peak_flops * a.mfu)
  kw = dict(model=cfg, seq_len=seq, bits=a.bits, replicas=m)
  gbs_kw = dict(model=cfg, seq_len=seq, bits=a.bits)
  payload = rl.payload_bytes(stats.total_params, a.bits, m)
  ici = rl.dp_critical_batch_per_chip(hw, model=cfg, seq_len=seq, bits=a.bits)

  rows = {}
  rows["DP"] = dict(
      critical_tokens_per_slice=rl.dp_critical_batch_per_slice(hw, **kw),
      max_slices=rl.max_slices(a.global_batch_tokens, hw, method="dp", **gbs_kw),
      gbps_per_slice=rl.required_bandwidth(a.target, payload, step, 1, a.latency) / _GBIT,
      memory_gb_per_chip=rl.memory_per_replica(cfg, method="dp").total / n / 1e9)
  rows[f"DiLoCo H={h}"] = dict(
      critical_tokens_per_slice=rl.diloco_critical_batch_per_slice(hw, h, **kw),
      max_slices=rl.max_slices(a.global_batch_tokens, hw, method="diloco", sync_every=h,
                               **gbs_kw),
      gbps_per_slice=rl.required_bandwidth(a.target, payload, step, h, a.latency) / _GBIT,
      memory_gb_per_chip=rl.memory_per_replica(cfg, method="diloco", sync_every=h).total
      / n / 1e9)
  if tau == 0:
    w = rl.required_bandwidth(a.target, payload / p, step, h / p, a.latency)
  else:
    w = rl.hidden_bandwidth(payload / p, step, tau, h / p)
  rows[f"Streaming H={h} P={p} tau={tau}"] = dict(
      critical_tokens_per_slice=rl.streaming_critical_batch_per_slice(hw, h, p, tau, **kw),
      max_slices=rl.max_slices(a.global_batch_tokens, hw, method="streaming", sync_every=h,
                               fragments=p, overlap=tau, **gbs_kw),
      gbps_per_slice=w / _GBIT,
      memory_gb_per_chip=rl.memory_per_replica(cfg, method="streaming", sync_every=h,
                                               fragments=p, overlap=tau).total / n / 1e9)
  table = pd.DataFrame.from_dict(rows, orient="index")
  table["compute_bound"] = tokens_slice >= table["critical_tokens_per_slice"]

  print(f"{hw.name}: {hw.peak_flops:.3g} FLOP/s, HBM {hw.hbm_bytes / 1e9:.0f} GB at "
        f"{hw.hbm_bandwidth:.3g} B/s, ICI {hw.ici_bandwidth:.3g} B/s per chip and axis, "
        f"DCN {hw.dcn_bandwidth:.3g} B/s per chip ({hw.chips_per_host} chips per host)")
  print("critical intensity (FLOPs/byte): "
        f"HBM {rl.critical_intensity(hw.peak_flops, hw.hbm_bandwidth):,.0f}, "
        f"ICI {rl.critical_intensity(hw.peak_flops, hw.ici_bandwidth):,.0f}, "
        f"DCN {rl.critical_intensity(hw.peak_flops, hw.dcn_bandwidth):,.0f}")
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
        f"gbps_per_slice: bandwidth for {a.target:.0%} utilization with blocking transfers "
        f"(closed form; for Streaming with tau >= 1, the bandwidth that hides every "
        f"transfer); memory_gb_per_chip: replica state sharded over the slice (HBM "
        f"{hw.hbm_bytes / 1e9:.0f} GB).")
  print(table.to_string(formatters=dict(
      critical_tokens_per_slice=lambda v: f"{v:,.0f}", gbps_per_slice=_fmt,
      memory_gb_per_chip=lambda v: f"{v:,.2f}")))


def _plan(a) -> None:
  kw = {} if a.overlaps is None else dict(overlaps=a.overlaps)
  p = plan_lib.plan_run(a.model, a.hardware, slices=a.slices, chips_per_slice=a.chips_per_slice,
                        seq_len=a.seq_len, global_batch_tokens=a.global_batch_tokens,
                        link_gbps=a.link_gbps, mfu=a.mfu, target=a.target, bits=a.bits,
                        sync_every=a.sync_every, **kw)
  hw = get_hardware(a.hardware)
  print(f"model {a.model}: {p.params:,} parameters ({p.active_params:,} active), {p.layers} "
        f"layers; {hw.name}, {p.slices} slices x {p.chips_per_slice} chips")
  print(f"run: {p.global_batch_tokens:,} tokens per step, {p.tokens_per_slice:,.0f} per slice, "
        f"seq_len {p.seq_len}; step time {p.step_time:.4g} s at MFU {p.mfu:g}; DP across "
        f"slices is compute-bound above {p.dp_critical_tokens:,.0f} tokens per slice")
  print(f"network per slice: link {p.link_gbps:,.4g} Gbit/s, in-pod DCN {p.dcn_gbps:,.4g} Gbit/s;"
        f" {p.bits:g}-bit payload; Gbit/s per slice: blocking transfers at {p.target:.0%} "
        f"utilization (tau = 0) or every fragment hidden behind tau steps (tau >= 1)")
  print()
  fmt = {"Gbit/s per slice": _fmt, "GB per sync": lambda v: f"{v:,.3g}",
         "memory GB/replica": lambda v: f"{v:,.0f}", "memory GB/chip": lambda v: f"{v:,.2f}"}
  print(p.table.drop(columns=["method"]).to_string(formatters=fmt))
  print()
  print(f"choice: {p.choice if p.choice is not None else 'none'}")
  print(f"reason: {p.reason}")


def _simulate(a) -> None:
  common = dict(replicas=a.replicas, sync_every=a.sync_every,
                fragment_layers=a.fragment_layers, latency=a.latency)
  if a.table:
    t0 = time.perf_counter()
    table = sim.paper_table(rounding=a.rounding, **common)
    print(f"Bandwidth (Gbit/s) for each compute utilization, rounding={a.rounding} "
          f"(M={a.replicas}, H={a.sync_every}, {a.fragment_layers} layers per fragment, "
          f"tau=1 for overlap rows, latency {a.latency} s); "
          f"computed in {time.perf_counter() - t0:.2f} s")
    print(table.to_string(float_format=lambda v: f"{v:.3g}"))
    return
  if a.model.lower() in {k.lower() for k in sim.SIM_MODELS}:
    model = sim.get_sim_model(a.model)
    if a.step_time is not None:
      model = sim.SimModel(model.params, model.layers, a.step_time)
  else:
    if a.step_time is None:
      raise ValueError(f"--step-time is needed for --model {a.model!r} (only "
                       f"{list(sim.SIM_MODELS)} have one).")
    model = sim.SimModel.from_config(a.model, a.step_time)
  kw = dict(common, overlap=a.overlap, bits=a.bits)
  targets = a.target or list(sim.PAPER_TARGETS)
  exact = sim.bandwidth_for_utilization(targets, model, a.method, rounding="exact", **kw)
  grid = sim.bandwidth_for_utilization(targets, model, a.method, rounding="grid", **kw)
  at = {f"{w:g}": sim.run_simulation(model, a.method, w, **kw).utilization
        for w in (a.bandwidth or [])}
  print(f"model: {model.params:.4g} parameters, {model.layers} layers, {model.step_time} s/step;"
        f" method {a.method}, M={a.replicas}, H={a.sync_every}, tau={a.overlap}, "
        f"{a.bits:g}-bit, latency {a.latency} s")
  if at:
    print(pd.Series(at, name="utilization").rename_axis("Gbit/s").to_string(
        float_format=lambda v: f"{v:.4f}"))
  print(pd.DataFrame({"exact Gbit/s": exact, "paper grid Gbit/s": grid},
                     index=[f"{u:.0%}" for u in targets]).rename_axis("utilization").to_string(
                         float_format=lambda v: f"{v:.4g}"))


def _hardware(a) -> None:
  rows = {k: dict(name=h.name, peak_flops=h.peak_flops, hbm_gb=h.hbm_bytes / 1e9,
                  hbm_bw=h.hbm_bandwidth, ici_bw=h.ici_bandwidth, dcn_bw_chip=h.dcn_bandwidth,
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
                 help="P, Streaming fragments incl. fragment 0 (the embeddings); P - 1 must "
                      "divide the layers (default: 1 + the smallest divisor of L >= 4)")
  r.add_argument("--overlap", type=int, default=1, help="tau, Streaming overlap steps (1)")
  r.add_argument("--mfu", type=float, default=1.0,
                 help="model FLOPs utilization used for the step time (1.0: peak)")
  r.add_argument("--target", type=float, default=0.95,
                 help="target compute utilization for the bandwidth column (0.95)")
  r.add_argument("--latency", type=float, default=0.0, help="seconds per transfer (0)")
  r.set_defaults(func=_roofline)

  q = sub.add_parser("plan", help="candidate H, P, tau for a link, and a suggestion",
                     description="Plan a run across slices: for DP, DiLoCo and Streaming "
                                 "DiLoCo candidates (H, P, tau valid under SPEC.md), the "
                                 "bandwidth per slice and memory each needs, and the one "
                                 "suggested for the link (see analysis.plan.plan_run).")
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
                 help="compute utilization for blocking transfers (0.95)")
  q.add_argument("--bits", type=float, default=16, help="bits per value on the wire (16)")
  q.add_argument("--sync-every", type=int, nargs="+", default=None,
                 help="H candidates (default: L + 1 and "
                      f"{' '.join(map(str, plan_lib.SYNC_EVERY_LADDER))})")
  q.add_argument("--overlaps", type=int, nargs="+", default=None,
                 help=f"tau candidates for Streaming (default: "
                      f"{' '.join(map(str, plan_lib.OVERLAPS))})")
  q.set_defaults(func=_plan)

  s = sub.add_parser("simulate", help="simulated utilization and bandwidth for a target",
                     description="Discrete-event simulation of M datacenters on one WAN link; "
                                 "prints the bandwidth (Gbit/s) needed for each target "
                                 "utilization, exact (bisection) and rounded up to the "
                                 "paper's 50-point grid, or the paper's whole table.")
  s.add_argument("--model", default="1B",
                 help=f"one of {list(sim.SIM_MODELS)} (paper step times), or a catalog model "
                      f"with --step-time")
  s.add_argument("--method", default="streaming", choices=sim.METHODS,
                 help="dp, diloco or streaming (streaming)")
  s.add_argument("--step-time", type=float, default=None, help="seconds of compute per step")
  s.add_argument("--replicas", type=int, default=2, help="M, datacenters (2)")
  s.add_argument("--sync-every", type=int, default=100, help="H (100)")
  s.add_argument("--fragment-layers", type=int, default=3,
                 help="layers per Streaming fragment; must divide the layers (3)")
  s.add_argument("--overlap", type=int, default=0, help="tau, steps before merging (0)")
  s.add_argument("--bits", type=float, default=16, help="bits per value on the wire (16)")
  s.add_argument("--latency", type=float, default=0.0, help="seconds per transfer (0)")
  s.add_argument("--target", type=float, nargs="+", default=None,
                 help="target utilizations in (0, 1) (default: 0.5 0.8 0.9 0.95 0.99)")
  s.add_argument("--bandwidth", type=float, nargs="+", default=None,
                 help="also print the utilization at these bandwidths (Gbit/s)")
  s.add_argument("--table", action="store_true",
                 help="print the Streaming DiLoCo paper's table (3 models x 5 methods)")
  s.add_argument("--rounding", default="grid", choices=("grid", "exact"),
                 help="table values: the paper's grid or exact bisection (grid)")
  s.set_defaults(func=_simulate)

  h = sub.add_parser("hardware", help="list the hardware catalog",
                     description="The hardware catalog (per chip, bytes and bytes/s).")
  h.set_defaults(func=_hardware)
  m = sub.add_parser("models", help="list the model catalog",
                     description="The model catalog with parameter counts and FLOPs/token.")
  m.add_argument("--seq-len", type=int, default=None, help="context length (default: own)")
  m.set_defaults(func=_models)
  return p


def main(argv=None) -> int:
  parser = build_parser()
  args = parser.parse_args(argv)
  try:
    args.func(args)
  except ValueError as e:
    print(f"{parser.prog}: error: {e}", file=sys.stderr)
    return 2
  return 0


if __name__ == "__main__":
  sys.exit(main())
