"""The reduction that scales (diloco_core.wire.reduce_scatter), its N processes played in one: the
chunks cut on scaling units, the mean equal to the in-step rule's, the bytes of a ring all-reduce."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from diloco_core import DiLoCoConfig

from diloco_core.wire import compression
from diloco_core.wire.reduce_scatter import ChunkPlan, assemble, reduce_owned, requantize_mean, scatter, traffic
from diloco_core.wire.packing import WireLayout

SIZES = (37, 5, 64, 1, 23)  # a fragment's leaves, of uneven sizes
LAYOUTS = {"none": WireLayout(SIZES, "none"), "bf16": WireLayout(SIZES, "bf16"),
           "fp4-per-leaf": WireLayout(SIZES, "fp4"), "fp8-blocks": WireLayout(SIZES, "fp8", block_size=8),
           "e3m0-blocks": WireLayout(SIZES, "e3m0", block_size=16)}


def _payloads(layout: WireLayout, replicas: int, seed: int = 0) -> np.ndarray:
  """Each replica's payload on the format's grid: Q(Δ_m), leaf by leaf, [M, n]."""
  x = np.random.default_rng(seed).normal(size=(replicas, layout.elements)).astype(np.float32)
  out, at = [], 0
  per_row = jax.jit(jax.vmap(lambda r: compression.quantize(r, layout.name, block_size=layout.block_size)))
  for n in layout.sizes:
    out.append(np.asarray(per_row(x[:, at:at + n])))
    at += n
  return np.concatenate(out, axis=1)


def _run(rows: np.ndarray, plan: ChunkPlan, local: int) -> np.ndarray:
  """The three phases over ``plan.parts`` processes holding ``local`` replicas each: every
  process's result (they must agree)."""
  n = plan.parts
  sent = [scatter(rows[r * local:(r + 1) * local], plan) for r in range(n)]
  reduced = [reduce_owned([sent[s][d] for s in range(n)], plan, d)[0] for d in range(n)]
  return assemble(reduced, plan)


@pytest.mark.parametrize("name, processes", [("none", 3), ("bf16", 7), ("fp4-per-leaf", 1), ("fp4-per-leaf", 7),
                                             ("fp8-blocks", 2), ("e3m0-blocks", 7)])
def test_the_mean_is_the_in_step_rule_whatever_the_number_of_processes(name, processes):
  """Q(mean of the payloads), exactly as requantize_mean computes it on the whole fragment (the
  in-step runtime's rule), for one to seven processes (seven: chunks of a part of one leaf, or
  empty where a scaled format has one scale per leaf)."""
  layout, local = LAYOUTS[name], 1 if processes > 2 else 2
  rows = _payloads(layout, processes * local)
  got = _run(rows, ChunkPlan(layout, processes), local)
  cfg = DiLoCoConfig(compression=name.split("-")[0], reduction="reduce-scatter",
                     compression_block=layout.block_size)
  at, leaves = 0, []
  for n in layout.sizes:
    leaves.append(jnp.mean(jnp.asarray(rows[:, at:at + n]), axis=0))
    at += n
  want = np.concatenate([np.asarray(x) for x in requantize_mean(leaves, cfg)])
  np.testing.assert_array_equal(got[0], want)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_cuts_fall_on_scaling_units_near_equal_shares(name):
  layout = LAYOUTS[name]
  offsets = np.concatenate([[0], np.cumsum(layout.sizes)])
  for parts in (2, 3, 4, 5):
    cuts = ChunkPlan(layout, parts).cuts
    assert cuts[0] == 0 and cuts[-1] == layout.elements and list(cuts) == sorted(cuts)
    for c in cuts:
      leaf = np.searchsorted(offsets, c, side="right") - 1
      inside = c - offsets[leaf]
      if layout.name in ("fp4", "fp8", "e3m0"):
        assert inside == 0 or (layout.block_size and inside % layout.block_size == 0), (parts, cuts)
    unit = 1 if layout.name in ("none", "bf16") else (layout.block_size or max(layout.sizes))
    share = layout.elements / parts
    assert all(abs(c - d * share) <= unit for d, c in enumerate(cuts)), (parts, cuts)


def test_bytes_per_process_are_a_ring_all_reduces():
  """One replica per process, a float32 payload of V bytes: each process hands the link V
  bytes and receives 2 (N - 1) / N V (the all-gather's (N - 1) V), up to the chunks' byte
  rounding; a packed fp4 row likewise, within one block's bytes per chunk."""
  big = WireLayout((4096, 1000), "none")
  V = big.row_bytes
  for n in (2, 4, 8):
    plan = ChunkPlan(big, n)
    for r in range(n):
      sent, received = traffic(plan, r, 1)
      assert sent == V and abs(received - 2 * (n - 1) / n * V) <= 8, (n, r, received)
  fp4 = WireLayout((4096, 1000), "fp4", block_size=64)
  for n in (2, 4, 8):
    plan = ChunkPlan(fp4, n)
    for r in range(n):
      sent, received = traffic(plan, r, 1)
      assert abs(sent - fp4.row_bytes) <= n and abs(received - 2 * (n - 1) / n * fp4.row_bytes) <= 2 * 36, (n, r)


def test_topk_is_refused_in_one_line():
  with pytest.raises(ValueError, match="`reduction` reduce-scatter re-quantizes the mean of dense payloads") as e:
    DiLoCoConfig(compression="e3m0", topk=3, topk_chunk=8, reduction="reduce-scatter")
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match="dense payloads"):
    ChunkPlan(dataclasses.replace(LAYOUTS["none"], topk=3, topk_chunk=8), 2)
  with pytest.raises(ValueError, match=r"`reduction` must be one of \('all-gather', 'reduce-scatter'\), got 'ring'"):
    DiLoCoConfig(reduction="ring")


def test_with_none_the_numbers_do_not_change():
  """compression none: the outer Q is the identity (the mean itself)."""
  cfg = DiLoCoConfig(reduction="reduce-scatter")
  mean = [jnp.array([0.1, -0.3]), jnp.array([1e-3])]
  assert [x.tolist() for x in requantize_mean(mean, cfg)] == [x.tolist() for x in mean]
