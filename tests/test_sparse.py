"""Top-k sparse pseudo-gradients (SparseLoCo): kept entries, residuals, bytes, the trainer."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from diloco_core import DiLoCo, DiLoCoConfig

from diloco_core.wire import compression

from diloco_core.wire import sparse

from diloco_core.spec import wire_formats
from diloco_core.train import train
from tiny_run import tiny

X = jnp.array([0.5, -3.0, 1.0, 0.25, 2.0, -1.0, 2.0, 0.0, 7.0])


def test_hand_made_tensor_kept_entries_residual_and_bits():
  """Chunks of 4 (the last of 1), k = 2, e3m0 values with one scale per chunk.

  Chunk 1 keeps -3 and 1 (scale 3: 1/3 rounds to 0.25, so 0.75 arrives); chunk 2 keeps the
  two 2.0 (the tie with nothing: -1 is smaller), chunk 3 its single 7. Bits: per chunk
  k_c·(4 + ⌈log2 |c|⌉) + 32: 2·(4 + 2) + 32 twice, 1·(4 + 0) + 32 once = 124."""
  sent, residual = compression.error_feedback(X, None, "e3m0", topk=2, topk_chunk=4)
  assert sent.tolist() == [0.0, -3.0, 0.75, 0.0, 2.0, 0.0, 2.0, 0.0, 7.0]
  assert residual.tolist() == [0.5, 0.0, 0.25, 0.25, 0.0, -1.0, 0.0, 0.0, 0.0]
  assert compression.wire_bits(9, "e3m0", topk=2, topk_chunk=4) == 124
  assert compression.wire_bits(9, "none", topk=2, topk_chunk=4) == 2 * 2 * 34 + 32  # no scales
  # the second round sends the residual's largest entries (plus the new Δ; here Δ = 0)
  sent2, residual2 = compression.error_feedback(jnp.zeros(9), residual, "none", topk=2, topk_chunk=4)
  assert sent2.tolist() == [0.5, 0.0, 0.25, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0]
  assert residual2.tolist() == [0.0, 0.0, 0.0, 0.25, 0.0, 0.0, 0.0, 0.0, 0.0]


def test_ties_go_to_the_lower_index_and_failures_propagate_per_chunk():
  assert sparse.sparsify(jnp.ones(8), k=3, chunk=4).tolist() == [1, 1, 1, 0] * 2
  out = sparse.sparsify(jnp.array([1.0, jnp.nan, 0.5, 2.0, 3.0, 1.0]), k=1, chunk=4)
  assert np.all(np.isnan(out[:4])) and out[4:].tolist() == [3.0, 0.0]


def test_error_feedback_adds_up_exactly():
  """β = 1: what is sent over K rounds plus the final residual is the sum of the Δ (exact here:
  dyadic values, float32 values on the wire, so every sum is exact)."""
  rng = np.random.default_rng(0)
  deltas = [jnp.asarray(rng.integers(-64, 65, size=37) / 16.0, jnp.float32) for _ in range(6)]
  residual, total_sent = None, jnp.zeros(37)
  for d in deltas:
    sent, residual = compression.error_feedback(d, residual, "none", topk=3, topk_chunk=8)
    assert int(jnp.sum(sent != 0)) <= 3 * 5  # 5 chunks (8, 8, 8, 8, 5)
    total_sent = total_sent + sent
  np.testing.assert_array_equal(total_sent + residual, sum(deltas))


def test_decay_scales_the_residual_before_it_is_added():
  d, e = jnp.array([1.0, 0.5]), jnp.array([0.25, -1.0])
  sent, res = compression.error_feedback(d, e, "none", topk=1, topk_chunk=2, decay=0.5)
  # target Δ + β e = [1.125, 0]: the first entry is sent
  assert sent.tolist() == [1.125, 0.0] and res.tolist() == [0.0, 0.0]


def test_bits_per_element_for_the_simulator():
  assert wire_formats.topk_bits_per_element(k=64, chunk=4096, name="e3m0") == (64 * (4 + 12) + 32) / 4096
  assert wire_formats.topk_bits_per_element(k=32, chunk=4096, name="bf16") == 32 * (16 + 12) / 4096


def loss(w, x):
  return jnp.sum((w["emb"] - x) ** 2) + jnp.sum((w["layers"] - 1.0) ** 2)


@pytest.mark.parametrize("algorithm,fragments", [("diloco", 1), ("streaming", 2)])
def test_keeping_every_entry_is_the_dense_run_bit_for_bit(algorithm, fragments):
  params = {"emb": jnp.arange(6.0), "layers": jnp.ones((2, 5))}
  mask = {"emb": False, "layers": True}
  batch = jnp.asarray(np.random.default_rng(1).normal(size=(2, 6)), jnp.float32)
  out = []
  for topk in (None, 8):
    sparse_kw = {} if topk is None else {"topk": topk, "topk_chunk": 8, "error_feedback": True}
    cfg = DiLoCoConfig(algorithm=algorithm, replicas=2, sync_every=4, fragments=fragments, **sparse_kw)
    algo = DiLoCo(loss, optax.adam(0.1), cfg, layer_mask=mask)
    state = algo.init(params)
    for _ in range(8):
      state, _ = algo.step(state, batch)
    out.append(jax.device_get(state.global_params))
  for a, b in zip(jax.tree.leaves(out[0]), jax.tree.leaves(out[1])):
    np.testing.assert_array_equal(a, b)


def test_trainer_counts_the_sparse_bytes_and_trains():
  cfg = DiLoCoConfig(algorithm="streaming", replicas=2, sync_every=4, fragments=2, topk=2,
                     topk_chunk=4, compression="e3m0", error_feedback=True, error_feedback_decay=0.9)
  params = {"emb": jnp.zeros(6), "layers": jnp.zeros((2, 5))}
  algo = DiLoCo(loss, optax.adam(0.1), cfg, layer_mask={"emb": False, "layers": True})
  state = algo.init(params)
  # fragment 0: emb (6 = chunks 4 + 2); fragment 1: both layers, one tensor (10 = 4 + 4 + 2)
  bits0 = 2 * (4 + 2) + 2 * (4 + 1) + 2 * 32
  bits1 = 2 * 2 * (4 + 2) + 2 * (4 + 1) + 3 * 32
  assert algo.fragment_bytes == [bits0 / 8, bits1 / 8]
  for _ in range(4):
    state, _ = algo.step(state, jnp.ones((2, 6)))
  assert np.all(np.isfinite(jax.tree.leaves(state.global_params)[0]))
  result = train(tiny(topk=4, topk_chunk=64, compression="e3m0", error_feedback=True))
  dense = train(tiny(compression="e3m0", error_feedback=True))
  assert result.summary["total_bytes_per_replica"] < dense.summary["total_bytes_per_replica"] / 3
