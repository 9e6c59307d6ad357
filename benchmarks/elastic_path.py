"""The elastic path beside gloo, measured in one run: MB/s of each, their ratio, and the largest value.

Two processes (``python -m diloco_core.launch --processes 2 --module diloco_core.launch.path_probe``,
:func:`analysis.lab.elastic_measured.path_benchmark`), joined as an elastic run's: for each payload
size, one payload per process through JAX's coordination service (what every sync, heal and
checkpoint row of an ``--elastic`` run takes: :meth:`~diloco_core.runtime.membership.Membership.exchange`)
and through gloo (a background run without ``--elastic``: :meth:`~diloco_core.runtime.link.Link.gather`),
the median of a few repeats. Per row: seconds and MB/s (a process's payload over the time until
every process has every payload) of each path, and gloo / elastic. With ``--limit``: one value of
:data:`~diloco_core.spec.footprint.KV_VALUE_LIMIT` bytes put (must succeed) and one of 2 GiB (must
be refused), and the largest model whose heal fits. Measured, never asserted.

Usage: python benchmarks/elastic_path.py [--sizes-mib 1,4,16,64] [--repeats 3] [--limit]
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from analysis.lab.elastic_measured import PATH_SIZES_MIB, path_benchmark  # noqa: E402
from diloco_core.spec.footprint import OUTER_STATE_COPIES, elastic_max_params  # noqa: E402


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--sizes-mib", default=",".join(map(str, PATH_SIZES_MIB)),
                 help=f"payload sizes, MiB ({','.join(map(str, PATH_SIZES_MIB))})")
  p.add_argument("--repeats", type=int, default=3, help="timed exchanges per size and path (3)")
  p.add_argument("--limit", action="store_true", help="also put the largest value (about 70 s and 12 GB more)")
  a = p.parse_args(argv)
  table, result = path_benchmark([int(x) for x in a.sizes_mib.split(",")], repeats=a.repeats, limit=a.limit)
  print(f"{result['processes']} processes on this machine, one payload per process, median of {a.repeats};"
        f" MB/s = 10^6 bytes/s; heartbeat {result['heartbeat_s']} s")
  print(f"{'MiB':>6} {'elastic s':>10} {'gloo s':>9} {'elastic MB/s':>13} {'gloo MB/s':>10} {'gloo/elastic':>13}")
  for r in table.itertuples():
    print(f"{r.size_mib:6.0f} {r.elastic_s:10.4f} {r.gloo_s:9.4f} {r.elastic_mb_s:13.1f} {r.gloo_mb_s:10.1f}"
          f" {r.gloo_over_elastic:12.1f}x")
  if result["limit"] is None:
    return
  for name, put in result["limit"].items():
    read = "not read back" if put["read_s"] is None else f"read back whole in {put['read_s']:.1f} s"
    said = (f"put in {put['put_s']:.1f} s, {read}" if put["ok"]
            else f"refused after {put['put_s']:.1f} s: {put['error']}")
    print(f"largest value ({name}): {put['bytes']} bytes ({put['bytes'] / 2**20:.0f} MiB): {said}")
  for outer in OUTER_STATE_COPIES:  # one replica per process: the heal is the largest value
    n = elastic_max_params(replicas_per_process=1, outer_optimizer=outer)
    print(f"  the largest model an elastic run carries (one replica per process, outer {outer}): {n} params")


if __name__ == "__main__":
  main()
