"""A real run's tape: the trace of a background quorum run turned into a syncer tape.

A run over real processes (``communication`` background, ``elastic``, ``quorum`` K:
:mod:`~diloco_core.runtime.quorum`) records, on each process, one ``settle`` row per sync
(``sent_at``: the step that sent it; ``present``: the [M] mask of the replicas whose
contributions the vote kept, or None for all). :func:`tape_from_trace` writes that record as a
tape of :mod:`~diloco_core.spec.tape` events, in **ticks = local steps** (a background run
steps every replica once per tick, in lock step), which
:func:`~diloco_core.run.tape_play.play_tape` plays with the real model; the trace stays the
source of truth. At the end of a quorum run the process that writes the run's files writes its
own trace's tape to ``<out>/tape.json`` (:func:`record_tape`; :func:`read_tape` reads it back),
and ``--tape FILE`` replays it in-step.

**The file.** One JSON object: ``{"replicas": M, "sync_every": H, "events": [...]}``, each event
an object with its ``"event"`` name (``"Sent"``, ``"Dropped"``, ``"Committed"``, ``"Merged"``)
and its fields; a :class:`~diloco_core.spec.tape.Committed` event's ``members`` are
``[replica, step, base, inner_steps]`` lists.

Not played (one-line ``ValueError``): a trace of more than one fragment or with overlap
(Streaming: P = 1, τ = 0 only), a skipped sync, and the losses, heals and resumes of an elastic
run (``lost``, ``heal``, ``resumed`` rows).
"""

from __future__ import annotations

import dataclasses
import json
import os

from diloco_core.runtime.background import TRACE_FILE
from diloco_core.spec.tape import Committed, Contribution, Dropped, Joined, Lost, Merged, Sent

__all__ = ["TAPE_FILE", "read_tape", "record_tape", "tape_from_trace", "write_tape"]

#: The recorded tape of a run, under its ``out``.
TAPE_FILE = "tape.json"

_EVENTS = {cls.__name__: cls for cls in (Lost, Joined, Sent, Dropped, Committed, Merged)}
_REFUSED = {"skip": "a skipped sync (nobody took part)", "lost": "a lost process (elastic)",
            "heal": "a healed replacement (elastic)", "resumed": "a resumed run"}


def tape_from_trace(rows, replicas: int, sync_every: int) -> tuple:
  """The tape of a background quorum run, from one process's trace (module docstring).

  The v-th sync, sent after local step :math:`s = vH` with the replicas :math:`S_v` present
  (all M when ``present`` is None), is, at tick s: every replica m sends
  (``Sent(s, m, s, base=v-1)``); each absent one is ``Dropped`` (staleness 1: it arrived after
  the decision); round v commits with the members :math:`S_v` **in replica order**, each
  :math:`H` steps from base v - 1; every replica merges version v, an absent one healed
  (replaced by it). Events are sorted by ``(tick, kind, replica)``, as
  :func:`~diloco_core.spec.tape.simulate_tape`'s.

  Args:
    rows: the trace's rows (dicts; ``settle`` rows make the tape, ``quorum``, ``compute``,
      ``wait``, ``transfer`` rows are ignored).
    replicas: M.
    sync_every: H.

  Returns:
    The tape: a tuple of :class:`~diloco_core.spec.tape.Sent`,
    :class:`~diloco_core.spec.tape.Dropped`, :class:`~diloco_core.spec.tape.Committed` and
    :class:`~diloco_core.spec.tape.Merged` events.

  Raises:
    ValueError: one line naming what the tape player cannot play.

  Examples:
    >>> tape = tape_from_trace([{"kind": "settle", "step": 2, "fragment": 0, "sent_at": 2,
    ...                          "present": [1.0, 0.0]}], replicas=2, sync_every=2)
    >>> [type(e).__name__ for e in tape]
    ['Sent', 'Sent', 'Dropped', 'Committed', 'Merged', 'Merged']
    >>> tape[3].members, tape[5]
    ((Contribution(replica=0, step=2, base=0, inner_steps=2),), Merged(tick=2, replica=1, step=2, version=1, heal=True))
  """
  syncs: list[tuple[int, tuple[int, ...]]] = []
  for row in rows:
    kind = row.get("kind")
    if kind in _REFUSED:
      raise ValueError(f"the trace holds {_REFUSED[kind]} (a {kind!r} row at step {row.get('step')}): the tape"
                       " player plays the settles of a run without losses, heals or resumes only.")
    if kind != "settle":
      continue
    step, sent = row["step"], row["sent_at"]
    if row.get("fragment", 0) != 0:
      raise ValueError(f"`fragments`: the trace syncs fragment {row['fragment']} (Streaming); the tape player"
                       " plays P = 1 only (fragment 0).")
    if step != sent:
      raise ValueError(f"`overlap`: the trace merges at step {step} a sync sent at step {sent}; the tape player"
                       " plays τ = 0 only (merged at its sending step).")
    if sent != (len(syncs) + 1) * sync_every:
      raise ValueError(f"`sync_every`: the trace's sync #{len(syncs) + 1} was sent at step {sent}, not"
                       f" {(len(syncs) + 1) * sync_every} (H={sync_every}, every sync in order).")
    present = row.get("present")
    if present is not None and len(present) != replicas:
      raise ValueError(f"`replicas`: the trace's sync of step {sent} lists {len(present)} replicas; the run has"
                       f" {replicas}.")
    syncs.append((sent, tuple(range(replicas)) if present is None else
                  tuple(m for m, on in enumerate(present) if on > 0)))
  tape: list = []
  for v, (s, members) in enumerate(syncs, start=1):
    tape += [Sent(s, m, s, v - 1) for m in range(replicas)]
    tape += [Dropped(s, m, s, v - 1, 1) for m in range(replicas) if m not in members]
    tape.append(Committed(s, v, tuple(Contribution(m, s, v - 1, sync_every) for m in members)))
    tape += [Merged(s, m, s, v, m not in members) for m in range(replicas)]
  return tuple(tape)


def write_tape(path: str, tape, replicas: int, sync_every: int) -> None:
  """Writes ``tape`` (of a run of M = ``replicas``, H = ``sync_every``) to ``path`` as JSON (module docstring)."""
  def encode(e):
    row = {"event": type(e).__name__, **dataclasses.asdict(e)}
    if isinstance(e, Committed):
      row["members"] = [list(c) for c in e.members]
    return row
  with open(path, "w") as f:
    json.dump({"replicas": replicas, "sync_every": sync_every, "events": [encode(e) for e in tape]}, f)


def read_tape(path: str, replicas: int, sync_every: int, steps: int | None = None) -> tuple:
  """The tape of :func:`write_tape`'s file, checked against the run (M, H, and with ``steps`` its
  syncs, one every H of them): one-line ``ValueError``.

  Examples:
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "tape.json")
    >>> tape = tape_from_trace([{"kind": "settle", "step": 2, "sent_at": 2, "present": None}], 2, 2)
    >>> write_tape(path, tape, replicas=2, sync_every=2)
    >>> read_tape(path, 2, 2) == tape
    True
    >>> read_tape(path, 3, 2)
    Traceback (most recent call last):
    ...
    ValueError: `tape`: the tape of ... was recorded with replicas=2, sync_every=2; this run has replicas=3, sync_every=2.
  """
  if not os.path.isfile(path):
    raise ValueError(f"`tape`: no file {path!r} (a run's recorded tape is <out>/{TAPE_FILE}).")
  try:
    with open(path) as f:
      data = json.load(f)
    events = []
    for row in data["events"]:
      row = dict(row)
      cls = _EVENTS[row.pop("event")]
      if cls is Committed:
        row["members"] = tuple(Contribution(*c) for c in row["members"])
      events.append(cls(**row))
  except (OSError, ValueError, KeyError, TypeError) as e:
    raise ValueError(f"`tape`: {path!r} is not a tape file ({type(e).__name__}: {str(e)[:120]}).") from None
  if (data["replicas"], data["sync_every"]) != (replicas, sync_every):
    raise ValueError(f"`tape`: the tape of {path!r} was recorded with replicas={data['replicas']}, sync_every="
                     f"{data['sync_every']}; this run has replicas={replicas}, sync_every={sync_every}.")
  rounds = sum(isinstance(e, Committed) for e in events)
  if steps is not None and rounds != steps // sync_every:
    raise ValueError(f"`tape`: the tape of {path!r} has {rounds} syncs; this run of steps={steps} makes"
                     f" {steps // sync_every} (H={sync_every}): pass the recorded run's steps.")
  return tuple(events)


def record_tape(out: str, rank: int, replicas: int, sync_every: int) -> str | None:
  """Writes ``<out>/tape.json`` from process ``rank``'s trace (``<out>/trace/process-<rank>.jsonl``).

  Returns:
    None when written, else the one line saying why not (a trace the tape player cannot play).
  """
  with open(os.path.join(out, TRACE_FILE.format(rank=rank))) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  try:
    tape = tape_from_trace(rows, replicas, sync_every)
  except ValueError as e:
    return f"no {TAPE_FILE} recorded: {e}"
  write_tape(os.path.join(out, TAPE_FILE), tape, replicas, sync_every)
  return None
