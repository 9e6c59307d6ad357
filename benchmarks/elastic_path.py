"""The elastic data plane beside gloo (and the coordination service), measured in one run: MB/s of each and their ratio.

For each process count (``python -m diloco_core.launch --processes N --module
diloco_core.launch.path_probe``, :func:`analysis.lab.elastic_measured.path_benchmark`), processes
joined as an elastic run's, and each payload size: one payload per process over the data plane
(what every sync, log row, checkpoint row and heal of an ``--elastic`` run takes:
:meth:`~diloco_core.runtime.membership.Membership.exchange`), through JAX's coordination service
(the path before the data plane) and through gloo (a background run without ``--elastic``:
:meth:`~diloco_core.runtime.link.Link.gather`), the median of a few repeats. Per row: seconds and
MB/s (a process's payload over the time until every process has every payload) of each path,
and elastic / gloo (the target is at least 0.5). Then the reduction of ``--reduction
reduce-scatter`` (the mean of every process's payload of float32 values) over the data plane
(an elastic sync: :func:`~diloco_core.runtime.plane_reduce.reduce_over_members`) and over gloo
(:meth:`~diloco_core.runtime.link.Link.reduce`), and their ratio. Measured, never asserted.

Usage: python benchmarks/elastic_path.py [--sizes-mib 1,4,16,64] [--processes 2,3] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from analysis.lab.elastic_measured import PATH_SIZES_MIB, path_benchmark  # noqa: E402


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--sizes-mib", default=",".join(map(str, PATH_SIZES_MIB)),
                 help=f"payload sizes, MiB ({','.join(map(str, PATH_SIZES_MIB))})")
  p.add_argument("--processes", default="2,3", help="process counts, one probe each (2,3)")
  p.add_argument("--repeats", type=int, default=3, help="timed exchanges per size and path (3)")
  a = p.parse_args(argv)
  for n in (int(x) for x in a.processes.split(",")):
    table, result = path_benchmark([int(x) for x in a.sizes_mib.split(",")], repeats=a.repeats, processes=n)
    print(f"{n} processes on this machine, one payload per process, median of {a.repeats}; MB/s = 10^6 bytes/s;"
          f" chunks of {result['chunk_bytes'] / 2**20:g} MiB; heartbeat {result['heartbeat_s']} s")
    print(f"{'MiB':>5} {'plane s':>8} {'service s':>10} {'gloo s':>8} {'plane MB/s':>11} {'service MB/s':>13}"
          f" {'gloo MB/s':>10} {'plane/gloo':>11}")
    for r in table.itertuples():
      print(f"{r.size_mib:5.0f} {r.elastic_s:8.4f} {r.service_s:10.4f} {r.gloo_s:8.4f} {r.elastic_mb_s:11.1f}"
            f" {r.service_mb_s:13.1f} {r.gloo_mb_s:10.1f} {r.elastic_over_gloo:10.2f}x")
    print("the mean of every process's payload (--reduction reduce-scatter), median of the same repeats")
    print(f"{'MiB':>5} {'plane s':>8} {'gloo s':>8} {'plane MB/s':>11} {'gloo MB/s':>10} {'plane/gloo':>11}")
    for r in table.itertuples():
      print(f"{r.size_mib:5.0f} {r.elastic_reduce_s:8.4f} {r.gloo_reduce_s:8.4f} {r.elastic_reduce_mb_s:11.1f}"
            f" {r.gloo_reduce_mb_s:10.1f} {r.elastic_reduce_over_gloo_reduce:10.2f}x")


if __name__ == "__main__":
  main()
