"""Checkpoints (Orbax): save the whole training state, resume it bit for bit, export params.

Layout of a run directory ``<out>``::

  <out>/checkpoints/<step>/state/   every leaf of the training state (Orbax, OCDBT)
  <out>/checkpoints/<step>/meta/    JSON: step, config, leaf table, checksums, data
                                    position, seeds and the metrics rows written so far
  <out>/final_params/               the global params at the end: a plain Orbax checkpoint

What a checkpoint holds. The state pytree (:class:`~diloco_core.DiLoCoState` or
:class:`~diloco_core.DPState`) is the complete training state: every replica's params and
inner optimizer state, the global params, the outer momentum, the error-feedback
residuals, the step, and who took part in each fragment's latest sync. The fragments in
flight (Streaming, τ > 0) need nothing more: they are fully determined by
``(global_params, step)`` (see :mod:`diloco_core.algorithm.diloco`). The data position of every
replica is the step (batches are a pure function of ``(seed, replica, step)``), and
there is no RNG state to carry: model init, data and simulated replica drops are all
pure functions of the seeds in the config. The meta item records all of these
explicitly, plus the config and the metrics rows, so a resumed run continues
``metrics.jsonl`` and the byte counters exactly.

Atomicity. Orbax writes each step into ``<step>.orbax-checkpoint-tmp-*`` and renames it
to ``<step>`` only once everything (state and meta) is on disk, so a crash mid-save
leaves the previous checkpoint loadable; :func:`restore_latest` ignores (and removes)
such leftovers, and skips damaged checkpoints (unreadable files, checksum mismatch)
in favour of the newest valid one, saying so on stderr.

Who writes. Every process writes its part of the state (Orbax over all of them), except in an
elastic run (:mod:`diloco_core.runtime.elastic`): a lost process would never reach Orbax's barriers,
so one process gathers the state and writes it alone: process 0 (``CheckpointWriter(alone=True)``),
or, once it was lost, the lowest process left, through :mod:`diloco_core.store.solo_write`. Either
way every process reads its part at a resume.

The leaves are stored under positional names (``00000``, ``00001``, ...) and restored
into the structure of a freshly initialised state, so the restored pytree has exactly
the structure, dtypes and shardings of the fresh one; the leaf table (paths, shapes,
dtypes) in the meta item catches a checkpoint of another model with a clear error.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import threading
import time
from typing import Any, Sequence

import jax
import orbax.checkpoint as ocp

from diloco_core.store.disk_space import disk_full, full_disk_message
from diloco_core.devices.processes import collective_failure
from diloco_core.store.tree_io import OrbaxLogs, fingerprint, leaf_table, one_line, quiet_orbax_failures

FORMAT_VERSION = 1
CHECKPOINTS = "checkpoints"
FINAL_PARAMS = "final_params"
TMP_MARK = ".orbax-checkpoint-tmp"



def _warn(msg: str) -> None:
  if jax.process_index() == 0:
    print(f"warning: {msg}", file=sys.stderr)


def _jsonable(x: Any) -> Any:
  return json.loads(json.dumps(x, default=str))


def checkpoints_dir(out: str) -> str:
  """``<out>/checkpoints`` (absolute: Orbax wants absolute paths)."""
  return os.path.join(os.path.abspath(out), CHECKPOINTS)


def step_dir(out: str, step: int) -> str:
  """``<out>/checkpoints/<step>``: where checkpoint ``step`` is (absolute).

  Examples:
    >>> step_dir("/runs/a", 8)
    '/runs/a/checkpoints/8'
  """
  return os.path.join(checkpoints_dir(out), str(step))


def finalized_steps(out: str) -> list[int]:
  """Steps with a finalized checkpoint directory in ``<out>/checkpoints``, ascending.

  Examples:
    >>> finalized_steps("/nonexistent")
    []
  """
  d = checkpoints_dir(out)
  if not os.path.isdir(d):
    return []
  return sorted(int(n) for n in os.listdir(d) if n.isdigit() and is_run_checkpoint(os.path.join(d, n)))


def is_run_checkpoint(path: str) -> bool:
  """Whether ``path`` was written by :class:`CheckpointWriter` (its marker: the Orbax
  ``_CHECKPOINT_METADATA`` file and the ``state`` and ``meta`` items), finished or not."""
  return (os.path.isfile(os.path.join(path, "_CHECKPOINT_METADATA"))
          and all(os.path.isdir(os.path.join(path, item)) for item in ("state", "meta")))


def check_no_foreign_steps(out: str) -> None:
  """Refuses a ``<out>/checkpoints`` holding a step-named entry no run wrote (``999/``):
  Orbax would take it for the newest checkpoint, skip this run's saves and, later, delete it.

  Examples:
    >>> check_no_foreign_steps("/nonexistent")
  """
  d = checkpoints_dir(out)
  names = sorted(os.listdir(d)) if os.path.isdir(d) else []
  foreign = [os.path.join(d, n) for n in names if n.isdigit() and not is_run_checkpoint(os.path.join(d, n))]
  if foreign:
    raise ValueError(f"{', '.join(foreign)} in the checkpoint directory was not written by a run (no"
                     " checkpoint marker); move it out of there or choose another `out`.")


def _items(state) -> dict[str, Any]:
  return {f"{i:05d}": x for i, x in enumerate(jax.tree.leaves(state))}


def _manager(out: str, keep: int | None, create: bool, alone: bool = False) -> ocp.CheckpointManager:
  """Orbax's manager of ``<out>/checkpoints``; ``alone``: this process writes without the others
  (Orbax's barriers then involve it only; Orbax leaves creating the directory to the caller)."""
  multiprocessing = {}
  if alone:
    os.makedirs(checkpoints_dir(out), exist_ok=True)
    me = jax.process_index()
    multiprocessing = {"multiprocessing_options": ocp.options.MultiprocessingOptions(primary_host=me,
                                                                                     active_processes={me})}
  options = ocp.CheckpointManagerOptions(
      max_to_keep=keep, enable_async_checkpointing=False, create=create and not alone, **multiprocessing)
  return ocp.CheckpointManager(checkpoints_dir(out), options=options, item_names=("state", "meta"))


class CheckpointWriter:
  """Saves training checkpoints to ``<out>/checkpoints/<step>/``, keeping the last ``keep``.

  Saves are synchronous (the next step donates the state's buffers) and atomic.

  Args:
    out: the run directory.
    keep: how many checkpoints to keep (older ones are deleted after a successful save).
    alone: this process writes every checkpoint by itself, from host arrays, while the other
      processes of the run write nothing (an elastic run: it cannot wait for a lost process;
      :meth:`~diloco_core.runtime.elastic_runtime.ElasticRuntime.checkpoint_state` gathers the state). Restoring
      is the same either way: every process reads its part.
  """

  def __init__(self, out: str, keep: int, alone: bool = False):
    self.out = out
    self._mgr = _manager(out, keep, create=True, alone=alone)
    self._last: str | None = None  # the newest checkpoint this writer saved
    self._failures = 0  # saves that failed (and were reported)

  def save(self, step: int, state, meta: dict) -> str:
    """Writes ``state`` and ``meta`` (JSON-able) as checkpoint ``step``; returns its path.

    Raises:
      OSError: one line, when the checkpoint directory (or the previous checkpoint) was
        removed during the run, or the save failed; it names the command that goes on.
    """
    meta = dict(meta, format=FORMAT_VERSION, step=int(step), leaves=leaf_table(state),
                checksums=fingerprint(state))
    path = step_dir(self.out, step)
    if not os.path.isdir(checkpoints_dir(self.out)) or (
        self._last and int(os.path.basename(self._last)) not in finalized_steps(self.out)):
      gone = checkpoints_dir(self.out) if not os.path.isdir(checkpoints_dir(self.out)) else self._last
      raise OSError(self._failed(path, f"{gone} was removed or replaced during the run"))
    errors: list[BaseException] = []
    previous = threading.excepthook  # Orbax's writer threads: their errors are reported below
    threading.excepthook = lambda info: errors.append(info.exc_value)
    quiet_orbax_failures()
    running = set(threading.enumerate())
    try:
      with OrbaxLogs():  # what Orbax logs of a failed save is in the one line below
        try:
          self._mgr.save(int(step), args=ocp.args.Composite(
              state=ocp.args.StandardSave(_items(state)), meta=ocp.args.JsonSave(_jsonable(meta))))
          self._mgr.wait_until_finished()
        except Exception:
          _join_new_threads(running)  # the save's other writers fail too: their logs go here
          raise
    except Exception as e:  # noqa: BLE001 - Orbax / TensorStore: one line at the boundary
      message = self._failed(path, e)  # (removes the partial save)
      if jax.process_count() > 1 and collective_failure(e):
        raise  # another process was lost during the save: the loop says so, not "could not be written"
      raise OSError(message) from None
    finally:
      threading.excepthook = previous
    if errors or not os.path.isdir(path):
      raise OSError(self._failed(path, errors[0] if errors else "it is missing after the save"))
    self._last = path
    return path

  def _failed(self, path: str, error: BaseException | str) -> str:
    """Why a save failed, and the command that goes on from what is left (the partial
    checkpoint is removed: it is never read, and on a full disk it holds the space)."""
    self._failures += 1
    d = checkpoints_dir(self.out)
    if os.path.isdir(d):
      for name in os.listdir(d):
        if name.startswith(f"{os.path.basename(path)}.orbax-checkpoint-tmp"):
          shutil.rmtree(os.path.join(d, name), ignore_errors=True)
    left = finalized_steps(self.out) if os.path.isdir(d) else []
    then = (f"continue with `resume` (from {os.path.join(d, str(left[-1]))})" if left else
            "start over with `overwrite` (no checkpoint is left)")
    if disk_full(error):
      return f"checkpoint {path} could not be written: {full_disk_message(d)}; free space there, then {then}."
    why = error if isinstance(error, str) else one_line(error)
    return (f"checkpoint {path} could not be written ({why}); check that {d} exists and is a"
            f" writable directory, then {then}.")

  def close(self) -> None:
    """Closes the manager; after a failed save (already reported) its error is dropped."""
    try:
      self._mgr.close()
    except Exception as e:  # noqa: BLE001 - e.g. "cannot schedule new futures after shutdown"
      if not self._failures:
        raise OSError(f"closing the checkpoints in {checkpoints_dir(self.out)} failed ({one_line(e)}).") from None


def _join_new_threads(running: set, timeout_s: float = 30.0) -> None:
  """Waits (at most ``timeout_s`` in all) for the threads started since ``running`` was taken.

  When one of Orbax's writers fails, ``wait_until_finished`` raises at once while the others
  still write; left running, they fail at interpreter exit ("cannot schedule new futures after
  interpreter shutdown") and log tracebacks after the one-line error. Waited for inside
  :class:`OrbaxLogs`, their failures are dropped with the rest of the failed save's logs."""
  deadline = time.monotonic() + timeout_s
  for t in threading.enumerate():  # Orbax's writers (not thread-pool workers: they wait forever)
    if t not in running and type(t).__module__.startswith("orbax"):
      t.join(max(0.0, deadline - time.monotonic()))


@dataclasses.dataclass
class Restored:
  """What :func:`restore_latest` returns."""

  state: Any  # the restored state, same pytree/shardings as the target
  meta: dict  # the meta item (config, metrics rows, counters, ...)
  step: int
  path: str


def check_compatible(saved: dict, current: dict, where: str, must_match: Sequence[str]) -> None:
  """Raises a one-line ``ValueError`` naming the first option that differs.

  Args:
    saved: the config stored in a checkpoint (``dataclasses.asdict`` of a TrainConfig, as JSON).
    current: the config of this run, same form.
    where: the checkpoint path, for the message.
    must_match: dotted paths of the fields a resumed run must share with its checkpoint
      (:func:`diloco_core.spec.fields.must_match_fields`; they fix the state's shapes or the
      trajectory). Every other field (steps, intervals, out, mesh, drops, ...) may change.

  Examples:
    >>> check_compatible({"algo": {"replicas": 2}}, {"algo": {"replicas": 4}}, "ck/8", ["algo.replicas"])
    Traceback (most recent call last):
    ...
    ValueError: `resume`: checkpoint ck/8 was written with replicas=2 but this run has replicas=4 (`replicas`); resume with the same value, or start a new run in another `out`.
  """
  saved, current = _jsonable(saved), _jsonable(current)
  for name in must_match:
    group, _, key = name.rpartition(".")
    if key not in (current.get(group, {}) if group else current):
      continue
    a = (saved.get(group, {}) if group else saved).get(key, "<missing>")
    b = (current.get(group, {}) if group else current).get(key)
    if a != b:
      label = key if group == "algo" else name
      raise ValueError(
          f"`resume`: checkpoint {where} was written with {label}={a!r} but this run has"
          f" {label}={b!r} (`{label}`); resume with the same value, or start a new run in"
          " another `out`.")


def _check_leaves(saved: list[dict], current: list[dict], where: str) -> None:
  if len(saved) != len(current):
    raise ValueError(
        f"`resume`: checkpoint {where} holds {len(saved)} arrays but this run's state has"
        f" {len(current)}: it was written by another model or algorithm; use its own `out`.")
  for a, b in zip(saved, current):
    if a != b:
      raise ValueError(
          f"`resume`: checkpoint {where} holds another model: {a['path']} is {a['dtype']}{a['shape']}"
          f" there but {b['dtype']}{b['shape']} here; use the same model options or another `out`.")


def _remove_leftovers(out: str) -> None:
  """Removes unfinished saves (``<step>.orbax-checkpoint-tmp-*``), saying so."""
  d = checkpoints_dir(out)
  if jax.process_index() != 0 or not os.path.isdir(d):
    return
  for name in sorted(os.listdir(d)):
    if TMP_MARK in name:
      _warn(f"removing {os.path.join(d, name)}: an interrupted save (never a valid checkpoint).")
      shutil.rmtree(os.path.join(d, name), ignore_errors=True)


def newest_meta(out: str) -> tuple[str, dict] | None:
  """(path, meta) of the newest finalized checkpoint whose meta item is readable JSON of this
  format, read straight from its file (no Orbax, no JAX): what a resumed run checks before it
  builds anything. None when there is none (:func:`restore_latest` then says why)."""
  d = checkpoints_dir(out)
  for step in reversed(finalized_steps(out)):
    try:
      with open(os.path.join(d, str(step), "meta", "metadata")) as f:
        meta = json.load(f)
    except (OSError, ValueError):
      continue
    if isinstance(meta, dict) and meta.get("format") == FORMAT_VERSION and meta.get("step") == step:
      return os.path.join(d, str(step)), meta
  return None


def restore_latest(out: str, target, config: dict, must_match: Sequence[str],
                   normalize=lambda config: config) -> Restored:
  """Restores the newest valid checkpoint of ``<out>`` into the structure of ``target``.

  Damaged checkpoints (unreadable, truncated, checksum mismatch) are skipped with a
  warning and moved aside to ``<step>.damaged``; interrupted saves are removed.

  Args:
    out: the run directory.
    target: a freshly initialised state of this run (gives structure, dtypes, shardings).
    config: this run's config as a dict (``dataclasses.asdict``), checked with
      :func:`check_compatible`.
    must_match: the dotted paths of ``config`` that must equal the checkpoint's.
    normalize: applied to the checkpoint's config before the comparison (e.g.
      :func:`diloco_core.run.config.effective_config`, as ``config`` is).

  Returns:
    A :class:`Restored`.

  Raises:
    ValueError: no checkpoint, none readable, or an incompatible config / model (one line).
  """
  d = checkpoints_dir(out)
  quiet_orbax_failures()
  steps = finalized_steps(out)
  if not steps:
    raise ValueError(no_checkpoint_message(out))
  expected = leaf_table(target)
  abstract = {k: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding)
              for k, x in _items(target).items()}
  mgr = _manager(out, None, create=False)
  failures: list[tuple[int, str]] = []
  try:
    for step in reversed(steps):
      path = os.path.join(d, str(step))
      try:
        meta = mgr.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
        if not isinstance(meta, dict) or meta.get("format") != FORMAT_VERSION or meta.get("step") != step:
          raise ValueError("its meta item is missing or not from this version")
      except Exception as e:  # noqa: BLE001 - any unreadable checkpoint is skipped
        failures.append((step, one_line(e)))
        continue
      check_compatible(normalize(meta.get("config", {})), config, path, must_match)
      _check_leaves(meta.get("leaves", []), expected, path)
      try:
        items = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract)))["state"]
        state = jax.tree.unflatten(jax.tree.structure(target), [items[k] for k in sorted(items)])
        saved_sums = list(meta.get("checksums") or [])
        for row, a, b in zip(expected, fingerprint(state), saved_sums + [None] * len(expected)):
          if a != b:
            raise ValueError(f"checksum mismatch in {row['path']}")
      except Exception as e:  # noqa: BLE001
        failures.append((step, one_line(e)))
        continue
      _remove_leftovers(out)  # only now: a run refused above leaves its directory untouched
      for bad_step, why in failures:
        _set_aside(d, bad_step, why, step)
      return Restored(state=state, meta=meta, step=step, path=path)
  finally:
    mgr.close()
  listed = "; ".join(f"step {step}: {why}" for step, why in failures)
  raise ValueError(f"`resume`: no readable checkpoint in {d} ({listed}); start over: drop `resume`"
                   " and pass `overwrite`.")


def no_checkpoint_message(out: str) -> str:
  """Why `resume` cannot continue ``out`` (no checkpoint), with a command that works.

  Examples:
    >>> no_checkpoint_message("/nonexistent")
    '`resume`: no checkpoint in /nonexistent/checkpoints; run without `resume` to start a new run (set `checkpoint_every` to write checkpoints).'
  """
  d = checkpoints_dir(out)
  if any(os.path.exists(os.path.join(out, name)) for name in ("metrics.jsonl", "summary.json")):
    return (f"`resume`: no checkpoint in {d} (the run there stopped before its first checkpoint);"
            " start over: drop `resume` and pass `overwrite`.")
  return (f"`resume`: no checkpoint in {d}; run without `resume` to start a new run (set"
          " `checkpoint_every` to write checkpoints).")


def _set_aside(d: str, step: int, why: str, resumed: int) -> None:
  if jax.process_index() != 0:
    return
  src = os.path.join(d, str(step))
  dst = damaged_path(d, step)
  os.rename(src, dst)
  _warn(f"checkpoint {src} is damaged ({why}); moved it to {dst} and resumed from step {resumed}.")


def damaged_path(d: str, step: int) -> str:
  """Where a damaged checkpoint ``step`` is set aside: ``<step>.damaged``, or ``.damaged.1``,
  ``.damaged.2``, ... when earlier evidence is there (it is never deleted).

  Examples:
    >>> damaged_path("/nonexistent", 8)
    '/nonexistent/8.damaged'
  """
  dst, n = os.path.join(d, f"{step}.damaged"), 0
  while os.path.exists(dst):
    n += 1
    dst = os.path.join(d, f"{step}.damaged.{n}")
  return dst
