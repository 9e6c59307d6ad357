"""Disk space: what a run will write under ``out``, checked before its first step.

A run writes its checkpoints (``keep_checkpoints`` of them, one more while the newest is
saved), its final params and ``metrics.jsonl``. :func:`run_bytes` adds them up from the
state's own arrays (their uncompressed bytes, plus what Orbax writes beside each array and
each checkpoint); :func:`check_space` refuses, in one line, a run whose disk has less free
space than that, before any step is taken. A disk that fills up during the run (another
program writing to it) is reported when a save fails (:mod:`diloco_core.store.checkpoint`).

Examples:
  >>> run_bytes(state_bytes=1000, state_leaves=10, params_bytes=200, params_leaves=2,
  ...           saves=5, keep=3, rows=10, replicas=2)
  197000
"""

from __future__ import annotations

import os
import shutil

import jax
import numpy as np

#: Bytes Orbax writes beside the arrays: per array (its metadata) and per checkpoint directory.
#: Measured on ``tiny``: a checkpoint of 64 arrays holds 73.9 kB besides them, the final params
#: (12 arrays) 32.8 kB; these constants give 100.8 kB and 38.4 kB. The arrays themselves are
#: counted uncompressed (Orbax compresses them: 8 replicas' state of 647 kB took 523 kB).
PER_ARRAY, PER_CHECKPOINT = 1_200, 24_000
#: Bytes of one ``metrics.jsonl`` row: a fixed part and one loss per replica (rounded up). Every
#: checkpoint's meta holds the rows so far too.
ROW_BYTES, ROW_BYTES_PER_REPLICA = 400, 24


def tree_bytes(tree) -> tuple[int, int]:
  """The uncompressed bytes and the number of arrays of a pytree (global shapes).

  Examples:
    >>> tree_bytes({"w": np.zeros((2, 3), np.float32), "b": np.zeros(3, np.float32)})
    (36, 2)
  """
  leaves = jax.tree.leaves(tree)
  return sum(int(np.prod(x.shape)) * np.dtype(x.dtype).itemsize for x in leaves), len(leaves)


def run_bytes(*, state_bytes: int, state_leaves: int, params_bytes: int, params_leaves: int,
              saves: int, keep: int, rows: int, replicas: int) -> int:
  r"""The most bytes a run has under ``out`` at once (its peak, at the end).

  .. math:: \min(\text{saves}, \text{keep} + 1)\,(C + R) + P + R,
     \quad C = \text{state} + a\,n_\text{state} + c,\; P = \text{params} + a\,n_\text{params} + c,
     \; R = \text{rows}\,(r + r_M M)

  with :data:`PER_ARRAY` :math:`a`, :data:`PER_CHECKPOINT` :math:`c`, :data:`ROW_BYTES`
  :math:`r` and :data:`ROW_BYTES_PER_REPLICA` :math:`r_M`.

  Args:
    state_bytes, state_leaves: a checkpoint's arrays (:func:`tree_bytes` of the saved state).
    params_bytes, params_leaves: the final params' arrays.
    saves: checkpoints the run saves; keep: how many it keeps.
    rows: ``metrics.jsonl`` rows; replicas: M (one loss per replica in each row).
  """
  metrics = rows * (ROW_BYTES + ROW_BYTES_PER_REPLICA * replicas)
  checkpoint = state_bytes + PER_ARRAY * state_leaves + PER_CHECKPOINT + metrics
  final = params_bytes + PER_ARRAY * params_leaves + PER_CHECKPOINT
  return min(saves, keep + 1) * checkpoint + final + metrics


def free_bytes(path: str) -> int:
  """Free bytes on the disk that holds ``path`` (or its nearest existing parent)."""
  path = os.path.abspath(path)
  while not os.path.exists(path):
    path = os.path.dirname(path)
  return shutil.disk_usage(path).free


def check_space(out: str, need: int, detail: str) -> None:
  """Raises a one-line ``OSError`` when the disk of ``out`` has less than ``need`` bytes free.

  Args:
    out: the run directory; need: bytes the run will write; detail: what they are (for the message).

  Examples:
    >>> check_space("/", 0, "nothing")  # always fits
  """
  free = free_bytes(out)
  if free < need:
    raise OSError(f"the disk of `out` {out} has {_size(free)} free, but this run writes about {_size(need)}"
                  f" ({detail}); free space there or choose another `out` (fewer `keep_checkpoints` or a"
                  " larger `checkpoint_every` write less).")


def _size(n: float) -> str:
  """Bytes for people.

  Examples:
    >>> _size(1_500_000), _size(900), _size(2.5e9)
    ('1.5 MB', '900 B', '2.5 GB')
  """
  for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
    if n >= scale:
      return f"{n / scale:.3g} {unit}"
  return f"{int(n)} B"


def check_run_space(cfg, state, params, first: int, on_disk: int = 0) -> None:
  """:func:`check_space` for a run: ``cfg`` (a :class:`~diloco_core.run.config.TrainConfig` with
  ``out``), its state as a checkpoint saves it, its params, the first step it takes, and the
  checkpoints a resumed run finds (on the disk already; its new saves replace them)."""
  steps = range(first, cfg.steps + 1)
  every = cfg.checkpoint_every
  saves = sum(1 for t in steps if t % every == 0 or t == cfg.steps) if every else 0
  if on_disk:  # the kept ones are there already; a new save replaces the oldest
    saves = max(min(saves + on_disk, cfg.keep_checkpoints + 1) - on_disk, min(saves, 1))
  rows = 1 + sum(1 for t in steps if t % cfg.log_every == 0 or t % cfg.eval_every == 0 or t == cfg.steps)
  (sb, sn), (pb, pn) = tree_bytes(state), tree_bytes(params)
  need = run_bytes(state_bytes=sb, state_leaves=sn, params_bytes=pb, params_leaves=pn, saves=saves,
                   keep=cfg.keep_checkpoints, rows=rows, replicas=cfg.algo.replicas)
  check_space(cfg.out, need, f"{min(saves, cfg.keep_checkpoints + 1)} checkpoint(s) of about"
              f" {_size(sb)}, final params of {_size(pb)}, {rows} metrics rows")


def disk_full(error: BaseException | str) -> bool:
  """Whether an error (Python's, or Orbax / TensorStore's text) says the disk is full.

  Examples:
    >>> disk_full(OSError(28, "No space left on device"))
    True
    >>> disk_full("RESOURCE_EXHAUSTED: Failed writing ...: No space left on device [os_error_code='28']")
    True
    >>> disk_full(PermissionError(13, "Permission denied"))
    False
  """
  if isinstance(error, OSError) and error.errno == 28:
    return True
  return "No space left on device" in str(error)


def full_disk_message(path: str) -> str:
  """How a write that found the disk full is reported: where, and how much is free."""
  return f"no space left on the disk of {path} ({_size(free_bytes(path))} free)"
