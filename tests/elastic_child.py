"""One process of an elastic exchange (tests/test_membership.py): a toy run over
:class:`diloco_core.runtime.membership.Membership`, printed as one JSON line per sync.

Usage: ``python elastic_child.py COORDINATOR PROCESSES RANK HEARTBEAT [DIE_AT]``.

Each process holds ``x`` (float64 [4]). At sync k it sends ``x + (rank + 1) * k`` and sets
``x`` to the mean of the members' payloads (in process order); the leader sends ``x`` to the
processes that joined, HEAL_DELAY syncs later (it counts from the next sync on). A process given ``DIE_AT`` kills itself (SIGKILL) at sync DIE_AT after
it put its payload, before the barrier: killed in the middle of a transfer. A replacement (the
same RANK started again) enters, takes the leader's ``x`` and goes on. Every process stops
HEAL_DELAY + 3 syncs after the first join (or at sync 400).
"""

import json
import os
import signal
import sys
import time

import numpy as np

#: Syncs the leader lets pass after a join before it sends the heal (the replacement takes part
#: in them with nothing).
HEAL_DELAY = 2


def main():
  coordinator, processes, rank, heartbeat = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
  die_at = int(sys.argv[5]) if len(sys.argv) > 5 else None
  from diloco_core.runtime import membership
  from diloco_core.devices import processes as procs
  procs.initialize_distributed(coordinator, processes, rank, join_timeout=120, elastic_heartbeat=heartbeat)

  class Dying(membership.Membership):
    def _barrier(self):
      if self._last_key is not None and die_at is not None and self._pending == f"sync-{die_at}":
        os.kill(os.getpid(), signal.SIGKILL)  # the payload is put; the others are in the barrier
      return super()._barrier()

    def exchange(self, key, payload):
      self._pending = key
      return super().exchange(key, payload)

  link = Dying()
  link._pending = None
  entered = link.enter()
  say = lambda **row: print(json.dumps({"rank": rank, **row}), flush=True)
  x, k, stop, joined_at = np.zeros(4), 0, 400, None
  if link.rejoined:  # take part with nothing until the leader's heal comes with the next agreement
    key, data = link.wait_for_heal()
    x, k = np.frombuffer(data, np.float64).copy(), int(key.split("-")[1])
    stop = k + 2
    say(key=key, healed=x.tobytes().hex(), members=list(entered.members))
  while k <= stop:
    start = time.monotonic()
    a = link.exchange(f"sync-{k}", (x + (rank + 1) * k).tobytes())
    waited = time.monotonic() - start
    x = np.mean([np.frombuffer(a.payloads[r], np.float64) for r in a.members], axis=0)
    if a.joined and stop == 400:
      joined_at, stop = k, k + HEAL_DELAY + 3
    for r in list(link.pending):  # the leader, HEAL_DELAY syncs after the join: the heal goes with the next one
      if k >= joined_at + HEAL_DELAY:
        link.send_heal(r, x.tobytes())
    say(key=a.key, members=list(a.members), joined=list(a.joined), lost=list(a.lost), x=x.tobytes().hex(),
        waited=waited)
    k += 1
    time.sleep(0.2)
  if rank == 0:
    time.sleep(2)  # process 0 hosts the coordination service: the others leave first
  sys.stdout.flush()
  os._exit(0)


if __name__ == "__main__":
  main()
