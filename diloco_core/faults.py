"""Fault injection for trying elastic runs: ``python -m diloco_core.launch --kill-at P:S``.

The launcher kills process P with SIGKILL (as a lost host would) once P's trace
(``<out>/trace/process-P.jsonl``, written by ``--communication background``) records its step
S; it may get a step further before the kill lands. With ``--elastic`` the others go on
(:mod:`diloco_core.elastic`); with ``--restart`` too, a replacement rejoins.
"""

from __future__ import annotations

import os


def parse_kill_at(text: str, processes: int, train_args: list[str]) -> tuple[int, int, str]:
  """``P:S`` of ``--kill-at`` as (process, step, its trace file), checked.

  Examples:
    >>> parse_kill_at("2:6", 3, ["--communication", "background", "--out", "runs/a"])
    (2, 6, 'runs/a/trace/process-2.jsonl')
    >>> parse_kill_at("3:6", 3, ["--out", "runs/a"])
    Traceback (most recent call last):
    ...
    ValueError: --kill-at '3:6' must be P:S with a process P in [0, 3) and a step S >= 1, e.g. 1:6.
  """
  from diloco_core.background import TRACE_FILE
  try:
    process, step = (int(x) for x in text.split(":"))
  except ValueError:
    process = step = -1
  if not (0 <= process < processes and step >= 1):
    raise ValueError(f"--kill-at {text!r} must be P:S with a process P in [0, {processes}) and a step S >= 1,"
                     f" e.g. {min(1, processes - 1)}:6.")
  out = next((train_args[i + 1] for i, x in enumerate(train_args[:-1]) if x == "--out"), None)
  if out is None or not any(x.endswith("background") for x in train_args):
    raise ValueError("--kill-at reads the process's trace: pass --communication background and --out to the trainer.")
  return process, step, os.path.join(out, TRACE_FILE.format(rank=process))


def reached(trace: str, step: int) -> bool:
  """Whether the trace file records a computed step >= ``step`` (False while it is not there)."""
  try:
    with open(trace) as f:
      return any(f'"kind": "compute", "step": ' in line and int(line.split('"step": ')[1].split(",")[0]) >= step
                 for line in f)
  except OSError:
    return False
