"""Device meshes for DiLoCo: a ``diloco`` axis for the replicas and a ``data`` axis inside each.

The DiLoCo core is written with drjax over a placement named ``diloco``. Under
``jax.set_mesh(mesh)`` with a mesh axis of that name, drjax shards every placed value
(replica params, inner optimizer states, per-replica batches) over that axis, and its
``reduce_mean`` becomes the cross-replica all-reduce, the only collective over ``diloco``.
Within a replica, the batch is sharded over ``data`` (plain data parallelism inside a
datacenter). The same code runs on 8 fake CPU devices, one TPU slice per replica, or
several hosts after :func:`~diloco_core.devices.processes.initialize_distributed`.
"""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from diloco_core.spec.mesh_shape import AXES, parse_mesh  # noqa: F401  (re-exported)


def check_mesh(shape: dict[str, int], *, replicas: int, batch_size: int,
               num_devices: int | None = None) -> None:
  """One-line errors when a mesh does not fit the devices, M or the per-replica batch."""
  n = jax.device_count() if num_devices is None else num_devices
  d, b = shape["diloco"], shape["data"]
  if d * b > n:
    raise ValueError(
        f"mesh diloco={d} x data={b} needs {d * b} devices, but {n} are available; choose sizes"
        f" whose product is at most {n} (e.g. `mesh`='diloco={_largest_divisor(n, replicas)},"
        f"data={n // _largest_divisor(n, replicas)}').")
  if replicas % d:
    raise ValueError(
        f"replicas (M={replicas}) must be divisible by the mesh's diloco axis ({d}); choose"
        f" diloco among {[x for x in range(1, replicas + 1) if replicas % x == 0]}.")
  if batch_size % b:
    raise ValueError(
        f"batch_size ({batch_size}) must be divisible by the mesh's data axis ({b}) so each"
        " device gets the same number of sequences.")


def check_process_mesh(shape: dict[str, int] | None, *, replicas: int, batch_size: int,
                       processes: int | None = None, num_devices: int | None = None) -> None:
  """One-line error when an in-step run over several processes would not use every device.

  Each process runs the same SPMD program over the global mesh; a mesh on fewer devices than
  there are (the default one-device mesh included) leaves a process without its part of it.

  Examples:
    >>> check_process_mesh(None, replicas=2, batch_size=4, processes=2, num_devices=2)
    Traceback (most recent call last):
    ...
    ValueError: an in-step run over 2 processes needs a `mesh` over all 2 devices of the processes (e.g. `mesh`='diloco=2,data=1'), or `communication` background.
    >>> check_process_mesh({"diloco": 2, "data": 1}, replicas=2, batch_size=4, processes=2, num_devices=2)
  """
  n = jax.device_count() if num_devices is None else num_devices
  processes = jax.process_count() if processes is None else processes
  if processes == 1 or (shape is not None and shape["diloco"] * shape["data"] == n):
    return
  fits = [d for d in range(n, 0, -1) if n % d == 0 and replicas % d == 0 and batch_size % (n // d) == 0]
  fix = (f"e.g. `mesh`='diloco={fits[0]},data={n // fits[0]}'" if fits else
         f"no mesh over {n} devices divides `replicas` ({replicas}) and `batch_size` ({batch_size}): change them")
  if shape is None:
    raise ValueError(f"an in-step run over {processes} processes needs a `mesh` over all {n} devices of"
                     f" the processes ({fix}), or `communication` background.")
  raise ValueError(f"`mesh` diloco={shape['diloco']} x data={shape['data']} uses {shape['diloco'] * shape['data']}"
                   f" of the {n} devices of the {processes} processes; an in-step run over several"
                   f" processes must use every device ({fix}).")


def _largest_divisor(n: int, m: int) -> int:
  return max(x for x in range(1, n + 1) if n % x == 0 and m % x == 0)


def make_mesh(shape: dict[str, int] | None = None) -> Mesh:
  """A mesh with axes ``("diloco", "data")`` (Auto sharding).

  Args:
    shape: axis sizes; the mesh takes the first diloco x data devices (all of them when the
      product equals the device count). None gives a one-device mesh (everything on the
      first device; drjax's map becomes a plain vmap).

  Returns:
    The mesh.

  Examples:
    >>> make_mesh({"diloco": 2, "data": 4}).shape
    OrderedDict([('diloco', 2), ('data', 4)])
    >>> make_mesh().size
    1
  """
  shape = shape or {"diloco": 1, "data": 1}
  d, b = shape["diloco"], shape["data"]
  if d * b == jax.device_count():
    return jax.make_mesh((d, b), AXES, axis_types=(AxisType.Auto, AxisType.Auto))
  devices = np.array(jax.devices()[:d * b]).reshape(d, b)
  return Mesh(devices, AXES, axis_types=(AxisType.Auto, AxisType.Auto))


class MeshPlacement:
  """Where an algorithm's state and batches live: the base of :class:`~diloco_core.algorithm.base.AlgorithmBase`
  and of the background runtime (:class:`~diloco_core.runtime.background.Background`).

  ``replica_fields`` names the state fields with a leading replica axis (sharded over
  ``diloco``); every other field is replicated.
  """

  replica_fields: tuple[str, ...] = ()
  mesh: Mesh

  def _place_state(self, state):
    # Always committed to the mesh (even a one-device one), so that the state returned by
    # the jitted step has the same shardings as the initial one: one compilation.
    return shard_state(state, self.mesh, self.replica_fields)

  def _jit_step(self, step_fn, state):
    """Jits ``step_fn(state, batch) -> (state, metrics)`` with the state's shardings pinned.

    Output shardings equal the input ones (donation reuses the buffers, and the next
    call hits the same compiled program); the per-replica losses stay on ``diloco``.
    """
    state_sh = jax.tree.map(lambda x: x.sharding, state)
    rep = replicated(self.mesh)
    per_replica = replica_sharding(self.mesh)  # also every value of ``loss_metrics``
    metrics_sh = {"loss": per_replica, "loss_metrics": per_replica, "sent": rep, "merged": rep}
    return jax.jit(step_fn, donate_argnums=0, out_shardings=(state_sh, metrics_sh))

  def place_batch(self, batch):
    """A host batch ``[M, b, ...]`` (pytree) as global arrays on the mesh."""
    return jax.tree.map(lambda x: shard_batch(x, self.mesh), batch)

  def place_replicated(self, x):
    """A host value copied to every device of the mesh."""
    return jax.tree.map(lambda v: global_array(v, replicated(self.mesh)), x)


def replica_sharding(mesh: Mesh) -> NamedSharding:
  """Leading axis (replicas) over ``diloco``; everything else replicated."""
  return NamedSharding(mesh, P("diloco"))


def batch_sharding(mesh: Mesh) -> NamedSharding:
  """A ``[M, b, T]`` batch: replicas over ``diloco``, sequences over ``data``."""
  return NamedSharding(mesh, P("diloco", "data"))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def local_replicas(mesh: Mesh, replicas: int) -> tuple[int, ...]:
  """The replicas whose batch rows live on this process's devices (all of them in one process).

  Examples:
    >>> local_replicas(make_mesh(), 3)
    (0, 1, 2)
  """
  index = batch_sharding(mesh).addressable_devices_indices_map((replicas, mesh.shape["data"]))
  return tuple(sorted({r for idx in index.values() for r in range(replicas)[idx[0]]}))


def global_array(x: Any, sharding: NamedSharding) -> jax.Array:
  """Builds a (possibly multi-process) global array from a host value every process holds."""
  if jax.process_count() == 1:
    return jax.device_put(x, sharding)
  x = np.asarray(x)
  return jax.make_array_from_callback(x.shape, sharding, lambda idx: x[idx])


def shard_state(state: Any, mesh: Mesh, replica_fields: tuple[str, ...]) -> Any:
  """Places a state pytree on ``mesh``: ``replica_fields`` over ``diloco``, the rest replicated.

  Works across processes: every process passes the same host values.
  """
  rs, rep = replica_sharding(mesh), replicated(mesh)
  changes = {}
  for field in state.__dataclass_fields__:
    value = getattr(state, field)
    sharding = rs if field in replica_fields else rep
    changes[field] = jax.tree.map(lambda x: global_array(x, sharding), value)
  return state.replace(**changes)


def shard_batch(batch: np.ndarray, mesh: Mesh) -> jax.Array:
  """Places a host batch ``[M, b, ...]`` on the mesh (replicas x sequences)."""
  return global_array(batch, batch_sharding(mesh))


def fetch(x: Any) -> np.ndarray:
  """Host copy of a (possibly sharded over processes) array."""
  if isinstance(x, (list, tuple)) and jax.process_count() > 1:  # several arrays (e.g. queued per-step values): one array
    return np.asarray([fetch(v) for v in x])
  if jax.process_count() > 1 and not x.is_fully_addressable:
    from jax.experimental import multihost_utils
    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
  return np.asarray(jax.device_get(x))


def host_copy(x: Any) -> np.ndarray:
  """A host copy of a replicated (possibly multi-process) array: this process's own copy, no
  collective."""
  if isinstance(x, jax.Array) and not x.is_fully_addressable:
    return np.asarray(x.addressable_shards[0].data)
  return np.asarray(x)
