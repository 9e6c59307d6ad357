"""Top-k sparse pseudo-gradients: per-chunk selection, the values' format, and exact wire bits.

SparseLoCo (Sarfi et al. 2025, arXiv 2508.15706) sends, of each chunk of a pseudo-gradient,
only its k largest-magnitude entries, in a low-bit format, and keeps the rest in an
error-feedback residual (:func:`diloco_core.compression.error_feedback`, whose decay β then
stands in for the outer momentum). Here:

* **Chunks.** The tensor is flattened and cut into chunks of C elements (``chunk``; the last
  one is shorter when C does not divide n; a tensor smaller than C is one chunk). SparseLoCo
  chunks a 2-D weight into 64 × 64 tiles (DeMo's layout): the same chunk size for C = 4096
  and the same index width, with contiguous runs of the flattened tensor instead of tiles.
* **Selection.** Chunk c keeps :math:`k_c = \\min(k, |c|)` entries: those of largest
  :math:`|x_i|`, ties broken towards the lower index (``jax.lax.top_k`` is specified so, on
  every backend: the choice is deterministic). Everything else decodes to zero.
* **Values.** The kept values of a chunk go through the wire format as one block
  (:func:`diloco_core.compression.quantize` with ``topk`` passes its format in): for the
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
  >>> wire_bits(8, k=2, chunk=4, name="none")  # 2 chunks x 2 x (32 + 2)
  136
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from diloco_core.minifloat import _BITS, _MINIFLOATS, validate_format

#: Elements per chunk unless told (SparseLoCo's 64 × 64).
DEFAULT_CHUNK = 4096
SCALE_BITS = 32  # each absmax scale travels as one float32


def check_topk(k, chunk) -> None:
  """Raises a one-line ValueError unless ``k`` and ``chunk`` are integers with 1 <= k <= chunk.

  Examples:
    >>> check_topk(64, 4096)
    >>> check_topk(0, 4096)
    Traceback (most recent call last):
    ...
    ValueError: `topk` must be an integer in [1, topk_chunk=4096] (entries kept per chunk), got 0.
  """
  if not _is_int(chunk) or chunk < 1:
    raise ValueError(f"`topk_chunk` must be an integer >= 1 (elements per chunk), got {chunk!r}.")
  if not _is_int(k) or not 1 <= k <= chunk:
    raise ValueError(f"`topk` must be an integer in [1, topk_chunk={chunk}] (entries kept per chunk),"
                     f" got {k!r}.")


def _is_int(v) -> bool:
  return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def index_bits(chunk_length: int) -> int:
  """Bits of one position within a chunk of ``chunk_length`` elements: ⌈log2 length⌉ (0 for 1)."""
  return max(0, math.ceil(math.log2(chunk_length))) if chunk_length > 1 else 0


def wire_bits(num_elements: int, *, k: int, chunk: int, name: str) -> int:
  """Exact bits of one tensor of ``num_elements`` sent top-k (the module docstring's sum).

  Args:
    num_elements: n.
    k: entries kept per chunk.
    chunk: C, elements per chunk.
    name: the values' wire format (:data:`diloco_core.compression.FORMATS`).

  Returns:
    The number of bits (an int).
  """
  validate_format(name)
  check_topk(k, chunk)
  n = int(num_elements)
  full, rest = divmod(n, chunk)  # full chunks, and a shorter last one when rest > 0
  bits = full * min(k, chunk) * (_BITS[name] + index_bits(chunk))
  if rest:
    bits += min(k, rest) * (_BITS[name] + index_bits(rest))
  if name in _MINIFLOATS:
    bits += SCALE_BITS * (full + (1 if rest else 0))
  return bits


def bits_per_element(*, k: int, chunk: int, name: str) -> float:
  """Average wire bits per parameter of a large tensor: :math:`(k (b_Q + \\lceil\\log_2 C\\rceil) + 32 [\\text{scaled}]) / C`.

  What the simulator and the planner take as ``bits`` for a top-k run (whole chunks).

  Examples:
    >>> bits_per_element(k=64, chunk=4096, name="e3m0")  # 64 (4 + 12) + 32, over 4096
    0.2578125
  """
  return wire_bits(chunk, k=k, chunk=chunk, name=name) / chunk


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
