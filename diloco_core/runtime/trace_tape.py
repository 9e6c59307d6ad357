"""A real run's tape: the trace of an elastic run over real processes turned into a syncer tape.

A run over real processes (``communication`` background, ``elastic``; with ``quorum`` K,
:mod:`~diloco_core.runtime.quorum`) records, on each process, one ``settle`` row per sync
(``sent_at``: the step that sent it; ``present``: the [M] mask of the replicas whose
contributions counted, or None for all) and one ``lost`` row per process it lost.
:func:`tape_from_trace` writes that record as a tape of :mod:`~diloco_core.spec.tape` events,
in **ticks = local steps** (a background run steps every replica once per tick, in lock step):
a late contribution ``Dropped`` and its replica healed, a lost process's replicas ``Lost``
(they send nothing after). :func:`~diloco_core.runtime.tape_player.play_tape` can play it with the
real model; the trace stays the source of truth. At the end of an elastic run the process that
writes the run's files writes its own trace's tape to ``<out>/tape.json`` (:func:`record_tape`;
:func:`read_tape` reads it back), and ``--tape FILE`` replays it: the in-step trainer with the
tape's drops (:func:`drops_of_tape`: every replica that is not a member of a round, late or
lost) as ``drop_schedule``, on any mesh; on a mesh of one replica per device (``--mesh
diloco=M,data=1``), the final params and eval losses of the real run bit for bit (each process
computed its replica alone, as each device does; a lost replica's own losses are the
replay's, not null).

**The file.** One JSON object: ``{"replicas": M, "sync_every": H, "events": [...]}``, each event
an object with its ``"event"`` name (``"Lost"``, ``"Sent"``, ``"Dropped"``, ``"Committed"``,
``"Merged"``) and its fields; a :class:`~diloco_core.spec.tape.Committed` event's ``members``
are ``[replica, step, base, inner_steps]`` lists.

Not recorded (one-line ``ValueError``): a trace of more than one fragment or with overlap
(Streaming: P = 1, τ = 0 only), a skipped sync, and the heals and resumes of an elastic run
(``heal``, ``resumed`` rows: a replacement takes a source replica's inner optimizer state,
which a tape's ``Joined`` does not say).
"""

from __future__ import annotations

import dataclasses
import json
import os

from diloco_core.runtime.background import TRACE_FILE
from diloco_core.spec.tape import Committed, Contribution, Dropped, Joined, Lost, Merged, Sent

__all__ = ["TAPE_FILE", "drops_of_tape", "read_tape", "record_tape", "tape_from_trace", "write_tape"]

#: The recorded tape of a run, under its ``out``.
TAPE_FILE = "tape.json"

_EVENTS = {cls.__name__: cls for cls in (Lost, Joined, Sent, Dropped, Committed, Merged)}
_REFUSED = {"skip": "a skipped sync (nobody took part)", "heal": "a healed replacement (elastic)",
            "resumed": "a resumed run"}


def tape_from_trace(rows, replicas: int, sync_every: int, processes: int | None = None) -> tuple:
  """The tape of an elastic run over real processes, from one process's trace (module docstring).

  The v-th sync, sent after local step :math:`s = vH` with the replicas :math:`S_v` present
  (all M when ``present`` is None), is, at tick s: every live replica m sends
  (``Sent(s, m, s, base=v-1)``); each absent one is ``Dropped`` (staleness 1: it arrived after
  the decision); round v commits with the members :math:`S_v` **in replica order**, each
  :math:`H` steps from base v - 1; every live replica merges version v, an absent one healed
  (replaced by it). A ``lost`` row at step t makes each replica of the lost processes ``Lost``
  at tick t (a process holds M / ``processes`` consecutive replicas); it sends nothing after.
  The others learn of a loss at an agreement over every live process (a log row's, a
  checkpoint's), which at a step that also syncs comes after that sync's vote: a lost replica
  that is a member of the round of step t contributed to it before it was lost, and is
  ``Lost`` at tick t + 1, after the round it last contributed to.
  Events are sorted by ``(tick, kind, replica)``, as :func:`~diloco_core.spec.tape.simulate_tape`'s.

  Args:
    rows: the trace's rows (dicts; ``settle`` and ``lost`` rows make the tape, ``quorum``,
      ``compute``, ``wait``, ``transfer`` rows are ignored).
    replicas: M.
    sync_every: H.
    processes: the run's processes (needed by a ``lost`` row).

  Returns:
    The tape: a tuple of :class:`~diloco_core.spec.tape.Lost`,
    :class:`~diloco_core.spec.tape.Sent`, :class:`~diloco_core.spec.tape.Dropped`,
    :class:`~diloco_core.spec.tape.Committed` and :class:`~diloco_core.spec.tape.Merged` events.

  Raises:
    ValueError: one line naming what a tape cannot record.

  Examples:
    >>> tape = tape_from_trace([{"kind": "settle", "step": 2, "fragment": 0, "sent_at": 2,
    ...                          "present": [1.0, 0.0]}], replicas=2, sync_every=2)
    >>> [type(e).__name__ for e in tape]
    ['Sent', 'Sent', 'Dropped', 'Committed', 'Merged', 'Merged']
    >>> tape[3].members, tape[5]
    ((Contribution(replica=0, step=2, base=0, inner_steps=2),), Merged(tick=2, replica=1, step=2, version=1, heal=True))
    >>> lost = tape_from_trace([{"kind": "settle", "sent_at": 2, "step": 2, "present": None},
    ...                         {"kind": "lost", "step": 3, "processes": [1]},
    ...                         {"kind": "settle", "sent_at": 4, "step": 4, "present": [1.0, 0.0]}], 2, 2, processes=2)
    >>> [type(e).__name__ for e in lost[5:]]
    ['Lost', 'Sent', 'Committed', 'Merged']
    >>> late = tape_from_trace([{"kind": "settle", "sent_at": 2, "step": 2, "present": None},
    ...                         {"kind": "lost", "step": 2, "processes": [1]}], 2, 2, processes=2)
    >>> [e for e in late if type(e).__name__ == "Lost"]  # a member of round 2: lost after it
    [Lost(tick=3, replica=1, step=2)]
  """
  syncs, lost = _syncs_and_losses(rows, replicas, sync_every, processes)
  for s, members in syncs:  # contributed, then lost before the barrier that noticed it
    for m in members:
      if lost.get(m) == s:
        lost[m] = s + 1
  return _lock_step(syncs, lost, replicas, sync_every)


def _syncs_and_losses(rows, replicas: int, sync_every: int, processes: int | None
                      ) -> tuple[list[tuple[int, tuple[int, ...]]], dict[int, int]]:
  """The trace's syncs, ``(sent at, members)`` in order, and each lost replica's step (the
  ``lost`` row's); one-line ``ValueError`` for what a tape cannot record."""
  syncs: list[tuple[int, tuple[int, ...]]] = []
  lost: dict[int, int] = {}
  for row in rows:
    kind = row.get("kind")
    if kind in _REFUSED:
      raise ValueError(f"the trace holds {_REFUSED[kind]} (a {kind!r} row at step {row.get('step')}): a tape"
                       " records the settles and losses of a run without heals, resumes or skipped syncs only.")
    if kind == "lost":
      if not processes or replicas % processes:
        raise ValueError(f"the trace's lost row at step {row.get('step')} names processes: pass `processes`"
                         f" (a divisor of replicas={replicas}), got {processes!r}.")
      per = replicas // processes
      for p in row["processes"]:
        for m in range(p * per, (p + 1) * per):
          lost.setdefault(m, row["step"])
      continue
    if kind != "settle":
      continue
    step, sent = row["step"], row["sent_at"]
    if row.get("fragment", 0) != 0:
      raise ValueError(f"`fragments`: the trace syncs fragment {row['fragment']} (Streaming); a tape"
                       " records P = 1 only (fragment 0).")
    if step != sent:
      raise ValueError(f"`overlap`: the trace merges at step {step} a sync sent at step {sent}; a tape"
                       " records τ = 0 only (merged at its sending step).")
    if sent != (len(syncs) + 1) * sync_every:
      raise ValueError(f"`sync_every`: the trace's sync #{len(syncs) + 1} was sent at step {sent}, not"
                       f" {(len(syncs) + 1) * sync_every} (H={sync_every}, every sync in order).")
    present = row.get("present")
    if present is not None and len(present) != replicas:
      raise ValueError(f"`replicas`: the trace's sync of step {sent} lists {len(present)} replicas; the run has"
                       f" {replicas}.")
    syncs.append((sent, tuple(range(replicas)) if present is None else
                  tuple(m for m, on in enumerate(present) if on > 0)))
  return syncs, lost


def _lock_step(syncs, lost: dict[int, int], replicas: int, sync_every: int) -> tuple:
  """The tape of rounds ``syncs`` (``(step, members)``) with replicas ``lost`` (replica: tick)."""
  tape: list = [Lost(t, m, (t - 1) // sync_every * sync_every if t > 0 else 0) for m, t in lost.items()]
  for v, (s, members) in enumerate(syncs, start=1):
    live = [m for m in range(replicas) if not (m in lost and lost[m] <= s)]
    ghost = next((m for m in members if m not in live), None)
    if ghost is not None:
      raise ValueError(f"replica {ghost} is a member of the round of step {s} after its loss at step"
                       f" {lost[ghost]}: on a tape a lost replica never comes back.")
    tape += [Sent(s, m, s, v - 1) for m in live]
    tape += [Dropped(s, m, s, v - 1, 1) for m in live if m not in members]
    tape.append(Committed(s, v, tuple(Contribution(m, s, v - 1, sync_every) for m in members)))
    tape += [Merged(s, m, s, v, m not in members) for m in live]
  return tuple(sorted(tape, key=lambda e: (e.tick, e.KIND, e.replica)))


def drops_of_tape(tape, replicas: int, sync_every: int) -> tuple[tuple[int, int], ...]:
  """The ``drop_schedule`` of a recorded tape: the ``(step, replica)`` of each replica that is not a
  member of the round of that step (its contribution late, or the replica lost).

  A recorded tape is the lock step :func:`tape_from_trace` writes (every live replica sends after
  each H steps, a late one dropped and healed, a lost one silent), so the in-step trainer with
  these drops runs the rounds it records; the lock step of its rounds and losses must give the
  tape back, event for event.

  Args:
    tape: the events (:func:`read_tape`).
    replicas: M.
    sync_every: H.

  Returns:
    ``(step, replica)`` pairs, sorted (empty: every replica in every round).

  Raises:
    ValueError: one line when the tape is not of that shape (a simulated tape, edited by hand).

  Examples:
    >>> tape = tape_from_trace([{"kind": "settle", "step": 2, "sent_at": 2, "present": [1.0, 0.0]},
    ...                         {"kind": "settle", "step": 4, "sent_at": 4, "present": None}], 2, 2)
    >>> drops_of_tape(tape, replicas=2, sync_every=2)
    ((2, 1),)
    >>> drops_of_tape(tape[:-1], replicas=2, sync_every=2)
    Traceback (most recent call last):
    ...
    ValueError: `tape`: not a recorded tape (every replica sends after each H=2 steps, a late one dropped and healed, a lost one silent, as an elastic run writes it): 10 events, the lock step of its 2 rounds has 11.
  """
  commits = [e for e in tape if isinstance(e, Committed)]
  syncs = [(v * sync_every, tuple(c.replica for c in e.members)) for v, e in enumerate(commits, start=1)]
  lost = {e.replica: e.tick for e in tape if isinstance(e, Lost)}
  try:
    made = _lock_step(syncs, lost, replicas, sync_every)
  except ValueError as e:
    raise ValueError(f"`tape`: {e}") from None
  tape = tuple(tape)
  if made != tape:
    at = next((i for i, (a, b) in enumerate(zip(made, tape)) if a != b), None)
    what = (f"its event {at + 1} is {tape[at]}, the lock step's {made[at]}" if at is not None else
            f"{len(tape)} events, the lock step of its {len(commits)} rounds has {len(made)}")
    raise ValueError(f"`tape`: not a recorded tape (every replica sends after each H={sync_every} steps, a late one"
                     f" dropped and healed, a lost one silent, as an elastic run writes it): {what}.")
  return tuple((s, m) for s, members in syncs for m in range(replicas) if m not in members)


def write_tape(path: str, tape, replicas: int, sync_every: int) -> None:
  """Writes ``tape`` (of a run of M = ``replicas``, H = ``sync_every``) to ``path`` as JSON (module docstring)."""
  def encode(e):
    row = {"event": type(e).__name__, **dataclasses.asdict(e)}
    if isinstance(e, Committed):
      row["members"] = [list(c) for c in e.members]
    return row
  with open(path, "w") as f:
    json.dump({"replicas": replicas, "sync_every": sync_every, "events": [encode(e) for e in tape]}, f)


def _refuse(path: str, what: str) -> ValueError:
  return ValueError(f"`tape`: {path!r} is not a tape file: {what}.")


def _whole(path: str, where: str, name: str, value, kind=int) -> None:
  """``value`` of field ``name`` must be a ``kind`` (an int is never a bool here, nor a bool an int)."""
  if type(value) is not kind:  # pylint: disable=unidiomatic-typecheck
    shown = "missing" if value is _MISSING else f"{value!r} ({type(value).__name__})"
    raise _refuse(path, f"{where}field {name!r} must be {'an integer' if kind is int else 'true or false'},"
                        f" got {shown}")


_MISSING = object()


def _event(path: str, i: int, row) -> object:
  """Event ``i`` of the file, every field checked (module docstring: the file)."""
  where = f"event {i + 1} "
  if not isinstance(row, dict):
    raise _refuse(path, f"{where}must be an object, got {row!r}")
  name = row.get("event", _MISSING)
  if name not in _EVENTS:
    raise _refuse(path, f"{where}field 'event' must be one of {sorted(_EVENTS)}, got"
                        f" {'nothing' if name is _MISSING else repr(name)}")
  cls, fields = _EVENTS[name], {f.name: f for f in dataclasses.fields(_EVENTS[name])}
  extra = sorted(set(row) - set(fields) - {"event"})
  if extra:
    raise _refuse(path, f"{where}({name}) has field(s) {extra} it does not take; its fields: {sorted(fields)}")
  values = {}
  for field_name in fields:
    value = row.get(field_name, _MISSING)
    if field_name == "members":
      if not isinstance(value, list) or not all(isinstance(c, list) and len(c) == 4 for c in value):
        raise _refuse(path, f"{where}({name}) field 'members' must be a list of [replica, step, base,"
                            f" inner_steps] lists, got {'nothing' if value is _MISSING else repr(value)[:80]}")
      for c in value:
        for part, x in zip(Contribution._fields, c):
          _whole(path, f"{where}({name}) member ", part, x)
      value = tuple(Contribution(*c) for c in value)
    else:
      _whole(path, f"{where}({name}) ", field_name, value, bool if field_name == "heal" else int)
    values[field_name] = value
  return cls(**values)


def _differ(a, b) -> str:
  """``a`` as a mismatch line shows it: with its type when ``a`` and ``b`` print alike."""
  alike = repr(a) == repr(b) and (type(a) is not type(b) or a != b)
  return f"{a!r} ({type(a).__name__})" if alike else repr(a)


def read_tape(path: str, replicas: int, sync_every: int, steps: int | None = None) -> tuple:
  """The tape of :func:`write_tape`'s file, checked against the run (M, H, and with ``steps`` its
  syncs, one every H of them): one-line ``ValueError`` naming the field at fault.

  Examples:
    >>> import json, os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "tape.json")
    >>> tape = tape_from_trace([{"kind": "settle", "step": 2, "sent_at": 2, "present": None}], 2, 2)
    >>> write_tape(path, tape, replicas=2, sync_every=2)
    >>> read_tape(path, 2, 2) == tape
    True
    >>> read_tape(path, 3, 2)
    Traceback (most recent call last):
    ...
    ValueError: `tape`: the tape of ... was recorded with replicas=2, sync_every=2; this run has replicas=3, sync_every=2.
    >>> json.dump({"sync_every": 2, "events": []}, open(path, "w"))
    >>> read_tape(path, 2, 2)
    Traceback (most recent call last):
    ...
    ValueError: `tape`: ... is not a tape file: field 'replicas' must be an integer, got missing.
  """
  if not os.path.isfile(path):
    raise ValueError(f"`tape`: no file {path!r} (a run's recorded tape is <out>/{TAPE_FILE}).")
  try:
    with open(path) as f:
      data = json.load(f)
  except (OSError, ValueError) as e:
    raise _refuse(path, f"{type(e).__name__}: {' '.join(str(e).split())[:120]}") from None
  if not isinstance(data, dict):
    raise _refuse(path, f"it must hold one object {{\"replicas\", \"sync_every\", \"events\"}}, got a"
                        f" {type(data).__name__}")
  for name in ("replicas", "sync_every"):
    _whole(path, "", name, data.get(name, _MISSING))
  rows = data.get("events", _MISSING)
  if not isinstance(rows, list):
    raise _refuse(path, f"field 'events' must be a list, got {'nothing' if rows is _MISSING else repr(rows)[:80]}")
  events = [_event(path, i, row) for i, row in enumerate(rows)]
  if (data["replicas"], data["sync_every"]) != (replicas, sync_every):
    raise ValueError(f"`tape`: the tape of {path!r} was recorded with replicas={_differ(data['replicas'], replicas)},"
                     f" sync_every={_differ(data['sync_every'], sync_every)}; this run has"
                     f" replicas={_differ(replicas, data['replicas'])}, sync_every={_differ(sync_every, data['sync_every'])}.")
  rounds = sum(isinstance(e, Committed) for e in events)
  if steps is not None and rounds != steps // sync_every:
    raise ValueError(f"`tape`: the tape of {path!r} has {rounds} syncs; this run of steps={steps} makes"
                     f" {steps // sync_every} (H={sync_every}): pass the recorded run's steps.")
  return tuple(events)


def record_tape(out: str, rank: int, replicas: int, sync_every: int, processes: int) -> str | None:
  """Writes ``<out>/tape.json`` from process ``rank``'s trace (``<out>/trace/process-<rank>.jsonl``)
  of a run of ``processes`` processes.

  Returns:
    None when written, else the one line saying why not (a trace a tape cannot record).
  """
  with open(os.path.join(out, TRACE_FILE.format(rank=rank))) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  try:
    tape = tape_from_trace(rows, replicas, sync_every, processes)
  except ValueError as e:
    return f"no {TAPE_FILE} recorded: {e}"
  write_tape(os.path.join(out, TAPE_FILE), tape, replicas, sync_every)
  return None
