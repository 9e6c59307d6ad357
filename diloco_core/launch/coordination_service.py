"""The coordination service of an elastic run in a process of its own, which trains no replica.

``jax.distributed`` runs its coordination service (the key-value store, the heartbeats, the
membership barrier the elastic agreements use: :mod:`diloco_core.runtime.membership`) inside process 0:
losing process 0 ends every process. Started here instead, in a process that trains nothing,
the service outlives any trainer, so an elastic run may lose any replica, process 0 included.

* ``launch --own-coordinator`` starts it beside the trainers (:func:`command`) and stops it when
  they end; losing it is one line and a resume from the last checkpoint.
* On several hosts: start ``python -m diloco_core.coordination_service --address HOST:PORT
  --processes N`` on a host of its own, and every trainer with ``--coordinator HOST:PORT`` and
  :data:`~diloco_core.devices.process_options.ELSEWHERE_ENV` ``=1`` in its environment (process 0 then starts
  JAX's service, which it cannot skip, on a spare local port that nothing uses:
  :func:`~diloco_core.devices.process_options.spare_bind_address`). Stop it (SIGTERM or Ctrl-C) once the
  trainers have ended.

The service is JAX's own (``get_distributed_runtime_service``), recoverable (a process lost
after the heartbeat is left out instead of ending the others; a replacement may register
again), as ``jax.distributed.initialize`` starts it in process 0 of an elastic run.

Examples:
  >>> command("127.0.0.1:4000", 3, 10)[-6:]
  ['--address', '127.0.0.1:4000', '--processes', '3', '--heartbeat', '10']
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

#: Seconds the service would wait for the trainers at its shutdown barrier (recoverable trainers skip it).
SHUTDOWN_S = 10


def command(address: str, processes: int, heartbeat: int) -> list[str]:
  """The command line that runs the service for ``processes`` trainers at ``address``."""
  return [sys.executable, "-m", "diloco_core.coordination_service", "--address", address,
          "--processes", str(processes), "--heartbeat", str(heartbeat)]


def serve(address: str, processes: int, heartbeat: int, stop: threading.Event | None = None) -> None:
  """Runs the service until ``stop`` is set (default: until SIGTERM or SIGINT).

  Args:
    address: ``host:port`` to listen on (the trainers' ``--coordinator``).
    processes: the number of trainer processes.
    heartbeat: seconds without a trainer's heartbeat after which it is left out (as
      :data:`diloco_core.runtime.option_checks.HEARTBEAT_S`).
    stop: set it to end the service (tests); None: a signal ends it.
  """
  from jax._src.lib import _jax  # JAX's own service (no public constructor)
  if stop is None:
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
      signal.signal(sig, lambda *_: stop.set())
  service = _jax.get_distributed_runtime_service(address, processes, heartbeat_timeout=heartbeat,
                                                 shutdown_timeout=SHUTDOWN_S, recoverable=True)
  print(f"coordination service for {processes} processes at {address} (heartbeat {heartbeat} s);"
        " stop it with SIGTERM or Ctrl-C once they have ended.", flush=True)
  while not stop.wait(0.5):
    pass
  service.shutdown()  # at once: its shutdown barrier blocks no recoverable trainer


def main(argv=None) -> int:
  from diloco_core.runtime.elastic import HEARTBEAT_S
  p = argparse.ArgumentParser(prog="python -m diloco_core.coordination_service",
                              description="The coordination service of an elastic run, in a process that trains nothing.",
                              allow_abbrev=False)
  p.add_argument("--address", required=True, help="host:port to listen on (the trainers' --coordinator)")
  p.add_argument("--processes", type=int, required=True, help="the number of trainer processes")
  p.add_argument("--heartbeat", type=int, default=HEARTBEAT_S,
                 help=f"seconds without a heartbeat before a trainer is left out ({HEARTBEAT_S})")
  a = p.parse_args(argv)
  if a.processes < 1 or a.heartbeat < 1:
    name, value = ("--processes", a.processes) if a.processes < 1 else ("--heartbeat", a.heartbeat)
    print(f"error: {name} must be an integer >= 1, got {value}.", file=sys.stderr)
    return 2
  serve(a.address, a.processes, a.heartbeat)
  return 0


if __name__ == "__main__":
  sys.exit(main())
