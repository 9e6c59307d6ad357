"""A run's log: its metrics rows, byte counters and ``metrics.jsonl``.

The loop (:func:`diloco_core.run.loop.train`) records every step's per-replica losses (left on
the device until a row is due) and bytes sent, and adds a row at every log step; the rows
go to ``metrics.jsonl`` as they come (strict JSON, one row per line) and into each
checkpoint (:meth:`MetricsLog.checkpoint_item`), so that a resumed run continues the file
exactly.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from diloco_core.store.disk_space import disk_full, full_disk_message
from diloco_core.devices.mesh import fetch
from diloco_core.store.tree_io import one_line


class RunFileError(OSError):
  """A file of the run could not be written, or was removed during the run."""


class MetricsLog:
  """The rows of a run, its byte counters, and ``metrics.jsonl`` (when given a path).

  Args:
    tokens_per_step: M·b·T, tokens of one inner step over all replicas.
    drops: the run simulates replica drops (rows then list each sync's participants).
    path: ``metrics.jsonl`` to write, or None.
    resumed: the ``metrics`` item of the checkpoint a run resumes from, or None; the file is
      then rewritten (atomically) to that checkpoint's rows first.
    gather: queued per-replica values (one per step) -> host ``[steps, M]``; default: stack and
      fetch (the in-step runtime's; background gathers over the processes).
  """

  def __init__(self, tokens_per_step: int, drops: bool, path: str | None = None,
               resumed: dict | None = None, gather=None):
    self.tokens_per_step, self.drops = tokens_per_step, drops
    self._gather = gather or (lambda values: fetch(jnp.stack(values)))
    self.rows: list[dict] = [] if resumed is None else resumed["rows"]
    self.total_bytes = 0.0 if resumed is None else resumed["total_bytes_sent"]
    self.peak_bytes = 0.0 if resumed is None else resumed["peak_bytes_per_step"]
    self._since_row, self._pending, self._pending_aux, self._syncs = 0.0, [], [], []
    self._file, self.path, self._failed = None, None, False
    if path is not None and resumed is None:
      self._file, self.path = open(path, "w"), path
    elif path is not None:
      self.take_over(path)

  def take_over(self, path: str) -> None:
    """Writes ``path`` (atomically) from the rows held here and appends the next rows to it: a
    resumed run (the checkpoint's rows), or an elastic run's process that becomes the writer
    when the one before it was lost (:meth:`~diloco_core.runtime.elastic_runtime.ElasticRuntime.writes_files`:
    every process holds every row)."""
    with open(path + ".tmp", "w") as f:
      f.writelines(json.dumps(r, allow_nan=False) + "\n" for r in self.rows[1:])  # the step-0 row is not in the file
    os.replace(path + ".tmp", path)
    self._file, self.path = open(path, "a"), path

  def start(self, eval_loss: float) -> None:
    """The step-0 row (the initial eval loss; kept in the summary's rows, not in the file)."""
    self.rows.append(_row(0, None, eval_loss, 0, 0.0, 0.0, 0.0))

  def step(self, t: int, loss: jax.Array, sent: float, present: np.ndarray | None, synced: bool,
           aux_loss: jax.Array | None = None) -> None:
    """Records step ``t``: its per-replica losses (on device), the bytes each replica sent, and
    an MoE's per-replica auxiliary loss term (on device; None for a dense model)."""
    if present is not None and synced:
      self._syncs.append([t, [i for i in range(len(present)) if present[i]]])
    self._pending.append(loss)
    if aux_loss is not None:
      self._pending_aux.append(aux_loss)
    self.peak_bytes = max(self.peak_bytes, sent)  # what one present replica puts on the wire
    if present is not None:
      sent *= float(np.mean(present))  # a dropped replica sends nothing: the mean over replicas
    self.total_bytes += sent
    self._since_row += sent

  def uncount(self, sent: float) -> None:
    """Takes back ``sent`` bytes per replica (mean over replicas) counted by :meth:`step` that
    were not sent (an elastic run's lost replicas, known once their sync settles)."""
    self.total_bytes -= sent
    self._since_row -= sent

  def fetch_losses(self) -> np.ndarray:
    """The training losses [steps since the last row, M] (one host sync)."""
    losses, self._pending = self._gather(self._pending), []
    return losses

  def fetch_aux(self) -> float | None:
    """The mean auxiliary loss term of the steps since the last row (None for a dense model)."""
    if not self._pending_aux:
      return None
    aux, self._pending_aux = self._gather(self._pending_aux), []
    return float(np.mean(aux[~np.isnan(aux)]))  # an elastic run's lost replicas: NaN, left out

  def row(self, t: int, losses: np.ndarray, eval_loss: float | None, wall: float,
          aux_loss: float | None = None) -> dict:
    """Adds (and writes) the row of step ``t``; ``losses`` [M] are the means since the last row,
    ``aux_loss`` (MoE runs only: the rows then have an ``aux_loss`` column) the auxiliary term's."""
    row = _row(t, losses, eval_loss, t * self.tokens_per_step, self._since_row, self.total_bytes, wall)
    if aux_loss is not None:
      row["aux_loss"] = aux_loss
    if self.drops:
      row["participants"], self._syncs = self._syncs, []
    self.rows.append(row)
    self._since_row = 0.0
    if self._file is not None:
      self._write(json.dumps(row, allow_nan=False) + "\n")  # strict JSON
    return row

  def _write(self, line: str) -> None:
    """Appends a line to ``metrics.jsonl``; a file removed or a disk full is a one-line
    :class:`RunFileError` (rows written to a removed file would be lost without a word)."""
    if os.fstat(self._file.fileno()).st_nlink == 0 or not os.path.isfile(self.path):
      out = os.path.dirname(self.path)
      raise RunFileError(f"`out` {out} was removed during the run" if not os.path.isdir(out) else
                         f"{self.path} was removed or replaced during the run")
    try:
      self._file.write(line)
      self._file.flush()
    except OSError as e:
      self._failed = True  # what is left in the file's buffer cannot be written either
      why = full_disk_message(os.path.dirname(self.path)) if disk_full(e) else one_line(e)
      raise RunFileError(f"{self.path} could not be written: {why}") from None

  def checkpoint_item(self) -> dict:
    """What a checkpoint keeps of the log, so that a resumed run continues it exactly."""
    return {"rows": self.rows, "total_bytes_sent": self.total_bytes,
            "peak_bytes_per_step": self.peak_bytes}

  def close(self) -> None:
    if self._file is None:
      return
    try:
      self._file.close()
    except OSError:
      if not self._failed:
        raise


def _row(t, losses, eval_loss, tokens, step_bytes, total_bytes, wall) -> dict:
  return {
      "step": t,
      # an elastic run's lost replicas have no losses (NaN): left out of the mean, null in the list
      "train_loss": None if losses is None else float(np.mean(losses[~np.isnan(losses)])),
      "replica_loss": None if losses is None else [None if np.isnan(x) else float(x) for x in losses],
      "eval_loss": eval_loss,
      "tokens": tokens,
      "bytes_sent": step_bytes,  # per replica (mean over replicas), since the previous row
      "total_bytes_sent": total_bytes,  # per replica (mean over replicas), since the start
      "wall_time_s": wall,
  }
