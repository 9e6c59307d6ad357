"""One command for N trainer processes on this machine, optionally over a shaped link.

``python -m diloco_core.launch --processes 2 -- <train flags>`` starts N processes of
``python -m diloco_core.train <train flags>`` joined by ``jax.distributed`` (a free
coordinator port on 127.0.0.1; each process gets ``JAX_COORDINATOR_ADDRESS``,
``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``; on CPU the cross-process collectives go
through gloo, see :func:`diloco_core.devices.processes.initialize_distributed`). The processes are those
a multi-host run starts one per host with ``--coordinator/--num-processes/--process-id``.

* Process 0's output (its progress bar and result lines) is shown as it comes; the others'
  is kept in memory and its last lines are shown if that process fails.
* When any process fails, the others end by themselves (they notice the lost peer) or are
  killed after :data:`FAILURE_GRACE_S` seconds. Ctrl-C or SIGTERM to the launcher sends SIGTERM
  to every process: they stop before one agreed step
  (:func:`diloco_core.devices.processes.stop_agreed`) and say how to resume; SIGKILL follows after
  :data:`GRACE_S` seconds. The exit code is that of the process that failed first (one killed
  by a signal the launcher did not send is the cause), 130 for a stop request, else 0.
* ``--pin-cpus`` gives each process an equal, disjoint share of the CPUs (as separate hosts
  would have): the processes then do not slow each other down unevenly.
* ``--kill-at P:S`` (fault injection, :mod:`diloco_core.launch.faults`) kills process P with SIGKILL
  once its trace records its step S. With the trainer's ``--elastic`` the others go on; with
  ``--restart`` a lost process (but 0) is started again, once: the replacement rejoins and is
  healed from a live peer (:mod:`diloco_core.runtime.elastic_runtime`).
* ``--own-coordinator`` (with the trainer's ``--elastic``) runs the coordination service in a
  process of its own that trains no replica (:mod:`diloco_core.launch.coordination_service`): any
  trainer may then be lost, process 0 included (the lowest process left takes over the run's
  files); losing the service's process is one line naming the last intact checkpoint, to go
  on from with ``--resume``. It is stopped once every trainer has ended.
* The processes die with the launcher, even when it is killed with SIGKILL (Linux).
* ``--link-mbit R`` runs every process in a new network namespace whose loopback is shaped
  to R Mbit/s (``tc qdisc ... tbf``: both directions share the rate; Linux, root, iproute2).
  The namespace is removed afterwards, also on failure or Ctrl-C; one left by a launcher killed
  with SIGKILL is removed by the next launch.

Examples:
  >>> parse_args(["--processes", "2", "--", "--model", "tiny"]).train_args
  ['--model', 'tiny']
  >>> parse_args(["--processes", "0"])
  Traceback (most recent call last):
  ...
  ValueError: --processes must be an integer >= 1, got 0.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import importlib
import os
import signal
import subprocess
import sys
import threading
import time

from diloco_core import interrupts

from diloco_core.launch import faults
from diloco_core.run.flags import FLAGS, PROCESS_FLAGS
from diloco_core.devices.process_options import ELSEWHERE_ENV, free_port
from diloco_core.launch.shaped_link import ShapedLink

#: The module every process runs unless ``--module`` names another (the trainer).
DEFAULT_MODULE = "diloco_core.train"
#: The modules whose flags the launcher checks once, before any process starts:
#: ``module: (checker's module, its function (train_args, processes, devices_per_process))``.
PREFLIGHTS = {DEFAULT_MODULE: ("diloco_core.run.cli", "check_launch"),
              "diloco_core.launch.path_probe": ("diloco_core.launch.path_probe", "check_launch")}
#: Seconds the processes get to stop after SIGTERM before they are killed.
GRACE_S = 30.0
#: Seconds the other processes get to end by themselves after one failed, before SIGKILL.
FAILURE_GRACE_S = 10.0
#: Seconds between two looks at the processes (exits, stop requests, ``--kill-at``'s trace).
POLL_S = 0.1
#: Lines of a failed process's output shown with its error.
TAIL_LINES = 20
#: Linux's prctl option that sends a process a signal when its parent dies.
PR_SET_PDEATHSIG = 1


def build_parser() -> argparse.ArgumentParser:
  p = argparse.ArgumentParser(
      prog="python -m diloco_core.launch",
      description="Run N trainer processes on this machine, joined by jax.distributed.",
      epilog="Everything after -- is passed to every process (python -m diloco_core.train --help).",
      allow_abbrev=False)
  p.add_argument("--processes", type=int, default=2, help="processes to start (2)")
  p.add_argument("--devices-per-process", type=int, default=None,
                 help="CPU devices each process sees (XLA's host device count; default: JAX's)")
  p.add_argument("--link-mbit", type=float, default=None,
                 help="shape the processes' link to this rate, Mbit/s (Linux, root, iproute2)")
  p.add_argument("--pin-cpus", action="store_true",
                 help="give each process its own share of this machine's CPUs (as separate hosts would have)")
  p.add_argument("--kill-at", default=None, metavar="P:S",
                 help="kill process P (SIGKILL) once its trace records step S (fault injection; needs"
                      f" {FLAGS['communication']} background and {FLAGS['out']})")
  p.add_argument("--restart", action="store_true",
                 help=f"with {FLAGS['elastic']}: start a lost process (but 0) again, once; the replacement"
                      " rejoins at a sync and is healed from a live peer")
  p.add_argument("--own-coordinator", action="store_true",
                 help=f"with {FLAGS['elastic']}: run the coordination service in a process that trains no"
                      " replica, so that any process may be lost, process 0 included")
  p.add_argument("--module", default=DEFAULT_MODULE,
                 help=f"the module each process runs ({DEFAULT_MODULE}; its flags are checked first)")
  p.add_argument("train_args", nargs=argparse.REMAINDER, help="-- then the trainer's flags")

  def error(message: str):  # one line, exit 2, as the trainer's own errors
    hint = ("; the trainer's flags go after -- (launch [options] -- --model tiny ...)"
            if message.startswith("unrecognized arguments") else "")
    p.exit(2, f"error: {message}{hint} (see --help).\n")

  p.error = error
  return p


def parse_args(argv):
  """The launcher's options, checked (one-line ``ValueError``); ``train_args`` without ``--``."""
  a = build_parser().parse_args(argv)
  if a.train_args and a.train_args[0] == "--":
    a.train_args = a.train_args[1:]
  if isinstance(a.processes, bool) or a.processes < 1:
    raise ValueError(f"--processes must be an integer >= 1, got {a.processes}.")
  if a.devices_per_process is not None and a.devices_per_process < 1:
    raise ValueError(f"--devices-per-process must be an integer >= 1, got {a.devices_per_process}.")
  if a.link_mbit is not None and not 0 < a.link_mbit < float("inf"):
    raise ValueError(f"--link-mbit must be a finite rate > 0 (Mbit/s), got {a.link_mbit:g}.")
  if a.pin_cpus and len(_cpus()) < a.processes:
    raise ValueError(f"--pin-cpus needs at least one CPU per process: {len(_cpus())} CPU(s) for"
                     f" {a.processes} processes; drop --pin-cpus or start fewer processes.")
  if a.kill_at is not None:
    a.kill_at = faults.parse_kill_at(a.kill_at, a.processes, a.train_args, a.own_coordinator)
  elastic = FLAGS["elastic"]
  if a.restart and elastic not in a.train_args:
    raise ValueError(f"--restart starts a lost process again for it to rejoin: pass {elastic} to the trainer.")
  if a.own_coordinator and elastic not in a.train_args:
    raise ValueError(f"--own-coordinator keeps the run going when process 0 is lost: pass {elastic} to"
                     " the trainer (without it a lost process ends the run anyway).")
  clash = [f for f in PROCESS_FLAGS.values() if any(x == f or x.startswith(f + "=") for x in a.train_args)]
  if clash:
    raise ValueError(f"{', '.join(clash)} is set by the launcher for each process; drop it from the"
                     " trainer's flags.")
  return a


def _cpus() -> list[int]:
  """The CPUs this process may run on."""
  return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def cpu_share(index: int, processes: int) -> list[int]:
  """Process ``index``'s CPUs under ``--pin-cpus``: an equal, disjoint share of the CPUs this process may run on.

  Examples:
    >>> share = [cpu_share(i, 2) for i in range(2)]
    >>> set(share[0]) & set(share[1])
    set()
  """
  cpus = _cpus()
  per = max(len(cpus) // processes, 1)
  return cpus[index * per:(index + 1) * per] or cpus[-1:]


def _child_setup(cpus: list[int] | None, launcher: int):
  """What each process runs before the trainer starts: dies with the launcher (Linux's
  parent-death signal: a launcher killed by SIGKILL leaves no trainer behind) and, under
  ``--pin-cpus``, keeps to its CPUs."""

  def setup():
    if sys.platform.startswith("linux"):
      ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
      if os.getppid() != launcher:  # the launcher died before the line above
        os._exit(1)
    if cpus is not None:
      os.sched_setaffinity(0, cpus)
  return setup


class _Child:
  """One process: its Popen and the last lines of its output (process 0's is also shown as
  it comes, carriage returns included, so its progress bar redraws in place)."""

  def __init__(self, index: int, cmd: list[str], env: dict, show: bool, cpus: list[int] | None = None):
    self.index, self.cmd, self.env, self.cpus = index, cmd, env, cpus
    self.tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    self.signalled: set[int] = set()  # the signals the launcher sent it
    self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True, preexec_fn=_child_setup(cpus, os.getpid()))
    self._reader = threading.Thread(target=self._read, args=(show,), daemon=True)
    self._reader.start()

  def _read(self, show: bool) -> None:
    pending = ""
    for chunk in iter(lambda: self.proc.stdout.read1(65536), b""):
      if show:
        sys.stdout.buffer.write(chunk)
        sys.stdout.flush()
      pending += chunk.decode(errors="replace")
      *lines, pending = pending.replace("\r", "\n").split("\n")
      self.tail.extend(line for line in lines if line.strip())
    if pending.strip():
      self.tail.append(pending)

  def stop(self, sig: int) -> None:
    if self.proc.poll() is None:
      self.signalled.add(sig)
      try:
        os.killpg(self.proc.pid, sig)
      except ProcessLookupError:
        pass

  def join(self) -> None:
    self._reader.join(timeout=5)


def _exit_code(rc: int) -> int:
  """A child's return code as a shell exit code (a signal N is 128 + N)."""
  return 128 - rc if rc < 0 else rc


def launch(argv) -> int:
  """Runs the launcher; returns its exit code (see the module docstring)."""
  a = parse_args(argv)
  if a.module in PREFLIGHTS:  # the module's refusal, once, before any process starts
    where, name = PREFLIGHTS[a.module]
    getattr(importlib.import_module(where), name)(a.train_args, a.processes, a.devices_per_process)
  address = f"127.0.0.1:{free_port()}"
  base_env = dict(os.environ, JAX_COORDINATOR_ADDRESS=address, JAX_NUM_PROCESSES=str(a.processes))
  base_env.pop(ELSEWHERE_ENV, None)
  if a.own_coordinator:
    base_env[ELSEWHERE_ENV] = "1"
  if a.devices_per_process is not None:
    flags = os.environ.get("XLA_FLAGS", "")
    base_env["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={a.devices_per_process}".strip()
  link = ShapedLink(a.link_mbit) if a.link_mbit is not None else None
  children: list[_Child] = []
  service: _Child | None = None
  try:
    if link is not None:
      link.__enter__()
    prefix = link.prefix if link is not None else []
    with interrupts.deferred():  # SIGINT / SIGTERM recorded, acted on in _supervise
      if interrupts.requested():  # during the imports: start nothing
        print("launch: stopped on request before any process started.", file=sys.stderr)
        return 130
      if a.own_coordinator:
        from diloco_core.launch.coordination_service import command
        from diloco_core.runtime.elastic import HEARTBEAT_S
        service = _Child(faults.COORDINATOR, [*prefix, *command(address, a.processes, HEARTBEAT_S)],
                         dict(os.environ), show=False)
      for i in range(a.processes):
        children.append(_Child(i, [*prefix, sys.executable, "-m", a.module, *a.train_args],
                               dict(base_env, JAX_PROCESS_ID=str(i)), show=i == 0,
                               cpus=cpu_share(i, a.processes) if a.pin_cpus else None))
      return _supervise(children, a.kill_at, a.restart, service)
  except KeyboardInterrupt:  # a second stop request: no more waiting
    for c in children + ([service] if service else []):
      c.stop(signal.SIGKILL)
    print("launch: stopped at once on a second request; every process was killed.", file=sys.stderr)
    return 130
  finally:
    if service is not None:  # the trainers have ended (or were killed): nothing uses it
      service.stop(signal.SIGTERM)
      try:
        service.proc.wait(timeout=GRACE_S)
      except subprocess.TimeoutExpired:
        service.stop(signal.SIGKILL)
    if link is not None:
      link.__exit__(None, None, None)


def _supervise(children: list[_Child], kill_at: tuple[int, int, str] | None = None, restart: bool = False,
               service: _Child | None = None) -> int:
  """Waits for every child; stops them all on a failure or a stop request; the worst code
  (:func:`_report`). ``kill_at``: (process, step, trace) of ``--kill-at``; ``restart``:
  ``--restart``; ``service``: the coordination service's own process (``--own-coordinator``)."""
  replaced: list[_Child] = []  # --restart: the lost processes whose replacement was started
  first_failure: _Child | None = None
  elastic = FLAGS["elastic"] in children[0].cmd
  spared = set(range(1 if service is None else 0, len(children))) if elastic else set()  # may be lost
  stopping_since = None
  ended: dict[int, float] = {}  # child index -> when the launcher saw it end
  while True:
    if kill_at is not None and faults.reached(kill_at[2], kill_at[1]):
      target = service if kill_at[0] == faults.COORDINATOR else children[kill_at[0]]
      os.killpg(target.proc.pid, signal.SIGKILL)  # not in c.signalled: a lost process
      kill_at = None
    if service is not None and service.proc.poll() is not None and first_failure is None:
      first_failure = service  # the trainers notice it (their agreements fail) and end
    for i, c in enumerate(children):
      if restart and i != 0 and c.proc.poll() not in (None, 0) and all(x.index != i for x in replaced):
        replaced.append(c)  # the same command and process id: it rejoins (--elastic)
        children[i] = _Child(i, c.cmd, c.env, show=False, cpus=c.cpus)
    codes = [c.proc.poll() for c in children]
    for c, rc in zip(children, codes):
      if rc is not None:
        ended.setdefault(c.index, time.monotonic())
    if all(rc is not None for rc in codes):
      break
    if first_failure is None:  # elastic (--elastic): the others go on without a lost process of `spared`
      first_failure = next((c for c, rc in zip(children, codes)
                            if rc not in (None, 0) and c.index not in spared), None)
    if stopping_since is None and (first_failure is not None or interrupts.requested()):
      stopping_since = time.monotonic()
      # A stop request: every trainer stops at one agreed step (SIGTERM). A failure: the others
      # notice the lost process and end by themselves; SIGTERM would ask them for an agreement
      # the lost one can never join.
      grace = GRACE_S if first_failure is None else FAILURE_GRACE_S
      if first_failure is None:
        for c in children:
          c.stop(signal.SIGTERM)
    if stopping_since is not None and time.monotonic() - stopping_since > grace:
      for c in children:
        c.stop(signal.SIGKILL)
    time.sleep(POLL_S)
  for c in children:
    c.join()
  return _report(children, first_failure, replaced, ended, elastic, service)


def _report(children: list[_Child], first_failure: _Child | None, replaced: list[_Child], ended: dict[int, float],
            elastic: bool, service: _Child | None) -> int:
  """After every child ended: the launcher's lines (who was lost, who failed first, or the stop
  request) and its exit code, the worst child's."""
  if service is not None and first_failure is service:
    print(f"launch: the coordination service's own process {_how(service.proc.returncode)}; the"
          f" trainers stopped ({_checkpoint_advice(children[0].cmd)}).", file=sys.stderr)
    return _exit_code(service.proc.returncode) or 1
  finished = [c for c in children if c.proc.returncode == 0]
  if elastic and finished and (service is not None or children[0] in finished):  # say who was lost on the way
    for c in replaced:
      new = children[c.index]
      fate = ("rejoined and finished" if new.proc.returncode == 0 else
              f"was started and {_how(new.proc.returncode)}: {new.tail[-1] if new.tail else ''}")
      print(f"launch: process {c.index} of {len(children)} {_how(c.proc.returncode)}; a replacement"
            f" {fate} ({FLAGS['elastic']} --restart).", file=sys.stderr)
    for c in children:
      if c.proc.returncode != 0 and c not in replaced:
        print(f"launch: process {c.index} of {len(children)} {_how(c.proc.returncode)}; the others went on"
              f" without it ({FLAGS['elastic']}).", file=sys.stderr)
    return 0
  # A process killed by a signal the launcher did not send is the cause, even when a peer that
  # lost it exited first (the kernel may still have been tearing the killed one down); one
  # killed from outside (SIGKILL: kill -9, the OOM killer, --kill-at) before one that aborted
  # itself (SIGABRT: JAX's reaction to a lost peer), whichever the launcher saw end first.
  lost = [c for c in children if c.proc.returncode < 0 and -c.proc.returncode not in c.signalled]
  if lost:
    first_failure = min(lost, key=lambda c: (c.proc.returncode != -signal.SIGKILL, ended[c.index], c.index))
  if first_failure is None:
    first_failure = next((c for c in children if c.proc.returncode != 0), None)
  if interrupts.requested() and (first_failure is None or first_failure.proc.returncode in (130, -2, -15)):
    print(f"launch: stopped on request; every process ended ({', '.join(str(_exit_code(c.proc.returncode)) for c in children)}).",
          file=sys.stderr)
    return 130
  if first_failure is not None:
    c = first_failure
    said = c.tail[-1] if c.tail else None  # every process refusing the same options: said once
    if c.index != 0 and said not in children[0].tail:  # process 0's output was shown already
      sys.stderr.write("\n".join(f"[process {c.index}] {line}" for line in c.tail) + "\n")
    rc = c.proc.returncode
    advice = f" ({_checkpoint_advice(children[0].cmd)})"
    if elastic and c.index == 0 and rc < 0 and service is None:
      advice = (": process 0 hosts the coordination service, which an elastic run cannot lose (give it a"
                " process of its own with --own-coordinator)" + advice)
    print(f"launch: process {c.index} of {len(children)} {_how(rc)}; the others were stopped{advice}.",
          file=sys.stderr)
    return _exit_code(rc)
  return 0


def _how(rc: int) -> str:
  """How a child ended, from its return code.

  Examples:
    >>> _how(-9), _how(2)
    ('was lost (killed by SIGKILL)', 'exited with 2')
  """
  return (f"was lost (killed by {signal.Signals(-rc).name})" if rc < 0 and -rc in signal.valid_signals()
          else f"exited with {_exit_code(rc)}")


def _checkpoint_advice(cmd: list[str]) -> str:
  """Where a stopped run can go on from: its newest finalized checkpoint (the ``--out`` of the
  train flags), which an interrupted save never is."""
  from diloco_core.store.checkpoint import CHECKPOINTS, finalized_steps
  out = faults.train_flag_value(cmd, "out")
  if out is None:
    return f"nothing was saved: no {FLAGS['out']}"
  steps = finalized_steps(out) if os.path.isdir(out) else []
  if not steps:
    return (f"no checkpoint was written: run the same command again, with {FLAGS['checkpoint_every']} to"
            " keep one")
  return (f"the last intact checkpoint is {os.path.join(out, CHECKPOINTS, str(max(steps)))}: run the"
          f" same command with {FLAGS['resume']}")


def main(argv=None) -> int:
  try:
    return launch(sys.argv[1:] if argv is None else argv)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2


if __name__ == "__main__":
  sys.exit(main())
