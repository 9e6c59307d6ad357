"""The wire formats and their sizes: what a pseudo-gradient costs in each, counted without JAX.

The trainer's byte counters and the planning library (:mod:`analysis.planning.plan`, the
``python -m analysis`` command line, :mod:`analysis.planning.paper_tables`) read the sizes here, so
the two never disagree and the calculator imports with numpy alone:

* **Formats** (:data:`FORMATS`): ``none`` (float32, 32 bits), ``bf16`` (16), and the scaled
  minifloats ``fp8`` (8), ``fp4`` and ``e3m0`` (4), whose parameters are :data:`MINIFLOATS`
  (their value grids and rounding are :mod:`diloco_core.wire.minifloat`). A scaled block adds one
  float32 absmax (:data:`SCALE_BITS`).
* **Top-k** (:mod:`diloco_core.wire.sparse`): per chunk of C elements, :math:`k_c = \\min(k, |c|)`
  values of :math:`b_Q` bits and as many indices of :math:`\\lceil \\log_2 |c| \\rceil`
  bits, plus one scale per chunk for the scaled formats:

  .. math::
     \\text{bits} = \\sum_c k_c \\left(b_Q + \\lceil \\log_2 |c| \\rceil\\right)
                 + 32 \\cdot [Q \\text{ scaled}] \\cdot n_\\text{chunks}

Examples:
  >>> [bits_per_element(f) for f in FORMATS]
  [32, 16, 8, 4, 4]
  >>> topk_wire_bits(8, k=2, chunk=4, name="none")  # 2 chunks x 2 x (32 + 2)
  136
"""

from __future__ import annotations

import math
from typing import NamedTuple

from diloco_core.spec.validity import is_int

#: The wire formats, by name (the ``compression`` option).
FORMATS = ("none", "bf16", "fp8", "fp4", "e3m0")
#: Elements per top-k chunk unless told (SparseLoCo's 64 × 64).
DEFAULT_CHUNK = 4096
#: Bits of one absmax scale of a scaled format (a float32).
SCALE_BITS = 32


class Minifloat(NamedTuple):
  """The parameters of a scaled wire format (see :mod:`diloco_core.wire.minifloat`)."""

  bits: int  #: bits per element on the wire
  mantissa_bits: int  #: explicit significand bits m
  min_exponent: int  #: exponent of the smallest normal value (subnormal spacing 2^(emin - m))
  max_value: float  #: largest finite value q_max


#: The scaled formats, by name.
MINIFLOATS = {
    "fp8": Minifloat(bits=8, mantissa_bits=3, min_exponent=-6, max_value=448.0),
    "fp4": Minifloat(bits=4, mantissa_bits=1, min_exponent=0, max_value=6.0),
    # e3m0: {0} and 2^-6 .. 2^0. With no mantissa bits, the "subnormal" grid below 2^-6 is
    # {0, 2^-6}, which is exactly the format's code E = 0 (zero) and E = 1 (2^-6).
    "e3m0": Minifloat(bits=4, mantissa_bits=0, min_exponent=-6, max_value=1.0),
}

#: Bits per element of every format, scales not counted.
BITS = {"none": 32, "bf16": 16, **{k: v.bits for k, v in MINIFLOATS.items()}}


def validate_format(name: str) -> None:
  """Raises a one-line :class:`ValueError` unless ``name`` is one of :data:`FORMATS`.

  Args:
    name: the wire format (the ``compression`` flag).

  Examples:
    >>> validate_format("fp4")
    >>> validate_format("int8")
    Traceback (most recent call last):
    ...
    ValueError: compression must be one of ('none', 'bf16', 'fp8', 'fp4', 'e3m0'), got 'int8'.
  """
  if not isinstance(name, str) or name not in FORMATS:
    raise ValueError(f"compression must be one of {FORMATS}, got {name!r}.")


def bits_per_element(name: str) -> int:
  """Bits one element takes on the wire, not counting the scales.

  Args:
    name: the wire format, one of :data:`FORMATS`.

  Returns:
    32, 16, 8, 4 or 4 for ``none``, ``bf16``, ``fp8``, ``fp4``, ``e3m0``.

  Examples:
    >>> bits_per_element("fp8")
    8
  """
  validate_format(name)
  return BITS[name]


def check_topk(k, chunk) -> None:
  """Raises a one-line ValueError unless ``k`` and ``chunk`` are integers with 1 <= k <= chunk.

  Examples:
    >>> check_topk(64, 4096)
    >>> check_topk(0, 4096)
    Traceback (most recent call last):
    ...
    ValueError: `topk` must be an integer in [1, topk_chunk=4096] (entries kept per chunk), got 0.
  """
  if not is_int(chunk) or chunk < 1:
    raise ValueError(f"`topk_chunk` must be an integer >= 1 (elements per chunk), got {chunk!r}.")
  if not is_int(k) or not 1 <= k <= chunk:
    raise ValueError(f"`topk` must be an integer in [1, topk_chunk={chunk}] (entries kept per chunk),"
                     f" got {k!r}.")


def check_topk_block(block_size) -> None:
  """Refuses a ``compression_block`` with ``topk`` (one line): top-k scales once per chunk."""
  if block_size is not None:
    raise ValueError(f"`compression_block` {block_size!r} cannot be combined with `topk`: top-k"
                     " values take one scale per chunk (set `topk_chunk`); drop `compression_block`.")


def index_bits(chunk_length: int) -> int:
  """Bits of one position within a chunk of ``chunk_length`` elements: ⌈log2 length⌉ (0 for 1).

  Examples:
    >>> index_bits(4096), index_bits(5), index_bits(1)
    (12, 3, 0)
  """
  return max(0, math.ceil(math.log2(chunk_length))) if chunk_length > 1 else 0


def topk_wire_bits(num_elements: int, *, k: int, chunk: int, name: str) -> int:
  """Exact bits of one tensor of ``num_elements`` sent top-k (the module docstring's sum).

  Args:
    num_elements: n.
    k: entries kept per chunk.
    chunk: C, elements per chunk.
    name: the values' wire format (:data:`FORMATS`).

  Returns:
    The number of bits (an int).

  Examples:
    A chunk of 4 and a shorter one of 2, 3 kept per chunk, fp8 values with one scale each:

    >>> topk_wire_bits(6, k=3, chunk=4, name="fp8")  # 3 (8 + 2) + 2 (8 + 1) + 2 x 32
    112
  """
  validate_format(name)
  check_topk(k, chunk)
  n = int(num_elements)
  full, rest = divmod(n, chunk)  # full chunks, and a shorter last one when rest > 0
  bits = full * min(k, chunk) * (BITS[name] + index_bits(chunk))
  if rest:
    bits += min(k, rest) * (BITS[name] + index_bits(rest))
  if name in MINIFLOATS:
    bits += SCALE_BITS * (full + (1 if rest else 0))
  return bits


def topk_bits_per_element(*, k: int, chunk: int, name: str) -> float:
  """Average wire bits per parameter of a large tensor sent top-k.

  .. math:: \\frac{k (b_Q + \\lceil\\log_2 C\\rceil) + 32 [\\text{scaled}]}{C}

  What the simulator and the planner take as ``bits`` for a top-k run (whole chunks).

  Examples:
    >>> topk_bits_per_element(k=64, chunk=4096, name="e3m0")  # 64 (4 + 12) + 32, over 4096
    0.2578125
  """
  return topk_wire_bits(chunk, k=k, chunk=chunk, name=name) / chunk
