"""The trainer under ``python -m diloco_core.launch --module kill_child``, with one process
killed (SIGKILL, as ``kill -9`` or a lost host would) in the middle of a run.

Process ``KILL_RANK`` (environment; default 1) kills itself as it hands the fragment sent at
step ``KILL_AT_STEP`` (default 10) to its link (several: ``KILL_RANK=2,1 KILL_AT_STEP=6,12``): the other processes are then in that
fragment's all-reduce, or about to start it. It first writes the time to the file
``KILL_STAMP`` (if set). With ``KILL_AFTER_VOTE=1`` (a quorum run) it dies instead right after its
vote on that sync returned: it is a member of the round, whose payloads every member has read,
and the others learn of its loss only at their next agreement over every process. With
``KILL_MID_TRANSFER=1`` (an elastic run) it dies in the middle of sending that sync's payload over
the data plane: right after a chunk past the first went out (set ``DILOCO_PLANE_CHUNK_BYTES`` small
so that the payload spans several), after writing ``{"time", "offset", "total", "chunk"}`` to
``KILL_STAMP``; with ``--reduction reduce-scatter``, ``KILL_PHASE=/ag`` picks the all-gather of the
reduced chunks (``/rs``: the chunks of the rows). Every other process runs the trainer unchanged. Every process prints what is
left of its data plane as it leaves (``plane_leftovers``).
"""

import json
import os
import signal
import sys
import time


def _die(stamp_row=None):
  stamp = os.environ.get("KILL_STAMP")
  if stamp:
    with open(stamp, "w") as f:
      f.write(json.dumps(stamp_row) if stamp_row else repr(time.time()))
  os.kill(os.getpid(), signal.SIGKILL)


def main():
  from diloco_core.runtime import link
  from diloco_core.run.cli import main as train_main
  from plane_leftovers import report_at_leave
  report_at_leave()  # prints what is left of the data plane as it leaves
  kills = dict(zip(os.environ.get("KILL_RANK", "1").split(","), os.environ.get("KILL_AT_STEP", "10").split(",")))
  if os.environ["JAX_PROCESS_ID"] in kills:
    at = f"@ step {kills[os.environ['JAX_PROCESS_ID']]}"

    def or_die(job):
      def job_or_die(self, x, what, *args, **kwargs):
        if what.endswith(at):
          _die()
        return job(self, x, what, *args, **kwargs)
      return job_or_die

    if os.environ.get("KILL_AFTER_VOTE") == "1":
      vote = link.vote_exchange

      def vote_then_die(membership, key, *args, **kwargs):
        out = vote(membership, key, *args, **kwargs)
        if key.endswith(at):
          os.kill(os.getpid(), signal.SIGKILL)
        return out

      link.vote_exchange = vote_then_die
    elif os.environ.get("KILL_MID_TRANSFER") == "1":
      from diloco_core.runtime import data_plane, plane_frames
      send_chunk = data_plane.DataPlane._send_chunk

      def chunk_or_die(self, dealer, header, body):
        send_chunk(self, dealer, header, body)
        h = plane_frames.decode(header)
        sync, _, phase = h.key.partition("~")  # a reduce-scatter's keys: "<sync>~<attempt>/rs" or "/ag"
        if sync.endswith(at) and phase.endswith(os.environ.get("KILL_PHASE", "")) and h.offset > 0:  # part way
          time.sleep(0.05)  # the chunks sent so far reach the receiver
          _die({"time": time.time(), "offset": h.offset, "total": h.total, "chunk": self.chunk})

      data_plane.DataPlane._send_chunk = chunk_or_die
    else:
      link.Link.gather, link.Link.reduce = or_die(link.Link.gather), or_die(link.Link.reduce)
  sys.exit(train_main(sys.argv[1:]))


if __name__ == "__main__":
  main()
