"""The NNX transformer: exact parameter counts, layer stacking, causality, both position kinds."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from diloco_core import ModelConfig, flops_per_token, get_preset, init_model, layer_mask, lm_loss, param_count


@pytest.mark.parametrize("changes", [
    {}, {"positions": "learned"}, {"tie_embeddings": True}, {"mlp": "gelu"}, {"n_kv_heads": 1},
])
def test_param_count_matches_the_built_model(changes):
  cfg = dataclasses.replace(get_preset("tiny"), **changes)
  _, params = init_model(cfg, 0)
  assert sum(x.size for x in jax.tree.leaves(params)) == param_count(cfg)


def test_layers_are_stacked_on_a_leading_axis():
  cfg = dataclasses.replace(get_preset("tiny"), n_layers=3)
  _, params = init_model(cfg, 0)
  mask = layer_mask(params)
  for x, is_layer in zip(jax.tree.leaves(params), jax.tree.leaves(mask)):
    if is_layer:
      assert x.shape[0] == 3
  assert any(jax.tree.leaves(mask)) and not all(jax.tree.leaves(mask))


@pytest.mark.parametrize("positions", ["rope", "learned"])
def test_causal(positions):
  cfg = dataclasses.replace(get_preset("tiny"), positions=positions)
  apply_fn, params = init_model(cfg, 0)
  a = jnp.array([[1, 2, 3, 4, 5, 6]])
  b = a.at[0, 4].set(9)
  la, lb = apply_fn(params, a), apply_fn(params, b)
  np.testing.assert_allclose(la[0, :4], lb[0, :4], atol=1e-6)
  assert not np.allclose(la[0, 4:], lb[0, 4:])


def test_flops_per_token_closed_form():
  cfg = ModelConfig(vocab_size=10, d_model=8, n_layers=2, n_heads=2, d_ff=16)
  # matmul params: 2 x (attention 256 + MLP 384) + head 80 = 1360; attention 12 L h d_h T
  assert flops_per_token(cfg, seq_len=4) == 6 * 1360 + 12 * 2 * 2 * 4 * 4


def test_config_errors():
  with pytest.raises(ValueError, match="ModelConfig.positions must be one of"):
    ModelConfig(positions="alibi")
  with pytest.raises(ValueError, match="must be divisible by n_heads"):
    ModelConfig(d_model=10, n_heads=4)
  with pytest.raises(ValueError, match="experts_per_token \\(3\\) must be <= num_experts"):
    ModelConfig(num_experts=2, experts_per_token=3)


@pytest.mark.parametrize("preset,changes", [
    ("tiny", {"positions": "learned"}), ("tiny", {"tie_embeddings": False, "n_layers": 3}), ("moe-tiny", {}),
])
def test_the_initial_params_are_a_draw_per_shape(preset, changes, monkeypatch):
  """The model draws each leaf as a power-of-two-long vector cut to size (one compiled program
  per power of two): the same params, bit for bit, as ``jax.random.normal`` of each shape."""
  from diloco_core.model import transformer
  cfg = dataclasses.replace(get_preset(preset), **changes)
  drawn = jax.tree.leaves(init_model(cfg, 3)[1])
  monkeypatch.setattr(transformer, "_normal_draw", lambda key, shape: jax.random.normal(key, shape, jnp.float32))
  per_shape = jax.tree.leaves(init_model(cfg, 3)[1])
  assert len(drawn) == len(per_shape)
  for x, y in zip(drawn, per_shape):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


# ---- the output head fused with the loss (loss_chunk) -----------------------------------------
#: The fused loss sums the same float32 terms in chunks (and the head's gradient chunk by chunk):
#: a few float32 roundings apart from the unfused one.
FUSED_RTOL = 1e-5


@pytest.mark.parametrize("chunk", [1, 7, 16, 10**6])  # one token, a partial last chunk, exact, one chunk
def test_fused_loss_equals_the_whole_logits_loss_and_gradients(chunk):
  with jax.default_matmul_precision("highest"):
    cfg = dataclasses.replace(get_preset("tiny"), compute_dtype="float32")
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, cfg.vocab_size, (2, 9)), jnp.int32)
    out = {}
    for c in (0, chunk):
      apply_fn, params = init_model(dataclasses.replace(cfg, loss_chunk=c), 0)
      out[c] = jax.jit(jax.value_and_grad(lambda p: lm_loss(apply_fn, p, tokens)))(params)
  np.testing.assert_allclose(float(out[chunk][0]), float(out[0][0]), rtol=FUSED_RTOL)
  for a, b in zip(jax.tree.leaves(out[0][1]), jax.tree.leaves(out[chunk][1])):
    np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=FUSED_RTOL * float(jnp.max(jnp.abs(a))))


def test_a_chunk_larger_than_the_tokens_is_not_padded():
  """Six tokens at chunk 4,096: one chunk of the six (the head's work is that of the six tokens,
  not of 4,096 padded rows); the loss is the unchunked one."""
  from diloco_core.model.fused_loss import chunked_cross_entropy
  x = jnp.asarray(np.random.default_rng(0).normal(size=(2, 3, 4)), jnp.float32)
  head = jnp.asarray(np.random.default_rng(1).normal(size=(4, 5)), jnp.float32)
  t = jnp.array([[0, 1, 2], [3, 4, 0]])
  jaxpr = str(jax.make_jaxpr(lambda x, h: jax.grad(chunked_cross_entropy)(x, h, t, 4096))(x, head))
  assert "4096" not in jaxpr and "f32[6,5]" in jaxpr and "f32[1,6,4]" in jaxpr  # one chunk: 6 rows, 6 x V logits
  with jax.default_matmul_precision("highest"):
    np.testing.assert_allclose(float(chunked_cross_entropy(x, head, t, 4096)),
                               float(chunked_cross_entropy(x, head, t, 6)), rtol=0)


@pytest.mark.parametrize("stacked", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_embed_lookup_is_the_gather_bit_for_bit(dtype, stacked, monkeypatch):
  """The lookup and its gradient equal ``table[tokens]``'s, bit for bit: alone, under one vmap
  (the replicas of a step), under two, and with the tokens shared by the replicas. With the
  gradient as one scatter per replica (``stacked``, an accelerator's form, forced here) too, on
  these shapes (on an AVX-512 CPU not on every shape: the reason the CPU keeps JAX's own)."""
  from diloco_core.model import embedding
  from diloco_core.model.embedding import embed_lookup
  monkeypatch.setattr(embedding, "stacked_scatter", lambda: stacked)
  rng = np.random.default_rng(0)
  tables = jnp.asarray(rng.normal(size=(3, 50, 8)), dtype)
  tokens = jnp.asarray(rng.integers(0, 50, (3, 4, 16)), jnp.int32)
  loss = lambda look: (lambda e, t: jnp.sum(jnp.sin(look(e, t).astype(jnp.float32)) * jnp.arange(8.0)))
  gather, ours = loss(lambda e, t: e[t]), loss(embed_lookup)
  cases = {"alone": (lambda f: jax.grad(f), (tables[0], tokens[0])),
           "vmap": (lambda f: jax.vmap(jax.grad(f)), (tables, tokens)),
           "vmap of vmap": (lambda f: jax.vmap(jax.vmap(jax.grad(f))), (jnp.stack([tables] * 2), jnp.stack([tokens] * 2))),
           "shared tokens": (lambda f: jax.vmap(jax.grad(f), (0, None)), (tables, tokens[0]))}
  for name, (wrap, args) in cases.items():
    want, got = jax.jit(wrap(gather))(*args), jax.jit(wrap(ours))(*args)
    assert got.dtype == want.dtype and np.array_equal(np.asarray(got), np.asarray(want)), name
  np.testing.assert_array_equal(np.asarray(embed_lookup(tables[0], tokens[0])), np.asarray(tables[0][tokens[0]]))


def test_embed_lookup_on_one_accelerator_scatters_each_replica_into_its_own_table(monkeypatch):
  """On one accelerator the batched gradient is M scatters into [V, d] tables (stacked), not one
  scatter into a flattened [M·V, d] table: the form XLA fuses with the optimizer update. On a
  CPU it is JAX's batched scatter, whose numbers the stored CPU experiments hold."""
  from diloco_core.model import embedding
  tables, tokens = jnp.zeros((3, 50, 8)), jnp.zeros((3, 4, 16), jnp.int32)
  lowered = lambda: jax.jit(jax.vmap(jax.grad(lambda e, t: jnp.sum(embedding.embed_lookup(e, t))))).lower(
      tables, tokens).as_text()  # a new function each time: traced afresh
  assert embedding.stacked_scatter() == (jax.default_backend() != "cpu")
  monkeypatch.setattr(embedding, "stacked_scatter", lambda: False)
  text = lowered()
  assert text.count('"stablehlo.scatter"') == 1  # one batched scatter for the three replicas
  monkeypatch.setattr(embedding, "stacked_scatter", lambda: True)
  text = lowered()
  assert text.count('"stablehlo.scatter"') == 3 and "operand_batching_dims" not in text
  assert "tensor<150x8xf32>" not in text and "tensor<3x50x8xf32>" in text


def test_fused_loss_by_hand_on_two_tokens():
  """x = [[1, 0], [0, 1]], head = I, targets [0, 0]: losses log(1 + e^-1) and log(1 + e)."""
  from diloco_core.model.fused_loss import chunked_cross_entropy
  x, head, t = jnp.eye(2), jnp.eye(2), jnp.array([0, 0])
  loss, (dx, dhead) = jax.value_and_grad(lambda x, h: chunked_cross_entropy(x, h, t, 1), argnums=(0, 1))(x, head)
  want = (np.log1p(np.exp(-1.0)) + np.log1p(np.exp(1.0))) / 2
  # float32 exp and log: exact to a few 2^-24 on a CPU; an accelerator's approximations are
  # allowed 2^-17 (relative) here, far below what a wrong term would change (0.3 and more)
  tol = 2.0 ** -17
  np.testing.assert_allclose(float(loss), want, rtol=tol)
  s = 1 / (1 + np.exp(-1.0))  # softmax([1, 0])[0]; dlogits = (softmax - onehot) / 2
  dlogits = np.array([[s - 1, 1 - s], [(1 - s) - 1, s]]) / 2
  np.testing.assert_allclose(np.asarray(dx), dlogits @ np.eye(2).T, rtol=0, atol=tol)
  np.testing.assert_allclose(np.asarray(dhead), np.eye(2).T @ dlogits, rtol=0, atol=tol)
  with pytest.raises(ValueError, match="chunk must be a positive integer, got 0"):
    chunked_cross_entropy(x, head, t, 0)
