"""Wire formats for the pseudo-gradients: quantize, dequantize, error feedback, bit counts.

Each replica's pseudo-gradient :math:`\\Delta_m` goes through a wire format :math:`Q`
before the cross-replica average, which is accumulated in float32:

.. math::
   \\Delta = \\frac{1}{M} \\sum_{m=1}^{M} Q(\\Delta_m)

This module simulates the wire inside a jitted step: :func:`quantize` encodes to the
format and decodes straight back to float32, so the trainer sees exactly the numbers the
receiver would see, and :func:`wire_bits` counts exactly what would have been sent. The
formats themselves (value grids, rounding :math:`R`) are in :mod:`diloco_core.wire.minifloat`;
their names are re-exported here.

==========  ==============  ===========================================================
format      bits / element  encoding
==========  ==============  ===========================================================
``none``    32              float32, the identity
``bf16``    16              bfloat16, round to nearest even (:func:`~diloco_core.wire.minifloat.round_bf16`)
``fp8``     8               float8 e4m3 (``float8_e4m3fn``: max 448, no inf) + absmax scale
``fp4``     4               float4 e2m1 (``float4_e2m1fn``: ±{0, .5, 1, 1.5, 2, 3, 4, 6}) + scale
``e3m0``    4               1 sign + 3 exponent bits, no mantissa (defined below) + scale
==========  ==============  ===========================================================

**Absmax scaling** (``fp8``, ``fp4``, ``e3m0``). The tensor is flattened and cut into
blocks of ``block_size`` elements (the last block is shorter; ``block_size=None`` means one
block holding the whole tensor). For a block with absmax :math:`a = \\max_i |x_i|` and a
format whose largest finite value is :math:`q_\\max`, the scale is :math:`s = a / q_\\max`
rounded to float32, and

.. math::
   Q(x_i) = s \\cdot R\\!\\left(\\frac{x_i}{s}\\right), \\quad \\text{except} \\quad
   R\\!\\left(\\frac{x_i}{s}\\right) = \\pm q_\\max \\;\\Rightarrow\\; Q(x_i) = \\pm a,

where :math:`R` rounds to the unscaled format (:func:`~diloco_core.wire.minifloat.round_to_format`).

- On the wire: the codes, plus the block's absmax :math:`a` as one float32 per block
  (counted by :func:`wire_bits`); the receiver rebuilds :math:`s` from :math:`a`.
- The largest element of every block comes back exactly. (For ``fp8`` and ``fp4``,
  :math:`q_\\max` is not a power of two and :math:`q_\\max \\cdot s` could miss :math:`a`
  by one float32 ulp, hence the saturated codes decode to :math:`\\pm a` itself.)
- A block :math:`v_i \\cdot c` with every :math:`v_i` on the format's grid,
  :math:`\\max_i |v_i| = q_\\max` and every :math:`v_i \\cdot c` exact in float32 comes
  back unchanged: :math:`s` is computed correctly rounded with integer arithmetic (XLA
  may compute a float division by a constant as a multiplication by its rounded
  reciprocal), after an exact power-of-two normalization, so it never underflows.
- :math:`x_i / s` itself may be computed as :math:`x_i \\cdot (1/s)`, so an exact tie
  under a scale that is not a power of two may round either way.
- An all-zero block decodes to zeros. A block holding a NaN or an infinity decodes to all
  NaN: failures propagate, they are never hidden (``none`` and ``bf16`` keep NaN and inf
  element by element). Backends that flush float32 subnormals (XLA does on CPU) see
  subnormal inputs as zeros.

**Top-k sparsification** (``topk=k``, SparseLoCo): of each chunk of ``topk_chunk``
elements only the k largest-magnitude entries are sent, their values in the format above
and their positions as fixed-width indices (:mod:`diloco_core.wire.sparse`, which counts them).

**Error feedback.** Each replica keeps a residual :math:`e_m` (zeros at the start),
sends :math:`c_m = Q(\\Delta_m + \\beta e_m)` and keeps
:math:`e_m \\leftarrow \\Delta_m + \\beta e_m - c_m` (:func:`error_feedback`; the decay β is 1
unless told, SparseLoCo uses β < 1 in place of outer momentum), so that with β = 1 what was
sent over any number of rounds adds up to the true pseudo-gradients minus the final residual.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from diloco_core.wire.minifloat import pow2
from diloco_core.wire.minifloat import max_value  # noqa: F401
from diloco_core.wire.minifloat import representable_values  # noqa: F401
from diloco_core.wire.minifloat import round_bf16
from diloco_core.wire.minifloat import round_to_format
from diloco_core.wire import sparse
from diloco_core.spec.wire_formats import BITS
from diloco_core.spec.wire_formats import DEFAULT_CHUNK
from diloco_core.spec.wire_formats import FORMATS, check_topk_block  # noqa: F401  (re-exported)
from diloco_core.spec.wire_formats import MINIFLOATS
from diloco_core.spec.wire_formats import SCALE_BITS
from diloco_core.spec.wire_formats import bits_per_element  # noqa: F401
from diloco_core.spec.wire_formats import check_topk
from diloco_core.spec.wire_formats import topk_wire_bits
from diloco_core.spec.wire_formats import validate_format


def validate_block_size(block_size: int | None) -> None:
  """Raises a one-line :class:`ValueError` unless ``block_size`` is None or a positive int.

  Args:
    block_size: elements per absmax-scaling block; None scales each tensor as one block.

  Examples:
    >>> validate_block_size(32)
    >>> validate_block_size(0)
    Traceback (most recent call last):
    ...
    ValueError: compression block_size must be a positive integer or None, got 0.
  """
  if block_size is None:
    return
  if (not isinstance(block_size, (int, np.integer)) or isinstance(block_size, bool)
      or block_size <= 0):
    raise ValueError(
        f"compression block_size must be a positive integer or None, got {block_size!r}.")


def quantize(x: jax.Array, name: str, *, block_size: int | None = None, topk: int | None = None,
             topk_chunk: int = DEFAULT_CHUNK) -> jax.Array:
  """Sends ``x`` through the wire format: encode, then decode back to float32.

  ``none`` is the identity, ``bf16`` rounds to nearest even (never a cast pair); the
  scaled formats use per-block absmax scaling (see the module docstring):

  .. math::
     Q(x_i) = s\\, R(x_i / s), \\qquad s = \\frac{\\max_{j \\in \\text{block}} |x_j|}{q_\\max}

  Args:
    x: the tensor to send (any shape; cast to float32).
    name: the wire format, one of :data:`~diloco_core.spec.wire_formats.FORMATS`.
    block_size: elements per scaling block along the flattened tensor; None uses one
      scale for the whole tensor. Ignored (but validated) for ``none`` and ``bf16``.
    topk: None (dense), or the entries kept per chunk (:func:`diloco_core.wire.sparse.sparsify`;
      the values then use one scale per chunk, and ``block_size`` must be None).
    topk_chunk: elements per chunk for ``topk``.

  Returns:
    float32 array shaped like ``x``: what the receiver decodes.

  Examples:
    >>> x = jnp.array([0.25, -0.875, 1.5, 3.0])
    >>> quantize(x, "fp4").tolist()  # s = 3 / 6: x / s = 0.5, -1.75 (a tie), 3, 6
    [0.25, -1.0, 1.5, 3.0]
    >>> quantize(jnp.array([4.0, 1.5, -0.5, 0.375]), "e3m0", block_size=2).tolist()
    [4.0, 2.0, -0.5, 0.5]
    >>> jax.jit(lambda t: quantize(t, "bf16"))(jnp.array([1.0 + 2.0**-9])).tolist()
    [1.0]
  """
  validate_format(name)
  validate_block_size(block_size)
  if topk is not None:
    check_topk_block(block_size)
    check_topk(topk, topk_chunk)
    return _quantize_topk(jnp.asarray(x, jnp.float32), name, int(topk), int(topk_chunk))
  block_size = None if block_size is None else int(block_size)
  return _quantize(jnp.asarray(x, jnp.float32), name, block_size)


@functools.partial(jax.jit, static_argnames=("name", "k", "chunk"))
def _quantize_topk(x: jax.Array, name: str, k: int, chunk: int) -> jax.Array:
  # The kept values of each chunk (one row) go through the format as one block.
  return sparse.sparsify(x, k=k, chunk=chunk, values=lambda v: _quantize(v, name, v.shape[1]))


@functools.partial(jax.jit, static_argnames=("name", "block_size"))
def _quantize(x: jax.Array, name: str, block_size: int | None) -> jax.Array:
  # Jitted so that eager callers compile the whole thing once per shape, not op by op.
  if name == "none":
    return x
  if name == "bf16":
    return round_bf16(x)
  if x.size == 0:
    return x
  n = x.size
  flat = x.reshape(-1)
  if block_size is None or block_size >= n:
    blocks = flat.reshape(1, n)
  else:
    num_blocks = -(-n // block_size)
    blocks = jnp.pad(flat, (0, num_blocks * block_size - n)).reshape(num_blocks, block_size)
  out = _quantize_blocks(blocks, name)
  return out.reshape(-1)[:n].reshape(x.shape)


def quantize_tree(tree: Any, name: str, *, block_size: int | None = None, topk: int | None = None,
                  topk_chunk: int = DEFAULT_CHUNK) -> Any:
  """Applies :func:`quantize` to every leaf of a pytree (one scale set per leaf).

  Args:
    tree: a pytree of arrays.
    name: the wire format, one of :data:`~diloco_core.spec.wire_formats.FORMATS`.
    block_size, topk, topk_chunk: as in :func:`quantize`.

  Returns:
    A pytree of float32 arrays with the same structure.

  Examples:
    >>> out = quantize_tree({"w": jnp.array([3.0, 0.6]), "b": jnp.zeros(2)}, "fp4")
    >>> out["w"].tolist(), out["b"].tolist()
    ([3.0, 0.5], [0.0, 0.0])
  """
  validate_format(name)
  validate_block_size(block_size)
  return jax.tree.map(lambda leaf: quantize(leaf, name, block_size=block_size, topk=topk,
                                            topk_chunk=topk_chunk), tree)


def wire_bits(num_elements: int, name: str, *, block_size: int | None = None,
              topk: int | None = None, topk_chunk: int = DEFAULT_CHUNK) -> int:
  """Exact bits one tensor takes on the wire, scales included.

  .. math::
     \\text{bits} = n \\cdot b_Q + 32 \\cdot n_\\text{blocks}, \\qquad
     n_\\text{blocks} = \\lceil n / \\text{block\\_size} \\rceil
     \\ (1 \\text{ per tensor when block\\_size is None, } 0 \\text{ if } n = 0)

  with no scale term for ``none`` and ``bf16``. Padding of the last block is not sent.
  With ``topk``: :func:`diloco_core.spec.wire_formats.topk_wire_bits` (kept values, their indices, one
  scale per chunk).

  Args:
    num_elements: elements n in the tensor.
    name: the wire format, one of :data:`~diloco_core.spec.wire_formats.FORMATS`.
    block_size, topk, topk_chunk: as in :func:`quantize`.

  Returns:
    The number of bits (an int).

  Examples:
    >>> wire_bits(1000, "fp4")  # 1000 * 4 + one float32 scale
    4032
    >>> wire_bits(1000, "fp4", block_size=32)  # 1000 * 4 + 32 scales
    5024
    >>> wire_bits(1000, "bf16", block_size=32)
    16000
  """
  validate_format(name)
  validate_block_size(block_size)
  if (not isinstance(num_elements, (int, np.integer)) or isinstance(num_elements, bool)
      or num_elements < 0):
    raise ValueError(f"num_elements must be a non-negative integer, got {num_elements!r}.")
  if topk is not None:
    check_topk_block(block_size)
    return topk_wire_bits(int(num_elements), k=topk, chunk=topk_chunk, name=name)
  n = int(num_elements)
  bits = n * BITS[name]
  if name in MINIFLOATS and n:
    bits += SCALE_BITS * (1 if block_size is None else math.ceil(n / block_size))
  return bits


def wire_bits_tree(tree: Any, name: str, *, block_size: int | None = None, topk: int | None = None,
                   topk_chunk: int = DEFAULT_CHUNK) -> int:
  """Total :func:`wire_bits` over the leaves of a pytree (arrays or shape-dtype structs).

  Args:
    tree: a pytree whose leaves have a ``size`` (arrays, ``jax.ShapeDtypeStruct``).
    name: the wire format, one of :data:`~diloco_core.spec.wire_formats.FORMATS`.
    block_size, topk, topk_chunk: as in :func:`quantize`.

  Returns:
    The number of bits (an int).

  Examples:
    >>> wire_bits_tree({"w": jnp.zeros((10, 100)), "b": jnp.zeros(7)}, "fp8")
    8120
  """
  return sum(wire_bits(int(np.prod(leaf.shape, dtype=np.int64)), name, block_size=block_size,
                       topk=topk, topk_chunk=topk_chunk)
             for leaf in jax.tree.leaves(tree))


def error_feedback(delta: Any, residual: Any, name: str, *, block_size: int | None = None,
                   topk: int | None = None, topk_chunk: int = DEFAULT_CHUNK,
                   decay=1.0) -> tuple[Any, Any]:
  """One round of error feedback: send the quantized sum, keep what was lost.

  .. math::
     c = Q(\\Delta + \\beta e), \\qquad e \\leftarrow \\Delta + \\beta e - c

  With β = 1, over K rounds :math:`\\sum_k c_k = \\sum_k \\Delta_k - e_K` (up to float32
  rounding); with ``none`` and no ``topk`` the residual stays exactly zero.

  Args:
    delta: the pseudo-gradient :math:`\\Delta_m` (a pytree of arrays).
    residual: the residual :math:`e_m`, same structure; None means zeros (first round).
    name: the wire format, one of :data:`~diloco_core.spec.wire_formats.FORMATS`.
    block_size, topk, topk_chunk: as in :func:`quantize`.
    decay: β, the residual's decay before it is added (1: none; may be traced).

  Returns:
    ``(sent, new_residual)``: two float32 pytrees shaped like ``delta``.

  Examples:
    >>> delta = jnp.array([0.3125, 1.0])
    >>> sent, res = error_feedback(delta, None, "e3m0")
    >>> sent.tolist(), res.tolist()
    ([0.25, 1.0], [0.0625, 0.0])
    >>> sent, res = error_feedback(delta, res, "e3m0")  # 0.375 is a tie: rounds up
    >>> sent.tolist(), res.tolist()
    ([0.5, 1.0], [-0.125, 0.0])
  """
  validate_format(name)
  validate_block_size(block_size)
  delta = jax.tree.map(lambda d: jnp.asarray(d, jnp.float32), delta)
  if residual is None:
    target = delta
  else:
    target = jax.tree.map(lambda d, e: d + decay * jnp.asarray(e, jnp.float32), delta, residual)
  sent = quantize_tree(target, name, block_size=block_size, topk=topk, topk_chunk=topk_chunk)
  new_residual = jax.tree.map(jnp.subtract, target, sent)
  return sent, new_residual


# ----------------------------------------------------------------------------- internals


def _odd_times_pow2(value: float) -> tuple[int, int]:
  """Splits a positive integer-valued or power-of-two float into (odd, e): value = odd * 2**e."""
  mantissa, exponent = math.frexp(value)
  odd, e = int(mantissa * 2**53), exponent - 53
  while odd % 2 == 0:
    odd, e = odd // 2, e + 1
  return odd, e


def _divide_exactly_rounded(mant: jax.Array, odd: int) -> tuple[jax.Array, jax.Array]:
  """Correctly rounded mant / odd in integers: returns (quo, k) with mant / odd ~ quo * 2^-k.

  ``mant`` is a 24-bit significand in [2^23, 2^24); ``k`` is picked so that ``quo`` has 24
  bits (2^24 after rounding up at most), so ``quo`` converts to float32 exactly. Rounding is
  to nearest; an odd divisor never leaves an exact tie. This avoids float division, which
  XLA may compute as a multiplication by a rounded reciprocal.
  """
  b = odd.bit_length()
  k = jnp.where((mant << b) < (odd << 24), b, b - 1)
  num = mant << k
  quo = num // odd
  rem = num - quo * odd
  return quo + (2 * rem > odd).astype(jnp.int32), k


def _scaling(absmax: jax.Array, name: str) -> tuple:
  """What decoding a block needs from its absmax: ``(finite, tiny, a, s_n, pexp)`` (see
  :func:`_quantize_blocks`); the receiver of a packed payload rebuilds it the same way."""
  odd, exp2 = _odd_times_pow2(MINIFLOATS[name].max_value)  # q_max = odd * 2^exp2: 7 * 2^6, 3 * 2^1, 1
  finite = jnp.isfinite(absmax)
  # Blocks below 2^-100 (float32 subnormals included) are scaled up by 2^64, exactly.
  tiny = absmax < 2.0**-100
  a = jnp.where(tiny, absmax * 2.0**64, absmax)
  a = jnp.where(finite & (a > 0), a, 1.0)
  # a = mant * 2^(ef - 150) = a_n * p with a_n = mant * 2^-23 in [1, 2), p = 2^(ef - 127).
  bits = jax.lax.bitcast_convert_type(a, jnp.int32)
  ef = (bits >> 23) & 0xFF
  mant = (bits & 0x7FFFFF) | 0x800000
  pexp = ef - 127
  # The scale s = a / q_max, correctly rounded, as s_n * p (s_n never under- or overflows).
  quo, k = _divide_exactly_rounded(mant, odd)
  s_n = quo.astype(jnp.float32) * pow2(-23 - k - exp2)
  return finite, tiny, a, s_n, pexp


def _decode(q: jax.Array, scaling: tuple, name: str) -> jax.Array:
  """The float32 values of unscaled codes ``q`` under a block's :func:`_scaling`."""
  finite, tiny, a, s_n, pexp = scaling
  decoded = (q * s_n) * pow2(pexp)
  decoded = jnp.where(jnp.abs(q) == MINIFLOATS[name].max_value, jnp.copysign(a, q), decoded)
  decoded = jnp.where(tiny, decoded * 2.0**-64, decoded)
  return jnp.where(finite, decoded, jnp.nan)


@functools.partial(jax.jit, static_argnames=("name",))
def decode_scaled(q: jax.Array, absmax: jax.Array, name: str) -> jax.Array:
  """The values a receiver decodes from unscaled codes and their block's absmax.

  The second half of :func:`quantize` for the scaled formats, the same operations in the
  same order (:func:`diloco_core.wire.packing.unpack_payload` rebuilds a packed payload with it).

  Args:
    q: unscaled values of the format's grid (:func:`~diloco_core.wire.minifloat.representable_values`, or -0).
    absmax: the absmax of each one's block, broadcastable against ``q``.
    name: ``fp8``, ``fp4`` or ``e3m0``.

  Returns:
    float32 values, shaped like ``q`` broadcast against ``absmax``.

  Examples:
    >>> decode_scaled(jnp.array([6.0, 3.0, -0.5]), jnp.float32(12.0), "fp4").tolist()
    [12.0, 6.0, -1.0]
  """
  q, absmax = jnp.broadcast_arrays(jnp.asarray(q, jnp.float32), jnp.asarray(absmax, jnp.float32))
  return _decode(q, _scaling(absmax, name), name)


def _quantize_blocks(blocks: jax.Array, name: str) -> jax.Array:
  """Absmax-scaled quantize/dequantize of each row of a (num_blocks, block) array."""
  absmax = jnp.max(jnp.abs(blocks), axis=1, keepdims=True)  # NaN if the block has a NaN
  scaling = _scaling(absmax, name)
  _, tiny, _, s_n, pexp = scaling
  blocks = jnp.where(tiny, blocks * 2.0**64, blocks)
  half = pexp // 2  # x / p in two exact steps (2^-pexp alone may not be a normal float)
  x_n = blocks * pow2(-half) * pow2(half - pexp)
  q = round_to_format(x_n / s_n, name)
  return _decode(q, scaling, name)
