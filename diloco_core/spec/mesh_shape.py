"""A device mesh's shape as the ``mesh`` option writes it: its axes and their sizes, without JAX.

The trainer's mesh has two axes (:data:`AXES`): ``diloco``, over which the M replicas are
placed, and ``data``, over which each replica's batch is split. ``--mesh diloco=2,data=4`` asks
for 2 × 4 devices; :func:`parse_mesh` reads it here (the run's options are checked without
asking a device), and :mod:`diloco_core.devices.mesh` builds the mesh and checks it against
the devices.

Examples:
  >>> parse_mesh("data=2")
  {'diloco': 1, 'data': 2}
"""

from __future__ import annotations

#: The mesh's axes: the replicas' (``diloco``) and the batch's within a replica (``data``).
AXES = ("diloco", "data")


def parse_mesh(spec: str | None) -> dict[str, int] | None:
  """Parses ``"diloco=2,data=4"`` into ``{"diloco": 2, "data": 4}`` (None stays None).

  Examples:
    >>> parse_mesh("diloco=2,data=4")
    {'diloco': 2, 'data': 4}
    >>> parse_mesh("diloco=2,model=4")
    Traceback (most recent call last):
    ...
    ValueError: mesh axis 'model' is not one of ('diloco', 'data'); write e.g. `mesh`='diloco=2,data=4'.
  """
  if spec is None:
    return None
  out: dict[str, int] = {}
  for part in spec.split(","):
    name, sep, value = part.strip().partition("=")
    if not sep:
      raise ValueError(f"mesh entry {part!r} must look like name=size; write e.g. `mesh`='diloco=2,data=4'.")
    if name not in AXES:
      raise ValueError(f"mesh axis {name!r} is not one of {AXES}; write e.g. `mesh`='diloco=2,data=4'.")
    if name in out:
      raise ValueError(f"mesh axis {name!r} is given twice in {spec!r}.")
    try:
      size = int(value)
    except ValueError:
      size = 0
    if size < 1 or str(size) != value.strip():
      raise ValueError(f"mesh axis {name} needs a positive integer size, got {value!r}.")
    out[name] = size
  return {axis: out.get(axis, 1) for axis in AXES}
