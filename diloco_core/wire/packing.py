"""What crosses the link: a payload packed to its wire format's own bits, and back, exactly.

The trainer counts what a replica sends with :func:`diloco_core.wire.compression.wire_bits`; the
background runtime's link (:class:`~diloco_core.runtime.link.Link`) moves exactly those bits.
A fragment's payload, per replica, is its leaves one after the other, as float32 values that
are already on the format's grid (what :func:`~diloco_core.wire.compression.quantize` decoded).
:func:`pack_payload` writes each leaf as fields of a little-endian bit stream (each value least
significant bit first), one row of bytes per replica:

* ``none``: each value's 32 bits; ``bf16``: its upper 16 bits (the lower 16 are zero);
* ``fp8``, ``fp4``, ``e3m0``: each value's code, its bit pattern in the format (8 or 4 bits:
  two values per byte), then one float32 absmax per block;
* top-k: per chunk, the :math:`k_c` values (raw or as codes, as above), their
  :math:`k_c` positions in :math:`\\lceil \\log_2 |c| \\rceil` bits each, and for the scaled
  formats the chunk's absmax.

A row is :math:`\\lceil \\text{bits} / 8 \\rceil` bytes: the counted bits, the last byte
padded. :func:`unpack_payload` decodes with the arithmetic :func:`~diloco_core.wire.compression.quantize`
decodes with (:func:`~diloco_core.wire.compression.decode_scaled`), and :func:`pack_payload` finds each
code by checking that it decodes to the value bit for bit, so the receiver computes with the
very numbers the sender holds; a value that no code reproduces (a backend that rounded
otherwise) raises :class:`WirePackingError` instead of travelling changed.

Examples:
  Two replicas, one leaf of 3 values in fp4 (one block): 3 codes of 4 bits and a float32
  absmax, 44 bits in 6 bytes per replica, and back bit for bit:

  >>> layout = WireLayout(sizes=(3,), name="fp4")
  >>> rows = np.array([[3.0, -1.0, 0.5], [0.0, 0.25, -0.125]], np.float32)
  >>> packed = pack_payload(rows, layout)
  >>> packed.shape, layout.bits
  ((2, 6), 44)
  >>> unpack_payload(packed, layout).tolist()
  [[3.0, -1.0, 0.5], [0.0, 0.25, -0.125]]
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from diloco_core.spec.wire_formats import BITS, MINIFLOATS, SCALE_BITS, index_bits, validate_format
from diloco_core.wire.minifloat import code_values


class WirePackingError(ValueError):
  """A payload value that its wire format's codes do not reproduce bit for bit."""


@dataclasses.dataclass(frozen=True)
class WireLayout:
  """How one fragment's payload is laid out on the wire (per replica).

  Attributes:
    sizes: elements of each leaf, in the payload's order.
    name: the wire format (``compression``).
    block_size: elements per absmax block of a scaled format (None: one per leaf).
    topk: entries kept per chunk (None: dense).
    topk_chunk: elements per top-k chunk (the names are those of ``DiLoCoConfig.wire``).
  """

  sizes: tuple[int, ...]
  name: str
  block_size: int | None = None
  topk: int | None = None
  topk_chunk: int | None = None

  def __post_init__(self):
    validate_format(self.name)

  @property
  def elements(self) -> int:
    """Values per replica (the float32 row's length)."""
    return int(sum(self.sizes))

  @property
  def bits(self) -> int:
    """Bits per replica: :func:`~diloco_core.wire.compression.wire_bits` of every leaf, added up."""
    return sum(count * width for leaf in self.sizes for _, count, width in _fields(self, leaf))

  @property
  def row_bytes(self) -> int:
    """Bytes of one packed replica row: the bits, the last byte padded."""
    return -(-self.bits // 8)


def pack_payload(rows: np.ndarray, layout: WireLayout) -> np.ndarray:
  """Packs float32 payload rows ``[m, n]`` (values on the format's grid) to ``[m, row_bytes]`` uint8.

  Raises:
    WirePackingError: a value that no code of the format reproduces bit for bit, or a top-k
      chunk with more nonzero entries than it keeps.
  """
  rows = np.ascontiguousarray(rows, np.float32)
  if rows.ndim != 2 or rows.shape[1] != layout.elements:
    raise ValueError(f"pack_payload: rows must be [m, {layout.elements}], got {list(rows.shape)}.")
  if layout.topk is None and layout.name == "none":  # the float32 values as they are
    return rows.view(np.uint8).copy()
  values, widths, at = [], [], 0
  for n in layout.sizes:
    values += _encode_leaf(rows[:, at:at + n], n, layout)
    widths += [width for _, _, width in _fields(layout, n)]
    at += n
  return _to_bytes(list(zip(values, widths)), layout.row_bytes)


def unpack_payload(packed: np.ndarray, layout: WireLayout) -> np.ndarray:
  """The float32 rows ``[M, n]`` of packed rows ``[M, row_bytes]`` (:func:`pack_payload`'s inverse)."""
  packed = np.ascontiguousarray(packed, np.uint8)
  M = packed.shape[0]
  if packed.ndim != 2 or packed.shape[1] != layout.row_bytes:
    raise ValueError(f"unpack_payload: packed rows must be [M, {layout.row_bytes}], got {list(packed.shape)}.")
  if layout.topk is None and layout.name == "none":
    return packed.view(np.float32).copy()
  fields = [(count, width) for n in layout.sizes for _, count, width in _fields(layout, n)]
  stream = iter(_from_bytes(packed, fields))
  out = [_decode_leaf(stream, M, n, layout) for n in layout.sizes]
  return np.concatenate(out, axis=1) if out else np.zeros((M, 0), np.float32)


# ----------------------------------------------------------------------------- fields


def _chunks(layout: WireLayout, n: int) -> list[tuple[int, int]]:
  """(number of chunks, their length) of a leaf of n elements: blocks of a scaled format, or
  top-k chunks (the last one shorter)."""
  if n == 0:
    return []
  if layout.topk is not None:
    size = int(layout.topk_chunk)
  elif layout.block_size is not None:
    size = int(layout.block_size)
  else:
    size = n
  size = min(size, n)
  full, rest = divmod(n, size)
  return [(full, size)] + ([(1, rest)] if rest else [])


def _fields(layout: WireLayout, n: int) -> list[tuple[str, int, int]]:
  """The fields ``(what, count, width)`` of one leaf of n elements, in stream order."""
  b, scaled = BITS[layout.name], layout.name in MINIFLOATS
  if n == 0:
    return []
  if layout.topk is None:
    if not scaled:
      return [("values", n, b)]
    blocks = sum(q for q, _ in _chunks(layout, n))
    return [("values", n, b), ("absmax", blocks, SCALE_BITS)]
  out = []
  for q, length in _chunks(layout, n):
    kept = min(int(layout.topk), length)
    out += [("values", q * kept, b), ("positions", q * kept, index_bits(length))]
    if scaled:
      out.append(("absmax", q, SCALE_BITS))
  return out


def _encode_leaf(x: np.ndarray, n: int, layout: WireLayout) -> list[np.ndarray]:
  """The field values (uint64 ``[m, count]`` each, in :func:`_fields` order) of one leaf."""
  m, out = x.shape[0], []
  if n == 0:
    return out
  if layout.topk is None:
    if layout.name not in MINIFLOATS:
      return [_raw(x, layout.name)]
    codes, absmax, at = [], [], 0
    for q, length in _chunks(layout, n):
      c, a = _encode_scaled(x[:, at:at + q * length].reshape(m, q, length), layout.name)
      codes.append(c.reshape(m, -1))
      absmax.append(a.view(np.uint32).astype(np.uint64).reshape(m, -1))
      at += q * length
    return [np.concatenate(codes, axis=1), np.concatenate(absmax, axis=1)]
  at = 0
  for q, length in _chunks(layout, n):
    chunks = x[:, at:at + q * length].reshape(m, q, length)
    at += q * length
    kept = min(int(layout.topk), length)
    nonzero = chunks.view(np.uint32) != 0  # -0.0 and NaN count: they must arrive as they are
    failed = np.isnan(chunks).all(axis=2)  # a chunk that held a NaN or inf decodes to all NaN
    if np.any((nonzero.sum(axis=2) > kept) & ~failed):
      raise WirePackingError(f"a top-k chunk has more than {kept} nonzero values: not a top-k payload.")
    positions = np.argsort(~nonzero, axis=2, kind="stable")[:, :, :kept]  # nonzero first, then zeros
    values = np.take_along_axis(chunks, positions, axis=2)
    if layout.name in MINIFLOATS:
      codes, absmax = _encode_scaled(values, layout.name)
      out += [codes.reshape(m, -1), positions.reshape(m, -1).astype(np.uint64),
              absmax.view(np.uint32).astype(np.uint64).reshape(m, -1)]
    else:
      out += [_raw(values.reshape(m, -1), layout.name), positions.reshape(m, -1).astype(np.uint64)]
  return out


def _decode_leaf(stream, M: int, n: int, layout: WireLayout) -> np.ndarray:
  """One leaf's float32 ``[M, n]`` from its fields (taken from ``stream`` in order)."""
  if n == 0:
    return np.zeros((M, 0), np.float32)
  if layout.topk is None:
    if layout.name not in MINIFLOATS:
      return _from_raw(next(stream), layout.name)
    codes, absmax = next(stream), _absmax(next(stream))
    per_block = np.concatenate([np.full(q, length) for q, length in _chunks(layout, n)])
    return _decode_scaled(codes, np.repeat(absmax, per_block, axis=1), layout.name)
  parts = []
  for q, length in _chunks(layout, n):
    kept = min(int(layout.topk), length)
    values, positions = next(stream), next(stream).astype(np.int64).reshape(M, q, kept)
    if layout.name in MINIFLOATS:
      absmax = _absmax(next(stream))
      values = _decode_scaled(values, np.repeat(absmax, kept, axis=1), layout.name)
    else:
      values = _from_raw(values, layout.name)
    values = values.reshape(M, q, kept)
    chunks = np.zeros((M, q, length), np.float32)
    np.put_along_axis(chunks, positions, values, axis=2)
    chunks[np.isnan(values).any(axis=2)] = np.nan
    parts.append(chunks.reshape(M, q * length))
  return np.concatenate(parts, axis=1)


# ----------------------------------------------------------------------------- formats


def _raw(x: np.ndarray, name: str) -> np.ndarray:
  """float32 values as their 32 bits (``none``) or their upper 16 (``bf16``), uint64."""
  bits = np.ascontiguousarray(x, np.float32).view(np.uint32)
  if name == "bf16":
    if np.any(bits & 0xFFFF):
      raise WirePackingError("a bf16 payload value has nonzero low 16 bits: it is not a bfloat16 number.")
    bits = bits >> 16
  return bits.astype(np.uint64)


def _from_raw(v: np.ndarray, name: str) -> np.ndarray:
  bits = v.astype(np.uint32)
  return (bits << 16 if name == "bf16" else bits).view(np.float32)


def _absmax(v: np.ndarray) -> np.ndarray:
  return v.astype(np.uint32).view(np.float32)


@functools.cache
def _sorted_codes(name: str) -> tuple[np.ndarray, np.ndarray]:
  """The finite codes of a format sorted by value (-0 before +0): (values float32, codes)."""
  values = code_values(name)
  finite = np.flatnonzero(np.isfinite(values))
  order = np.lexsort((~np.signbit(values[finite]), values[finite]))
  return values[finite][order], finite[order].astype(np.uint64)


def _decode_scaled(codes: np.ndarray, absmax: np.ndarray, name: str) -> np.ndarray:
  from diloco_core.wire.compression import decode_scaled
  return np.asarray(decode_scaled(code_values(name)[codes.astype(np.int64)], absmax, name))


def _encode_scaled(v: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
  """The codes (uint64, shaped like ``v``) and block absmax (float32 ``v.shape[:-1]``) of
  blocks ``v`` ``[..., length]`` decoded by :func:`~diloco_core.wire.compression.quantize`.

  Each value's code is the one that decodes to it bit for bit under the block's absmax (the
  largest magnitude of the block, which the quantizer returns exactly): the value over the
  block's unit gives its place on the grid, and the neighbouring codes are checked.
  """
  from diloco_core.wire.compression import decode_scaled
  shape = v.shape
  blocks = v.reshape(-1, shape[-1])
  absmax = np.max(np.abs(blocks), axis=1)  # NaN where the block failed (decodes to all NaN)
  grid, codes_by_place = _sorted_codes(name)
  table = np.asarray(decode_scaled(grid[None, :], absmax[:, None], name))  # [blocks, codes]
  unit = table[:, np.flatnonzero(grid == 1.0)[0]].astype(np.float64)  # what the code of 1.0 decodes to
  unit = np.where(unit > 0, unit, 1.0)
  place = np.searchsorted(grid.astype(np.float64), blocks / unit[:, None])
  want = blocks.view(np.uint32)
  codes = np.zeros(blocks.shape, np.uint64)
  found = np.isnan(absmax)[:, None] & np.isnan(blocks)  # a failed block: every value NaN, any code
  for shift in (-1, 0, 1):
    j = np.clip(place + shift, 0, len(grid) - 1)
    hit = ~found & (np.take_along_axis(table, j, axis=1).view(np.uint32) == want)
    codes[hit] = codes_by_place[j[hit]]
    found |= hit
  if not found.all():
    bad = blocks[~found][0]
    raise WirePackingError(f"a {name} payload value ({bad!r}) is decoded by none of the format's codes"
                           " under its block's absmax: the sender rounded otherwise than the receiver"
                           " decodes; it cannot travel packed.")
  return codes.reshape(shape), absmax.astype(np.float32).reshape(shape[:-1])


# ----------------------------------------------------------------------------- bit stream


def _to_bytes(fields: list[tuple[np.ndarray, int]], row_bytes: int) -> np.ndarray:
  """Fields ``(values uint64 [m, count], width)`` as rows of a little-endian bit stream (each
  value least significant bit first), ``[m, row_bytes]`` uint8."""
  m = fields[0][0].shape[0] if fields else 0
  if all(width % 8 == 0 for _, width in fields):  # whole bytes: the same stream, without the bits
    parts = [v.astype(f"<u{width // 8}").view(np.uint8).reshape(m, -1) for v, width in fields if width]
    return np.concatenate(parts, axis=1) if parts else np.zeros((m, 0), np.uint8)
  if all(width % 4 == 0 for _, width in fields):  # whole nibbles (4-bit codes): two per byte
    nibbles = np.concatenate([((v[:, :, None] >> np.arange(0, width, 4, dtype=np.uint64)) & 15)
                              .astype(np.uint8).reshape(m, -1) for v, width in fields if width], axis=1)
    if nibbles.shape[1] % 2:
      nibbles = np.pad(nibbles, ((0, 0), (0, 1)))
    return nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)
  bits = [((v[:, :, None] >> np.arange(width, dtype=np.uint64)) & 1).astype(np.uint8).reshape(m, -1)
          for v, width in fields if width]
  out = np.packbits(np.concatenate(bits, axis=1), axis=1, bitorder="little")
  assert out.shape[1] == row_bytes
  return out


def _from_bytes(packed: np.ndarray, fields: list[tuple[int, int]]) -> list[np.ndarray]:
  """The fields ``(count, width)`` of packed rows, uint64 ``[M, count]`` each (:func:`_to_bytes`'s inverse)."""
  M, out, at = packed.shape[0], [], 0
  if all(width % 8 == 0 for _, width in fields):
    for count, width in fields:
      if width == 0:  # positions in a chunk of one element
        out.append(np.zeros((M, count), np.uint64))
        continue
      size = count * width // 8
      out.append(packed[:, at:at + size].copy().view(f"<u{width // 8}").astype(np.uint64))
      at += size
    return out
  if all(width % 4 == 0 for _, width in fields):
    nibbles = np.stack([packed & 15, packed >> 4], axis=2).reshape(M, -1).astype(np.uint64)
    shifts = np.arange(0, 64, 4, dtype=np.uint64)
    for count, width in fields:
      chunk = nibbles[:, at:at + count * width // 4].reshape(M, count, width // 4)
      out.append((chunk << shifts[:width // 4]).sum(axis=2, dtype=np.uint64))
      at += count * width // 4
    return out
  bits = np.unpackbits(packed, axis=1, bitorder="little")
  weights = np.uint64(1) << np.arange(64, dtype=np.uint64)
  for count, width in fields:
    chunk = bits[:, at:at + count * width].reshape(M, count, width).astype(np.uint64)
    out.append((chunk * weights[:width]).sum(axis=2, dtype=np.uint64))
    at += count * width
  return out
