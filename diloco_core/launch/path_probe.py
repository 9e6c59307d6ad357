"""The ways a background run's payloads cross processes, timed: the data plane, the service, gloo.

``python -m diloco_core.launch --processes 2 --module diloco_core.launch.path_probe -- --sizes-mib
1,4,16 --json OUT [--repeats 3] [--paths elastic,gloo]`` (:func:`analysis.lab.elastic_measured.path_benchmark` runs it,
``benchmarks/elastic_path.py`` prints it). Every process joins as a process of an elastic run
does (:func:`~diloco_core.devices.processes.initialize_distributed` with ``elastic_heartbeat``:
the coordination service recoverable), then, for each payload size S (MiB; S random bytes on
every process), times the paths of :data:`PATHS` (``--paths``: some of them):

* ``elastic``: one :meth:`~diloco_core.runtime.membership.Membership.exchange`, what each sync of
  an elastic run does: every process sends its payload to the others over the data plane
  (:mod:`~diloco_core.runtime.data_plane`), puts a marker, passes the membership barrier and
  takes every member's payload;
* ``service``: the same through the coordination service's key-value store, the path elastic
  runs took before the data plane (every process puts its payload on process 0's host, passes
  the barrier and reads every payload back);
* ``gloo``: one :meth:`~diloco_core.runtime.link.Link.gather` of a link without membership, what
  each sync of a background run without ``elastic`` does (``process_allgather``: gloo on CPU);
* ``elastic_reduce``: the mean of every process's S bytes of float32 values, as a sync of an
  elastic run with ``reduction="reduce-scatter"`` takes it
  (:func:`~diloco_core.runtime.plane_reduce.reduce_over_members`: a barrier, the reduce-scatter
  and the all-gather over the data plane, the commit barrier);
* ``gloo_reduce``: the same mean as a background run without ``elastic`` takes it
  (:meth:`~diloco_core.runtime.link.Link.reduce`: gloo's all-to-all, then its all-gather).

Each runs once untimed (the gather compiles for its shape), then ``repeats`` times, each after a
small agreement that lines the processes up. A repeat takes as long as its slowest process; a
size's time is the median of its repeats, and its rate (MB/s, 10^6 bytes per second) S over that
time: every process's S bytes delivered to every process, or reduced with the others'.

Process 0 writes the JSON: ``{"processes", "repeats", "heartbeat_s", "chunk_bytes", "rows":
[{"size_mib", "path", "seconds", "mb_per_s"}, ...]}``.

Examples:
  >>> parse_sizes("1,4,16")
  (1, 4, 16)
  >>> slowest_median([[0.5, 0.2, 0.3], [0.1, 0.4, 0.2]])  # each repeat's slowest process, then the median
  0.4
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

from diloco_core.run.flags import one_line_errors
from diloco_core.runtime.option_checks import HEARTBEAT_S
from diloco_core.spec.footprint import host_bytes

#: Bytes of one MiB (the sizes' unit).
MIB = 2**20
#: Seconds a process waits for a payload.
WAIT_S = 600.0
#: The key-value prefix of the probe's agreements and puts (no trainer runs beside it).
PREFIX = "diloco/path-probe"
#: The paths the probe can time (see the module docstring), in the order it times them.
PATHS = ("elastic", "service", "gloo", "elastic_reduce", "gloo_reduce")


def parse_paths(text: str) -> tuple[str, ...]:
  """The paths of ``--paths``: some of :data:`PATHS`, comma-separated, each once.

  Examples:
    >>> parse_paths("gloo,elastic")
    ('elastic', 'gloo')
    >>> parse_paths("elastic,ring")
    Traceback (most recent call last):
    ...
    ValueError: --paths must be some of elastic, service, gloo, elastic_reduce, gloo_reduce separated by commas, got 'elastic,ring'.
  """
  names = text.split(",")
  if not names or any(n not in PATHS for n in names) or len(set(names)) != len(names):
    raise ValueError(f"--paths must be some of {', '.join(PATHS)} separated by commas, got {text!r}.")
  return tuple(p for p in PATHS if p in names)

def parse_sizes(text: str) -> tuple[int, ...]:
  """The payload sizes of ``--sizes-mib``: whole MiB, at least 1.

  Examples:
    >>> parse_sizes("2, 8")
    (2, 8)
    >>> parse_sizes("1,0")
    Traceback (most recent call last):
    ...
    ValueError: --sizes-mib must be whole numbers of MiB >= 1 separated by commas (e.g. 1,4,16), got '1,0'.
  """
  try:
    sizes = tuple(int(x) for x in text.split(","))
  except ValueError:
    sizes = ()
  if not sizes or min(sizes) < 1:
    raise ValueError(f"--sizes-mib must be whole numbers of MiB >= 1 separated by commas (e.g. 1,4,16), got {text!r}.")
  return sizes


def probe_bytes(size_mib: int, processes: int) -> int:
  """A lower bound on the host memory one size's exchanges take, every process on this machine.

  Each of the N processes holds its payload S and its float32 copy, the N payloads an exchange
  reads, the N rows a gather returns and the mean a reduction returns; the service (process 0's
  host) holds the N payloads put on its path:

  .. math:: \\text{bytes} = N (3 + 2N) S + N S = 2 N (N + 2) S

  Examples:
    >>> probe_bytes(1, 2) == 16 * MIB
    True
  """
  return 2 * processes * (processes + 2) * size_mib * MIB


def check_options(a: argparse.Namespace, processes: int) -> tuple[int, ...]:
  """The probe's options checked before any timing (one-line ``ValueError``); the sizes.

  Checked: the sizes (:func:`parse_sizes`) and ``--repeats``; that ``--json`` can be written
  (its folder exists and takes files; it names no folder); that the largest size's exchanges
  (:func:`probe_bytes`) fit in this host's memory.
  """
  sizes = parse_sizes(a.sizes_mib)
  parse_paths(a.paths)
  if a.repeats < 1:
    raise ValueError(f"--repeats must be an integer >= 1, got {a.repeats}.")
  folder = os.path.dirname(os.path.abspath(a.json))
  if os.path.isdir(a.json):
    raise ValueError(f"--json {a.json!r} is a folder: name the file process 0 writes, e.g. {a.json}/probe.json.")
  if not os.path.isdir(folder):
    raise ValueError(f"--json {a.json!r}: no folder {folder!r} to write it in; create it, or name another path.")
  if not os.access(folder, os.W_OK):
    raise ValueError(f"--json {a.json!r}: the folder {folder!r} cannot be written; name another path.")
  need, have = probe_bytes(max(sizes), processes), host_bytes()
  if need > have:
    largest = int(have // probe_bytes(1, processes))
    raise ValueError(f"--sizes-mib {max(sizes)}: its exchanges over {processes} processes hold at least"
                     f" {need / 2**30:,.1f} GiB, more than this host's {have / 2**30:,.1f} GiB; sizes up to"
                     f" {largest:,} MiB fit.")
  return sizes


def check_launch(argv: list[str], processes: int, devices_per_process: int | None = None) -> None:
  """The probe's refusal of ``argv`` over ``processes`` processes, said once by the launcher
  before any process starts (:func:`check_options`; ``devices_per_process`` is not used).

  Examples:
    >>> check_launch(["--json", "/nonexistent/dir/q.json"], 2)
    Traceback (most recent call last):
    ...
    ValueError: --json '/nonexistent/dir/q.json': no folder '/nonexistent/dir' to write it in; create it, or name another path.
  """
  del devices_per_process
  parser = build_parser()

  def refuse(message: str):
    raise ValueError(f"{message} (see python -m diloco_core.launch.path_probe --help).")

  parser.error = refuse
  if any(x in ("-h", "--help") for x in argv):
    return
  check_options(parser.parse_args(argv), processes)


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(prog="python -m diloco_core.launch --module diloco_core.launch.path_probe --",
                              description=__doc__.split("\n")[0], allow_abbrev=False)
  p.add_argument("--sizes-mib", default="1,4,16", help="payload sizes, MiB (1,4,16)")
  p.add_argument("--repeats", type=int, default=3, help="timed exchanges per size and path (3)")
  p.add_argument("--json", required=True, help="where process 0 writes the results")
  p.add_argument("--paths", default=",".join(PATHS), help=f"the paths to time, some of {','.join(PATHS)} (all)")
  return one_line_errors(p)


def slowest_median(times: list[list[float]]) -> float:
  """The median over repeats of the slowest process's time (``times``: per process, per repeat)."""
  return float(statistics.median(max(column) for column in zip(*times)))


def time_paths(membership, link, sizes, repeats: int, which=PATHS) -> list[dict]:
  """This process's times: ``[{"size_mib", "path", "times"}, ...]`` (see the module docstring),
  over ``membership`` (a :class:`~diloco_core.runtime.membership.Membership`) and ``link`` (a
  :class:`~diloco_core.runtime.link.Link` without one)."""
  from diloco_core.runtime.link import Link  # JAX: not for the launcher's check
  elastic_link = Link(membership=membership)  # a link of an elastic run: its reduction over the plane
  rng, rows = np.random.default_rng(membership.rank), []
  for size in sizes:
    payload = rng.bytes(size * MIB)
    array = np.frombuffer(payload, np.uint8)[None]
    values = rng.standard_normal((1, size * MIB // 4), dtype=np.float32)  # S bytes of float32
    paths = {"elastic": lambda key: membership.exchange(key, payload),
             "service": lambda key: service_exchange(membership, key, payload),
             "gloo": lambda key: link.gather(array, key).result(),
             "elastic_reduce": lambda key: elastic_link.reduce(values, key).result(),
             "gloo_reduce": lambda key: link.reduce(values, key).result()}
    for path in which:
      times = []
      for i in range(repeats + 1):  # the first compiles (gloo) or warms the connection up: untimed
        membership.exchange(f"line up {path} {size} {i}", b"1")
        start = time.perf_counter()
        paths[path](f"{path} {size} MiB {i}")
        times.append(time.perf_counter() - start)
      rows.append({"size_mib": size, "path": path, "times": times[1:]})
  elastic_link.close()
  elastic_link.join(60)
  return rows


def service_exchange(membership, key: str, payload: bytes) -> dict[int, bytes]:
  """Every live process's ``payload`` through the coordination service's key-value store: put,
  the membership barrier, every payload read (the path before the data plane); the keys are
  removed after the next line-up."""
  client, base = membership.client, f"{PREFIX}/service/{key}"
  client.key_value_set_bytes(f"{base}/{membership.rank}", payload, allow_overwrite=True)
  live = client.get_live_nodes(list(range(membership.processes)))
  got = {int(r): client.blocking_key_value_get_bytes(f"{base}/{r}", int(WAIT_S * 1000)) for r in sorted(live)}
  membership.free_later(f"{base}/{membership.rank}")
  return got


def main(argv=None) -> int:
  try:
    a = build_parser().parse_args(sys.argv[1:] if argv is None else argv)
  except SystemExit as e:  # --help (0) or a malformed flag (2, one line)
    return int(e.code or 0)
  try:
    sizes = check_options(a, int(os.environ.get("JAX_NUM_PROCESSES", "1")))
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  from diloco_core.devices.processes import initialize_distributed, leave_elastic  # JAX: after the checks
  from diloco_core.runtime.link import Link
  from diloco_core.runtime.membership import Membership
  heartbeat = HEARTBEAT_S
  if not initialize_distributed(elastic_heartbeat=heartbeat):
    print("error: the path probe runs under the launcher: python -m diloco_core.launch --processes 2 --module"
          " diloco_core.launch.path_probe -- ...", file=sys.stderr)
    return 2
  membership = Membership.entered(prefix=PREFIX, payload_timeout_s=WAIT_S)
  link = Link()
  rows = time_paths(membership, link, sizes, a.repeats, parse_paths(a.paths))
  link.close()
  everyone = membership.exchange("times", json.dumps(rows).encode())
  if membership.rank == 0:
    theirs = [json.loads(everyone.payloads[r]) for r in everyone.members]
    table = []
    for i, row in enumerate(rows):
      seconds = slowest_median([process[i]["times"] for process in theirs])
      table.append({"size_mib": row["size_mib"], "path": row["path"], "seconds": seconds,
                    "mb_per_s": row["size_mib"] * MIB / seconds / 1e6})
    with open(a.json, "w") as f:
      json.dump({"processes": membership.processes, "repeats": a.repeats, "heartbeat_s": heartbeat,
                 "chunk_bytes": membership.plane.chunk, "rows": table}, f, indent=1)
  membership.close()
  leave_elastic(0)
  return 0


if __name__ == "__main__":
  sys.exit(main())
