"""Writing a checkpoint or the final params from a process other than 0 of a multi-process run.

An elastic run whose process 0 was lost (possible with a coordination service of its own,
:mod:`diloco_core.launch.coordination_service`) goes on with another writer
(:meth:`~diloco_core.runtime.elastic_runtime.ElasticRuntime.writes_files`). Orbax cannot write from
there: in a multi-process run it writes host (numpy) arrays from process 0 only, and refuses
arrays held by one process. So that writer hands the arrays (already gathered on its host) to
a short-lived single-process Python (``python -m diloco_core.solo_write``), which writes them
with the same code as process 0 runs (:class:`~diloco_core.store.checkpoint.CheckpointWriter`,
:func:`~diloco_core.store.params_io.export_params`): the files are the same, and every process reads
them at a resume as usual. It costs a Python start (a few seconds) per write.

Examples:
  >>> import tempfile, numpy as np
  >>> out = tempfile.mkdtemp()
  >>> path = export_params({"w": np.arange(3.0)}, out + "/final_params")
  >>> from diloco_core.store.params_io import load_params
  >>> load_params(path)["w"].tolist()
  [0.0, 1.0, 2.0]
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import jax

from diloco_core.devices.mesh import host_copy
from diloco_core.devices.processes import ELSEWHERE_ENV

#: The environment variables of a multi-process run that the single-process writer must not see.
RUN_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID", ELSEWHERE_ENV)


def run(kind: str, payload) -> str:
  """Writes ``payload`` in a single-process Python; returns the path written.

  Args:
    kind: ``"checkpoint"`` (payload ``(out, keep, step, state, meta)``) or ``"params"``
      (payload ``(params, path)``); the arrays on the host.

  Raises:
    OSError: the writer's one-line error (it says what is left and how to go on).
  """
  env = {k: v for k, v in os.environ.items() if k not in RUN_ENV}
  env["JAX_PLATFORMS"] = "cpu"  # host arrays only: no accelerator to claim
  r = subprocess.run([sys.executable, "-m", "diloco_core.store.solo_write", kind], input=pickle.dumps(payload),
                     capture_output=True, env=env)
  lines = r.stdout.decode(errors="replace").strip().splitlines()
  if r.returncode != 0 or not lines:
    said = r.stderr.decode(errors="replace").strip().splitlines()
    raise OSError(said[-1] if said else f"the {kind} writer exited with {r.returncode}")
  return lines[-1]


class CheckpointWriter:
  """:class:`diloco_core.store.checkpoint.CheckpointWriter`'s ``save`` / ``close``, each save in a
  single-process Python (for a writer other than process 0, see the module docstring)."""

  def __init__(self, out: str, keep: int):
    self.out, self.keep = out, keep

  def save(self, step: int, state, meta: dict) -> str:
    """Writes checkpoint ``step`` (host arrays); returns its path."""
    return run("checkpoint", (self.out, self.keep, int(step), jax.tree.map(host_copy, state), meta))

  def close(self) -> None:
    """Nothing stays open between saves."""


def export_params(params, path: str) -> str:
  """:func:`diloco_core.store.params_io.export_params` of the host ``params``, in a single-process Python."""
  return run("params", (jax.tree.map(host_copy, params), path))


def export_final_params(params, path: str, alone: bool) -> str:
  """The run's final params written by the process that writes its files: Orbax's export
  (:func:`~diloco_core.store.params_io.export_params`; every process of a lock-step run takes
  part), with ``alone`` (an elastic run) by this process by itself, and from a process other than
  0 through :func:`export_params` (Orbax writes host arrays from process 0 only).

  Args:
    params: the final params.
    path: the directory to write.
    alone: an elastic run: the writer writes by itself, the others not taking part.

  Returns:
    The absolute path written.
  """
  if alone and jax.process_index() != 0:
    return export_params(params, path)
  from diloco_core.store import params_io
  return params_io.export_params(params, path, alone=alone)


def _write(kind: str, payload) -> str:
  from diloco_core.store import checkpoint
  from diloco_core.store import params_io
  if kind == "params":
    params, path = payload
    return params_io.export_params(params, path)
  out, keep, step, state, meta = payload
  writer = checkpoint.CheckpointWriter(out, keep)
  try:
    return writer.save(step, state, meta)
  finally:
    writer.close()


def main(argv=None) -> int:
  kind = (sys.argv[1:] if argv is None else argv)[0]
  try:
    print(_write(kind, pickle.load(sys.stdin.buffer)), flush=True)
  except OSError as e:
    print(f"{e}", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
