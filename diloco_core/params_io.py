"""Plain params checkpoints: export the params of a run, check and load them back.

``<out>/final_params`` is one (written at the end of every run with ``out``); ``init_from``
starts a run from one. :func:`check_params_dir` looks at the files only, so a bad path is
refused before the model is built; :func:`load_params` then checks shapes and dtypes.
"""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp  # noqa: F401 (doctests)
import orbax.checkpoint as ocp

from diloco_core.checkpoint import CHECKPOINTS, _quiet_orbax_failed_reads, _reason, leaf_table


def export_params(params, path: str) -> str:
  """Writes ``params`` (any pytree of arrays) as a plain Orbax checkpoint at ``path``.

  The directory is replaced atomically if it exists. Load it back with
  :func:`load_params` (or ``orbax.checkpoint.StandardCheckpointer().restore(path)``).

  Args:
    params: the params pytree (e.g. ``TrainResult.params``, the global params).
    path: the directory to write.

  Returns:
    The absolute path written.

  Examples:
    >>> import tempfile
    >>> path = export_params({"w": jnp.arange(3.0)}, tempfile.mkdtemp() + "/final_params")
    >>> load_params(path)["w"].tolist()
    [0.0, 1.0, 2.0]
  """
  path = os.path.abspath(path)
  with ocp.StandardCheckpointer() as ckptr:
    ckptr.save(path, params, force=True)
  return path


def check_params_dir(path: str) -> str:
  """Raises a one-line ``ValueError`` unless ``path`` looks like a params checkpoint
  (:func:`export_params`); returns it as an absolute path. Reads no array.

  Examples:
    >>> check_params_dir("/nonexistent/final_params")
    Traceback (most recent call last):
    ...
    ValueError: params checkpoint '/nonexistent/final_params' does not exist; pass the final_params/ directory of a finished run.
  """
  path = os.path.abspath(path)
  if not os.path.exists(path):
    raise ValueError(f"params checkpoint {path!r} does not exist; pass the final_params/ directory"
                     " of a finished run.")
  if not os.path.isdir(path):
    raise ValueError(f"params checkpoint {path!r} is a file, not a checkpoint directory; pass the"
                     " final_params/ directory of a finished run.")
  if os.path.isdir(os.path.join(path, "state")) or os.path.isdir(os.path.join(path, CHECKPOINTS)) or (
      os.path.basename(path) == CHECKPOINTS):
    raise ValueError(f"{path!r} is a training checkpoint (or run) directory, not a params checkpoint;"
                     " pass the run's final_params/ (or use `resume` to continue that run).")
  if not os.path.exists(os.path.join(path, "_METADATA")):
    raise ValueError(f"{path!r} is not a params checkpoint (no Orbax _METADATA file; it may be"
                     " truncated); pass a final_params/ directory written by a run.")
  return path


def load_params(path: str, like=None):
  """Loads a params checkpoint written by :func:`export_params` (e.g. ``<out>/final_params``).

  One line for evaluation: ``params = diloco_core.load_params("runs/x/final_params")``.

  Args:
    path: the checkpoint directory.
    like: optional params pytree this must match (structure, shapes, dtypes); the result
      then has its structure and shardings. A mismatch is a one-line ``ValueError``.

  Returns:
    The params pytree (nested dicts of arrays).
  """
  path = check_params_dir(path)
  _quiet_orbax_failed_reads()
  damaged = lambda e: ValueError(f"params checkpoint {path!r} cannot be read ({_reason(e)}); it is"
                                 " damaged or incomplete.")
  with ocp.StandardCheckpointer() as ckptr:
    try:
      meta = ckptr.metadata(path).item_metadata
      if like is None:
        return ckptr.restore(path)
    except Exception as e:  # noqa: BLE001 - damaged files: one clear line
      raise damaged(e) from None
    saved = jax.tree_util.tree_flatten_with_path(meta.tree if hasattr(meta, "tree") else meta)[0]
    saved = {jax.tree_util.keystr(p): (list(m.shape), str(m.dtype)) for p, m in saved}
    if not saved:
      raise damaged(ValueError("no readable array metadata"))
    for row in leaf_table(like):
      got = saved.pop(row["path"], None)
      if got is None:
        raise ValueError(f"params checkpoint {path!r} has no {row['path']} (this model needs"
                         f" {row['dtype']}{row['shape']}); it is from another model.")
      if got != (row["shape"], row["dtype"]):
        raise ValueError(f"params checkpoint {path!r} holds {row['path']} as {got[1]}{got[0]} but"
                         f" this model needs {row['dtype']}{row['shape']}; use the same model"
                         " options as the run that wrote it.")
    if saved:
      raise ValueError(f"params checkpoint {path!r} has {sorted(saved)[0]}, which this model does"
                       " not; it is from another model.")
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), like)
    try:
      return ckptr.restore(path, abstract)
    except Exception as e:  # noqa: BLE001
      raise damaged(e) from None
