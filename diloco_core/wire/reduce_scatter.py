"""The reduction that scales: a reduce-scatter of packed chunks, a re-quantized mean, an all-gather.

With ``reduction="all-gather"`` every process of a background run receives every replica's
payload, :math:`(N - 1)\\,V` bytes per process and sync for a payload of :math:`V` bytes, and
averages them itself: the exact mean of what was sent. ``reduction="reduce-scatter"`` moves what
a ring all-reduce moves, :math:`2 (N - 1) / N \\cdot V` per process (what
:func:`analysis.planning.bandwidth.allreduce_factor` and the simulator assume), in two phases:

1. **Reduce-scatter.** The payload's elements are cut into N chunks (:class:`ChunkPlan`), each
   cut on a boundary of the format's scaling units (anywhere for ``none`` and ``bf16``, between
   blocks of ``compression_block``, between leaves when a scaled format has one scale per
   leaf). Process d owns chunk d: every process sends it its replicas' rows of chunk d, packed
   to the wire format (:mod:`~diloco_core.wire.packing`), in one all-to-all.
2. **Re-quantized mean.** Process d averages the M rows of its chunk in replica order and
   re-quantizes the mean to the same wire format (:func:`requantize_mean`, dense, the same
   blocks), as torchft's quantized all-reduce does; a mean of fp4 values is not an fp4 value,
   and sending it as float32 would cost 8 times the chunk.
3. **All-gather.** Every process gathers every packed reduced chunk and decodes the mean.

The outer gradient is then

.. math::
   \\Delta = Q\\Big(\\frac{1}{M} \\sum_{m=1}^{M} Q(\\Delta_m)\\Big)

with :math:`Q` the wire format (for ``none`` the identity: the numbers do not change). Cutting
on scaling-unit boundaries makes the second :math:`Q` independent of N: the in-step runtime
applies it to the whole mean (:meth:`~diloco_core.algorithm.phases.Phases.average`) and gets the same
values. Error feedback keeps each replica's residual of the first :math:`Q` only (the second
is not fed back). Top-k payloads are refused (the mean of sparse payloads is not sparse).

Bytes per process r and sync (``m`` replicas per process, ``b_d`` bytes of one packed row of
chunk d), each byte it originates counted once, as for the all-gather (which hands the link its
payload :math:`V` and receives :math:`(N - 1)\\,V`): it hands the link
:math:`\\sum_{d \\ne r} m\\,b_d + b_r` (its rows of the others' chunks, its reduced chunk) and
receives :math:`(N - 1)\\,m\\,b_r + \\sum_{d \\ne r} b_d`; with one replica per process and equal
chunks, :math:`V` and :math:`2 (N - 1) / N \\cdot V`. JAX's all-to-all and all-gather move equal blocks, so
the shorter chunks travel padded to the longest (at most a scaling block's bytes; counted apart).

Examples:
  Two processes, one replica each, a payload of 4 bf16 values: the mean of each half is taken
  by its owner and re-rounded to bf16 (``1 + 2^-8`` is a tie: to even, 1.0):

  >>> from diloco_core.wire.packing import WireLayout
  >>> plan = ChunkPlan(WireLayout(sizes=(4,), name="bf16"), parts=2)
  >>> plan.cuts
  (0, 2, 4)
  >>> rows = [np.array([[1.0, 2.0, 3.0, 4.0]], np.float32),
  ...         np.array([[1.0078125, 2.0, 3.0, 5.0]], np.float32)]
  >>> sent = [scatter(r, plan) for r in rows]  # [to process 0, to process 1] of each
  >>> owned = [reduce_owned([sent[s][d] for s in range(2)], plan, d) for d in range(2)]
  >>> assemble([packed for packed, _ in owned], plan).tolist()
  [[1.0, 2.0, 3.0, 4.5]]
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from diloco_core.wire import compression
from diloco_core.spec.wire_formats import MINIFLOATS
from diloco_core.wire.packing import WireLayout, pack_payload, unpack_payload


def requantize_mean(mean: list, config) -> list:
  """The mean of the payloads as the reduction delivers it: re-quantized to the wire format under
  ``reduction="reduce-scatter"`` (dense, the same blocks), unchanged otherwise.

  Args:
    mean: the averaged leaves (float32).
    config: the run's :class:`~diloco_core.DiLoCoConfig` (``reduction``, ``compression``,
      ``compression_block``).

  Returns:
    The leaves :math:`Q(\\text{mean})`, or ``mean`` itself.

  Examples:
    >>> from diloco_core import DiLoCoConfig
    >>> cfg = DiLoCoConfig(compression="fp4", reduction="reduce-scatter")
    >>> [x.tolist() for x in requantize_mean([jnp.array([3.0, 0.6])], cfg)]
    [[3.0, 0.5]]
  """
  if config.reduction != "reduce-scatter":
    return mean
  return compression.quantize_tree(mean, config.compression, block_size=config.compression_block)


def _allowed_cut(layout: WireLayout, offsets: np.ndarray, target: int) -> int:
  """The cut nearest ``target`` on a scaling-unit boundary of ``layout`` (ties: the lower)."""
  if layout.name not in MINIFLOATS:  # element by element
    return target
  i = int(np.searchsorted(offsets, target, side="right")) - 1  # the leaf holding target
  lo, hi = int(offsets[i]), int(offsets[min(i + 1, len(offsets) - 1)])
  if layout.block_size is None:
    below, above = lo, hi
  else:
    below = lo + (target - lo) // layout.block_size * layout.block_size
    above = min(below + layout.block_size, hi)
  return below if target - below <= above - target else above


@dataclasses.dataclass(frozen=True)
class ChunkPlan:
  """A payload's elements cut into ``parts`` chunks on scaling-unit boundaries (see the module).

  Attributes:
    layout: the whole payload's :class:`~diloco_core.wire.packing.WireLayout` (dense).
    parts: N, the number of chunks (one per process).
    cuts: element offsets ``0 = c_0 <= ... <= c_N = n``: chunk d is ``[c_d, c_{d+1})``.
  """

  layout: WireLayout
  parts: int
  cuts: tuple[int, ...] = dataclasses.field(init=False)
  _chunks: tuple[WireLayout, ...] = dataclasses.field(init=False, repr=False, compare=False)

  def __post_init__(self):
    if self.layout.topk is not None:
      raise ValueError("reduce-scatter needs dense payloads: top-k payloads travel by all-gather.")
    n = self.layout.elements
    offsets = np.concatenate([[0], np.cumsum(self.layout.sizes, dtype=np.int64)])
    cuts = [0]
    for d in range(1, self.parts):
      cuts.append(max(cuts[-1], _allowed_cut(self.layout, offsets, (d * n) // self.parts)))
    object.__setattr__(self, "cuts", (*cuts, n))
    object.__setattr__(self, "_chunks", tuple(self._cut(d) for d in range(self.parts)))

  def _cut(self, d: int) -> WireLayout:
    lo, hi = self.cuts[d], self.cuts[d + 1]
    sizes, at = [], 0
    for size in self.layout.sizes:
      a, b = max(lo, at), min(hi, at + size)
      if a < b:
        sizes.append(b - a)
      at += size
    return dataclasses.replace(self.layout, sizes=tuple(sizes))

  def chunk(self, d: int) -> WireLayout:
    """Chunk d's layout: the parts of the leaves it holds, each starting on a unit boundary."""
    return self._chunks[d]


@functools.lru_cache(maxsize=64)
def chunk_plan(layout: WireLayout, parts: int) -> ChunkPlan:
  """:class:`ChunkPlan` of ``layout`` in ``parts`` chunks, cut once per layout and count (each
  sync of a run reuses it).

  Examples:
    >>> chunk_plan(WireLayout(sizes=(4,), name="none"), 2) is chunk_plan(WireLayout(sizes=(4,), name="none"), 2)
    True
  """
  return ChunkPlan(layout, parts)


def scatter(rows: np.ndarray, plan: ChunkPlan) -> list[np.ndarray]:
  """Phase 1, one process: its float32 rows ``[m, n]`` packed chunk by chunk, one uint8 buffer
  ``[m * b_d]`` for each owner d."""
  return [pack_payload(rows[:, plan.cuts[d]:plan.cuts[d + 1]], plan.chunk(d)).reshape(-1)
          for d in range(plan.parts)]


def reduce_owned(received: list[np.ndarray], plan: ChunkPlan, d: int, present: np.ndarray | None = None,
                 mean=None) -> tuple[np.ndarray, np.ndarray]:
  """Phase 2, the owner d of a chunk: the packed rows every process sent it (in process order,
  so the rows are in replica order), averaged and re-quantized.

  Args:
    received: each process's packed rows of chunk d (``[m * b_d]`` uint8), in process order.
    plan: the payload's chunks.
    d: the chunk.
    present: the [M] participation mask of the rows (an elastic run: the replicas of the
      processes left out are 0, their rows any bytes), or None for every row.
    mean: with ``present``, the masked mean ``mean(rows [M, n], present [M]) -> [n]`` (the
      runtimes' rule, :func:`~diloco_core.algorithm.phases.present_mean`); a module-level
      function (the jitted reduction is cached by it).

  Returns:
    ``(packed, mean)``: the reduced chunk packed (``[b_d]`` uint8) and as float32 ``[len]``.
  """
  layout = plan.chunk(d)
  if layout.elements == 0:  # more processes than scaling units: an empty chunk
    return np.zeros(0, np.uint8), np.zeros(0, np.float32)
  rows = np.concatenate([unpack_payload(r.reshape(-1, layout.row_bytes), layout) for r in received])
  cpu = jax.local_devices(backend="cpu")[0]
  args = (rows,) if present is None else (rows, np.asarray(present, np.float32))
  mean = np.asarray(_reduced(layout, None if present is None else mean)(*[jax.device_put(a, cpu) for a in args]))
  return pack_payload(mean[None], layout).reshape(-1), mean


@functools.lru_cache(maxsize=None)
def _reduced(layout: WireLayout, masked_mean=None):
  """The jitted mean over the rows of one chunk (``masked_mean`` with a mask) and its
  re-quantization, segment by segment (each segment starts on a unit boundary of its leaf, so its
  blocks are the leaf's)."""

  def fn(rows, *present):
    mean, out, at = jnp.mean(rows, axis=0) if masked_mean is None else masked_mean(rows, *present), [], 0
    for size in layout.sizes:
      out.append(compression.quantize(mean[at:at + size], layout.name, block_size=layout.block_size))
      at += size
    return jnp.concatenate(out) if out else mean
  return jax.jit(fn)


def assemble(reduced: list[np.ndarray], plan: ChunkPlan) -> np.ndarray:
  """Phase 3, every process: the packed reduced chunks (in owner order) as the mean ``[1, n]``."""
  parts = [unpack_payload(r[None, :plan.chunk(d).row_bytes], plan.chunk(d)) for d, r in enumerate(reduced)]
  return np.concatenate(parts, axis=1)


def traffic(plan: ChunkPlan, rank: int, local: int) -> tuple[int, int]:
  """(bytes handed to the link, bytes received from the other processes) by process ``rank``
  holding ``local`` replicas, padding excluded (see the module docstring).

  Examples:
    >>> traffic(ChunkPlan(WireLayout(sizes=(8,), name="none"), parts=4), rank=0, local=1)  # V = 32
    (32, 48)
  """
  b = [plan.chunk(d).row_bytes for d in range(plan.parts)]
  others = sum(b) - b[rank]
  return local * others + b[rank], (plan.parts - 1) * local * b[rank] + others
