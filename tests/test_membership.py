"""Elastic membership over JAX's coordination service, with real processes: one is killed in
the middle of a transfer, the others go on without it after a bounded wait, a replacement
rejoins and is healed from a live peer, and every value equals a replay of the recorded
membership bit for bit."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from diloco_core.launch import supervisor as launch
from diloco_core.runtime.agreement import Agreement
from elastic_child import HEAL_DELAY
from tiny_run import ENV, TESTS

HEARTBEAT_S = 5
DIE_AT = 3


def test_an_agreement_names_its_leader_and_mask():
  a = Agreement("sync-1", members=(1, 2), joined=(0,), lost=(0,), payloads={}, incarnations={0: 5, 1: 6, 2: 7})
  assert a.leader == 1
  assert a.present(3).tolist() == [0.0, 1.0, 1.0]


def _spawn(coordinator, rank, *extra):
  return subprocess.Popen([sys.executable, os.path.join(TESTS, "elastic_child.py"), coordinator, "3", str(rank),
                           str(HEARTBEAT_S), *map(str, extra)], env=ENV, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)


def _rows(out: str) -> list[dict]:
  return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


class _Reader:
  """A child's stdout lines, read on a thread (the test watches them while it runs)."""

  def __init__(self, proc):
    self.proc, self.lines = proc, []
    self.thread = threading.Thread(target=lambda: self.lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    self.thread.start()

  def rows(self) -> list[dict]:
    return _rows("".join(self.lines))


@pytest.fixture(scope="module")
def elastic_run():
  coordinator = f"127.0.0.1:{launch.free_port()}"
  procs = [_spawn(coordinator, 0), _spawn(coordinator, 1), _spawn(coordinator, 2, DIE_AT)]
  readers = [_Reader(p) for p in procs]
  try:
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # the others go on without process 2 for two syncs first
      rows = readers[0].rows()
      lost = [i for i, r in enumerate(rows) if r.get("lost")]
      if lost and len(rows) > lost[0] + 2:
        break
      time.sleep(0.1)
    procs.append(_spawn(coordinator, 2))
    readers.append(_Reader(procs[-1]))
    for p in procs:
      p.wait(timeout=300)
  finally:
    for p in procs:
      if p.poll() is None:
        p.kill()
  for r in readers:
    r.thread.join(timeout=10)
  codes = [p.returncode for p in procs]
  assert codes == [0, 0, -signal.SIGKILL, 0], (codes, [p.stderr.read()[-2000:] for p in procs])
  return dict(zip(["0", "1", "killed", "new"], [r.rows() for r in readers]))


@pytest.mark.slow
def test_a_killed_process_is_left_out_after_a_bounded_wait(elastic_run):
  for rank in "01":
    rows = {r["key"]: r for r in elastic_run[rank]}
    for k in range(DIE_AT):
      assert rows[f"sync-{k}"]["members"] == [0, 1, 2]
    lost = rows[f"sync-{DIE_AT}"]  # process 2 put its payload, then died: left out, its payload ignored
    assert (lost["members"], lost["lost"], lost["joined"]) == ([0, 1], [2], [])
    assert lost["waited"] < 6 * HEARTBEAT_S  # bounded by the heartbeat (slack for a loaded CI machine)
  assert [r["key"] for r in elastic_run["killed"]] == [f"sync-{k}" for k in range(DIE_AT)]


@pytest.mark.slow
def test_a_replacement_rejoins_is_healed_and_counts_again(elastic_run):
  rows0 = {r["key"]: r for r in elastic_run["0"]}
  joins = [r for r in elastic_run["0"] if r["joined"]]
  assert len(joins) == 1 and joins[0]["joined"] == [2] and joins[0]["members"] == [0, 1]
  j = int(joins[0]["key"].split("-")[1])
  h = j + HEAL_DELAY  # the leader sends the heal after sync h; the replacement counts from h + 1
  for k in range(j + 1, h + 1):  # meanwhile it takes part in the barriers with nothing
    assert rows0[f"sync-{k}"]["members"] == [0, 1] and rows0[f"sync-{k}"]["joined"] == []
  healed, *after = elastic_run["new"]
  assert healed["key"] == f"sync-{h + 1}" and healed["healed"] == rows0[f"sync-{h}"]["x"]  # bit for bit
  assert [r["key"] for r in after] == [f"sync-{k}" for k in range(h + 1, h + 4)]
  for r in after:  # it counts in the average again, and every process holds the same values
    assert r["members"] == [0, 1, 2] and r["x"] == rows0[r["key"]]["x"] == {q["key"]: q for q in elastic_run["1"]}[r["key"]]["x"]


@pytest.mark.slow
def test_every_value_equals_a_replay_of_the_recorded_membership(elastic_run):
  x = np.zeros(4)
  for row in elastic_run["0"]:
    k = int(row["key"].split("-")[1])
    x = np.mean([x + (r + 1) * k for r in row["members"]], axis=0)
    assert x.tobytes().hex() == row["x"], row["key"]


class _Store:
  """An in-memory stand-in for the coordination service's client (its key-value store and
  membership barrier), for the replacement's side in one process."""

  def __init__(self, live):
    self.kv, self.live, self.barriers = {}, live, 0

  def key_value_set(self, key, value, allow_overwrite=False):
    self.kv[key] = value.encode()

  def key_value_set_bytes(self, key, value, allow_overwrite=False):
    self.kv[key] = bytes(value)

  def key_value_try_get_bytes(self, key):
    if key not in self.kv:
      raise RuntimeError("NOT_FOUND")
    return self.kv[key]

  def blocking_key_value_get_bytes(self, key, timeout_ms):
    deadline = time.time() + timeout_ms / 1000
    while key not in self.kv:
      if time.time() > deadline:
        raise RuntimeError(f"DEADLINE_EXCEEDED {key}")
      time.sleep(0.01)
    return self.kv[key]

  def key_value_delete(self, key):
    self.kv.pop(key, None)

  def get_live_nodes(self, processes):
    self.barriers += 1
    return dict(self.live)


def test_a_replacement_takes_part_on_a_thread_until_its_heal():
  """The leader names two agreements, then the heal: the replacement's thread takes part in both
  with an empty payload (no contribution) and heal() gives the leader's data and the key of its
  first agreement as a member; its readiness is a key of its own incarnation."""
  from diloco_core.runtime.data_plane import DataPlane
  from diloco_core.runtime.membership import Membership, PREFIX
  from diloco_core.runtime.agreement import frame as _frame
  store = _Store({0: 41})
  store.kv[f"{PREFIX}/started"] = b"1"
  m = Membership(client=store)
  m.enter()
  assert m.rejoined and m.incarnation == 41
  m.start_waiting_for_heal(timeout_s=60)
  for n, key in enumerate(("rows-3", "fragment 1 @ step 14")):
    store.kv[f"{PREFIX}/status/0/41/{n}"] = f"key:{key}".encode()
    store.blocking_key_value_get_bytes(f"{PREFIX}/{key}/0", 60_000)  # it took part...
    assert store.kv[f"{PREFIX}/{key}/0"] == b""  # ...with nothing
  leader_plane = DataPlane(1, 3, store.kv[f"{PREFIX}/plane/token"])  # the heal crosses the data plane
  leader_plane.set_peers({0: (41, m.plane.address)})
  m.plane.set_peers({1: (3, leader_plane.address)})
  assert leader_plane.send("heal/0/41", _frame("fragment 0 @ step 16", b"state"), to=[0]) == (0,)
  store.kv[f"{PREFIX}/status/0/41/2"] = b"heal"
  assert m.heal() == ("fragment 0 @ step 16", b"state")
  leader_plane.close()
  m.close()
  assert store.barriers == 3  # enter, then the two named agreements
  m.mark_ready()
  leader = Membership(client=store)
  leader.pending = {0: [41, 0]}
  assert leader.ready(0)
  leader.pending = {0: [42, 0]}  # a later incarnation of the same process: not ready yet
  assert not leader.ready(0)


def test_a_replacement_whose_run_ended_says_so():
  from diloco_core.runtime.membership import Membership, MembershipError, PREFIX
  store = _Store({0: 7})
  store.kv[f"{PREFIX}/started"] = b"1"
  m = Membership(client=store)
  m.enter()
  m.start_waiting_for_heal(timeout_s=60)
  store.kv[f"{PREFIX}/status/0/7/0"] = b"ended"
  with pytest.raises(MembershipError, match="the run ended before this replacement could join it"):
    m.heal()
  m.close()


def test_the_path_probe_times_the_data_plane_beside_the_service_and_gloo(capsys):
  """``diloco_core.launch.path_probe`` under the launcher (path_benchmark): two processes joined as
  an elastic run's, one payload each over the data plane, through the coordination service and
  through gloo, and its mean over the data plane and over gloo; the table has all five and their
  ratios, and a bad size or path is one line before anything starts."""
  from analysis.lab.elastic_measured import path_benchmark
  from diloco_core.launch import path_probe
  from diloco_core.runtime.data_plane import CHUNK_BYTES
  from diloco_core.runtime.elastic import HEARTBEAT_S as ELASTIC_HEARTBEAT_S
  table, result = path_benchmark((1, 2), repeats=1)
  assert table["size_mib"].tolist() == [1.0, 2.0]
  assert (table[[f"{p}_{x}" for p in path_probe.PATHS for x in ("s", "mb_s")]] > 0).all().all()
  assert (table[["elastic_over_gloo", "elastic_over_service", "elastic_reduce_over_gloo_reduce"]] > 0).all().all()
  assert result["processes"] == 2 and result["heartbeat_s"] == ELASTIC_HEARTBEAT_S
  assert result["chunk_bytes"] == CHUNK_BYTES
  assert path_probe.main(["--sizes-mib", "1,x", "--json", "o.json"]) == 2
  assert capsys.readouterr().err == ("error: --sizes-mib must be whole numbers of MiB >= 1 separated by commas"
                                     " (e.g. 1,4,16), got '1,x'.\n")
  assert path_probe.main(["--paths", "gloo,ring", "--json", "o.json"]) == 2
  assert capsys.readouterr().err == ("error: --paths must be some of elastic, service, gloo, elastic_reduce,"
                                     " gloo_reduce separated by commas, got 'gloo,ring'.\n")
