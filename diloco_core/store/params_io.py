"""Plain params checkpoints: export the params of a run, check and load them back.

``<out>/final_params`` is one (written at the end of every run with ``out``); ``init_from``
starts a run from one. :func:`check_params_dir` looks at the files only, so a bad path is
refused before the model is built; :func:`load_params` then checks shapes and dtypes, and
the contents: :func:`export_params` writes beside the Orbax files a manifest
(``params_manifest.json``: every file it wrote, every leaf's path, shape, dtype and checksum,
:func:`~diloco_core.store.tree_io.fingerprint`), and a loaded leaf whose checksum differs is a
one-line error. The manifest also tells which files of the directory an export wrote:
:func:`remove_exported` removes those and nothing else.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import warnings

import jax
import jax.numpy as jnp  # noqa: F401 (doctests)
import numpy as np
import orbax.checkpoint as ocp

from diloco_core.store.checkpoint import CHECKPOINTS
from diloco_core.store.disk_space import disk_full, full_disk_message
from diloco_core.store.tree_io import OrbaxLogs, fingerprint, leaf_table, one_line, quiet_orbax_failures

#: The manifest an export writes last (its presence marks a complete export).
MANIFEST = "params_manifest.json"
MANIFEST_FORMAT = 1


def _files_under(path: str) -> list[str]:
  return sorted(os.path.relpath(os.path.join(root, name), path)
                for root, _, names in os.walk(path) for name in names)


def remove_exported(path: str) -> list[str]:
  """Removes what :func:`export_params` wrote at ``path`` (the files its manifest lists, then
  the directories left empty) and returns what is left: files no export wrote. A directory
  without a manifest but with Orbax's ``_METADATA`` (an export of an older version) is removed
  whole; anything else is left alone and returned.

  Examples:
    >>> import tempfile
    >>> path = export_params({"w": jnp.arange(3.0)}, tempfile.mkdtemp() + "/final_params")
    >>> _ = open(os.path.join(path, "mine.txt"), "w").write("notes")
    >>> remove_exported(path) == [os.path.join(path, "mine.txt")], sorted(os.listdir(path))
    (True, ['mine.txt'])
  """
  if not os.path.isdir(path):
    return [path] if os.path.exists(path) else []
  manifest = _read_manifest(path)
  if manifest is None:
    if os.path.isfile(os.path.join(path, "_METADATA")):
      shutil.rmtree(path, ignore_errors=True)
      return []
    return [os.path.join(path, f) for f in _files_under(path)]
  for rel in manifest.get("files", []) + [MANIFEST]:
    target = os.path.normpath(os.path.join(path, rel))
    if target.startswith(path + os.sep) and os.path.isfile(target):
      os.remove(target)
  for root, dirs, names in sorted(os.walk(path, topdown=False), key=lambda w: -len(w[0])):
    if root != path and not os.listdir(root):
      os.rmdir(root)
  left = [os.path.join(path, f) for f in _files_under(path)]
  if not left and not os.listdir(path):
    os.rmdir(path)
  return left


def _read_manifest(path: str) -> dict | None:
  try:
    with open(os.path.join(path, MANIFEST)) as f:
      manifest = json.load(f)
  except (OSError, ValueError):
    return None
  return manifest if isinstance(manifest, dict) and manifest.get("format") == MANIFEST_FORMAT else None


def export_params(params, path: str, alone: bool = False) -> str:
  """Writes ``params`` (any pytree of arrays) as a plain Orbax checkpoint at ``path``.

  The checkpoint is written to a temporary sibling and then renamed to ``path`` (atomic);
  when ``path`` exists, what an earlier export wrote there is replaced and any other file in
  it is kept (moved in beside the new files). Load it back with :func:`load_params` (or
  ``orbax.checkpoint.StandardCheckpointer().restore(path)``).

  Args:
    params: the params pytree (e.g. ``TrainResult.params``, the global params).
    path: the directory to write.
    alone: this process writes a host copy by itself, the others not taking part (an elastic
      run, where a lost process would never reach Orbax's barriers).

  Returns:
    The absolute path written.

  Examples:
    >>> import tempfile
    >>> path = export_params({"w": jnp.arange(3.0)}, tempfile.mkdtemp() + "/final_params")
    >>> load_params(path)["w"].tolist()
    [0.0, 1.0, 2.0]
  """
  path = os.path.abspath(path)
  tmp = path + ".export-tmp"
  quiet_orbax_failures()
  options = {}
  if alone and jax.process_count() > 1:
    me = jax.process_index()
    options["multiprocessing_options"] = ocp.options.MultiprocessingOptions(primary_host=me, active_processes={me})
    params = jax.tree.map(lambda x: np.asarray(x.addressable_shards[0].data) if isinstance(x, jax.Array) else x, params)
  try:
    with OrbaxLogs(), ocp.StandardCheckpointer(**options) as ckptr:  # every process takes part; process 0 writes
      ckptr.save(tmp, params, force=True)
  except Exception as e:  # noqa: BLE001 - Orbax / TensorStore: one line, and no half-written copy left
    for name in os.listdir(os.path.dirname(path)) if os.path.isdir(os.path.dirname(path)) else []:
      if name.startswith(os.path.basename(tmp)):
        shutil.rmtree(os.path.join(os.path.dirname(path), name), ignore_errors=True)
    why = full_disk_message(os.path.dirname(path)) if disk_full(e) else one_line(e)
    raise OSError(f"the params could not be written to {path} ({why})") from None
  checksums = fingerprint(params)  # a computation on every process's arrays
  if jax.process_index() != 0 and not alone:
    return path
  files = _files_under(tmp)
  manifest = {"format": MANIFEST_FORMAT, "files": files, "leaves": leaf_table(params),
              "checksums": checksums}
  with open(os.path.join(tmp, MANIFEST), "w") as f:
    json.dump(manifest, f, indent=1)
  if os.path.isdir(path):
    remove_exported(path)
  if not os.path.exists(path):
    os.rename(tmp, path)
    return path
  for name in os.listdir(tmp):  # `path` holds files no export wrote: keep them beside the new ones
    os.replace(os.path.join(tmp, name), os.path.join(path, name))
  os.rmdir(tmp)
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


@contextlib.contextmanager
def _quiet_absl():
  """Orbax logs ``WARNING:absl`` lines while it fails to read a damaged checkpoint; the caller
  reports the failure in one line, so those warnings are muted for the read."""
  log = logging.getLogger("absl")
  level = log.level
  log.setLevel(logging.ERROR)
  try:
    yield
  finally:
    log.setLevel(level)


def load_params(path: str, like=None):
  """Loads a params checkpoint written by :func:`export_params` (e.g. ``<out>/final_params``).

  One line for evaluation: ``params = diloco_core.load_params("runs/x/final_params")``.

  Args:
    path: the checkpoint directory.
    like: optional params pytree this must match (structure, shapes, dtypes); the result
      then has its structure and shardings. A mismatch is a one-line ``ValueError``.

  Returns:
    The params pytree (nested dicts of arrays); without ``like``, on this process's first
    device, also when several processes wrote the checkpoint (``--communication background``).
  """
  path = check_params_dir(path)
  quiet_orbax_failures()
  damaged = lambda e: ValueError(f"params checkpoint {path!r} cannot be read ({one_line(e)}); it is"
                                 " damaged or incomplete.")
  manifest = _read_manifest(path)
  if manifest is None:
    warnings.warn(f"params checkpoint {path!r} has no {MANIFEST} (not written by export_params of this"
                  " version): its contents cannot be checked.", stacklevel=2)
  with ocp.StandardCheckpointer() as ckptr, _quiet_absl():
    try:
      meta = ckptr.metadata(path).item_metadata
      tree = meta.tree if hasattr(meta, "tree") else meta
      # Onto this process's first device, whatever the topology that wrote it (several processes)
      here = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
      whole = (ckptr.restore(path, jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=here), tree))
               if like is None else None)
    except Exception as e:  # noqa: BLE001 - damaged files: one clear line
      raise damaged(e) from None
    if like is None:
      return _verified(whole, manifest, path)
    saved = jax.tree_util.tree_flatten_with_path(tree)[0]
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
      restored = ckptr.restore(path, abstract)
    except Exception as e:  # noqa: BLE001
      raise damaged(e) from None
  return _verified(restored, manifest, path)


def _verified(params, manifest: dict | None, path: str):
  """``params`` if every leaf's checksum is the manifest's; else a one-line ``ValueError``."""
  if manifest is None:
    return params
  saved = dict(zip((row["path"] for row in manifest.get("leaves", [])), manifest.get("checksums", [])))
  for row, got in zip(leaf_table(params), fingerprint(params)):
    if saved.get(row["path"]) != got:
      raise ValueError(f"params checkpoint {path!r} is damaged: {row['path']} does not match its"
                       f" checksum in {MANIFEST}; export the params again (or use another copy).")
  return params
