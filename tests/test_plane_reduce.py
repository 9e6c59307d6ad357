"""The elastic reduce-scatter over the data plane (diloco_core.runtime.plane_reduce), with three
processes as threads of this one: real data planes, an in-memory coordination service whose
barrier waits for every live process. What each member receives is the runtimes' masked mean,
bit for bit, at the bytes of a ring all-reduce; a member lost mid-sync is retried without.
(Over real processes, with the run replayed in-step: test_elastic.py.)"""

import threading
import time

import jax.numpy as jnp
import numpy as np
import pytest

from diloco_core.algorithm.phases import present_mean
from diloco_core.runtime.background_programs import local_mean
from diloco_core.runtime.membership import Membership
from diloco_core.runtime.plane_reduce import reduce_over_members
from diloco_core.wire import compression, reduce_scatter
from diloco_core.wire.packing import WireLayout


class _Service:
  """The coordination service's key-value store (create-only honoured) and a barrier over the
  live processes; :meth:`kill` removes one, as a missed heartbeat does."""

  def __init__(self, processes):
    self.kv, self.live, self.arrived, self.generation = {}, {r: 10 + r for r in range(processes)}, set(), 0
    self.cond = threading.Condition()

  def client(self, rank):
    service = self

    class Client:
      def key_value_set(self, key, value, allow_overwrite=False):
        self.key_value_set_bytes(key, value.encode(), allow_overwrite)

      def key_value_set_bytes(self, key, value, allow_overwrite=False):
        with service.cond:
          if key in service.kv and not allow_overwrite:
            raise RuntimeError("ALREADY_EXISTS")
          service.kv[key] = bytes(value)
          service.cond.notify_all()

      def key_value_try_get_bytes(self, key):
        with service.cond:
          if key not in service.kv:
            raise RuntimeError("NOT_FOUND")
          return service.kv[key]

      def blocking_key_value_get_bytes(self, key, timeout_ms):
        with service.cond:
          if not service.cond.wait_for(lambda: key in service.kv, timeout_ms / 1000):
            raise RuntimeError(f"DEADLINE_EXCEEDED {key}")
          return service.kv[key]

      def key_value_delete(self, key):
        with service.cond:
          service.kv.pop(key, None)

      def get_live_nodes(self, processes):
        with service.cond:
          generation = service.generation
          service.arrived.add(rank)
          service._release()
          service.cond.wait_for(lambda: service.generation != generation, 60)
          return dict(service.last)
    return Client()

  def _release(self):
    if self.arrived >= set(self.live):
      self.arrived, self.last = set(), dict(self.live)
      self.generation += 1
      self.cond.notify_all()

  def kill(self, rank):
    with self.cond:
      self.live.pop(rank)
      self.arrived.discard(rank)
      self._release()


def _members(service, n, chunk=None):
  out = []
  for r in range(n):
    m = Membership(client=service.client(r), payload_timeout_s=20, chunk=chunk)
    m.rank, m.processes = r, n
    out.append(m)
  threads = [threading.Thread(target=m.enter) for m in out]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  return out


def _run(service, members, rows, layout, die=None):
  """Each member's ``reduce_over_members`` on a thread; ``die``: a rank that is lost as it starts
  the all-gather (its plane closed, the service told), after the owners took its rows."""
  out = {}

  def go(m):
    if m.rank == die:
      send_each = m.send_each

      def send_or_die(key, payloads):
        if key.endswith("/ag"):
          m.close()
          service.kill(m.rank)
          raise SystemExit
        return send_each(key, payloads)
      m.send_each = send_or_die
    try:
      out[m.rank] = reduce_over_members(m, "fragment 0 @ step 4", rows[m.rank][None], layout, len(members))
    except SystemExit:
      pass
  threads = [threading.Thread(target=go, args=(m,)) for m in members]
  for t in threads:
    t.start()
  for t in threads:
    t.join(120)
  for m in members:
    m.close()
  return out


def _expected(rows, present, layout):
  mean = present_mean([jnp.asarray(rows)], jnp.asarray(present), len(rows), local_mean)
  return np.asarray(compression.quantize(mean[0], layout.name, block_size=layout.block_size))


@pytest.mark.parametrize("name,block", [("none", None), ("fp4", 4)])
def test_every_member_gets_the_masked_mean_at_the_bytes_of_a_ring(name, block):
  """Three members, one replica each, a payload of 10 values (fp4: blocks of 4, so the chunks
  are cut 4/4/2... on block boundaries): each gets the mean the in-step runtime computes, bit
  for bit, and moves the ring's bytes (reduce_scatter.traffic), no padding."""
  rng = np.random.default_rng(0)
  layout = WireLayout(sizes=(10,), name=name, block_size=block)
  rows = np.stack([np.asarray(compression.quantize(jnp.asarray(x, jnp.float32), name, block_size=block))
                   for x in rng.normal(size=(3, 10))])  # each replica's payload on the format's grid
  service = _Service(3)
  out = _run(service, _members(service, 3, chunk=8), rows, layout)
  want = _expected(rows, np.ones(3, np.float32), layout)
  plan = reduce_scatter.ChunkPlan(layout, 3)
  for r in range(3):
    mean, agreement, sent, received = out[r]
    assert mean.shape == (1, 10) and np.array_equal(mean[0], want), (r, mean, want)
    assert agreement.members == (0, 1, 2) and agreement.lost == ()
    assert (sent, received) == reduce_scatter.traffic(plan, r, 1)


def test_a_member_lost_mid_sync_is_left_out_and_the_rest_retry():
  """Process 2 is lost as the all-gather starts (it sent its rows to the owners; the others'
  takes of its reduced chunk give up as its connection drops): processes 0 and 1 agree to try
  again without it, and both get the mean over their own replicas, M / |S| = 3 / 2, the masked
  mean of a drop; the agreement names 2 lost."""
  rng = np.random.default_rng(1)
  layout = WireLayout(sizes=(6, 3), name="bf16")
  rows = np.asarray(jnp.asarray(rng.normal(size=(3, 9)), jnp.bfloat16).astype(jnp.float32))
  service = _Service(3)
  start = time.time()
  out = _run(service, _members(service, 3), rows, layout, die=2)
  assert time.time() - start < 15  # no wait ran to the plane's 20 s timeout
  assert sorted(out) == [0, 1]
  want = np.asarray(present_mean([jnp.asarray(rows)], jnp.asarray([1.0, 1.0, 0.0]), 3, local_mean)[0])
  want = np.concatenate([np.asarray(compression.quantize(jnp.asarray(want[:6]), "bf16")),
                         np.asarray(compression.quantize(jnp.asarray(want[6:]), "bf16"))])
  for r in (0, 1):
    mean, agreement, _, _ = out[r]
    assert np.array_equal(mean[0], want), (r, mean, want)
    assert agreement.members == (0, 1) and agreement.lost == (2,)
