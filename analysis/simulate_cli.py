"""``python -m analysis simulate``: the compute-utilization simulator on the command line.

It prints the bandwidth (Gbit/s) each target utilization needs, exact (bisection) and rounded
up to the Streaming DiLoCo paper's 50-point grid, the utilization at given bandwidths, or the
paper's whole table (:mod:`analysis.planning.simulate`).
"""

from __future__ import annotations

import time

import pandas as pd

from analysis.planning import simulate as sim
from diloco_core.spec.validity import FRAGMENT_PATTERNS
from diloco_core.spec.validity import check_real


def simulate(a) -> None:
  """Runs ``python -m analysis simulate`` with the parsed arguments ``a`` (prints its tables)."""
  check_real("--latency", a.latency, low=0.0)
  if a.step_time is not None:
    check_real("--step-time", a.step_time, low=0.0, low_open=True)
  if a.rounding is not None and not a.table:
    raise ValueError("--rounding applies to --table (the paper's grid); the other output prints both"
                     " roundings: pass --table or drop --rounding.")
  a.rounding = "grid" if a.rounding is None else a.rounding
  common = dict(replicas=a.replicas, sync_every=a.sync_every,
                fragment_layers=a.fragment_layers, latency=a.latency,
                fragment_pattern=a.fragment_pattern, bucket_layers=a.bucket_layers)
  if a.table:
    t0 = time.perf_counter()
    table = sim.paper_table(rounding=a.rounding, **common)
    print(f"Bandwidth (Gbit/s) for each compute utilization, rounding={a.rounding} "
          f"(M={a.replicas}, H={a.sync_every}, {a.fragment_layers} layers per fragment "
          f"({a.fragment_pattern}), "
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



def add_simulate(sub) -> None:
  """Adds the ``simulate`` command to the subparsers ``sub`` of ``python -m analysis``."""
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
  s.add_argument("--fragment-pattern", default="strided", choices=FRAGMENT_PATTERNS,
                 help="how layers are dealt to fragments, as in the trainer (strided)")
  s.add_argument("--bucket-layers", type=int, default=1,
                 help="layers per gradient bucket, released when its backward pass ends (1)")
  s.add_argument("--overlap", type=int, default=0, help="tau, steps before merging (0)")
  s.add_argument("--bits", type=float, default=16, help="bits per value on the wire (16)")
  s.add_argument("--latency", type=float, default=0.0, help="seconds per chunk (0)")
  s.add_argument("--target", type=float, nargs="+", default=None,
                 help="target utilizations in (0, 1) (default: 0.5 0.8 0.9 0.95 0.99)")
  s.add_argument("--bandwidth", type=float, nargs="+", default=None,
                 help="also print the utilization at these bandwidths (Gbit/s)")
  s.add_argument("--table", action="store_true",
                 help="print the Streaming DiLoCo paper's table (3 models x 5 methods)")
  s.add_argument("--rounding", default=None, choices=sim.ROUNDINGS,
                 help="table values: grid (first grid point reaching the target), paper (the grid"
                      " point below it, the paper's reading) or exact (bisection) (grid)")
  s.set_defaults(func=simulate)
