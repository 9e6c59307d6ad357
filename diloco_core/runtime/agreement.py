"""What the processes of an elastic run agree on at a barrier, and the service's few-byte values.

An :class:`Agreement` is what every live process reads after one barrier of the coordination
service (:mod:`~diloco_core.runtime.membership`): who counts, who joined, who was lost, and what
each put before it. The helpers below are the values a process puts in the service (a marker,
a framed heal) and the service calls that must not fail when a key is missing.

Examples:
  >>> agreement = Agreement("sync/4", members=(0, 2), joined=(1,), lost=(), payloads={0: b"a", 2: b"b"},
  ...                       incarnations={0: 7, 1: 9, 2: 8})
  >>> agreement.leader, agreement.present(3).tolist()
  (0, [1.0, 0.0, 1.0])
"""

from __future__ import annotations

import dataclasses
import struct

import numpy as np


@dataclasses.dataclass(frozen=True)
class Agreement:
  """What every live process agreed on at one sync.

  Attributes:
    key: the sync's name (the same on every process, e.g. ``"fragment 1 @ step 6"``).
    members: the processes whose payloads count (sorted): live, with the incarnation they had at
      the previous agreement.
    joined: live processes with a new incarnation: replacements that get the heal now and
      count from the next sync.
    lost: processes of the previous agreement that are gone (dead, or restarted: a restarted
      process is lost and joined at once).
    payloads: ``{process: bytes}`` of the members (empty for :meth:`~diloco_core.runtime.membership.Membership.enter`, and for a
      barrier alone, :meth:`~diloco_core.runtime.membership.Membership.agree`).
    incarnations: ``{process: incarnation}`` of every live process.
    markers: ``{process: bytes}``: what each live process with its previous incarnation put
      before the barrier (empty: it takes part without counting).
  """

  key: str
  members: tuple[int, ...]
  joined: tuple[int, ...]
  lost: tuple[int, ...]
  payloads: dict
  incarnations: dict
  markers: dict = dataclasses.field(default_factory=dict)

  @property
  def leader(self) -> int:
    """The member that sends the heal to the joiners (the lowest)."""
    return min(self.members)

  def present(self, processes: int) -> np.ndarray:
    """The float32 ``[processes]`` mask of the members (1 counts, 0 does not)."""
    mask = np.zeros(processes, np.float32)
    mask[list(self.members)] = 1.0
    return mask


def marker_of(payload: bytes) -> bytes:
  """What a process puts in the service for its payload: the length (8 bytes), or nothing.

  Examples:
    >>> marker_of(b""), marker_of(b"abc")
    (b'', b'\\x03\\x00\\x00\\x00\\x00\\x00\\x00\\x00')
  """
  return struct.pack("<Q", len(payload)) if len(payload) else b""


def try_get(client, key: str) -> bytes | None:
  """The value under ``key``, or None when there is none (the service raises NOT_FOUND)."""
  try:
    return client.key_value_try_get_bytes(key)
  except Exception:  # noqa: BLE001 - NOT_FOUND
    return None


def delete_key(client, key: str) -> None:
  try:
    client.key_value_delete(key)
  except Exception:  # noqa: BLE001 - already gone: nothing to free
    pass


def first_line(e: Exception) -> str:
  return (str(e).strip().splitlines() or [type(e).__name__])[0][:200]


def frame(key: str, data: bytes) -> bytes:
  """``key`` and ``data`` in one value: the key's length (4 bytes), the key, the data.

  Examples:
    >>> unframe(frame("fragment 0 @ step 4", b"xyz"))
    ('fragment 0 @ step 4', b'xyz')
  """
  k = key.encode()
  return struct.pack("<I", len(k)) + k + data


def unframe(raw: bytes) -> tuple[str, bytes]:
  (n,) = struct.unpack("<I", raw[:4])
  return raw[4:4 + n].decode(), raw[4 + n:]
