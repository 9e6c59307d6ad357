"""A live sweep's printed estimate against the time it took, on this machine's CPU, stored.

Trains, as a notebook does the first time (an empty sweep cache and an empty JAX compilation
cache beside it: every program compiled), the sweep :func:`analysis.lab.notebooks_measured.cpu_sweep`
(the stored experiments' ``mini`` model at 400 steps: two DiLoCo runs sharing a program and a DP
run), and prints the estimate :func:`analysis.lab.live.live_sweep` printed before training beside
the time the training took. ``--store`` writes the sweep (plan, estimate, time, runs) with the
machine's provenance to ``analysis/results/measured/live_estimate.json``; the tutorial shows it
beside the TPU's notebooks, and :func:`~analysis.lab.notebooks_measured.load_cpu_estimate` holds it
to the same bound as theirs. A measurement, not a test: a timing on a shared machine is noisy.

    python benchmarks/live_estimate.py --store     # about 30 s on 2 CPU cores (run it on an idle machine)
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--store", action="store_true", help="write analysis/results/measured/live_estimate.json")
  args = p.parse_args(argv)
  os.environ.pop("JAX_COMPILATION_CACHE_DIR", None)  # the sweep's own, empty one (beside its sweep cache)
  from analysis.lab import live, notebooks_measured as nbm
  from analysis.lab.measured import machine_provenance, write_measurement
  with tempfile.TemporaryDirectory() as tmp:
    live.live_sweep(nbm.cpu_sweep(), cache=os.path.join(tmp, "sweeps"), progress=False, desc="cpu sweep")
  record = nbm.sweep_record(live.TRAINED[-1])
  print(f"took / estimate - 1 = {nbm.estimate_error(record):+.1%} (bound ±{nbm.ESTIMATE_RTOL:.0%})")
  if args.store:
    doc = {"provenance": machine_provenance(" ".join(["python", "benchmarks/live_estimate.py", *argv])), "sweep": record}
    write_measurement(nbm.CPU_ESTIMATE_PATH, doc)
    print(f"wrote {os.path.relpath(nbm.CPU_ESTIMATE_PATH, ROOT)}")


if __name__ == "__main__":
  main()
