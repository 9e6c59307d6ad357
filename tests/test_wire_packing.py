"""Packed wire formats (diloco_core.wire.packing): every format's own bits, back bit for bit."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from diloco_core.wire import compression

from diloco_core.wire import packing as wp
from diloco_core.spec.wire_formats import FORMATS

SIZES = (1, 7, 64, 130, 0, 33)  # leaves of one fragment, a leaf of one element and an empty one


def payload(name, sizes=SIZES, m=3, seed=0, scale=1.0, **wire):
  """Rows [m, n] as the trainer sends them: each leaf of each replica through quantize."""
  rng = np.random.default_rng(seed)
  rows = []
  for _ in range(m):
    leaves = [jnp.asarray(rng.standard_normal(n).astype(np.float32) * scale) for n in sizes]
    sent = compression.quantize_tree(leaves, name, **wire)
    rows.append(np.concatenate([np.asarray(x) for x in sent]) if sizes else np.zeros(0, np.float32))
  return np.stack(rows)


def same_bits(a, b):
  return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


WIRES = [dict(), dict(block_size=16), dict(block_size=1000), dict(topk=5, topk_chunk=16),
         dict(topk=3, topk_chunk=4), dict(topk=64, topk_chunk=64)]


@pytest.mark.parametrize("name", FORMATS)
@pytest.mark.parametrize("wire", WIRES, ids=str)
def test_pack_is_the_counted_bits_and_unpacks_bit_for_bit(name, wire):
  if wire.get("block_size") and name in ("none", "bf16"):
    wire = {}
  rows = payload(name, **wire)
  layout = wp.WireLayout(SIZES, name, wire.get("block_size"), wire.get("topk"), wire.get("topk_chunk"))
  counted = sum(compression.wire_bits(n, name, **{**dict(block_size=None, topk=None, topk_chunk=None), **wire})
                for n in SIZES)
  assert layout.bits == counted
  packed = wp.pack_payload(rows, layout)
  assert packed.dtype == np.uint8 and packed.shape == (3, math.ceil(counted / 8))
  assert same_bits(wp.unpack_payload(packed, layout), rows)


@pytest.mark.parametrize("name", ["fp8", "fp4", "e3m0"])
def test_scaled_formats_take_their_bits_per_value(name):
  """A large leaf: bits per value plus one float32 scale, i.e. 2 values per byte for 4-bit."""
  n = 10_000
  layout = wp.WireLayout((n,), name)
  assert wp.pack_payload(payload(name, sizes=(n,), m=1), layout).nbytes == math.ceil((n * {"fp8": 8}.get(name, 4) + 32) / 8)


def test_edge_values_travel_exactly():
  """Signed zeros, a block of zeros, a saturated element, a tiny block, a failed (NaN) block."""
  for name in ("fp8", "fp4", "e3m0"):
    leaves = [jnp.array([-0.0, 0.0, 1e-30, -3e-31]), jnp.zeros(5), jnp.array([np.nan, 1.0, 2.0]),
              jnp.array([448.0, -1e-3, 2.0**-20]), jnp.array([np.inf, 0.0])]
    rows = np.concatenate([np.asarray(x) for x in compression.quantize_tree(leaves, name)])[None]
    layout = wp.WireLayout(tuple(int(x.size) for x in leaves), name)
    assert same_bits(wp.unpack_payload(wp.pack_payload(rows, layout), layout), rows), name
  for name in ("none", "bf16"):
    rows = np.asarray(compression.quantize(jnp.array([-0.0, np.inf, -np.inf, np.nan, 1.5, 3e38]), name))[None]
    layout = wp.WireLayout((6,), name)
    assert same_bits(wp.unpack_payload(wp.pack_payload(rows, layout), layout), rows), name


@pytest.mark.parametrize("name", FORMATS)
def test_topk_failed_chunk_and_kept_zeros(name):
  """A chunk holding an inf decodes to all NaN; kept values that round to (-)0 stay as sent."""
  x = jnp.array([np.inf, 1.0, 2.0, 3.0, -1e-9, 1.0, 0.0, 0.0, 5.0, -4.0])
  rows = np.asarray(compression.quantize(x, name, topk=2, topk_chunk=4))[None]
  layout = wp.WireLayout((10,), name, topk=2, topk_chunk=4)
  assert same_bits(wp.unpack_payload(wp.pack_payload(rows, layout), layout), rows)


def test_a_value_off_the_grid_is_refused():
  layout = wp.WireLayout((3,), "fp4")
  with pytest.raises(wp.WirePackingError, match="fp4 payload value"):
    wp.pack_payload(np.array([[3.0, 1.1, 0.5]], np.float32), layout)
  with pytest.raises(wp.WirePackingError, match="bfloat16"):
    wp.pack_payload(np.array([[1.0 + 2.0**-20]], np.float32), wp.WireLayout((1,), "bf16"))
  with pytest.raises(wp.WirePackingError, match="more than 1 nonzero"):
    wp.pack_payload(np.array([[1.0, 2.0]], np.float32), wp.WireLayout((2,), "none", topk=1, topk_chunk=2))


def test_error_feedback_payloads_over_many_steps():
  """What a replica sends over many syncs (error feedback), every format, bit for bit."""
  for name in ("fp8", "fp4", "e3m0"):
    residual = None
    rng = np.random.default_rng(1)
    layout = wp.WireLayout((50, 20), name, block_size=8)
    for _ in range(5):
      delta = [jnp.asarray(rng.standard_normal(n).astype(np.float32) * 1e-3) for n in layout.sizes]
      sent, residual = compression.error_feedback(delta, residual, name, block_size=8)
      rows = np.concatenate([np.asarray(s) for s in sent])[None]
      assert same_bits(wp.unpack_payload(wp.pack_payload(rows, layout), layout), rows)
