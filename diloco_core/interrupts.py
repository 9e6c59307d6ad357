"""Stop requests: under the command line, SIGINT and SIGTERM end a run at the next safe point.

Python's default SIGINT handler raises ``KeyboardInterrupt`` wherever the main thread is at
that moment: inside an import, an XLA compilation's Python callbacks, an Orbax save. Raised
there, it can leave a checkpoint half written, report the wrong step, or leave native
threads running into the interpreter's shutdown (a segfault on exit). Under the command
line (``python -m diloco_core.train`` / ``compare``) the handler of :func:`deferred` only
records the signal; the training loop calls :func:`check` between steps and between the
phases of its set-up, which raises ``KeyboardInterrupt`` there (the loop turns it into
:class:`Interrupted`, one line saying how to go on). A second signal
raises at once. A save that is running when the signal comes is finished first, so an
interrupted run reports the step of its newest checkpoint.

In a run over several processes, a stop must be agreed: the processes stop at the same step,
or one would wait for another in a collective. There JAX's preemption service takes SIGTERM
(see :func:`diloco_core.devices.processes.stop_agreed`), and :func:`forward` makes a first SIGINT a
SIGTERM to this process, so that Ctrl-C takes the same path.

The Python API keeps Python's default behaviour (Ctrl-C raises where it lands); :func:`check`
is then a no-op. This module imports nothing heavy, so that the package can install the
handler before it imports JAX (see ``diloco_core/__init__.py``).

Examples:
  >>> check()  # no signal recorded: nothing happens
  >>> with deferred():
  ...   _record(signal.SIGTERM, None)  # what the handler does on the first signal
  ...   requested()
  True
  >>> requested()  # leaving the block clears it
  False
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)
_requested: list[int] = []
_installed: dict[int, object] = {}
_forward: list[int] = []  # set by forward(): the signal a first stop request is re-sent as
_forwarded: list[int] = []


def _record(signum, frame) -> None:
  if _requested or _forwarded:  # the second signal: stop now
    raise KeyboardInterrupt
  if _forward:
    _forwarded.append(signum)
    os.kill(os.getpid(), _forward[0])
    return
  _requested.append(signum)


def forward(sig: int) -> None:
  """Re-sends the first stop request to this process as ``sig`` (not recorded for :func:`check`);
  a second one still raises at once. Undone by :func:`uninstall`."""
  _forward[:] = [sig]


def command_line_module() -> str | None:
  """The module of ``python [options] -m MODULE ...`` that started this process, or None.

  Examples:
    >>> command_line_module() != "diloco_core.train"  # pytest, not the trainer
    True
  """
  argv = getattr(sys, "orig_argv", [])
  return argv[argv.index("-m") + 1] if "-m" in argv[:-1] else None


def install() -> bool:
  """Installs the recording handler for SIGINT and SIGTERM (main thread only); True if it did."""
  if threading.current_thread() is not threading.main_thread():
    return False
  for sig in SIGNALS:
    if sig not in _installed:
      _installed[sig] = signal.signal(sig, _record)
  return True


def uninstall() -> None:
  """Restores the handlers :func:`install` replaced and forgets any recorded signal."""
  while _installed:
    sig, previous = _installed.popitem()
    signal.signal(sig, previous)
  _requested.clear()
  _forward.clear()
  _forwarded.clear()


@contextlib.contextmanager
def deferred():
  """Within the block, SIGINT / SIGTERM are recorded for :func:`check` (a second one raises)."""
  ours = not _installed and install()
  try:
    yield
  finally:
    if ours:
      uninstall()
    else:
      _requested.clear()
      _forwarded.clear()


def requested() -> bool:
  """Whether a stop was requested (a signal was recorded)."""
  return bool(_requested)


def check() -> None:
  """Raises ``KeyboardInterrupt`` if a stop was requested; call it at safe points."""
  if _requested:
    raise KeyboardInterrupt


class Interrupted(KeyboardInterrupt):
  """Ctrl-C (or SIGTERM under the command line) during :func:`~diloco_core.run.loop.train`; says how to go on.

  Examples:
    >>> str(Interrupted(12, "runs/a", "runs/a/checkpoints/10"))
    'interrupted at step 12; resume with `resume` (from runs/a/checkpoints/10).'
  """

  def __init__(self, step: int, out: str | None, checkpoint: str | None):
    if checkpoint is not None:
      advice = f"resume with `resume` (from {checkpoint})."
    elif out is not None:
      advice = "no checkpoint was written: start over with `overwrite` (set `checkpoint_every` to resume later runs)."
    else:
      advice = "nothing was saved (no `out`)."
    super().__init__(f"interrupted at step {step}; {advice}")
    self.step = step
