"""The main job: DP vs DiLoCo vs Streaming DiLoCo on the built-in data, one table, one plot.

``python -m diloco_core.compare --out runs/compare`` trains the same model from the same
initialisation with the three algorithms (same replicas M, per-replica batch, steps and
inner optimizer), prints a comparison table (final eval loss, gap to the data's exact
entropy floor, bytes each replica sent in total and at peak, wall time) and writes
``loss.png``, ``comparison.csv`` and every run's ``metrics.jsonl`` / ``summary.json``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

import pandas as pd

from diloco_core.config import DiLoCoConfig
from diloco_core.train import TrainConfig, train


def comparison_configs(base: TrainConfig, *, replicas: int, sync_every: int, fragments: int,
                       overlap: int) -> dict[str, TrainConfig]:
  """The three runs: DP, vanilla DiLoCo and Streaming DiLoCo sharing everything else."""
  runs = {
      "dp": DiLoCoConfig(algorithm="dp", replicas=replicas),
      "diloco": DiLoCoConfig(algorithm="diloco", replicas=replicas, sync_every=sync_every),
      "streaming": DiLoCoConfig(algorithm="streaming", replicas=replicas, sync_every=sync_every,
                                fragments=fragments, overlap=overlap),
  }
  out = {}
  for name, algo in runs.items():
    sub = None if base.out is None else os.path.join(base.out, name)
    out[name] = dataclasses.replace(base, algo=algo, out=sub)
  return out


def summary_table(results: dict) -> pd.DataFrame:
  """One row per algorithm from :class:`~diloco_core.train.TrainResult` objects."""
  rows = []
  for name, r in results.items():
    s = r.summary
    rows.append({
        "algorithm": name,
        "final eval loss": s["final_eval_loss"],
        "gap to floor": s["gap_to_floor"],
        "MB sent / replica": s["total_bytes_per_replica"] / 1e6,
        "peak MB / step": s["peak_bytes_per_step"] / 1e6,
        "wall time (s)": s["wall_time_s"],
    })
  return pd.DataFrame(rows).set_index("algorithm")


def loss_figure(results: dict, floor: float | None):
  """Eval loss of the global params vs step for each algorithm, with the entropy floor."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  for name, r in results.items():
    m = r.metrics.dropna(subset=["eval_loss"])
    ax.plot(m["step"], m["eval_loss"], label=name, marker="o", ms=3)
  if floor is not None:
    ax.axhline(floor, color="k", ls="--", lw=1, label=f"entropy floor {floor:.3f}")
  ax.set_xlabel("inner step")
  ax.set_ylabel("eval loss (nats/token)")
  top = max(float(r.metrics["eval_loss"].dropna().iloc[1]) for r in results.values())
  ax.set_ylim(bottom=0.95 * (floor if floor is not None else 0.0), top=1.05 * top)
  ax.legend()
  ax.grid(alpha=0.3)
  fig.tight_layout()
  return fig


def main(argv: list[str] | None = None) -> int:
  p = argparse.ArgumentParser(prog="python -m diloco_core.compare", description=__doc__.splitlines()[0],
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
  p.add_argument("--out", default="runs/compare", help="output directory")
  p.add_argument("--model", default="small", help="model preset")
  p.add_argument("--steps", type=int, default=600, help="inner steps per run")
  p.add_argument("--replicas", type=int, default=4, help="M")
  p.add_argument("--sync-every", type=int, default=50, help="H for DiLoCo and Streaming")
  p.add_argument("--fragments", type=int, default=5, help="P for Streaming ((P-1) must divide L)")
  p.add_argument("--overlap", type=int, default=1, help="τ for Streaming")
  p.add_argument("--batch-size", type=int, default=8, help="sequences per replica per step")
  p.add_argument("--seq-len", type=int, default=64, help="tokens per sequence")
  p.add_argument("--overwrite", action="store_true", help="allow --out to hold earlier results")
  p.add_argument("--no-progress", action="store_true", help="hide progress bars")
  args = p.parse_args(argv)
  try:
    base = TrainConfig(model=args.model, steps=args.steps, batch_size=args.batch_size,
                       seq_len=args.seq_len, out=args.out, overwrite=args.overwrite,
                       progress=not args.no_progress)
    configs = comparison_configs(base, replicas=args.replicas, sync_every=args.sync_every,
                                 fragments=args.fragments, overlap=args.overlap)
    for cfg in configs.values():  # every run is checked before the first one trains
      cfg.validate()
    results = {name: train(cfg) for name, cfg in configs.items()}
  except (ValueError, FileNotFoundError, FloatingPointError) as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  table = summary_table(results)
  floor = results["dp"].summary["loss_floor"]
  os.makedirs(args.out, exist_ok=True)
  table.to_csv(os.path.join(args.out, "comparison.csv"))
  loss_figure(results, floor).savefig(os.path.join(args.out, "loss.png"), dpi=120)
  with pd.option_context("display.float_format", "{:.4f}".format, "display.width", 120):
    print()
    print(f"M={args.replicas} replicas x {args.batch_size} seqs x {args.seq_len} tokens, "
          f"{args.steps} steps, H={args.sync_every}, streaming P={args.fragments} τ={args.overlap}; "
          f"entropy floor {floor:.4f} nats/token")
    print(table.to_string())
  print(f"\nwrote {os.path.join(args.out, 'loss.png')} and {os.path.join(args.out, 'comparison.csv')}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
