"""The run's output directory (``out``): refused up front when it is a file, not writable, or
holds another run, before anything compiles (the config's validation).

Examples:
  >>> import tempfile
  >>> check_out_dir(tempfile.mkdtemp() + "/run", overwrite=False)  # a new directory: fine
  >>> check_out_dir("/proc/version", overwrite=False)
  Traceback (most recent call last):
  ...
  ValueError: out='/proc/version' is a file; give a directory path.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile

from diloco_core.store.checkpoint import finalized_steps, no_checkpoint_message


def writes_files() -> bool:
  """Whether this process writes the run's files: a lone process, or process 0 of several."""
  import jax
  return not jax.distributed.is_initialized() or jax.process_index() == 0


def check_out_dir(out: str, overwrite: bool, resume: bool = False, *, resumable: bool = True,
                  probe: bool = True) -> None:
  """Refuses an output directory that is a file, not writable, or holds another run.

  Args:
    out: the run directory (created later if it does not exist).
    overwrite: the run may replace a run in ``out``.
    resume: the run continues the run in ``out``.
    resumable: whether the caller offers `resume` (the comparison does not: its messages
      then name `overwrite` only).
    probe: whether a missing ``out`` is created and removed again to learn that it can be
      made. Only the process that writes the files probes: the other processes of a
      multi-process run check it at the same moment, and one's removal would race another's
      look (they see the checks on an existing ``out`` only, and ask the OS whether it is
      writable rather than write a file of their own in it).
  """
  if not isinstance(out, str) or not out.strip():
    raise ValueError(f"`out` must be a directory path, got {out!r}.")
  try:  # one stat: another process's probe (below) may create and remove `out` meanwhile
    kind = os.stat(out).st_mode
  except (FileNotFoundError, NotADirectoryError):  # not there (under a file: the probe says so)
    kind = None
  except OSError as e:
    raise ValueError(f"`out` {out!r} cannot be read ({e.strerror or e}); choose another directory.") from None
  if kind is not None and not stat.S_ISDIR(kind):
    raise ValueError(f"out={out!r} is a file; give a directory path.")
  if kind is None:
    if resume:
      raise ValueError(no_checkpoint_message(out))
    if probe:
      _probe_create(out)
    return
  # A process that does not write only asks the OS: a file of its own in `out` could land between
  # the writer's probe listing `out` and removing it, and keep the probed `out` alive.
  if not os.access(out, os.W_OK) or (probe and not _can_write_in(out)):
    if not os.path.isdir(out):  # removed meanwhile by process 0's probe (multi-process run)
      return check_out_dir(out, overwrite, resume, resumable=resumable, probe=probe)
    raise ValueError(f"out={out!r} is not writable; choose another directory.")
  if resume and not finalized_steps(out):
    raise ValueError(no_checkpoint_message(out))
  if overwrite or resume:
    return
  if not resumable and (os.path.exists(os.path.join(out, "summary.json")) or finalized_steps(out)
                        or os.path.exists(os.path.join(out, "metrics.jsonl"))):
    raise ValueError(f"out={out!r} already holds a run; pass `overwrite` to replace it, or choose"
                     " another directory.")
  if os.path.exists(os.path.join(out, "summary.json")):
    raise ValueError(f"out={out!r} already holds a finished run; pass `overwrite`, `resume` (with more"
                     " `steps`), or choose another directory.")
  if finalized_steps(out):
    raise ValueError(f"out={out!r} holds checkpoints of an unfinished run; pass `resume` to continue"
                     " it, `overwrite` to start over, or choose another directory.")
  if os.path.exists(os.path.join(out, "metrics.jsonl")):
    raise ValueError(f"out={out!r} holds metrics.jsonl of an unfinished run (no checkpoint); pass"
                     " `overwrite` to start over or choose another directory.")


def _probe_create(out: str) -> None:
  """Creates ``out`` (and missing parents) and removes them again: the only check that holds
  as root and on read-only or virtual file systems (``/proc``, ``/sys``)."""
  top = os.path.abspath(out)
  while not os.path.exists(os.path.dirname(top)):
    top = os.path.dirname(top)
  try:
    os.makedirs(out)
  except FileExistsError:  # another process of a multi-process run created it meanwhile
    return
  except OSError as e:
    raise ValueError(f"`out` {out!r} cannot be created ({e.strerror or e}); choose a directory in a"
                     " writable place.") from None
  shutil.rmtree(top, ignore_errors=True)


def _can_write_in(directory: str) -> bool:
  try:
    fd, path = tempfile.mkstemp(dir=directory, prefix=".diloco-probe-")
  except OSError:
    return False
  os.close(fd)
  try:
    os.remove(path)
  except FileNotFoundError:  # `directory` removed meanwhile (process 0's probe): it was writable
    pass
  return True
