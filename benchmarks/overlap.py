"""Background communication over a shaped link, measured beside the simulator, in one run.

Two trainer processes (``python -m diloco_core.launch --processes 2 --link-mbit R``), one
replica each, DiLoCo with H inner steps (:func:`analysis.lab.measured.overlap_benchmark`): a
calibration run measures the pure compute time T of a step, the payload and the cost of one
collective; the link is then shaped so that one payload's gather takes about k steps, and
in-step, background τ = 0, background τ = k + 1 and background eager run on it. Per row: wall
time per step, the fraction of the communication hidden, the measured compute utilization
(pure compute ÷ wall, from the run's own trace) and the utilization the simulator predicts
for the same T, payload, rate and schedule. Targets: τ ≥ k hides ≥ 90%; measured within 0.10
of simulated in every row. Measured, never asserted. Needs Linux, root and iproute2.

With ``--wire`` it measures instead the packed wire formats
(:func:`analysis.lab.wire_measured.wire_benchmark`): over one shaped link, float32, bf16 and fp4
payloads (τ = 0), the bytes each process handed to the link and received per sync, the median
transfer time and float32's time over it (target: close to the bit ratio, >= 5x for fp4 once
the payload dominates the per-collective cost), the utilization measured and simulated for
each (within 0.10); then the bytes one process sends and receives per sync with 4 processes
(fp4 in blocks, unshaped), by all-gather and by reduce-scatter (target: it receives
2 (N - 1) / N = 1.5 payloads where the all-gather receives N - 1 = 3).

``--store`` also stores the measurement for the background-communication page: the overlap runs
at the page's setting (:func:`analysis.lab.overlap_measured.store_overlap`), or with ``--wire`` the
wire formats (:func:`analysis.lab.wire_measured.store_wire`).

Usage: python benchmarks/overlap.py [--k 3] [--sync-every 12] [--steps 60] [--model small] [--wire] [--store]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from analysis.lab.measured import can_shape, overlap_benchmark  # noqa: E402


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--k", type=int, default=3, help="steps one payload's gather should take (3)")
  p.add_argument("--sync-every", type=int, default=12, help="H (12)")
  p.add_argument("--steps", type=int, default=60, help="steps per run (60)")
  p.add_argument("--model", default="small", help="model preset (small)")
  p.add_argument("--batch-size", type=int, default=16, help="sequences per replica (16)")
  p.add_argument("--wire", action="store_true", help="measure the packed wire formats instead")
  p.add_argument("--store", action="store_true", help="store the measurement the background-communication page"
                 " shows (analysis/results/measured/overlap.json, or wire.json with --wire); without --wire, at"
                 " the page's setting (overlap_measured.PAGE_SETTING), whatever the other flags say")
  a = p.parse_args(argv)
  why = can_shape()
  if why is not None:
    sys.exit(f"overlap benchmark: {why}")
  if a.store and not a.wire:
    from analysis.lab.overlap_measured import PAGE_SETTING
    a.k, a.sync_every, a.steps, a.model, a.batch_size = (PAGE_SETTING[k] for k in
                                                          ("k", "sync_every", "steps", "model", "batch_size"))
  if a.wire:
    return wire(a, argv if argv is not None else sys.argv[1:])
  with tempfile.TemporaryDirectory() as tmp:
    s, table = overlap_benchmark(tmp, k=a.k, sync_every=a.sync_every, steps=a.steps, model=a.model,
                                 batch_size=a.batch_size)
    if a.store:
      import shlex
      from analysis.lab.overlap_measured import STORED, store_overlap
      store_overlap(s, table, shlex.join(["python", "benchmarks/overlap.py", *(argv if argv is not None else sys.argv[1:])]))
      print(f"stored {STORED}")
  print(f"model {s['model']}: T = {s['step_s'] * 1e3:.1f} ms of compute per local step and"
        f" {s['host_s'] * 1e3:.1f} ms of the process's own work between steps (in-step's SPMD"
        f" step between syncs: {s['in_step_s'] * 1e3:.1f} ms), payload {s['payload_bytes'] / 1e6:.3f} MB (float32),"
        f" one collective unshaped {s['latency_s'] * 1e3:.1f} ms; link {s['mbit']:.1f} Mbit/s (one gather ≈"
        f" {s['k']} steps), H = {s['sync_every']}, steps {s['first_step']}..{s['last_step']} measured"
        " (means over the 2 processes)")
  print(f"{'run':<20} {'s/step':>8} {'hidden':>7} {'util (measured)':>16} {'util (simulated)':>17} {'|diff|':>7}")
  for r in table.itertuples():
    hidden = "-" if r.hidden != r.hidden else f"{r.hidden:.1%}"
    print(f"{r.run:<20} {r.s_per_step:8.4f} {hidden:>7} {r.measured:16.3f} {r.simulated:17.3f}"
          f" {abs(r.measured - r.simulated):7.3f}")


def wire(a, argv: list[str]) -> None:
  import shlex
  from analysis.lab.wire_measured import STORED, store_wire, wire_benchmark
  with tempfile.TemporaryDirectory() as tmp:
    s, formats, processes = wire_benchmark(tmp, model=a.model, batch_size=a.batch_size)
  if a.store:
    store_wire(s, formats, processes, shlex.join(["python", "benchmarks/overlap.py", *argv]))
    print(f"stored {STORED}")
  print(f"model {s['model']}: T = {s['step_s'] * 1e3:.1f} ms per step, float32 payload"
        f" {s['payload_bytes'] / 1e6:.3f} MB, one collective unshaped {s['latency_s'] * 1e3:.1f} ms; link"
        f" {s['mbit']:.1f} Mbit/s (a float32 gather ≈ {s['k']} steps), H = {s['sync_every']}, τ = 0")
  print(f"{'format':<7} {'sent B':>10} {'received B':>11} {'counted B':>10} {'transfer s':>11}"
        f" {'f32 / this':>10} {'util meas.':>10} {'util sim.':>9} {'|diff|':>7}")
  for r in formats.itertuples():
    print(f"{r.format:<7} {r.sent_bytes:10.0f} {r.received_bytes:11.0f} {r.counted_bytes:10.1f}"
          f" {r.transfer_s:11.4f} {r.f32_over_this:10.2f} {r.measured:10.3f} {r.simulated:9.3f}"
          f" {abs(r.measured - r.simulated):7.3f}")
  print("fp4 in blocks, unshaped, per process and sync:")
  for r in processes.itertuples():
    print(f"  {r.processes} processes, {r.reduction:<14}: sent {r.sent_bytes:.0f} B, received"
          f" {r.received_bytes:.0f} B ({r.received_over_sent:.2f}x what it sent)")


if __name__ == "__main__":
  main()
