"""The command line of the main job: ``python -m diloco_core.compare`` (``make demo``).

The library part (the three runs, the table's rows) is :mod:`diloco_core.run.main_job`; this module
parses the options (the train command line's field metadata, :mod:`diloco_core.run.cli`), trains,
prints the table and writes ``comparison.csv`` and ``loss.png`` (:func:`loss_figure`: matplotlib
is imported here only, at the edge).
"""

from __future__ import annotations

import argparse
import os
import sys

from diloco_core.run import main_job
from diloco_core import interrupts
from diloco_core.devices.backend import configure_determinism, default_demo_steps
from diloco_core.run.flags import OneDefaultHelpFormatter, add_options, field_defaults, command_error, one_line_errors
from diloco_core.run.config import TrainConfig


def build_compare_parser() -> argparse.ArgumentParser:
  """The parser of ``python -m diloco_core.compare`` (defaults: :data:`diloco_core.run.main_job.DEFAULTS`)."""
  p = argparse.ArgumentParser(prog="python -m diloco_core.compare",
                              description=main_job.__doc__.splitlines()[0],
                              formatter_class=OneDefaultHelpFormatter,
                              allow_abbrev=False)
  defaults = {**field_defaults(TrainConfig()), **main_job.DEFAULTS}
  add_options(p, TrainConfig, defaults, only=set(main_job.DEFAULTS))
  steps = next(a for a in p._actions if a.dest == "steps")
  steps.help = (f"inner steps (default: {default_demo_steps('gpu')} on a GPU/TPU, so that the outer"
                f" loop matters; {default_demo_steps('cpu')} on CPU)")
  return p


def compare_main(argv: list[str] | None = None) -> int:
  """``python -m diloco_core.compare``: trains the three runs, prints and writes the table and plot.

  Bad input: one ``error:`` line, exit 2. SIGINT / SIGTERM: one line naming the run and step
  it stopped at, exit 130 (the comparison has no resume: it is run again with ``--overwrite``).
  """
  with interrupts.deferred():
    try:
      return _compare_main(argv)
    except KeyboardInterrupt as e:
      where = (f" during the {e.run} run at step {e.step}" if getattr(e, "run", None) else
               " before the first step")
      print(f"interrupted{where}; the comparison has no resume: run it again with --overwrite.",
            file=sys.stderr)
      return 130


def _compare_main(argv: list[str] | None) -> int:
  import pandas as pd
  parser = one_line_errors(build_compare_parser(),
                            "; the comparison trains dp, diloco and streaming with the options it lists")
  try:
    args = parser.parse_args(argv)
  except SystemExit as e:
    return int(e.code or 0)
  interrupts.check()
  configure_determinism(False if args.nondeterministic else None)  # before JAX starts
  args.steps = default_demo_steps() if args.steps is None else args.steps
  outer = {k: getattr(args, "algo." + k) for k in ("replicas", "sync_every", "fragments", "overlap")}
  try:
    configs = main_job.default_configs(
        model=args.model, steps=args.steps, nondeterministic=args.nondeterministic,
        batch_size=args.batch_size, seq_len=args.seq_len, out=args.out, overwrite=args.overwrite,
        progress=args.progress, **outer)
    results = main_job.compare(configs)
  except (ValueError, OSError, FloatingPointError) as e:
    return command_error(e)
  spread = {name: main_job.eval_spread(configs[name], r.summary["final_params"]) for name, r in results.items()
            if r.summary.get("final_params")}
  table = pd.DataFrame(main_job.summary_rows(results, spread if len(spread) == len(results) else None))
  table = table.set_index("algorithm")
  floor = results["dp"].summary["loss_floor"]
  os.makedirs(args.out, exist_ok=True)
  table.to_csv(os.path.join(args.out, "comparison.csv"))
  import matplotlib
  matplotlib.use("Agg")  # files only, no window
  loss_figure(results, floor).savefig(os.path.join(args.out, "loss.png"), dpi=120)
  with pd.option_context("display.float_format", "{:.4f}".format, "display.width", 120):
    print()
    print(f"M={outer['replicas']} replicas x {args.batch_size} seqs x {args.seq_len} tokens, "
          f"{args.steps} steps ({args.steps // outer['sync_every']} outer steps), H={outer['sync_every']},"
          f" streaming P={outer['fragments']}"
          f" τ={outer['overlap']}; entropy floor {floor:.4f} nats/token")
    print(table.to_string())
    note = main_job.floor_note(table, next(iter(spread.values()))["sequences"] if spread else 0)
    if note:
      print("\n" + note)
  print(f"\nwrote {os.path.join(args.out, 'loss.png')} and {os.path.join(args.out, 'comparison.csv')}")
  return 0


def loss_figure(results: dict, floor: float | None):
  """Eval loss of the global params vs step for each algorithm, with the entropy floor.

  Args:
    results: algorithm name -> :class:`~diloco_core.TrainResult` (its ``metrics`` rows).
    floor: the data's entropy floor (nats/token), or None.

  Returns:
    A matplotlib figure.
  """
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


if __name__ == "__main__":
  sys.exit(compare_main())
