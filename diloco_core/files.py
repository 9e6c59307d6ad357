"""Local token files, memory-mapped: one text or ``.npy`` file, or a directory of shards.

Nothing is ever downloaded, and no file is loaded whole: :func:`open_tokens` maps the
file(s) and returns a :class:`TokenStore`, one flat stream of token ids that reads any
``[start, stop)`` range on demand. Four layouts (``DataConfig.source``):

* **a UTF-8 text file** (any name not ending in ``.npy``): its bytes are the tokens
  (vocabulary 256), mapped with ``np.memmap``;
* **a 1-D integer ``.npy`` array** of token ids, mapped with ``np.load(mmap_mode="r")``;
* **a directory of ``.npy`` shards**: every ``*.npy`` in it, in name order, concatenated
  (all of one integer dtype);
* **a directory of ArrayRecord shards**: every ``*.array_record`` in it, in name order,
  read through Grain's ``ArrayRecordDataSource``; each record is a run of tokens and the
  stream is all records concatenated in order (records of ``a.array_record``, then of
  ``b.array_record``, ...). A record of ``*.bytes.array_record`` is raw bytes (one token
  per byte, vocabulary 256); a record of any other ``*.array_record`` is little-endian
  int32 token ids (``np.asarray(ids, "<i4").tobytes()``).

A directory holds shards of one kind and one dtype only (hidden files are ignored). The
ids are checked once when opening (a streaming pass, chunk by chunk): none negative,
none at or above the model's vocabulary, text valid UTF-8; ArrayRecord records are read
once then to learn their lengths (kept as an offset table, one integer per record).
"""

from __future__ import annotations

import codecs
import os
import pathlib
from typing import Callable, Sequence

import numpy as np

_HINT = ("use 'synthetic', a UTF-8 text file, an .npy file of token ids, or a directory of"
         " .npy or .array_record shards")
_CHUNK = 1 << 24  # tokens per chunk of the checking pass
_MAX_ID = 2**31 - 2  # ids become int32


def _name(path) -> str:
  return repr(str(path))


class TokenStore:
  """One stream of token ids over several segments (files or records), read on demand.

  Attributes:
    kind: ``"text"``, ``"npy"``, ``"npy-shards"``, ``"array_record"`` or ``"bytes-records"``.
    paths: the files, in stream order.
    segments: the memory-mapped arrays (text and ``.npy``); empty for ArrayRecord.
    vocab_size: token ids are in ``[0, vocab_size)``.
  """

  def __init__(self, kind: str, paths: Sequence[str], lengths: Sequence[int],
               segment: Callable[[int], np.ndarray], vocab_size: int,
               segments: Sequence[np.ndarray] = ()):
    self.kind, self.paths, self.vocab_size = kind, [str(p) for p in paths], int(vocab_size)
    self.segments = list(segments)
    self._segment = segment
    self._offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)])

  def __len__(self) -> int:
    return int(self._offsets[-1])

  def read(self, start: int, stop: int) -> np.ndarray:
    """Tokens ``[start, stop)`` of the stream as a new int32 array (only those are read).

    Examples:
      >>> a, b = np.arange(5), np.arange(5, 9)
      >>> store = TokenStore("npy", ["a", "b"], [5, 4], [a, b].__getitem__, 9)
      >>> store.read(3, 7), len(store)
      (array([3, 4, 5, 6], dtype=int32), 9)
    """
    if not 0 <= start <= stop <= len(self):
      raise IndexError(f"token range [{start}, {stop}) outside [0, {len(self)}).")
    out, pos = [], start
    while pos < stop:
      i = int(np.searchsorted(self._offsets, pos, side="right")) - 1
      base, end = int(self._offsets[i]), int(self._offsets[i + 1])
      out.append(np.asarray(self._segment(i)[pos - base:min(stop, end) - base], dtype=np.int32))
      pos = min(stop, end)
    return np.concatenate(out) if len(out) != 1 else out[0]


def open_tokens(source, model_vocab_size: int | None = None) -> TokenStore:
  """Maps ``source`` (a file or a shard directory, see the module docstring) and checks it.

  Args:
    source: the path.
    model_vocab_size: the model's vocabulary; every id must be below it. Without it,
      ``.npy`` / int32 data has vocabulary (largest id + 1); text and bytes have 256.

  Returns:
    A :class:`TokenStore`.

  Raises:
    FileNotFoundError: nothing at ``source``.
    ValueError: one line naming ``DataConfig.source``: an empty, unreadable or non-UTF-8
      file, a non-integer or non-1-D array, ids < 0 or >= the vocabulary, an empty
      directory or one mixing kinds or dtypes.

  Examples:
    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "ids.npy")
    >>> np.save(path, np.arange(10, dtype=np.int16))
    >>> store = open_tokens(path)
    >>> store.kind, len(store), store.vocab_size, type(store.segments[0]).__name__
    ('npy', 10, 10, 'memmap')
  """
  path = pathlib.Path(source)
  if not path.exists():
    raise FileNotFoundError(f"DataConfig.source: no such file {_name(path)} ({_HINT}).")
  if path.is_dir():
    return _open_directory(path, model_vocab_size)
  if not path.is_file():
    raise ValueError(f"DataConfig.source: {_name(path)} is not a regular file or directory ({_HINT}).")
  if path.suffix.lower() == ".npy":
    ids = _map_npy(path)
    return _store("npy", [path], [ids], _check_ids(_pieces([ids], [path]), model_vocab_size))
  data = _map_text(path, model_vocab_size)
  return _store("text", [path], [data], 256)


def _store(kind, paths, arrays, vocab) -> TokenStore:
  return TokenStore(kind, paths, [a.size for a in arrays], arrays.__getitem__, vocab, arrays)


def _map_npy(path: pathlib.Path) -> np.ndarray:
  """A 1-D integer ``.npy``, memory-mapped (not read)."""
  try:
    ids = np.load(path, mmap_mode="r", allow_pickle=False)
  except Exception as e:  # noqa: BLE001 - any failure to parse is one clear error
    raise ValueError(
        f"DataConfig.source: cannot read {_name(path)} as .npy ({type(e).__name__}:"
        f" {str(e).splitlines()[0] if str(e) else ''}).") from None
  if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(
        f"DataConfig.source: {_name(path)} must hold a 1-D integer array of token ids, got"
        f" shape {ids.shape} dtype {ids.dtype}.")
  if ids.size == 0:
    raise ValueError(f"DataConfig.source: {_name(path)} is empty (no tokens).")
  return ids


def _chunks(n: int):
  return ((a, min(a + _CHUNK, n)) for a in range(0, n, _CHUNK))


def _pieces(arrays, paths):
  """(chunk, path) pairs over the arrays, at most ``_CHUNK`` tokens each."""
  for ids, path in zip(arrays, paths):
    for a, b in _chunks(ids.size):
      yield ids[a:b], path


def _check_ids(pieces, model_vocab_size: int | None, *, byte: bool = False) -> int:
  """Checks every id in ``[0, vocab)``; returns vocab (256 for bytes, the model's, or largest + 1)."""
  limit = model_vocab_size if model_vocab_size is not None else _MAX_ID + 1
  high = -1
  for chunk, path in pieces:
    if not chunk.size:
      continue
    if int(chunk.min()) < 0:
      raise ValueError(f"DataConfig.source: {_name(path)} has token id {int(chunk.min())} < 0.")
    high = max(high, int(chunk.max()))
    if high >= limit and byte:
      raise ValueError(
          f"DataConfig.source: {_name(path)} has byte token {high} outside the model vocabulary"
          f" [0, {limit}); byte-level text needs vocab_size 256.")
    if high >= limit:
      raise ValueError(
          f"DataConfig.source: {_name(path)} has token id {high} outside the model vocabulary"
          f" [0, {limit}).")
  return 256 if byte else limit if model_vocab_size is not None else high + 1


def _map_text(path: pathlib.Path, model_vocab_size: int | None) -> np.ndarray:
  """The bytes of a UTF-8 text file, memory-mapped, as token ids (vocabulary 256)."""
  try:
    size = path.stat().st_size
    data = np.memmap(path, dtype=np.uint8, mode="r") if size else None
  except OSError as e:
    raise ValueError(f"DataConfig.source: cannot read {_name(path)} ({e.strerror}).") from None
  if data is None:
    raise ValueError(f"DataConfig.source: {_name(path)} is empty (no tokens).")
  carry = b""
  for a, b in _chunks(size):
    buf = carry + data[a:b].tobytes()
    try:
      _, used = codecs.utf_8_decode(buf, "strict", b == size)
    except UnicodeDecodeError as e:
      raise ValueError(
          f"DataConfig.source: {_name(path)} is not valid UTF-8 text (byte {a - len(carry) + e.start}:"
          f" {e.reason}); save it as UTF-8 or pass token ids as .npy.") from None
    carry = buf[used:]
  if model_vocab_size is not None and model_vocab_size < 256:
    _check_ids(_pieces([data], [path]), model_vocab_size, byte=True)
  return data


def _shard_kind(name: str) -> str | None:
  lower = name.lower()
  if lower.endswith(".bytes.array_record"):
    return "bytes-records"
  if lower.endswith(".array_record"):
    return "array_record"
  return "npy-shards" if lower.endswith(".npy") else None


def _open_directory(path: pathlib.Path, model_vocab_size: int | None) -> TokenStore:
  """A directory of ``.npy`` or ArrayRecord shards of one kind and dtype."""
  files = sorted(p for p in path.iterdir() if not p.name.startswith("."))
  if not files:
    raise ValueError(f"DataConfig.source: directory {_name(path)} is empty ({_HINT}).")
  kinds = {p.name: _shard_kind(p.name) if p.is_file() else None for p in files}
  other = [n for n, k in kinds.items() if k is None]
  if other:
    raise ValueError(
        f"DataConfig.source: directory {_name(path)} holds {other[0]!r}, not a shard; a shard"
        " directory holds only *.npy or only *.array_record files.")
  found = sorted(set(kinds.values()))
  if "npy-shards" in found and len(found) > 1:
    raise ValueError(
        f"DataConfig.source: directory {_name(path)} mixes file kinds (.npy and .array_record);"
        " a shard directory holds only *.npy or only *.array_record files.")
  if len(found) > 1:
    raise ValueError(
        f"DataConfig.source: directory {_name(path)} mixes dtypes: int32 records (*.array_record)"
        " and byte records (*.bytes.array_record); use one of them.")
  if found == ["npy-shards"]:
    arrays = [_map_npy(p) for p in files]
    dtypes = sorted({str(a.dtype) for a in arrays})
    if len(dtypes) > 1:
      raise ValueError(
          f"DataConfig.source: directory {_name(path)} mixes dtypes {dtypes}; save every .npy"
          " shard with one integer dtype.")
    return _store("npy-shards", files, arrays, _check_ids(_pieces(arrays, files), model_vocab_size))
  return _open_records(path, files, found[0], model_vocab_size)


def _open_records(path, files, kind: str, model_vocab_size: int | None) -> TokenStore:
  """ArrayRecord shards through Grain's ``ArrayRecordDataSource``: one pass for lengths and ids."""
  import grain  # noqa: PLC0415 - only ArrayRecord directories need the reader

  try:
    source = grain.sources.ArrayRecordDataSource([str(p) for p in files])
  except Exception as e:  # noqa: BLE001 - a damaged shard is one clear error
    raise ValueError(f"DataConfig.source: cannot read {_name(path)} as ArrayRecord shards"
                     f" ({type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}).") from None
  dtype = np.uint8 if kind == "bytes-records" else np.dtype("<i4")

  def record(i: int) -> np.ndarray:
    raw = source[i]
    if len(raw) % np.dtype(dtype).itemsize:
      raise ValueError(f"DataConfig.source: record {i} of {_name(path)} has {len(raw)} bytes, not"
                       " a whole number of int32 token ids (4 bytes each, little-endian).")
    return np.frombuffer(raw, dtype=dtype)

  lengths = []

  def pieces():
    for i in range(len(source)):
      tokens = record(i)
      lengths.append(tokens.size)
      yield tokens, path

  vocab = _check_ids(pieces(), model_vocab_size, byte=kind == "bytes-records")
  if sum(lengths) == 0:
    raise ValueError(f"DataConfig.source: directory {_name(path)} is empty (no tokens).")
  return TokenStore(kind, files, lengths, record, vocab)
