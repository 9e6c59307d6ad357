"""Number formats of the wire: their value grids and exact rounding to them.

==========  ==============  ===========================================================
format      bits / element  encoding
==========  ==============  ===========================================================
``none``    32              float32, the identity
``bf16``    16              bfloat16, round to nearest even (:func:`round_bf16`)
``fp8``     8               float8 e4m3 (``float8_e4m3fn``: max 448, no inf) + absmax scale
``fp4``     4               float4 e2m1 (``float4_e2m1fn``: ±{0, .5, 1, 1.5, 2, 3, 4, 6}) + scale
``e3m0``    4               1 sign + 3 exponent bits, no mantissa (defined below) + scale
==========  ==============  ===========================================================

**Rounding** :math:`R` is round-to-nearest in the linear domain, ties to even (the
neighbour whose integer significand is even), after saturating :math:`|y|` to
:math:`q_\\max`. It is computed by hand with exact power-of-two arithmetic, identically on
every backend; for ``fp8`` and ``fp4`` it agrees bit for bit with the ``ml_dtypes``
cast of the saturated value.

**The e3m0 format** (no library has it). A code is a sign bit and a 3-bit exponent
:math:`E \\in \\{0, \\dots, 7\\}`: :math:`E = 0` is zero, :math:`E \\ge 1` is
:math:`\\pm 2^{E-7}`. There are no subnormals, infinities or NaNs, so the unscaled
values are :math:`\\{0\\} \\cup \\{\\pm 2^{-6}, \\pm 2^{-5}, \\dots, \\pm 2^{-1}, \\pm 1\\}`
(15 values, :math:`q_\\max = 1`, so the scale is the absmax itself). Rounding after
saturation to :math:`[-1, 1]`: between :math:`2^e` and :math:`2^{e+1}` the linear midpoint
:math:`1.5 \\cdot 2^e` (not the log-domain midpoint :math:`\\sqrt{2} \\cdot 2^e`) decides,
and a tie goes up to :math:`2^{e+1}`; below :math:`2^{-6}`, magnitudes up to and including
:math:`2^{-7}` flush to zero and larger ones go to :math:`2^{-6}`.


**Backend-proof.** No rounding here is a cast pair such as
``x.astype(bfloat16).astype(float32)``: XLA may drop such a pair when excess precision is
allowed (its GPU compiler does by default), which silently turns the format into float32.
``bf16`` rounds with :func:`jax.lax.reduce_precision`, the minifloats with integer and
power-of-two arithmetic.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

# The formats' names and sizes live with the byte counting (diloco_core.spec.wire_formats, no JAX).
from diloco_core.spec.wire_formats import FORMATS  # noqa: F401
from diloco_core.spec.wire_formats import MINIFLOATS
from diloco_core.spec.wire_formats import Minifloat
from diloco_core.spec.wire_formats import bits_per_element  # noqa: F401
from diloco_core.spec.wire_formats import validate_format

#: The ``ml_dtypes`` type of each scaled format that has one (``e3m0`` has none: see above).
ML_DTYPES = {"fp8": ml_dtypes.float8_e4m3fn, "fp4": ml_dtypes.float4_e2m1fn}


def max_value(name: str) -> float:
  """Largest finite value :math:`q_\\max` of a scaled format (before scaling).

  Absmax scaling maps the absmax of each block to it.

  Args:
    name: ``fp8``, ``fp4`` or ``e3m0``.

  Returns:
    448.0, 6.0 or 1.0.

  Raises:
    ValueError: for ``none`` and ``bf16``, which are not scaled.

  Examples:
    >>> max_value("fp8"), max_value("fp4"), max_value("e3m0")
    (448.0, 6.0, 1.0)
  """
  return _minifloat(name).max_value


def representable_values(name: str) -> np.ndarray:
  """Sorted finite values of an unscaled format (zero once), as float32.

  The finite values of :func:`code_values`, each once (-0 and +0 are the one zero).

  Args:
    name: ``fp8``, ``fp4`` or ``e3m0``.

  Returns:
    A sorted 1-D float32 array: 253 values for ``fp8``, 15 for ``fp4`` and ``e3m0``.

  Raises:
    ValueError: for ``none`` and ``bf16``, whose value sets are not small grids.

  Examples:
    >>> representable_values("fp4").tolist()
    [-6.0, -4.0, -3.0, -2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
    >>> representable_values("e3m0")[7:].tolist()
    [0.0, 0.015625, 0.03125, 0.0625, 0.125, 0.25, 0.5, 1.0]
  """
  _minifloat(name)
  values = code_values(name)
  return np.unique(values[np.isfinite(values)] + np.float32(0.0))  # + 0 turns -0 into 0


@functools.cache
def code_values(name: str) -> np.ndarray:
  """The float32 value of every code (bit pattern) of a scaled format, indexed by code.

  For ``fp8`` and ``fp4`` the codes are read off every bit pattern of the ``ml_dtypes`` type
  (:data:`ML_DTYPES`; its NaN codes give NaN); ``e3m0`` is defined by this module (see the
  module docstring): code ``sign << 3 | E``, :math:`E = 0` is zero, :math:`E \\ge 1` is
  :math:`2^{E-7}`.

  Args:
    name: ``fp8``, ``fp4`` or ``e3m0``.

  Returns:
    A float32 array of :math:`2^\\text{bits}` values (256 for ``fp8``, 16 for the others).

  Raises:
    ValueError: for ``none`` and ``bf16``, which have no small code table.

  Examples:
    >>> code_values("fp4")[[0, 1, 7, 8, 15]].tolist()
    [0.0, 0.5, 6.0, -0.0, -6.0]
    >>> code_values("e3m0")[[1, 7, 9]].tolist()
    [0.015625, 1.0, -0.015625]
  """
  fmt = _minifloat(name)
  if name == "e3m0":
    mags = np.array([0.0] + [2.0**(e - 7) for e in range(1, 8)], np.float32)
    return np.concatenate([mags, -mags]).astype(np.float32)
  codes = np.arange(2**fmt.bits, dtype=np.uint8)
  return codes.view(ML_DTYPES[name]).astype(np.float32)  # ml_dtypes stores fp4 one per byte


def round_to_format(y: jax.Array, name: str) -> jax.Array:
  """Rounds float32 values to the unscaled grid of ``fp8``, ``fp4`` or ``e3m0``.

  Saturates first, then rounds to nearest in the linear domain with ties to even. With
  :math:`m` mantissa bits and smallest normal exponent :math:`e_\\min`:

  .. math::
     e = \\max(\\lfloor \\log_2 |y| \\rfloor, e_\\min), \\qquad
     R(y) = \\operatorname{sign}(y)\\, 2^{e-m}\\,
       \\operatorname{rne}\\!\\left(\\min(|y|, q_\\max) / 2^{e-m}\\right)

  Every step is exact (powers of two and an integer-valued round), so the result does not
  depend on how a backend converts to float8 or float4. NaN stays NaN.

  Args:
    y: values in the unscaled domain (any shape).
    name: ``fp8``, ``fp4`` or ``e3m0``.

  Returns:
    float32 values of :func:`representable_values`, same shape as ``y``.

  Examples:
    >>> y = jnp.array([0.25, 0.26, 0.75, 1.25, 5.0, 7.0, -2.5])
    >>> round_to_format(y, "fp4").tolist()
    [0.0, 0.5, 1.0, 1.0, 4.0, 6.0, -2.0]
    >>> round_to_format(jnp.array([0.75, 0.74, 2.0**-7, 3.0, -0.3]), "e3m0").tolist()
    [1.0, 0.5, 0.0, 1.0, -0.25]
  """
  _minifloat(name)
  return _round_to_format(jnp.asarray(y, jnp.float32), name)


@functools.partial(jax.jit, static_argnames=("name",))
def _round_to_format(y: jax.Array, name: str) -> jax.Array:
  fmt = MINIFLOATS[name]
  mag = jnp.minimum(jnp.abs(y), fmt.max_value)  # saturate (NaN stays NaN)
  _, k = jnp.frexp(mag)  # mag = f * 2^k, f in [0.5, 1): floor(log2 mag) = k - 1
  e = jnp.maximum(k - 1, fmt.min_exponent)  # binade exponent, clamped into the subnormals
  ulp = pow2(e - fmt.mantissa_bits)
  rounded = jnp.round(mag / ulp) * ulp  # jnp.round is round-half-to-even
  return jnp.copysign(rounded, y)


def round_bf16(x: jax.Array) -> jax.Array:
  """Rounds float32 values to bfloat16's grid (8 exponent, 7 mantissa bits), kept as float32.

  Round to nearest, ties to even, exactly as a float32 -> bfloat16 cast; overflow goes to
  infinity, NaN stays NaN. Written with :func:`jax.lax.reduce_precision`, which no compiler
  may elide, unlike the cast pair ``x.astype(bfloat16).astype(float32)``.

  Args:
    x: float32 values (any shape).

  Returns:
    float32 values, each a bfloat16 number.

  Examples:
    >>> round_bf16(jnp.array([1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-7])).tolist()
    [1.0, 1.015625, 1.0078125]
  """
  return jax.lax.reduce_precision(jnp.asarray(x, jnp.float32), exponent_bits=8, mantissa_bits=7)


# ----------------------------------------------------------------------------- internals


def _minifloat(name: str) -> Minifloat:
  validate_format(name)
  if name not in MINIFLOATS:
    raise ValueError(
        f"compression {name!r} has no scaled value grid; expected one of {tuple(MINIFLOATS)}.")
  return MINIFLOATS[name]


def pow2(e: jax.Array) -> jax.Array:
  """Exact 2**e as float32 for integer e in [-126, 127] (built from the exponent bits)."""
  bits = (e.astype(jnp.int32) + 127) << 23
  return jax.lax.bitcast_convert_type(bits, jnp.float32)
