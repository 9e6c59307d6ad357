"""Where a background run can go: its one-line refusals and its mesh (before anything compiles).

:func:`~diloco_core.runtime.option_checks.check_background` (the options alone) is called by :meth:`TrainConfig.validate
<diloco_core.TrainConfig.validate>` for ``communication="background"``, and
:func:`check_background_processes` (the processes and their devices) by
:func:`~diloco_core.run.preflight.preflight`; :func:`background_mesh` lays the replicas out over
the processes (:mod:`diloco_core.runtime.background`).
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

from diloco_core.devices.mesh import AXES, parse_mesh
from diloco_core.runtime.option_checks import check_background  # noqa: F401  (re-exported)


def check_background_processes(cfg, processes: int | None = None) -> None:
  """One-line errors for a background run the processes cannot hold (before anything compiles):
  M % N != 0, a mesh not split over the processes or wanting more devices than a process has.

  Args:
    cfg: a :class:`~diloco_core.TrainConfig` with ``communication="background"`` whose options
      :func:`~diloco_core.runtime.option_checks.check_background` accepted.
    processes: the process count N (default: JAX's). Given, only the counts are checked (the
      launcher, before it starts any process); the devices are checked by each process.

  Returns:
    None.

  Examples:
    >>> from diloco_core import TrainConfig
    >>> check_background_processes(TrainConfig(communication="background", mesh="diloco=3,data=1"))
    Traceback (most recent call last):
    ...
    ValueError: `mesh` 'diloco=3,data=1': with `communication` background the diloco axis (3) must be divisible by the process count (1) and divide replicas (M=2); e.g. `mesh`='diloco=1,data=1'.
    >>> check_background_processes(TrainConfig(communication="background"), processes=3)
    Traceback (most recent call last):
    ...
    ValueError: `communication` background splits the replicas over the processes: replicas (M=2) must be divisible by the process count (3); choose M among [3, 6, 9, 12].
  """
  n, M = (jax.process_count() if processes is None else processes), cfg.algo.replicas
  if M % n:
    raise ValueError(f"`communication` background splits the replicas over the processes: replicas"
                     f" (M={M}) must be divisible by the process count ({n}); choose M among"
                     f" {[n * i for i in range(1, 5)]}.")
  if processes is None:
    background_mesh(cfg.mesh, M)
  else:
    _mesh_shape(cfg.mesh, M, n)


def _mesh_shape(spec: str | None, replicas: int, n: int) -> tuple[int, int]:
  """The ``(diloco, data)`` shape of a background run's mesh over ``n`` processes, checked."""
  shape = parse_mesh(spec) or {"diloco": n, "data": 1}
  d, b = shape["diloco"], shape["data"]
  if d % n or replicas % d:
    raise ValueError(f"`mesh` {spec!r}: with `communication` background the diloco axis ({d}) must be"
                     f" divisible by the process count ({n}) and divide replicas (M={replicas});"
                     f" e.g. `mesh`='diloco={n},data=1'.")
  return d, b


def background_mesh(spec: str | None, replicas: int) -> Mesh:
  """The run's mesh: every process's devices, each process's block of rows contiguous along
  ``diloco`` (process r holds replicas ``[r M / N, (r + 1) M / N)``); ``mesh`` describes it
  (None: one device per process)."""
  n = jax.process_count()
  d, b = _mesh_shape(spec, replicas, n)
  per_process = (d // n) * b
  by_process = [sorted((x for x in jax.devices() if x.process_index == r), key=lambda x: x.id)
                for r in range(n)]
  if any(len(devs) < per_process for devs in by_process):
    raise ValueError(f"`mesh` {spec!r} needs {per_process} devices per process, but a process has"
                     f" {min(len(devs) for devs in by_process)}.")
  rows = [np.array(devs[:per_process]).reshape(d // n, b) for devs in by_process]
  return Mesh(np.concatenate(rows), AXES, axis_types=(AxisType.Auto, AxisType.Auto))
