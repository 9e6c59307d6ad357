"""Local token files, read on demand: one text or ``.npy`` file, or a directory of shards.

Nothing is ever downloaded, and no file is loaded whole: :func:`open_tokens` opens the
file(s) and returns a :class:`TokenStore`, one flat stream of token ids that reads any
``[start, stop)`` range on demand. Text and ``.npy`` files are read with ``os.pread``
(:class:`FileSegment`), not memory-mapped: a file that shrinks while a run reads it is a
one-line :class:`DataChangedError`, where a memory map would kill the process with SIGBUS.
Four layouts (``DataConfig.source``):

* **a UTF-8 text file** (any name not ending in ``.npy``): its bytes are the tokens
  (vocabulary 256);
* **a 1-D integer ``.npy`` array** of token ids (its header parsed by ``np.load``);
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

:func:`identity` fingerprints a source (every file's name, size and SHA-256, of the whole
files when the source holds up to :data:`FULL_HASH_BYTES`, else of :data:`SAMPLE_BLOCKS`
blocks at fixed offsets):
checkpoints record it, and ``resume`` refuses a source that changed since.
"""

from __future__ import annotations

import codecs
import hashlib
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


class DataChangedError(OSError):
  """A data file changed (shrank, vanished, was replaced) while a run read it."""


class FileSegment:
  """``size`` items of ``dtype`` at byte ``offset`` of a file, read with ``os.pread`` on slicing.

  A read past the end of the file (it shrank after it was opened) raises
  :class:`DataChangedError`; a memory map would raise SIGBUS instead.

  Examples:
    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "t.bin")
    >>> _ = open(path, "wb").write(np.arange(6, dtype="<i4").tobytes())
    >>> seg = FileSegment(path, "<i4", 4, 5)  # skip the first id
    >>> seg[1:3].tolist(), seg.size, len(seg)
    ([2, 3], 5, 5)
    >>> os.truncate(path, 12)
    >>> seg[0:5]
    Traceback (most recent call last):
    ...
    diloco_core.data.files.DataChangedError: DataConfig.source: ... shrank to 12 bytes while the run read it (it had 24); restore it.
  """

  def __init__(self, path, dtype, offset: int, size: int):
    self.path, self.dtype = str(path), np.dtype(dtype)
    self.offset, self.size = int(offset), int(size)
    self.file_bytes = self.offset + self.size * self.dtype.itemsize  # what the file held when opened
    self._fd = os.open(self.path, os.O_RDONLY)

  def __len__(self) -> int:
    return self.size

  def __getitem__(self, key: slice) -> np.ndarray:
    start, stop, _ = key.indices(self.size)
    want = max(stop - start, 0) * self.dtype.itemsize
    buf = os.pread(self._fd, want, self.offset + start * self.dtype.itemsize) if want else b""
    if len(buf) < want:
      raise DataChangedError(
          f"DataConfig.source: {_name(self.path)} shrank to {os.fstat(self._fd).st_size} bytes while"
          f" the run read it (it had {self.file_bytes}); restore it.")
    return np.frombuffer(buf, self.dtype)

  def __del__(self):
    fd = getattr(self, "_fd", None)
    if fd is not None:
      os.close(fd)


class TokenStore:
  """One stream of token ids over several segments (files or records), read on demand.

  Attributes:
    kind: ``"text"``, ``"npy"``, ``"npy-shards"``, ``"array_record"`` or ``"bytes-records"``.
    paths: the files, in stream order.
    segments: the :class:`FileSegment` of each text or ``.npy`` file; empty for ArrayRecord.
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

  def check_unchanged(self) -> None:
    """Raises :class:`DataChangedError` when a file of the store vanished or changed size
    since it was opened (one ``stat`` per file; the run checks at every log row)."""
    for seg in self.segments:
      try:
        size = os.stat(seg.path).st_size
      except FileNotFoundError:
        raise DataChangedError(f"DataConfig.source: {_name(seg.path)} vanished while the run read it;"
                               " restore it.") from None
      if size != seg.file_bytes:
        raise DataChangedError(f"DataConfig.source: {_name(seg.path)} changed size while the run read"
                               f" it ({seg.file_bytes} -> {size} bytes); restore it.")

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
    ('npy', 10, 10, 'FileSegment')
  """
  path = _existing(source)
  if path.is_dir():
    return _open_directory(path, model_vocab_size)
  if not path.is_file():
    raise ValueError(f"DataConfig.source: {_name(path)} is not a regular file or directory ({_HINT}).")
  if path.suffix.lower() == ".npy":
    ids = _map_npy(path)
    return _store("npy", [path], [ids], _check_ids(_pieces([ids], [path]), model_vocab_size))
  data = _map_text(path, model_vocab_size)
  return _store("text", [path], [data], 256)


def _existing(source) -> pathlib.Path:
  path = pathlib.Path(source)
  if not path.exists():
    raise FileNotFoundError(f"DataConfig.source: no such file {_name(path)} ({_HINT}).")
  return path


def _store(kind, paths, arrays, vocab) -> TokenStore:
  return TokenStore(kind, paths, [a.size for a in arrays], arrays.__getitem__, vocab, arrays)


def _map_npy(path: pathlib.Path) -> FileSegment:
  """A 1-D integer ``.npy`` as a :class:`FileSegment` (its header parsed, no id read)."""
  try:
    ids = np.load(path, mmap_mode="r", allow_pickle=False)  # parses the header; the map is never read
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
  segment = FileSegment(path, ids.dtype, ids.offset, ids.size)
  ids._mmap.close()
  return segment


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


def _map_text(path: pathlib.Path, model_vocab_size: int | None) -> FileSegment:
  """The bytes of a UTF-8 text file as token ids (vocabulary 256), a :class:`FileSegment`."""
  try:
    size = path.stat().st_size
    data = FileSegment(path, np.uint8, 0, size) if size else None
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
  files = _listing(path)
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
    arrays = [_map_npy(p) for p in files]  # FileSegments
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


def _listing(path: pathlib.Path) -> list[pathlib.Path]:
  """The files of a shard directory, in stream order (hidden files are ignored)."""
  return sorted(p for p in path.iterdir() if not p.name.startswith("."))


#: A source (all its files) up to this size is hashed whole by :func:`identity`.
FULL_HASH_BYTES = 64 << 20
#: A larger one: this many blocks of :data:`SAMPLE_BLOCK_BYTES` in all, shared by its files
#: (at least 2 each, evenly spaced, first and last included), and every file's size.
SAMPLE_BLOCKS = 64
#: Bytes of one sampled block.
SAMPLE_BLOCK_BYTES = 1 << 16


def _digest(path: pathlib.Path, size: int, blocks: int | None) -> tuple[str, str]:
  """(sha256 hex, "whole" or "sampled") of a file's contents: all of it (``blocks`` None), or
  ``blocks`` blocks of :data:`SAMPLE_BLOCK_BYTES` evenly spaced, first and last included."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    if blocks is None or size <= blocks * SAMPLE_BLOCK_BYTES:
      for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)
      return h.hexdigest(), "whole"
    last = size - SAMPLE_BLOCK_BYTES
    for i in range(blocks):
      f.seek(last * i // (blocks - 1))
      h.update(f.read(SAMPLE_BLOCK_BYTES))
  return h.hexdigest(), "sampled"


def identity(source) -> dict | None:
  """The fingerprint of a data source: None for ``"synthetic"`` (its config defines it), else
  every file's name, size and content hash (see the module docstring).

  Examples:
    >>> import tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "a.txt")
    >>> _ = open(path, "w").write("abc")
    >>> identity(path)["files"]
    [{'name': 'a.txt', 'size': 3, 'sha256': 'ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad', 'hashed': 'whole'}]
    >>> identity("synthetic") is None
    True
  """
  if str(source) == "synthetic":
    return None
  path = _existing(source)
  files = _listing(path) if path.is_dir() else [path]
  out = []
  try:
    sizes = [p.stat().st_size for p in files]
    # Whole files while the source is small; else a budget of SAMPLE_BLOCKS blocks shared by the
    # files (at least the first and last block of each).
    blocks = None if sum(sizes) <= FULL_HASH_BYTES else max(2, SAMPLE_BLOCKS // len(files))
    for p, size in zip(files, sizes):
      digest, how = _digest(p, size, blocks) if p.is_file() else ("", "not a file")
      out.append({"name": p.name, "size": size, "sha256": digest, "hashed": how})
  except OSError as e:
    raise ValueError(f"DataConfig.source: cannot read {_name(source)} ({e.strerror or e}).") from None
  return {"source": str(source), "files": out}


def identity_change(saved: dict | None, current: dict | None) -> str | None:
  """How ``current`` differs from ``saved`` (:func:`identity`), in words; None if it does not.

  Examples:
    >>> a = {"source": "d", "files": [{"name": "x.npy", "size": 8, "sha256": "1", "hashed": "whole"}]}
    >>> identity_change(a, a) is None
    True
    >>> identity_change(a, {"source": "d", "files": [dict(a["files"][0], size=4, sha256="2")]})
    'x.npy is 4 bytes, was 8'
  """
  if saved is None or current is None:
    return None if saved == current else "the source changed between synthetic and a file"
  old = {f["name"]: f for f in saved["files"]}
  new = {f["name"]: f for f in current["files"]}
  if list(old) != list(new):
    gone, added = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    return "; ".join([f"{', '.join(gone)} gone"] * bool(gone) + [f"{', '.join(added)} added"] * bool(added)
                     ) or "the shard order changed"
  for name, f in old.items():
    g = new[name]
    if g["size"] != f["size"]:
      return f"{name} is {g['size']} bytes, was {f['size']}"
    if g["sha256"] != f["sha256"]:
      return f"{name} has other contents (SHA-256 of {f['hashed']} file)"
  return None
