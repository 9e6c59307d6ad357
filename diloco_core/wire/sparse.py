"""Top-k sparse pseudo-gradients: per-chunk selection, the values' format, and exact wire bits.

SparseLoCo (Sarfi et al. 2025, arXiv 2508.15706) sends, of each chunk of a pseudo-gradient,
only its k largest-magnitude entries, in a low-bit format, and keeps the rest in an
error-feedback residual (:func:`diloco_core.wire.compression.error_feedback`, whose decay β then
stands in for the outer momentum). Here:

* **Chunks.** The tensor is flattened and cut into chunks of C elements (``chunk``; the last
  one is shorter when C does not divide n; a tensor smaller than C is one chunk). SparseLoCo
  chunks a 2-D weight into 64 × 64 tiles (DeMo's layout): the same chunk size for C = 4096
  and the same index width, with contiguous runs of the flattened tensor instead of tiles.
* **Selection.** Chunk c keeps :math:`k_c = \\min(k, |c|)` entries: those of largest
  :math:`|x_i|`, ties broken towards the lower index (``jax.lax.top_k`` is specified so, on
  every backend: the choice is deterministic). Everything else decodes to zero.
* **Values.** The kept values of a chunk go through the wire format as one block
  (:func:`diloco_core.wire.compression.quantize` with ``topk`` passes its format in): for the
  scaled formats one absmax scale per chunk.
* **On the wire**, per chunk: :math:`k_c` indices of :math:`\\lceil \\log_2 |c| \\rceil` bits
  each (fixed-width unsigned positions within the chunk, no entropy coding), :math:`k_c`
  values of :math:`b_Q` bits, and for the scaled formats one float32 absmax:

  .. math::
     \\text{bits} = \\sum_c k_c \\left(b_Q + \\lceil \\log_2 |c| \\rceil\\right)
                 + 32 \\cdot [Q \\text{ scaled}] \\cdot n_\\text{chunks}

* **Failures propagate**: a chunk holding a NaN or an infinity decodes to all NaN.

Examples:
  Chunks of 4, two kept per chunk, float32 values: ties (the two 2.0 of the second chunk)
  go to the lower index:

  >>> import jax.numpy as jnp
  >>> x = jnp.array([0.5, -3.0, 1.0, 0.25, 2.0, -1.0, 2.0, 0.0])
  >>> sparsify(x, k=2, chunk=4).tolist()
  [0.0, -3.0, 1.0, 0.0, 2.0, 0.0, 2.0, 0.0]
  >>> sparsify(jnp.array([2.0, 2.0, 2.0]), k=2, chunk=4).tolist()
  [2.0, 2.0, 0.0]
  >>> topk_wire_bits(8, k=2, chunk=4, name="none")  # 2 chunks x 2 x (32 + 2)
  136
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from diloco_core.spec.wire_formats import check_topk
from diloco_core.spec.wire_formats import topk_wire_bits  # noqa: F401  (the exact bits, counted without JAX)


def sparsify(x: jax.Array, *, k: int, chunk: int,
             values: Callable[[jax.Array], jax.Array] | None = None) -> jax.Array:
  """What the receiver decodes of ``x`` sent top-k: the kept entries, zeros elsewhere.

  Args:
    x: the tensor (any shape; cast to float32).
    k: entries kept per chunk.
    chunk: C, elements per chunk.
    values: applied to the kept values, a float32 ``[chunks, k_c]`` array (one row per
      chunk), e.g. a wire format quantizing each row as one block; None keeps them as they are.

  Returns:
    float32 array shaped like ``x``.
  """
  check_topk(k, chunk)
  x = jnp.asarray(x, jnp.float32)
  n = x.size
  if n == 0:
    return x
  c = min(int(chunk), n)
  rows = -(-n // c)
  # Padding sits after every real entry, so a stable top-k picks it only once a chunk's real
  # entries are all kept; it is cut off again below.
  chunks = jnp.pad(x.reshape(-1), (0, rows * c - n)).reshape(rows, c)
  _, idx = jax.lax.top_k(jnp.abs(chunks), min(int(k), c))
  kept = jnp.take_along_axis(chunks, idx, axis=1)
  sent = kept if values is None else values(kept)
  out = jnp.zeros_like(chunks).at[jnp.arange(rows)[:, None], idx].set(sent)
  finite = jnp.all(jnp.isfinite(chunks), axis=1, keepdims=True)
  out = jnp.where(finite, out, jnp.nan)
  return out.reshape(-1)[:n].reshape(x.shape)
