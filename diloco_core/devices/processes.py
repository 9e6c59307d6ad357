"""Multi-process runs: joining the processes, with a bounded wait, and stopping them together.

A run over several processes (one per host, or several on one machine under
:mod:`diloco_core.launch.supervisor`) starts with :func:`initialize_distributed` (``jax.distributed``; on
CPU the cross-process collectives go through gloo). Two things a single process never needs:

* **A bounded wait for the others.** JAX waits for every process to register with the
  coordinator, then aborts the process with a C++ stack (five minutes by default). Here a
  process that is still alone after ``join_timeout`` seconds (:data:`~diloco_core.devices.process_options.JOIN_TIMEOUT_S`,
  ``--join-timeout``) prints one ``error:`` line naming the coordinator and the process
  count, and exits with 2.
* **One step at which every process stops.** A stop request reaches each process at its own
  moment; a process that stopped alone would leave the others waiting in a collective.
  Once ``jax.distributed`` is up, JAX's preemption service takes SIGTERM: it tells every
  process, and :func:`stop_agreed` answers True for the same step on all of them (the
  largest step any of them had reached, plus one). The command line forwards SIGINT to the
  same path (:func:`diloco_core.interrupts.forward`).

Examples:
  >>> initialize_distributed()  # no coordinator, no JAX_* variables: a single process
  False
  >>> stop_agreed(1)  # a single process never waits for an agreement
  False
"""

from __future__ import annotations

import os
import sys
import threading
import time

import jax

from diloco_core.devices.compile_cache import cache_every_process
from diloco_core.devices.process_options import (ELSEWHERE_ENV, HEARTBEAT_S, JOIN_TIMEOUT_S,  # noqa: F401
                                                 SHUTDOWN_S, check_process_options, free_port,
                                                 own_coordinator, spare_bind_address)

#: The XLA status codes of a failure at run time (the text before the first colon of the error).
RUNTIME_STATUSES = frozenset({"UNKNOWN", "INTERNAL", "UNAVAILABLE", "ABORTED", "DEADLINE_EXCEEDED",
                              "CANCELLED", "DATA_LOSS", "FAILED_PRECONDITION"})
#: Seconds a process that ended its run (or stopped at the agreed step) waits at the end for
#: the others to end theirs: a peer may still evaluate and write its final checkpoint and
#: params long after the last collective (process 0 hosts the coordination service and must
#: outlive it). As long as the heartbeat, past which JAX would call the peer lost anyway.
END_WAIT_S = HEARTBEAT_S
#: The longest process 0 (the coordination service's host) waits at the end of an elastic run for
#: a peer that is still alive to say it leaves: a loaded machine can hold a peer's exit past
#: :data:`~diloco_core.devices.process_options.SHUTDOWN_S`, and leaving first would take the service from under it (it aborts).
LEAVE_WAIT_S = 6 * SHUTDOWN_S
#: Seconds process 0 (the coordination service's host) still waits after the last live peer of
#: an elastic run said it leaves: that peer exits right after saying so, but a loaded machine
#: can hold it between the two, and a service gone before its exit aborts it (its client polls
#: the service for errors; seen once in a suite run, 140 ms after the peer said it leaves).
LEFT_GRACE_S = 1.0


def lock_step_writes() -> bool:
  """Whether this process writes the files of a run every process runs in lock step (the in-step
  runtime, a tape's play): process 0. (An elastic run decides by its membership:
  :meth:`~diloco_core.runtime.elastic_runtime.ElasticRuntime.writes_files`.)"""
  return jax.process_index() == 0


def initialize_distributed(coordinator: str | None = None, num_processes: int | None = None,
                           process_id: int | None = None, join_timeout: float = JOIN_TIMEOUT_S,
                           describe=None, elastic_heartbeat: int | None = None) -> bool:
  """Starts multi-process JAX when asked (the arguments, or the ``JAX_*`` environment variables below).

  Args:
    coordinator: ``host:port`` of process 0 (env ``JAX_COORDINATOR_ADDRESS``).
    num_processes: total processes (env ``JAX_NUM_PROCESSES``).
    process_id: this process (env ``JAX_PROCESS_ID``).
    join_timeout: seconds to wait for every process to join; past it the process prints one
      ``error:`` line and exits with 2 (JAX itself would abort it later, with a C++ stack).
    describe: rewrites that line's option names (the command line passes its ``to_flags``).
    elastic_heartbeat: an elastic run (:mod:`diloco_core.runtime.membership`): the coordination service
      keeps going when a process dies (``jax_enable_recoverability``: it leaves the process out
      after this many seconds without its heartbeat, instead of ending every process) and lets
      a replacement with the same ``process_id`` in. None: a process lost ends the run
      (heartbeat :data:`~diloco_core.devices.process_options.HEARTBEAT_S`).

  Returns:
    True if :func:`jax.distributed.initialize` was called. On CPU it selects the gloo
    collectives so the replicas' all-reduce crosses processes; with a persistent compilation
    cache in a local folder, every process writes its own programs there
    (:func:`~diloco_core.devices.compile_cache.cache_every_process`).
  """
  coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS")
  if num_processes is None and os.environ.get("JAX_NUM_PROCESSES"):
    num_processes = int(os.environ["JAX_NUM_PROCESSES"])
  if process_id is None and os.environ.get("JAX_PROCESS_ID"):
    process_id = int(os.environ["JAX_PROCESS_ID"])
  if isinstance(join_timeout, bool) or not 0 < join_timeout < float("inf"):
    raise ValueError(f"`join_timeout` must be a finite number of seconds > 0, got {join_timeout:g}.")
  if elastic_heartbeat is not None and (isinstance(elastic_heartbeat, bool) or int(elastic_heartbeat) != elastic_heartbeat
                                        or elastic_heartbeat < 1):
    raise ValueError(f"`elastic_heartbeat` must be a whole number of seconds >= 1, got {elastic_heartbeat!r}.")
  if not check_process_options(coordinator, num_processes, process_id):
    return False
  if jax.config.jax_platforms in (None, "", "cpu") or os.environ.get("JAX_PLATFORMS") == "cpu":
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.config.update("jax_enable_recoverability", elastic_heartbeat is not None)
  joined = threading.Event()
  message = join_timeout_message(join_timeout, coordinator, num_processes, process_id)
  threading.Thread(target=_give_up_unless, args=(joined, (describe or str)(message), join_timeout),
                   daemon=True, name="join-timeout").start()
  elsewhere = own_coordinator() and process_id == 0  # its own service goes unused
  jax.distributed.initialize(coordinator_address=coordinator, num_processes=num_processes,
                             process_id=process_id, initialization_timeout=int(join_timeout) + 60,
                             coordinator_bind_address=spare_bind_address() if elsewhere else None,
                             heartbeat_timeout_seconds=int(elastic_heartbeat or HEARTBEAT_S),
                             shutdown_timeout_seconds=SHUTDOWN_S)
  joined.set()
  cache_every_process(jax.config.jax_compilation_cache_dir)  # processes 1.. write their programs too
  return True


def join_timeout_message(timeout: float, coordinator: str, num_processes: int, process_id: int) -> str:
  """The one line of a process the others did not join (fields in backticks, as library errors).

  Examples:
    >>> join_timeout_message(5, "127.0.0.1:4000", 2, 0)
    'process 0 of 2 (`num_processes`) waited 5 s (`join_timeout`) at 127.0.0.1:4000 for the others to join and gave up: start every process with the same `coordinator` and `num_processes`, each with its own `process_id`, or wait longer with `join_timeout`.'
  """
  return (f"process {process_id} of {num_processes} (`num_processes`) waited {timeout:g} s (`join_timeout`)"
          f" at {coordinator} for the others to join and gave up: start every process with the same"
          " `coordinator` and `num_processes`, each with its own `process_id`, or wait longer with"
          " `join_timeout`.")


def _give_up_unless(joined: threading.Event, message: str, timeout: float) -> None:
  if joined.wait(timeout):
    return
  print(f"error: {message}", file=sys.stderr, flush=True)
  os._exit(2)  # the main thread is inside JAX's blocking connect; nothing was written yet


def stop_agreed(step: int) -> bool:
  """Whether every process stops before ``step`` (multi-process runs; call it at every step).

  True on every process at the same step once any of them got SIGTERM (JAX's preemption
  service: the largest step the processes had reached when told, plus one); always False
  in a single process.
  """
  if jax.process_count() == 1:
    return False
  from jax.experimental import multihost_utils
  return bool(multihost_utils.reached_preemption_sync_point(step))


def collective_failure(error: Exception) -> bool:
  """Whether ``error`` is what JAX raises when a computation or transfer fails at run time (a
  collective whose peer is gone, among others): a ``JaxRuntimeError``, or a ``ValueError``
  carrying an XLA status of :data:`RUNTIME_STATUSES` (jaxlib reports a gloo collective that lost
  its peer that way: the class alone does not tell it from a bad option).

  Examples:
    >>> collective_failure(ValueError("UNKNOWN: Gloo all-reduce failed: [pair.cc:538] Read error"
    ...                               " [127.0.0.1]:41141: Connection reset by peer"))
    True
    >>> collective_failure(ValueError("--steps must be an integer >= 1, got 0."))
    False
  """
  if isinstance(error, jax.errors.JaxRuntimeError):
    return True
  return isinstance(error, ValueError) and str(error).split(":", 1)[0] in RUNTIME_STATUSES


def lost_process(error: Exception) -> str | None:
  """What a failed collective says of the processes: a line naming the lost peer, or None when
  ``error`` is not about another process (a single process, or not a runtime error).

  Examples:
    >>> lost_process(ConnectionError("fragment 0 @ step 10 failed: another process was lost"))
    'fragment 0 @ step 10 failed: another process was lost'
    >>> lost_process(ValueError("x")) is None
    True
  """
  if isinstance(error, ConnectionError):
    return str(error)
  if not collective_failure(error) or jax.process_count() == 1:
    return None
  first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
  return f"a collective across the {jax.process_count()} processes failed: another process was lost or cut off ({first})"


def leave_together(code: int, timeout: float = END_WAIT_S) -> int:
  """The end of a multi-process run: waits up to ``timeout`` seconds for every process to
  reach its end too, and returns ``code`` when they did (JAX's shutdown barrier at exit then
  passes at once). When one does not come (it was lost, or is stuck in a collective with a
  lost one), this process exits with ``code`` now, without that barrier
  (:func:`exit_without_peers`).

  Args:
    code: the exit code of this process.
    timeout: :data:`END_WAIT_S` after a run that ended or stopped at the agreed step (the
      others end too, maybe after long final writes); :data:`~diloco_core.devices.process_options.SHUTDOWN_S` after an error of
      this process alone (the others are not ending: they wait for it in a collective).
  """
  from jax._src import distributed  # the coordination service's client (no public accessor)
  client, rank, deadline = distributed.global_state.client, jax.process_index(), time.monotonic() + timeout
  try:
    client.key_value_set(f"diloco/end/{rank}", str(code))
    for other in range(jax.process_count()):
      if other != rank:
        left_ms = max(int((deadline - time.monotonic()) * 1000), 1)
        client.blocking_key_value_get(f"diloco/end/{other}", left_ms)
  except Exception:  # noqa: BLE001 - a timeout, or the coordinator itself gone
    exit_without_peers(code)
  return code


def elastic_joined() -> bool:
  """Whether this process joined an elastic run (:func:`initialize_distributed` with
  ``elastic_heartbeat``): its end must then be :func:`leave_elastic`.

  Examples:
    >>> elastic_joined()
    False
  """
  from jax._src import distributed  # the coordination service's client (no public accessor)
  return distributed.global_state.client is not None and bool(jax.config.jax_enable_recoverability)


def leave_elastic(code: int) -> None:
  """The end of an elastic run's process (:mod:`diloco_core.runtime.elastic`): it says it leaves and
  exits; process 0, when it hosts the coordination service, once the live others said they
  leave: it waits for each as long as the service still counts it alive (a lost one is left
  out after the heartbeat), at most :data:`LEAVE_WAIT_S` in all, then :data:`LEFT_GRACE_S`
  more for the last one's exit (the service sees it only at the heartbeat). A service of its own
  (:func:`~diloco_core.devices.process_options.own_coordinator`) outlives every trainer: nobody waits."""
  from jax._src import distributed  # the coordination service's client (no public accessor)
  client, rank = distributed.global_state.client, jax.process_index()
  try:
    live = client.get_live_nodes(list(range(jax.process_count())))
    if rank != 0 or own_coordinator():
      client.key_value_set(f"diloco/left/{rank}", str(code))
    else:
      deadline, peers = time.monotonic() + LEAVE_WAIT_S, sorted(set(live) - {0})
      for other in peers:
        while True:
          try:
            client.blocking_key_value_get(f"diloco/left/{other}", SHUTDOWN_S * 1000)
            break
          except Exception:  # noqa: BLE001 - not yet: wait on while it is alive (slow, not lost)
            if time.monotonic() > deadline or other not in client.get_live_nodes(list(range(jax.process_count()))):
              break
      if peers:
        time.sleep(LEFT_GRACE_S)  # the last one to say it leaves may not have exited yet
  except Exception:  # noqa: BLE001 - a peer lost on the way out, or the service gone: leave anyway
    pass
  exit_without_peers(code)


def exit_without_peers(code: int) -> None:
  """Ends this process now, skipping JAX's shutdown barrier (after another process was lost).

  At exit, ``jax.distributed`` waits for every process at a barrier; a lost one never comes,
  and JAX then aborts with a C++ stack. Call it after the run's files are closed and its
  one-line error is printed.
  """
  sys.stdout.flush()
  sys.stderr.flush()
  os._exit(code)
