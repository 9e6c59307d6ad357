"""The elastic data plane (diloco_core.runtime.data_plane) with real sockets in one process: a
payload crosses in many chunks bit for bit, a hostile client's messages are each dropped with
one line and never trusted, a killed receiver does not hold the sender, the plane listens on
its one address, and no socket or thread outlives it (after a run, and after a stop request)."""

import os
import threading
import time

import numpy as np
import pytest
import zmq

from diloco_core.runtime import plane_frames
from diloco_core.runtime.data_plane import DataPlane, PlaneTimeout, bind_host, chunk_bytes
from diloco_core.runtime.plane_frames import ACK, PAYLOAD, Header, encode
from plane_leftovers import leftovers

TOKEN = bytes(range(16))


def _none_left(before) -> bool:
  """Nothing a test started outlives it: the same sockets and Python threads as ``before``, and
  no more OS threads (a thread the runtime started earlier may end meanwhile: fewer is fine)."""
  now = _counts()
  return now[0] == before[0] and now[2] == before[2] and now[1] <= before[1]


def _counts() -> tuple[int, int, list[str]]:
  """Open sockets of this process, its OS threads, its Python threads' names."""
  fds = []
  for fd in os.listdir("/proc/self/fd"):
    try:
      fds.append(os.readlink(f"/proc/self/fd/{fd}"))
    except FileNotFoundError:  # the listing's own descriptor, closed by now
      pass
  tasks = len(os.listdir("/proc/self/task"))
  return sum(x.startswith("socket:") for x in fds), tasks, sorted(t.name for t in threading.enumerate())


def _pair(chunk=None):
  a, b = DataPlane(0, 5, TOKEN, chunk=chunk), DataPlane(1, 6, TOKEN, chunk=chunk)
  a.set_peers({1: (6, b.address)})
  b.set_peers({0: (5, a.address)})
  return a, b


class _Counting(DataPlane):
  def __init__(self, *args, **kwargs):
    super().__init__(*args, **kwargs)
    self.chunks = []

  def _send_chunk(self, dealer, header, body):
    self.chunks.append(plane_frames.decode(header).offset)
    super()._send_chunk(dealer, header, body)


def test_a_payload_crosses_in_many_chunks_bit_for_bit_and_nothing_outlives_the_planes():
  before = _counts()
  a = DataPlane(0, 5, TOKEN)
  b = _Counting(1, 6, TOKEN, chunk=1000)
  a.set_peers({1: (6, b.address)})
  b.set_peers({0: (5, a.address)})
  payload = np.random.default_rng(0).bytes(10_500)
  assert b.send("fragment 1 @ step 6", payload, to=[0]) == (0,)
  assert b.chunks == list(range(0, 10_500, 1000))  # 11 chunks, the last of 500 bytes
  assert bytes(a.take("fragment 1 @ step 6", 1, timeout_s=5)) == payload
  assert a.send("empty", b"", to=[1]) == (1,) and bytes(b.take("empty", 0, timeout_s=5)) == b""
  a.finish("late")  # a payload for a finished key is acknowledged, then dropped
  assert b.send("late", b"xyz", to=[0]) == (0,)
  with pytest.raises(PlaneTimeout, match="the payload of 'late' from process 1 did not arrive within 0.2 s"):
    a.take("late", 1, timeout_s=0.2)
  assert a.dropped == b.dropped == []
  assert leftovers()["zmq_threads"] >= 2 and leftovers()["plane_threads"] == 2  # what the run-level check counts
  a.close()
  b.close()
  a.close()  # idempotent
  assert _none_left(before) and leftovers() == {"zmq_threads": 0, "plane_threads": 0}


def test_a_stop_while_waiting_ends_the_wait_and_leaves_nothing_behind():
  before = _counts()
  a, b = _pair()
  errors = []

  def wait():
    try:
      a.take("fragment 0 @ step 4", 1, timeout_s=60)
    except PlaneTimeout as e:
      errors.append(str(e))
  waiter = threading.Thread(target=wait)
  waiter.start()
  time.sleep(0.2)
  start = time.monotonic()
  a.close()  # what an interrupted run's close does
  waiter.join(timeout=5)
  assert not waiter.is_alive() and time.monotonic() - start < 2
  assert errors and "did not arrive" in errors[0]
  b.close()
  assert _none_left(before)


def test_a_killed_receiver_does_not_hold_the_sender():
  """The receiver's socket closes (as a SIGKILL closes it): the sender's wait for its
  acknowledgement ends when the connection drops, long before its timeout."""
  a, b = _pair()
  assert b.send("sync-0", b"1" * 100, to=[0]) == (0,)
  a.close()
  start = time.monotonic()
  assert b.send("sync-1", b"2" * 100_000, to=[0], timeout_s=30) == ()
  assert time.monotonic() - start < 10
  assert b.send("sync-2", b"3", to=[0], timeout_s=30) == ()  # known gone: not waited for again
  b.close()


def _hostile(address, *frames):
  ctx = zmq.Context()
  s = ctx.socket(zmq.DEALER)
  s.setsockopt(zmq.LINGER, 1000)
  s.connect(address)
  s.send_multipart(list(frames))
  s.close()
  ctx.term()


def _header(**kw):
  fields = dict(token=TOKEN, kind=PAYLOAD, rank=1, incarnation=6, offset=0, length=4, total=4, key="sync-9")
  return encode(Header(**{**fields, **kw}))


@pytest.mark.parametrize("frames,reason", [
    ([b"GET / HTTP/1.1\r\n\r\n"], "a message of 1 frame(s) (a header and a body expected)"),
    ([b"junk" * 20, b"body"], "not a data plane header (magic b'junk')"),
    ([_header()[:30], b"body"], "a header of 30 bytes (at least 60)"),
    ([_header(token=bytes(16)), b"evil"], "a message that does not carry this run's token"),
    ([_header(rank=7), b"evil"], "a message from process 7, outside the current membership"),
    ([_header(incarnation=3), b"evil"], "a message from a stale incarnation of process 1 (3, now 6"),
    ([_header(length=100, total=100), b"half" * 12], "a truncated chunk from process 1 (48 of 100 bytes"),
    ([_header(kind=ACK), b""], "an acknowledgement sent to the receiving socket by process 1"),
    ([_header(offset=2), b"evil"], "a chunk of 4 bytes at byte 2 of a payload of 4 bytes"),
], ids=["one-frame", "other-protocol", "short-header", "token", "outsider", "stale", "truncated", "ack", "overrun"])
def test_a_hostile_message_is_dropped_with_one_line_and_never_trusted(frames, reason):
  lines = []
  a = DataPlane(0, 5, TOKEN, log=lines.append)
  b = DataPlane(1, 6, TOKEN)
  a.set_peers({1: (6, b.address)})
  b.set_peers({0: (5, a.address)})
  _hostile(a.address, *frames)
  deadline = time.monotonic() + 10
  while not lines and time.monotonic() < deadline:
    time.sleep(0.01)
  assert len(lines) == 1 and lines[0].startswith(f"data plane (process 0): dropped {reason}"), lines
  with pytest.raises(PlaneTimeout):  # nothing of it was kept
    a.take("sync-9", None, timeout_s=0.1)
  assert b.send("sync-10", b"good", to=[0]) == (0,)  # the plane goes on
  assert bytes(a.take("sync-10", 1, timeout_s=5)) == b"good" and lines == a.dropped and len(lines) == 1
  a.close()
  b.close()


def test_the_plane_listens_on_its_one_address_only():
  a = DataPlane(0, 1, TOKEN, host=bind_host("127.0.0.1:1234", {}))
  host, port = a.address.removeprefix("tcp://").rsplit(":", 1)
  listening = []
  with open("/proc/net/tcp") as f:
    for line in f.readlines()[1:]:
      local, state = line.split()[1], line.split()[3]
      if state == "0A" and int(local.split(":")[1], 16) == int(port):  # 0A: LISTEN
        listening.append(local.split(":")[0])
  assert host == "127.0.0.1" and listening == ["0100007F"]  # 127.0.0.1, not 0.0.0.0
  a.close()


def test_a_bad_chunk_size_is_one_line():
  assert chunk_bytes({"DILOCO_PLANE_CHUNK_BYTES": " 256 "}) == 256
  for bad in ("0", "-4", "4k", ""):
    with pytest.raises(ValueError, match=r"^DILOCO_PLANE_CHUNK_BYTES must be a whole number of bytes >= 1"):
      chunk_bytes({"DILOCO_PLANE_CHUNK_BYTES": bad})
