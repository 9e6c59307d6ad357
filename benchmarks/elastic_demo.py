"""The elastic demo of the background-communication page, run and stored: a process killed and replaced.

Three processes train Streaming DiLoCo with ``--elastic``; the launcher kills process 2 once it
computed step 10 and starts it again (:func:`analysis.lab.elastic_measured.elastic_demo`). Prints
when it was lost, rejoined and healed; with ``--store`` writes the run's raw rows (every process's
trace, the metrics) with this machine's provenance to ``analysis/results/measured/elastic_demo.json``
(:func:`~analysis.lab.elastic_measured.store_demo`), which the page reads and computes from. About
a minute on 2 CPU cores.

Usage: python benchmarks/elastic_demo.py [--store]
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from analysis.lab.elastic_measured import DEMO_STORED, elastic_demo, store_demo  # noqa: E402


def main(argv=None) -> None:
  argv = sys.argv[1:] if argv is None else argv
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--store", action="store_true", help="write analysis/results/measured/elastic_demo.json")
  a = p.parse_args(argv)
  with tempfile.TemporaryDirectory() as tmp:
    demo = elastic_demo(tmp)
  print(f"process {demo['killed']} killed after step {demo['last_step']}, left out at step {demo['lost_step']}"
        f" ({demo['lost_time'] - demo['kill_time']:.1f} s later), its replacement joined"
        f" {demo['join_time'] - demo['kill_time']:.1f} s after the kill and was healed at step {demo['healed_step']};"
        f" final eval loss {demo['metrics']['eval_loss'].dropna().iloc[-1]:.4f}")
  if a.store:
    store_demo(demo, shlex.join(["python", "benchmarks/elastic_demo.py", *argv]))
    print(f"stored {DEMO_STORED}")


if __name__ == "__main__":
  main()
