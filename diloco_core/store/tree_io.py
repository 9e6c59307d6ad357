"""What the Orbax files of a pytree share: the leaf table, bit checksums, one-line read errors.

Checkpoints (:mod:`diloco_core.store.checkpoint`) and exported params (:mod:`diloco_core.store.params_io`)
both record each leaf's path, shape and dtype (:func:`leaf_table`) and a checksum of its bits
(:func:`fingerprint`), and report a failed read in one line (:func:`one_line`), with Orbax's
leftover asyncio noise silenced (:func:`quiet_orbax_failures`).
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import traceback
import warnings

import jax
import jax.numpy as jnp
import numpy as np


def leaf_table(tree) -> list[dict]:
  """Path, shape and dtype of every leaf of ``tree`` (what a checkpoint must match).

  Examples:
    >>> leaf_table({"w": jnp.zeros((2, 3)), "b": jnp.zeros((), jnp.int32)})
    [{'path': "['b']", 'shape': [], 'dtype': 'int32'}, {'path': "['w']", 'shape': [2, 3], 'dtype': 'float32'}]
  """
  flat, _ = jax.tree_util.tree_flatten_with_path(tree)
  return [{"path": jax.tree_util.keystr(p), "shape": [int(s) for s in np.shape(x)],
           "dtype": str(x.dtype if hasattr(x, "dtype") else np.asarray(x).dtype)}
          for p, x in flat]


def _bits(x):
  x = jnp.asarray(x)
  if x.dtype == jnp.bool_:
    return x.astype(jnp.uint32)
  unsigned = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32}.get(x.dtype.itemsize)
  if unsigned is None:  # 8-byte leaves (x64 mode): fold both halves
    return jax.lax.bitcast_convert_type(x, jnp.uint32).astype(jnp.uint32)
  return jax.lax.bitcast_convert_type(x, unsigned).astype(jnp.uint32)


@jax.jit
def _checksums(leaves):
  # Sum of the bit patterns modulo 2**32: exact and independent of the reduction order.
  return jnp.stack([jnp.sum(_bits(x), dtype=jnp.uint32) for x in leaves]) if leaves else jnp.zeros(0, jnp.uint32)


def fingerprint(tree) -> list[int]:
  """One uint32 checksum per leaf (sum of the bit patterns mod 2**32), computed on device.

  Examples:
    >>> fingerprint({"w": jnp.array([1.0, -1.0])})  # 0x3f800000 + 0xbf800000 mod 2**32
    [4278190080]
  """
  from diloco_core.devices.mesh import fetch
  return [int(v) for v in fetch(_checksums(jax.tree.leaves(tree)))]


def quiet_orbax_failures() -> None:
  """After a failed Orbax read or write (a damaged checkpoint, a full disk), its leftover
  callbacks can hit a closed event loop, and Python prints "RuntimeError: Event loop is
  closed" with a traceback. Such failures are reported in one line by the caller, so those
  errors (and only those) are dropped. Installed before reading or writing, because the
  callbacks may fire before the failure surfaces."""
  closed = lambda e: isinstance(e, RuntimeError) and "Event loop is closed" in str(e)
  for owner, name in ((sys, "unraisablehook"), (threading, "excepthook"), (sys, "excepthook")):
    previous = getattr(owner, name)
    if getattr(previous, "_diloco_quiet", False):
      continue

    def hook(*args, previous=previous):  # (info) with .exc_value, or sys.excepthook's (type, value, tb)
      if not closed(args[1] if len(args) == 3 else args[0].exc_value):
        previous(*args)

    hook._diloco_quiet = True
    setattr(owner, name, hook)
  # Orbax's concurrent reads of a damaged checkpoint: the tasks whose failure is not the one
  # raised end up in asyncio's "Task exception was never retrieved" log, with a traceback.
  # Its writes cut short by a full disk leave coroutines that Python reports at exit.
  warnings.filterwarnings("ignore", message=r"coroutine '[^']*serializ[^']*' was never awaited",
                          category=RuntimeWarning)
  asyncio_log = logging.getLogger("asyncio")
  if not any(isinstance(f, OrbaxReadFailures) for f in asyncio_log.filters):
    asyncio_log.addFilter(OrbaxReadFailures())


class OrbaxReadFailures(logging.Filter):
  """Drops asyncio log records of exceptions raised inside Orbax (reported by the caller)."""

  def filter(self, record: logging.LogRecord) -> bool:
    tb = record.exc_info[2] if record.exc_info else None
    return not (tb is not None and any("orbax" in frame.filename for frame in traceback.extract_tb(tb)))


class OrbaxLogs(logging.Filter):
  """Within the block, Orbax's own warnings and errors (``WARNING:absl:...``, ``ERROR:absl:...``
  with a traceback) are dropped: the caller checks what they are about (a failed write, a
  checkpoint removed under it) and reports it in one line (a context manager)."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.levelno >= logging.WARNING and "orbax" in record.pathname)

  def __enter__(self) -> "OrbaxLogs":
    logging.getLogger("absl").addFilter(self)
    return self

  def __exit__(self, *exc) -> None:
    logging.getLogger("absl").removeFilter(self)


def one_line(e: Exception) -> str:
  """One line of an exception, without Python object reprs (``<... at 0x...>``, pybind11).

  Examples:
    >>> one_line(ValueError("bad <bound method pybind11_detail.x of <a.B object at 0x7f>> read"))
    'ValueError: bad read'
  """
  text = str(e)
  while True:  # innermost first, so nested reprs go too
    shorter = re.sub(r"\s*<[^<>]*(?: at 0x[0-9a-fA-F]+|pybind11[^<>]*|bound method[^<>]*)>", "", text)
    if shorter == text:
      break
    text = shorter
  text = " ".join(text.split())
  text = text if len(text) <= 160 else text[:159] + "…"
  return f"{type(e).__name__}: {text}" if text else type(e).__name__
