"""The frames of the elastic data plane: a fixed header that names the run, the sender and the round.

Every message of :mod:`~diloco_core.runtime.data_plane` is two ZeroMQ frames: a header
(:func:`encode`) and the bytes it describes (a chunk of a payload, or nothing for an
acknowledgement). The header is little-endian, :data:`HEADER` followed by the key:

======== ======= ==========================================================================
field    bytes   meaning
======== ======= ==========================================================================
magic    4       ``b"DLPL"``
version  1       :data:`VERSION`
token    16      the run's identity: random bytes the first process put in the coordination
                 service (:func:`~diloco_core.runtime.data_plane.run_token`); a process outside
                 the run does not know it
kind     1       :data:`PAYLOAD` (a chunk) or :data:`ACK` (the whole payload arrived)
rank     4       the sender's process
incarn.  8       the sender's incarnation (the coordination service's, changed by a restart)
offset   8       where the chunk starts in the payload (bytes)
length   8       the chunk's bytes (the body frame must have exactly these)
total    8       the payload's bytes
key      2 + n   the agreement's key (UTF-8, at most :data:`MAX_KEY` bytes)
======== ======= ==========================================================================

:func:`decode` checks the structure only (a :class:`FrameError` for anything else); whether the
token, the sender and its incarnation belong to the run is the data plane's check.

Examples:
  >>> token = bytes(16)
  >>> raw = encode(Header(token, PAYLOAD, rank=1, incarnation=7, offset=4, length=6, total=10,
  ...                    key="sync-3"))
  >>> decode(raw).key, decode(raw).offset, len(raw) == HEADER.size + 6
  ('sync-3', 4, True)
  >>> decode(raw[:20])
  Traceback (most recent call last):
  ...
  diloco_core.runtime.plane_frames.FrameError: a header of 20 bytes (at least 60)
"""

from __future__ import annotations

import dataclasses
import struct

#: The first bytes of every header.
MAGIC = b"DLPL"
#: The header's version (a change of layout changes it).
VERSION = 1
#: A chunk of a payload.
PAYLOAD = 1
#: The receiver holds the whole payload.
ACK = 2
#: Bytes of a key, at most.
MAX_KEY = 512
#: The fixed part of the header (the key's length is its last field; the key follows).
HEADER = struct.Struct("<4sB16sBIQQQQH")


class FrameError(ValueError):
  """A header that is not one of the data plane's (truncated, another protocol, a bad field)."""


@dataclasses.dataclass(frozen=True)
class Header:
  """One message's header (the module docstring's table)."""

  token: bytes
  kind: int
  rank: int
  incarnation: int
  offset: int
  length: int
  total: int
  key: str


def encode(h: Header) -> bytes:
  """The header's bytes (see the module docstring)."""
  key = h.key.encode()
  if len(key) > MAX_KEY:
    raise ValueError(f"a data plane key is at most {MAX_KEY} bytes, got {len(key)} ({h.key[:40]!r}...).")
  return HEADER.pack(MAGIC, VERSION, h.token, h.kind, h.rank, h.incarnation, h.offset, h.length, h.total, len(key)) + key


def decode(raw: bytes) -> Header:
  """The header in ``raw``, or :class:`FrameError` saying what is wrong with it.

  Examples:
    >>> decode(b"GET / HTTP/1.1" + bytes(60))
    Traceback (most recent call last):
    ...
    diloco_core.runtime.plane_frames.FrameError: not a data plane header (magic b'GET ')
  """
  if len(raw) < HEADER.size:
    raise FrameError(f"a header of {len(raw)} bytes (at least {HEADER.size})")
  magic, version, token, kind, rank, incarnation, offset, length, total, n = HEADER.unpack_from(raw)
  if magic != MAGIC:
    raise FrameError(f"not a data plane header (magic {magic!r})")
  if version != VERSION:
    raise FrameError(f"header version {version} (this process speaks {VERSION})")
  if kind not in (PAYLOAD, ACK):
    raise FrameError(f"message kind {kind} (known: {PAYLOAD} payload, {ACK} ack)")
  if len(raw) != HEADER.size + n or n > MAX_KEY:
    raise FrameError(f"a key of {n} bytes in a header of {len(raw)} bytes")
  if offset + length > total:
    raise FrameError(f"a chunk of {length} bytes at byte {offset} of a payload of {total} bytes")
  try:
    key = raw[HEADER.size:].decode()
  except UnicodeDecodeError:
    raise FrameError("a key that is not UTF-8") from None
  return Header(token, kind, rank, incarnation, offset, length, total, key)
