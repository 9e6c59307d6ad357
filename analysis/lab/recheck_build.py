"""The docs build's re-checks of the stored experiments, as processes started with the build.

The experiments page re-checks a fixed sample of every stored experiment
(:func:`~analysis.lab.recheck.verify_all`) and, on a CPU with instruction sets newer than AVX2,
the same re-check with XLA compiling for AVX2 (:func:`~analysis.lab.cpu_kind.cap_in_effect`).
Together they keep both cores busy for most of the build's time, and run inside the page they
would hold the whole build while the pages that train on one core wait their turn. So the
build's configuration (``conf.py``) :func:`start`\\ s them as soon as Sphinx knows it will
execute the page and has the page read last, the other pages build meanwhile, and the page
:func:`collect`\\ s their reports; executed on its own, the page starts them itself. The numbers are the same either
way: each is ``python -m analysis experiments verify NAMES --sample 1 --json FILE`` (the
emulated one with ``--isa AVX2``), a fresh process as before.

Each re-check ``KIND`` (:data:`KINDS`) writes into one folder its report ``KIND.json``, its
error output ``KIND.err`` and, once it has ended, its exit status ``KIND.rc``.

Examples:
  >>> [c[4:7] for c in commands(["h_m"], emulated=True).values()]
  [['verify', 'h_m', '--sample'], ['verify', 'h_m', '--sample']]
  >>> commands(["h_m"], emulated=False)["native"][-4:]
  ['--workers', '2', '--json', 'native.json']
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Sequence

import pandas as pd

__all__ = ["ENV", "KINDS", "collect", "commands", "kill_started", "start", "started", "stop"]

#: The environment variable that names the folder of the build's re-checks (set by ``conf.py``,
#: read by the page's kernel, which inherits it).
ENV = "DILOCO_RECHECK_DIR"
#: The re-checks: this CPU's, and the one emulating a CPU with AVX2 and nothing newer.
KINDS = ("native", "avx2")
# Runs a command with its error output in $0.err, then writes its exit status to $0.rc (whole:
# written beside, then renamed, so a reader never sees half of it).
_WRAP = '"$@" 2> "$0.err"; echo $? > "$0.rc.part" && mv "$0.rc.part" "$0.rc"'


def commands(names: Sequence[str], emulated: bool) -> dict[str, list[str]]:
  """Each re-check's command line (its report as ``KIND.json``, relative to its folder): this
  CPU's, on two workers, or on one beside the emulated AVX2 one when ``emulated``."""
  verify = [sys.executable, "-m", "analysis", "experiments", "verify", *names, "--sample", "1"]
  out = {"native": [*verify, "--workers", "1" if emulated else "2", "--json", "native.json"]}
  if emulated:
    out["avx2"] = [*verify, "--isa", "AVX2", "--workers", "1", "--json", "avx2.json"]
  return out


def start(names: Sequence[str], folder: str, emulated: bool) -> list:
  """Starts the re-checks of :func:`commands` in ``folder`` (created), each in a process group
  of its own (:func:`stop` ends it with its workers; its number is written as ``KIND.pgid``, so
  that :func:`kill_started` ends it from another process); returns their ``subprocess.Popen`` objects."""
  os.makedirs(folder, exist_ok=True)
  procs = []
  for kind, cmd in commands(names, emulated).items():
    procs.append(subprocess.Popen(["sh", "-c", _WRAP, os.path.join(folder, kind), *cmd], cwd=folder,
                                  stdout=subprocess.DEVNULL, stdin=subprocess.DEVNULL, process_group=0))
    with open(os.path.join(folder, f"{kind}.pgid"), "w") as f:
      f.write(str(procs[-1].pid))
  return procs


def stop(procs: Sequence) -> None:
  """Kills the re-checks of :func:`start` still running, with every process they started."""
  for proc in procs:
    if proc.poll() is None:
      try:
        os.killpg(proc.pid, signal.SIGKILL)
      except ProcessLookupError:
        pass
      proc.wait()


def kill_started(folder: str) -> list[int]:
  """Kills the process groups of the re-checks :func:`start` started in ``folder``, from any
  process (the docs build's watchdog, after it killed a Sphinx that never stopped them);
  returns the groups it found still there.

  Examples:
    >>> kill_started("/nonexistent")
    []
  """
  killed = []
  for kind in KINDS:
    try:
      with open(os.path.join(folder, f"{kind}.pgid")) as f:
        group = int(f.read())
      os.killpg(group, signal.SIGKILL)
    except (OSError, ValueError):  # no such file, or the group already ended
      continue
    killed.append(group)
  return killed


def started(folder: str | None) -> bool:
  """Whether ``folder`` holds re-checks started by :func:`start` (their error files exist)."""
  return bool(folder) and os.path.isfile(os.path.join(folder, "native.err"))


def collect(folder: str, emulated: bool, timeout: float = 3600.0, poll: float = 1.0) -> dict[str, pd.DataFrame]:
  """Waits for the re-checks in ``folder`` to end and returns each one's report.

  Args:
    folder: where :func:`start` started them.
    emulated: whether the emulated AVX2 re-check was started too.
    timeout: seconds to wait for them in all.
    poll: seconds between two looks.

  Returns:
    ``{"native": report, "avx2": report}`` (no ``"avx2"`` unless ``emulated``): the records of
    :func:`~analysis.lab.recheck.verify_all` with the ``cpu`` they ran as.

  Raises:
    RuntimeError: a re-check failed (a stored number was not reproduced, or it could not run),
      with the end of its error output; or it did not end within ``timeout``.
  """
  kinds = KINDS if emulated else KINDS[:1]
  deadline = time.monotonic() + timeout
  out = {}
  for kind in kinds:
    rc = os.path.join(folder, f"{kind}.rc")
    while not os.path.isfile(rc):
      if time.monotonic() > deadline:
        raise RuntimeError(f"the {kind} re-check in {folder} did not end within {timeout:.0f} s.")
      time.sleep(poll)
    with open(rc) as f:
      status = f.read().strip()
    if status != "0":
      with open(os.path.join(folder, f"{kind}.err")) as f:
        raise RuntimeError(f"the {kind} re-check failed (exit status {status}): {f.read().strip()[-2000:]}")
    with open(os.path.join(folder, f"{kind}.json")) as f:
      out[kind] = pd.DataFrame(json.load(f))
  return out
