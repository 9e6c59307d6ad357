"""FLOPs and HBM bytes of one operation: what a point of a measured roofline is worth.

Used by ``benchmarks/roofline.py`` (the roofline measured on a chip) and by its reader
(:mod:`analysis.lab.roofline_measured`), so a measured point and the calculator's roofline
(:mod:`analysis.planning.roofline`) count the same FLOPs and bytes.
"""

from __future__ import annotations

from analysis.planning import _checks


def matmul_cost(m: int, k: int, n: int, bytes_per_element: int = 2) -> tuple[float, float]:
  """FLOPs and HBM bytes of one matmul ``[m, k] @ [k, n]``: each operand read once, the result
  written once.

  .. math::
     F = 2mkn, \\qquad V = b\\,(mk + kn + mn)

  Args:
    m, k, n: the shapes.
    bytes_per_element: b (2 for bfloat16).

  Returns:
    ``(F, V)``; their ratio is the matmul's :func:`~analysis.planning.roofline.arithmetic_intensity`.

  Examples:
    >>> matmul_cost(256, 8192, 8192)  # the example of arithmetic_intensity
    (34359738368, 142606336)
    >>> f, v = matmul_cost(1, 4096, 4096)  # a matrix-vector product: about 1 FLOP per byte
    >>> round(f / v, 4)
    0.9995
  """
  for name, x in (("m", m), ("k", k), ("n", n), ("bytes_per_element", bytes_per_element)):
    _checks.positive(name, x)
  return 2 * m * k * n, bytes_per_element * (m * k + k * n + m * n)


def elementwise_cost(size: int, bytes_per_element: int = 2, reads: int = 1, writes: int = 1,
                     flops_per_element: int = 1) -> tuple[float, float]:
  """FLOPs and HBM bytes of an elementwise operation over ``size`` elements.

  .. math::
     F = f\\,s, \\qquad V = b\\,s\\,(r + w)

  Args:
    size: s, elements.
    bytes_per_element: b.
    reads, writes: arrays of ``size`` elements read and written.
    flops_per_element: f.

  Returns:
    ``(F, V)``.

  Examples:
    >>> elementwise_cost(2**20)  # x + 1 in bfloat16: a quarter FLOP per byte
    (1048576, 4194304)
  """
  for name, x in (("size", size), ("bytes_per_element", bytes_per_element), ("reads", reads),
                  ("writes", writes), ("flops_per_element", flops_per_element)):
    _checks.positive(name, x)
  return flops_per_element * size, bytes_per_element * size * (reads + writes)
