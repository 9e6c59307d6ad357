"""The mixture-of-experts blocks: exact equivalences, hand-computed routing and aux losses, counts."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from diloco_core import (DataParallel, DiLoCoConfig, Fragments, ModelConfig, flops_per_token, get_preset,
                         init_model, layer_mask, lm_loss, param_count, resolve_model_config)
from diloco_core.model import transformer as M
from diloco_core.run.cli import main as cli_main
from diloco_core.model import moe
from diloco_core.model.transformer import train_loss
from diloco_core.run.config import TrainConfig
from diloco_core.train import train
from tiny_run import tiny

EXPERT_LEAVES = ("w_gate", "w_up", "w_down")


def _f32(name):
  return resolve_model_config(dataclasses.replace(get_preset(name), compute_dtype="float32"))


def test_one_expert_top_one_is_the_dense_swiglu_block_bit_for_bit():
  cfg = _f32("tiny")
  _, params = init_model(cfg, 0)
  w = jax.tree.map(lambda x: x[0], params["blocks"])  # layer 0
  x = jax.random.normal(jax.random.key(1), (2, 8, cfg.d_model))
  dense = M._block(cfg, x, w)
  w_moe = {**w, **{n: w[n][None] for n in EXPERT_LEAVES}, "router": jnp.zeros((cfg.d_model, 1))}
  out, _ = M._moe_block(dataclasses.replace(cfg, experts_per_token=1), x, w_moe)
  np.testing.assert_array_equal(np.asarray(out), np.asarray(dense))


def test_routing_picks_the_top_k_and_renormalizes_the_gates():
  probs = np.array([[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4], [0.05, 0.6, 0.05, 0.3]], np.float32)
  r = moe.route(jnp.log(probs), k=2)
  assert np.asarray(r.experts).tolist() == [[0, 1], [3, 2], [1, 3]]
  expected = np.array([[0.4 / 0.7, 0.3 / 0.7, 0, 0], [0, 0, 0.3 / 0.7, 0.4 / 0.7], [0, 0.6 / 0.9, 0, 0.3 / 0.9]])
  np.testing.assert_allclose(np.asarray(r.combine), expected, rtol=1e-6, atol=0)
  np.testing.assert_allclose(np.asarray(r.probs), probs, rtol=1e-6)
  # random logits: the chosen are the k largest, the gates sum to 1 and are 0 elsewhere
  logits = jax.random.normal(jax.random.key(0), (64, 8)) * 3
  r = moe.route(logits, k=3)
  top = np.argsort(-np.asarray(logits), axis=-1)[:, :3]
  assert (np.sort(np.asarray(r.experts), axis=-1) == np.sort(top, axis=-1)).all()
  combine = np.asarray(r.combine)
  np.testing.assert_allclose(combine.sum(-1), 1.0, rtol=1e-6)
  assert ((combine > 0).sum(-1) == 3).all()
  assert (np.take_along_axis(combine, top, -1) > 0).all()


def test_aux_losses_match_their_closed_forms_on_a_hand_made_batch():
  # 4 tokens, E = 4, k = 2; logits = log p + c, so softmax = p and logsumexp = c.
  p = np.array([[0.4, 0.3, 0.2, 0.1], [0.1, 0.2, 0.3, 0.4],
                [0.5, 0.25, 0.125, 0.125], [0.25, 0.5, 0.125, 0.125]], np.float32)
  c = np.array([0.0, 1.0, 2.0, -1.0], np.float32)
  logits = jnp.log(p) + c[:, None]
  r = moe.route(logits, k=2)
  # top-2: {0,1}, {3,2}, {0,1}, {1,0}: f = (3, 3, 1, 1) / 8; P = (1.25, 1.25, 0.75, 0.75) / 4
  # E sum f P = 4 * (2 * 3/8 * 0.3125 + 2 * 1/8 * 0.1875) = 4 * 0.28125 = 1.125
  assert float(moe.load_balance_loss(r.probs, r.experts)) == pytest.approx(1.125, rel=1e-6)
  assert float(moe.z_loss(logits)) == pytest.approx((0 + 1 + 4 + 1) / 4, rel=1e-6)  # mean c^2
  # a perfectly balanced router (uniform probabilities, each expert chosen equally): exactly 1
  uniform = jnp.full((4, 4), 0.25)
  assert float(moe.load_balance_loss(uniform, jnp.array([[0, 1], [2, 3], [0, 2], [1, 3]]))) == 1.0
  # the objective's term: coefficients times the means over layers
  per_layer = {"balance": jnp.array([1.125, 1.0]), "z": jnp.array([1.5, 0.5])}
  assert float(moe.aux_loss(per_layer, 0.01, 0.1)) == pytest.approx(0.01 * 1.0625 + 0.1 * 1.0, rel=1e-6)
  assert float(moe.aux_loss(per_layer, 0.01, 0.0)) == pytest.approx(0.01 * 1.0625, rel=1e-6)


def test_the_objective_is_the_lm_loss_plus_the_aux_term():
  cfg = _f32("moe-tiny")
  tokens = jax.random.randint(jax.random.key(2), (2, 9), 0, cfg.vocab_size)
  apply_fn, params = init_model(cfg, 0)
  objective, metrics = train_loss(apply_fn, params, tokens)
  assert float(objective) == float(metrics["loss"] + metrics["aux_loss"])
  assert float(metrics["loss"]) == float(lm_loss(apply_fn, params, tokens))
  assert 1.0 <= float(metrics["aux_loss"]) / cfg.aux_loss_coef <= cfg.num_experts  # E sum f P in [1, E]
  off_fn, off_params = init_model(dataclasses.replace(cfg, aux_loss_coef=0.0), 0)
  off, off_metrics = train_loss(off_fn, off_params, tokens)
  assert float(off_metrics["aux_loss"]) == 0.0 and float(off) == float(metrics["loss"])
  z_fn, z_params = init_model(dataclasses.replace(cfg, z_loss_coef=0.5), 0)
  assert float(train_loss(z_fn, z_params, tokens)[1]["aux_loss"]) > float(metrics["aux_loss"])
  # a dense model's training loss is its LM loss, a plain scalar
  dense_fn, dense_params = init_model(_f32("tiny"), 0)
  assert float(train_loss(dense_fn, dense_params, tokens % 32)) == float(lm_loss(dense_fn, dense_params, tokens % 32))


@pytest.mark.parametrize("changes", [{}, {"mlp": "gelu"}, {"tie_embeddings": True, "positions": "learned"},
                                     {"num_experts": 3, "experts_per_token": 1}])
def test_param_count_total_and_active_equal_the_built_model(changes):
  cfg = dataclasses.replace(get_preset("moe-tiny"), **changes)
  _, params = init_model(cfg, 0)
  blocks = params["blocks"]
  assert blocks["w_up"].shape == (cfg.n_layers, cfg.num_experts, cfg.d_model, cfg.d_ff)
  assert blocks["router"].shape == (cfg.n_layers, cfg.d_model, cfg.num_experts)
  total = sum(x.size for x in jax.tree.leaves(params))
  assert total == param_count(cfg)
  E, k = cfg.num_experts, cfg.experts_per_token
  unrouted = sum(blocks[n].size // E * (E - k) for n in EXPERT_LEAVES if n in blocks)
  assert total - unrouted == param_count(cfg, active=True)


def _compiled_flops_per_token(cfg: ModelConfig, b: int, T: int) -> float:
  apply_fn, params = init_model(cfg, 0)
  dp = DataParallel(lambda p, x: train_loss(apply_fn, p, x), optax.adamw(1e-3),
                    DiLoCoConfig(algorithm="dp", replicas=1))
  state = dp.init(params)
  cost = dp.lower(state, jnp.zeros((1, b, T + 1), jnp.int32)).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  return cost["flops"] / (b * T)


@pytest.mark.parametrize("experts", [1, 4])
def test_flops_per_token_agrees_with_the_compiled_step(experts):
  """Within 10% (measured on XLA:CPU: 1.018 for both, the rest is AdamW, norms and softmaxes).

  One layer: XLA's cost analysis counts a while loop's body once whatever its trip count, so
  with the layer scan of L > 1 it would see one layer of L. The dense dispatch runs every
  expert on every token: its FLOPs are those of k = E, which exceed the active ones
  (``flops_per_token(cfg)``) by the E - k unrouted experts' MLPs.
  """
  cfg = ModelConfig(vocab_size=256, d_model=256, n_layers=1, n_heads=4, d_ff=512 // min(experts, 2),
                    max_seq_len=64, num_experts=experts, experts_per_token=min(experts, 2),
                    compute_dtype="float32")
  T = 64
  compiled = _compiled_flops_per_token(cfg, 4, T)
  dispatched = dataclasses.replace(cfg, experts_per_token=experts)
  assert compiled / flops_per_token(dispatched, T) == pytest.approx(1.0, abs=0.1)
  if experts > 1:
    unrouted = 6 * cfg.n_layers * (experts - 2) * 3 * cfg.d_model * cfg.d_ff
    assert flops_per_token(dispatched, T) - flops_per_token(cfg, T) == unrouted


def test_gradients_reach_exactly_the_experts_that_receive_tokens():
  d, f, E = 8, 6, 4
  keys = jax.random.split(jax.random.key(3), 5)
  h = jax.random.uniform(keys[0], (16, d), minval=0.1, maxval=1.0)  # positive features
  # expert e < 3 reads features i = e mod 3; the last expert's logits are all negative
  router = jnp.array([[float(i % 3 == e) for e in range(E - 1)] + [-1.0] for i in range(d)])
  w = {"router": router, "w_gate": jax.random.normal(keys[2], (E, d, f)),
       "w_up": jax.random.normal(keys[3], (E, d, f)), "w_down": jax.random.normal(keys[4], (E, f, d))}
  r = moe.route(h @ router, k=2)
  receives = np.asarray(r.combine).sum(0) > 0
  assert receives.tolist() == [True, True, True, False]
  grads = jax.grad(lambda w: jnp.sum(moe.moe_mlp(h, w, 2, "swiglu")[0] ** 2))(w)
  for name in EXPERT_LEAVES:
    per_expert = np.abs(np.asarray(grads[name])).reshape(E, -1).max(axis=1)
    assert (per_expert[receives] > 0).all() and (per_expert[~receives] == 0).all(), name
  assert np.abs(np.asarray(grads["router"])).max() > 0
  # in the model: every expert of moe-tiny receives tokens of a random batch, and gets a gradient
  cfg = _f32("moe-tiny")
  apply_fn, params = init_model(cfg, 0)
  tokens = jax.random.randint(keys[0], (4, 17), 0, cfg.vocab_size)
  g = jax.grad(lambda p: train_loss(apply_fn, p, tokens)[0])(params)
  for name in EXPERT_LEAVES:
    per_expert = np.abs(np.asarray(g["blocks"][name])).reshape(cfg.n_layers, cfg.num_experts, -1).max(-1)
    assert (per_expert > 0).all(), name


def test_streaming_fragments_partition_an_moe_model():
  cfg = dataclasses.replace(get_preset("moe-tiny"), n_layers=4)
  _, params = init_model(cfg, 0)
  leaves = jax.tree.leaves(params)
  frag = Fragments(jax.tree.leaves(layer_mask(params)), [x.shape for x in leaves], fragments=3)
  assert sum(frag.sizes()) == param_count(cfg)
  assert [row["layers"] for row in frag.fragment_map()] == [[], [0, 2], [1, 3]]
  # every layer fragment holds its layers' experts and routers, whole: [L / (P - 1), E, ...]
  layer_shapes = frag.leaf_shapes(1)
  assert (2, cfg.num_experts, cfg.d_model, cfg.d_ff) in layer_shapes
  assert (2, cfg.d_model, cfg.num_experts) in layer_shapes


@pytest.mark.parametrize("algo,kw", [("dp", {}), ("diloco", {}), ("streaming", {"fragments": 2}),
                                     ("streaming", {"fragments": 2, "outer_overlap": "eager"})])
def test_moe_tiny_trains_with_every_algorithm(algo, kw):
  result = train(tiny(algo, model="moe-tiny", steps=16, eval_every=8, log_every=4, inner_lr=1e-2, **kw))
  rows = result.metrics
  assert rows["eval_loss"].iloc[-1] < rows["eval_loss"].iloc[0]
  aux = rows["aux_loss"].to_numpy(float)[1:]  # the step-0 row has none
  assert np.isfinite(aux).all() and (aux >= 0.01).all() and (aux <= 0.01 * 4).all()  # c·E Σ f P, in [c, c·E]
  assert result.summary["final_aux_loss"] == aux[-1]
  assert result.summary["active_params"] < result.summary["params"]


def test_expert_flags_turn_a_dense_preset_into_an_moe():
  config = tiny("diloco", model="tiny", num_experts=3, experts_per_token=2, steps=4, eval_every=4, log_every=2)
  cfg = config.model_config()
  assert (cfg.num_experts, cfg.experts_per_token) == (3, 2)
  assert dataclasses.replace(cfg, num_experts=1, experts_per_token=1) == tiny(
      "diloco", model="tiny", steps=4).model_config()  # nothing else changed
  summary = train(config).summary
  built = config.model_config(vocab_size=config.data.vocab_size)
  assert (summary["params"], summary["active_params"]) == (param_count(built), param_count(built, active=True))
  assert summary["active_params"] < summary["params"]


def test_bad_moe_options_are_one_line_errors_naming_the_option():
  with pytest.raises(ValueError, match=r"^ModelConfig.experts_per_token \(3\) must be <= num_experts \(2\).$"):
    ModelConfig(num_experts=2, experts_per_token=3)
  with pytest.raises(ValueError, match=r"^ModelConfig.aux_loss_coef must be a finite number >= 0, got -1.$"):
    ModelConfig(aux_loss_coef=-1)
  with pytest.raises(ValueError, match=r"^`z_loss_coef` must be a finite number >= 0, got nan.$"):
    TrainConfig(model="moe-tiny", z_loss_coef=float("nan")).validate()


def test_the_cli_names_the_coefficient_flags(capsys):
  assert cli_main(["--model", "moe-tiny", "--aux-loss-coef", "-1"]) == 2
  assert capsys.readouterr().err == "error: --aux-loss-coef must be a finite number >= 0, got -1.0.\n"


def test_streaming_sends_total_params_so_an_moe_sends_its_total_ratio_of_bytes():
  # Every fragment is sent steps / H times: bytes per replica are proportional to the total
  # (not active) params, exactly (the recipes page states this ratio).
  # (the shape of test_moe_tiny_trains_with_every_algorithm's streaming run: its program)
  kw = dict(fragments=2, steps=16, eval_every=8, log_every=4, inner_lr=1e-2)
  moe_run = train(tiny("streaming", model="moe-tiny", **kw)).summary
  dense_run = train(tiny("streaming", model="moe-tiny", num_experts=1, experts_per_token=1, **kw)).summary
  assert moe_run["total_bytes_per_replica"] * dense_run["params"] == (
      dense_run["total_bytes_per_replica"] * moe_run["params"])
  assert moe_run["params"] > 2 * dense_run["params"]
