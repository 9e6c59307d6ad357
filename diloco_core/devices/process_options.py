"""A multi-process run's options and timings, checked without JAX.

The process options (``--coordinator``, ``--num-processes``, ``--process-id``) are checked by
:func:`check_process_options` both in each trainer (:func:`~diloco_core.devices.processes.initialize_distributed`)
and in the launcher before it starts any process; the waits (:data:`JOIN_TIMEOUT_S`,
:data:`HEARTBEAT_S`, :data:`SHUTDOWN_S`) are the ones :mod:`diloco_core.devices.processes` applies.
Kept apart from it so that the trainer's flags and ``python -m diloco_core.launch --help`` load
without JAX.
"""

from __future__ import annotations

import os
import socket

#: Seconds a process waits for every process to join before it gives up (``--join-timeout``).
JOIN_TIMEOUT_S = 120.0
#: Seconds after which the coordinator declares a silent process lost (JAX's heartbeat; it then
#: aborts every process). Longer than the link's own wait (``link.PEER_TIMEOUT_S``), so that a
#: lost peer of a background run is reported by the link, in one line, first.
HEARTBEAT_S = 100
#: Set to ``1`` in the trainers' environment when the coordination service runs in a process of
#: its own (:mod:`diloco_core.launch.coordination_service`, ``launch --own-coordinator``): process 0
#: then hosts none (:func:`spare_bind_address`), and any process may be lost.
ELSEWHERE_ENV = "DILOCO_OWN_COORDINATOR"
#: Seconds a process waits at exit for the others to exit too (JAX's shutdown barrier).
SHUTDOWN_S = 10

def check_process_options(coordinator: str | None, num_processes: int | None, process_id: int | None) -> bool:
  """Whether the process options ask for several processes; a one-line ``ValueError`` if they
  are incomplete or out of range (:func:`~diloco_core.devices.processes.initialize_distributed` and the trainer's up-front
  check, :func:`diloco_core.run.flags.check_launch`, both apply it).

  Args:
    coordinator: ``host:port`` of process 0, or None.
    num_processes: total processes, or None.
    process_id: this process, or None.

  Returns:
    False when neither ``coordinator`` nor ``num_processes`` is given (a single process), True
    when all three are given and consistent.

  Examples:
    >>> check_process_options(None, None, None), check_process_options("host0:1234", 2, 1)
    (False, True)
    >>> check_process_options("host0:1234", 2, 2)
    Traceback (most recent call last):
    ...
    ValueError: process_id must be in [0, `num_processes`=2), got 2.
    >>> check_process_options("host0", 2, 0)
    Traceback (most recent call last):
    ...
    ValueError: `coordinator` must be host:port with a port in [1, 65535], got 'host0'.
  """
  if coordinator is None and num_processes is None:
    return False
  if coordinator is None or num_processes is None or process_id is None:
    raise ValueError("multi-process runs need all of `coordinator`, `num_processes` and `process_id`"
                     " (or JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID).")
  host, _, port = str(coordinator).rpartition(":")
  if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
    raise ValueError(f"`coordinator` must be host:port with a port in [1, 65535], got {coordinator!r}.")
  if isinstance(num_processes, bool) or num_processes < 1:
    raise ValueError(f"num_processes must be an integer >= 1, got {num_processes}.")
  if not 0 <= process_id < num_processes:
    raise ValueError(f"process_id must be in [0, `num_processes`={num_processes}), got {process_id}.")
  return True


def own_coordinator() -> bool:
  """Whether the coordination service runs in a process of its own (:data:`ELSEWHERE_ENV`)."""
  return os.environ.get(ELSEWHERE_ENV) == "1"


def spare_bind_address() -> str:
  """Where process 0 starts the coordination service that ``jax.distributed.initialize`` always
  starts there, when the run's service runs elsewhere (:func:`own_coordinator`): a free local
  port that no process connects to.

  Examples:
    >>> spare_bind_address().startswith("127.0.0.1:")
    True
  """
  return f"127.0.0.1:{free_port()}"


def free_port() -> int:
  """A TCP port on 127.0.0.1 that nothing listens on now."""
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]
