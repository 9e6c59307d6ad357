"""The two ways a background run's payloads cross processes, timed: the coordination service and gloo.

``python -m diloco_core.launch --processes 2 --module diloco_core.launch.path_probe -- --sizes-mib
1,4,16 --json OUT [--repeats 3] [--limit]`` (:func:`analysis.lab.elastic_measured.path_benchmark`
runs it, ``benchmarks/elastic_path.py`` prints it). Every process joins as a process of an elastic
run does (:func:`~diloco_core.devices.processes.initialize_distributed` with ``elastic_heartbeat``:
the coordination service recoverable), then, for each payload size S (MiB; S random bytes on
every process):

* ``elastic``: one :meth:`~diloco_core.runtime.membership.Membership.exchange`, what each sync of
  an elastic run does: every process puts its payload in the service's key-value store (on
  process 0's host), passes the membership barrier and reads every member's payload;
* ``gloo``: one :meth:`~diloco_core.runtime.link.Link.gather` of a link without membership, what
  each sync of a background run without ``elastic`` does (``process_allgather``: gloo on CPU).

Each runs once untimed (the gather compiles for its shape), then ``repeats`` times, each after a
small agreement that lines the processes up. A repeat takes as long as its slowest process; a
size's time is the median of its repeats, and its rate (MB/s, 10^6 bytes per second) S over that
time: every process's S bytes delivered to every process.

With ``--limit``, the last process also puts one value of
:data:`~diloco_core.spec.footprint.KV_VALUE_LIMIT` bytes, which process 0 reads back, and one of
:data:`~diloco_core.spec.footprint.PROTOBUF_LIMIT` bytes, which the service must refuse (about
70 s and 12 GB of memory on a small CPU). The processes then join with the heartbeat of a run
without ``elastic`` (:data:`LIMIT_HEARTBEAT_S`): on a small CPU a 2 GiB request keeps the service
busy past an elastic run's heartbeat (:data:`~diloco_core.runtime.option_checks.HEARTBEAT_S`), and JAX
then aborts process 0 for a heartbeat its own service did not answer.

Process 0 writes the JSON: ``{"processes", "repeats", "heartbeat_s", "rows": [{"size_mib", "path",
"seconds", "mb_per_s"}, ...], "limit": None or {"value": ..., "beyond": ...}}``, each put as
``{"bytes", "ok", "put_s", "read_s", "error"}`` (``read_s``: process 0 read it back whole;
``error``: the first line of what the put raised).

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

from diloco_core.devices import processes
from diloco_core.devices.processes import initialize_distributed, leave_elastic
from diloco_core.runtime.elastic import HEARTBEAT_S
from diloco_core.runtime.link import Link
from diloco_core.runtime.membership import Membership
from diloco_core.run.flags import one_line_errors
from diloco_core.spec.footprint import KV_VALUE_LIMIT, PROTOBUF_LIMIT, host_bytes

#: Bytes of one MiB (the sizes' unit).
MIB = 2**20
#: Seconds a process waits for a payload, or for the other side of a limit put (a 2 GiB put takes
#: about 70 s on a small CPU).
WAIT_S = 600.0
#: The key-value prefix of the probe's agreements and puts (no trainer runs beside it).
PREFIX = "diloco/path-probe"
#: The heartbeat (s) of a ``--limit`` probe: that of a run without ``elastic``
#: (:data:`diloco_core.devices.process_options.HEARTBEAT_S`), which a 2 GiB request does not outlast.
LIMIT_HEARTBEAT_S = processes.HEARTBEAT_S


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

  Each of the N processes holds its payload S, the N payloads an elastic exchange reads and
  the N rows a gather returns; the service (process 0's host) holds the N payloads put:

  .. math:: \\text{bytes} = N (1 + 2N) S + N S = 2 N (N + 1) S

  Examples:
    >>> probe_bytes(1, 2) == 12 * MIB
    True
  """
  return 2 * processes * (processes + 1) * size_mib * MIB


def check_options(a: argparse.Namespace, processes: int) -> tuple[int, ...]:
  """The probe's options checked before any timing (one-line ``ValueError``); the sizes.

  Checked: the sizes (:func:`parse_sizes`) and ``--repeats``; that ``--json`` can be written
  (its folder exists and takes files; it names no folder); that the largest size's exchanges
  (:func:`probe_bytes`) fit in this host's memory.
  """
  sizes = parse_sizes(a.sizes_mib)
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
  p.add_argument("--limit", action="store_true",
                 help="also put one value of the service's limit and one of 2 GiB (slow: about 70 s, 12 GB)")
  p.add_argument("--json", required=True, help="where process 0 writes the results")
  return one_line_errors(p)


def slowest_median(times: list[list[float]]) -> float:
  """The median over repeats of the slowest process's time (``times``: per process, per repeat)."""
  return float(statistics.median(max(column) for column in zip(*times)))


def time_paths(membership: Membership, link: Link, sizes, repeats: int) -> list[dict]:
  """This process's times: ``[{"size_mib", "path", "times"}, ...]`` (see the module docstring)."""
  rng, rows = np.random.default_rng(membership.rank), []
  for size in sizes:
    payload = rng.bytes(size * MIB)
    array = np.frombuffer(payload, np.uint8)[None]
    paths = {"elastic": lambda key: membership.exchange(key, payload),
             "gloo": lambda key: link.gather(array, key).result()}
    for path, run in paths.items():
      times = []
      for i in range(repeats + 1):  # the first compiles (gloo) or warms the connection up: untimed
        membership.exchange(f"line up {path} {size} {i}", b"1")
        start = time.perf_counter()
        run(f"{path} {size} MiB {i}")
        times.append(time.perf_counter() - start)
      rows.append({"size_mib": size, "path": path, "times": times[1:]})
  return rows


def put_limit(membership: Membership, client) -> dict:
  """The last process puts a value of :data:`~diloco_core.spec.footprint.KV_VALUE_LIMIT` bytes, then one of
  :data:`~diloco_core.spec.footprint.PROTOBUF_LIMIT`; process 0 reads each that was put back and removes it. Returns
  ``{"value": ..., "beyond": ...}`` on process 0 (``{}`` on the others)."""
  putter, out = membership.processes - 1, {}
  for name, size in (("value", KV_VALUE_LIMIT), ("beyond", PROTOBUF_LIMIT)):
    key = f"{PREFIX}/limit/{name}"
    if membership.rank == putter:
      data = np.random.default_rng(size).bytes(size)
      start, error = time.perf_counter(), None
      try:
        client.key_value_set_bytes(key, data, allow_overwrite=True)
      except Exception as e:  # noqa: BLE001 - what the service says is the result
        error = (str(e).strip().splitlines() or [type(e).__name__])[0][:300]
      del data
      put = {"bytes": size, "ok": error is None, "put_s": time.perf_counter() - start, "error": error}
      client.key_value_set(f"{key}/put", json.dumps(put), allow_overwrite=True)
    if membership.rank == 0:
      put = json.loads(client.blocking_key_value_get(f"{key}/put", int(WAIT_S * 1000)))
      put["read_s"] = None
      if put["ok"]:
        start = time.perf_counter()
        whole = len(client.blocking_key_value_get_bytes(key, int(WAIT_S * 1000))) == size
        put["read_s"] = time.perf_counter() - start if whole else None
        client.key_value_delete(key)
      out[name] = put
      client.key_value_set(f"{key}/read", "1", allow_overwrite=True)
    if membership.rank == putter:  # the value is gone from the service before the next one
      client.blocking_key_value_get(f"{key}/read", int(WAIT_S * 1000))
  return out


def _client():
  from jax._src import distributed  # the coordination service's client (no public accessor)
  return distributed.global_state.client


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
  heartbeat = LIMIT_HEARTBEAT_S if a.limit else HEARTBEAT_S
  if not initialize_distributed(elastic_heartbeat=heartbeat):
    print("error: the path probe runs under the launcher: python -m diloco_core.launch --processes 2 --module"
          " diloco_core.launch.path_probe -- ...", file=sys.stderr)
    return 2
  membership = Membership.entered(prefix=PREFIX, payload_timeout_s=WAIT_S)
  link = Link()
  rows = time_paths(membership, link, sizes, a.repeats)
  link.close()
  limit = put_limit(membership, _client()) if a.limit else None
  everyone = membership.exchange("times", json.dumps(rows).encode())
  if membership.rank == 0:
    theirs = [json.loads(everyone.payloads[r]) for r in everyone.members]
    table = []
    for i, row in enumerate(rows):
      seconds = slowest_median([process[i]["times"] for process in theirs])
      table.append({"size_mib": row["size_mib"], "path": row["path"], "seconds": seconds,
                    "mb_per_s": row["size_mib"] * MIB / seconds / 1e6})
    with open(a.json, "w") as f:
      json.dump({"processes": membership.processes, "repeats": a.repeats, "heartbeat_s": heartbeat, "rows": table,
                 "limit": limit}, f, indent=1)
  leave_elastic(0)
  return 0


if __name__ == "__main__":
  sys.exit(main())
