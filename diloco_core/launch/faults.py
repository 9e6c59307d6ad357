"""Fault injection for trying elastic runs: ``python -m diloco_core.launch --kill-at P:S``.

The launcher kills process P with SIGKILL (as a lost host would) once P's trace
(``<out>/trace/process-P.jsonl``, written by ``--communication background``) records its step
S; it may get a step further before the kill lands. With ``--elastic`` the others go on
(:mod:`diloco_core.runtime.elastic`); with ``--restart`` too, a replacement rejoins. With
``--own-coordinator``, ``--kill-at coordinator:S`` kills the coordination service's process
once process 0's trace records step S.
"""

from __future__ import annotations

import os

from diloco_core.run.flags import FLAGS


#: The process ``--kill-at`` names for the coordination service's own (``coordinator:S``).
COORDINATOR = -1


def parse_kill_at(text: str, processes: int, train_args: list[str],
                  own_coordinator: bool = False) -> tuple[int, int, str]:
  """``P:S`` of ``--kill-at`` as (process, step, the trace file read), checked; with
  ``own_coordinator``, ``coordinator:S`` is (:data:`COORDINATOR`, S, process 0's trace).

  Examples:
    >>> parse_kill_at("2:6", 3, ["--communication", "background", "--out", "runs/a"])
    (2, 6, 'runs/a/trace/process-2.jsonl')
    >>> parse_kill_at("3:6", 3, ["--out", "runs/a"])
    Traceback (most recent call last):
    ...
    ValueError: --kill-at '3:6' must be P:S with a process P in [0, 3) and a step S >= 1, e.g. 1:6.
    >>> parse_kill_at("coordinator:6", 3, ["--communication", "background", "--out", "runs/a"], True)
    (-1, 6, 'runs/a/trace/process-0.jsonl')
  """
  from diloco_core.runtime.background import TRACE_FILE
  who, _, at = text.partition(":")
  coordinator = own_coordinator and who == "coordinator"
  try:
    process, step = COORDINATOR if coordinator else int(who), int(at)
  except ValueError:
    process = step = -2
  if not ((coordinator or 0 <= process < processes) and step >= 1):
    also = " (or coordinator:S, its service's process)" if own_coordinator else ""
    raise ValueError(f"--kill-at {text!r} must be P:S with a process P in [0, {processes}){also} and a step"
                     f" S >= 1, e.g. {min(1, processes - 1)}:6.")
  out = train_flag_value(train_args, "out")
  if out is None or not any(x.endswith("background") for x in train_args):
    raise ValueError(f"--kill-at reads the process's trace: pass {FLAGS['communication']} background and"
                     f" {FLAGS['out']} to the trainer.")
  return process, step, os.path.join(out, TRACE_FILE.format(rank=max(process, 0)))


def train_flag_value(train_args: list[str], name: str) -> str | None:
  """The value after the trainer's flag of option ``name`` in ``train_args`` (None when absent).

  Args:
    train_args: the trainer's command line (or a whole command holding it).
    name: the option as errors name it (``"out"``); its flag is the field metadata's
      (:data:`diloco_core.run.flags.FLAGS`).

  Returns:
    The text after the flag, or None.

  Examples:
    >>> train_flag_value(["--model", "tiny", "--out", "runs/a"], "out")
    'runs/a'
    >>> train_flag_value(["--model", "tiny"], "out") is None
    True
  """
  flag = FLAGS[name]
  return next((train_args[i + 1] for i, x in enumerate(train_args[:-1]) if x == flag), None)


def reached(trace: str, step: int) -> bool:
  """Whether the trace file records a computed step >= ``step`` (False while it is not there)."""
  try:
    with open(trace) as f:
      return any(f'"kind": "compute", "step": ' in line and int(line.split('"step": ')[1].split(",")[0]) >= step
                 for line in f)
  except OSError:
    return False
