"""Per-fragment outer state, the optimizer choices, and MaxText's fragment order (exact fixtures)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from diloco_core import DiLoCo, DiLoCoConfig, schedule_table

from diloco_core.store import tree_io
from diloco_core.model.transformer import init_model, muon_dimensions
from diloco_core.spec.model_config import get_preset
from diloco_core.algorithm.optimizers import (ADAM_BETAS, MUON_CONSISTENT_RMS, MUON_NS_STEPS,
                                    inner_optimizer_factory, outer_optimizer_factory)
from diloco_core.run.programs import program_key
from diloco_core.train import train
from tiny_run import tiny

MASK = {"emb": False, "layers": True}


def layered_loss(w, x):
  return jnp.sum((w["emb"] - x) ** 2) + jnp.sum((w["layers"] - 1.0) ** 2)


def first_update_per_fragment(fragments, outer_overlap="none", order="embeddings-first"):
  """One outer Adam(0.1) step per fragment: {fragment: |θ_g change| of its leaves} at its first send."""
  cfg = DiLoCoConfig(algorithm="streaming" if fragments > 1 else "diloco", replicas=2, sync_every=6,
                     fragments=fragments, outer_overlap=outer_overlap, fragment_order=order)
  algo = DiLoCo(layered_loss, optax.sgd(0.1), cfg, layer_mask=MASK, outer_optimizer=optax.adam(0.1))
  params = {"emb": jnp.zeros(2), "layers": jnp.zeros((2, 2))}
  state = algo.init(params)
  before = jax.tree.map(np.array, state.global_params)
  moved = []
  steps = 12 if outer_overlap != "none" else 6
  for _ in range(steps):
    state, m = algo.step(state, jnp.array([[1.0, 2.0], [3.0, 5.0]]))
    now = jax.tree.map(np.array, state.global_params)
    change = jax.tree.map(lambda a, b: np.abs(a - b), now, before)
    if bool(m["sent"]) and any(np.any(c > 0) for c in jax.tree.leaves(change)):
      moved.append(change)
    before = now
  return moved, state


@pytest.mark.parametrize("fragments", [2, 3])
def test_adam_outer_each_fragment_first_update_is_the_learning_rate(fragments):
  """Adam's first step is η·Δ/(|Δ| + ε): 0.1 on every entry of the fragment sent, whichever
  fragment goes first (a shared count would give the second fragment 0.0744)."""
  moved, state = first_update_per_fragment(fragments)
  assert len(moved) == fragments
  for change in moved:
    touched = np.concatenate([c[c > 0] for c in jax.tree.leaves(change)])
    np.testing.assert_allclose(touched, 0.1, rtol=1e-5)
  np.testing.assert_array_equal(state.outer_state[0].count, [1] * fragments)


def test_adam_outer_with_eager_overlap_is_per_fragment_too():
  """Eager: each replica's first outer gradient is its own Δ_m / M (nothing in flight yet), so
  Adam's first step on every replica's own outer params, and on their mean θ_g, is η again."""
  moved, state = first_update_per_fragment(2, outer_overlap="eager")
  assert len(moved) == 4  # two rounds of syncs (12 steps)
  for change in moved[:2]:
    touched = np.concatenate([c[c > 0] for c in jax.tree.leaves(change)])
    np.testing.assert_allclose(touched, 0.1, rtol=1e-5)
  # each replica holds its own per-fragment counts: [M, P]
  np.testing.assert_array_equal(state.in_flight.outer_state[0].count, [[2, 2], [2, 2]])


def test_one_fragment_keeps_the_plain_state_and_nesterov_keeps_its_leaf_table():
  """P = 1: the outer state is exactly optimizer.init(params); the default Nesterov state has
  no non-parameter leaf, so its checkpoint leaf table (and every checkpoint written before
  per-fragment state) is unchanged at any P."""
  _, state = first_update_per_fragment(1)
  assert state.outer_state[0].count.shape == ()
  params = {"emb": jnp.zeros(2), "layers": jnp.zeros((2, 2))}
  cfg = DiLoCoConfig(algorithm="streaming", replicas=2, sync_every=6, fragments=3)
  nesterov = DiLoCo(layered_loss, optax.sgd(0.1), cfg, layer_mask=MASK).init(params)
  plain = optax.sgd(0.7, momentum=0.9, nesterov=True).init(params)
  assert tree_io.leaf_table(nesterov.outer_state) == tree_io.leaf_table(plain)


# ---- the outer optimizers: one and two hand-computed steps -----------------------------------
# Two replicas, loss (w - x)², inner SGD 0.25, H = 1, targets 1 and 3: from w = 0 the replicas
# reach 0.5 and 1.5, so Δ = mean(0 - w_m) = -1. From θ_g = 0.5 (η = 0.5, heavy-ball μ = 0.5,
# merged, α = 0) they reach 0.75 and 1.75: Δ = -0.75, v = 0.5·(-1) - 0.75 = -1.25, θ_g = 1.125.
@pytest.mark.parametrize("name,expected", [
    ("sgd", [0.5, 1.125]),          # v ← μv + Δ; θ ← θ - ηv
    ("nesterov", [0.75, 1.34375]),  # θ ← θ - η(Δ + μv): 0.5·1.5; then Δ = -0.625, v = -1.125
])
def test_outer_sgd_and_nesterov_hand_computed(name, expected):
  np.testing.assert_allclose(two_outer_steps(name), expected, rtol=1e-6)


@pytest.mark.parametrize("mu", [0.0, 0.9])
@pytest.mark.parametrize("name", ["nesterov", "sgd", "adam"])
def test_outer_state_copies_are_what_the_outer_optimizer_keeps(name, mu):
  """The memory count (spec.footprint.OUTER_STATE_COPIES) against optax's state: model-sized
  buffers only (Adam's step count is a scalar); SGD keeps its trace even with μ = 0."""
  from diloco_core.spec.footprint import OUTER_STATE_COPIES
  opt = outer_optimizer_factory(name)({"outer_lr": 0.5, "outer_momentum": mu, "outer_beta2": 0.99})
  leaves = jax.tree.leaves(opt.init(jnp.zeros(1000)))
  assert sum(x.size for x in leaves if x.size > 1) == OUTER_STATE_COPIES[name] * 1000


def two_outer_steps(name, **kw):
  cfg = DiLoCoConfig(replicas=2, sync_every=1, outer_lr=0.5, outer_momentum=0.5, outer_optimizer=name, **kw)
  algo = DiLoCo(lambda w, x: jnp.sum((w - x) ** 2), optax.sgd(0.25), cfg)
  state = algo.init(jnp.zeros(()))
  got = []
  for _ in range(2):
    state, _ = algo.step(state, jnp.array([1.0, 3.0]))
    got.append(float(state.global_params))
  return got


def test_outer_adam_two_hand_computed_steps_with_its_bias_correction():
  """β1 = μ = 0.5, β2 = 0.5, η = 0.5, ε = 1e-8. From θ the replicas reach θ + (x_m - θ)/2, so
  Δ = -(2 - θ)/2: Δ1 = -1, and Δ2 = -0.75 from θ1 ≈ 0.5."""
  b1, b2, eta, eps = 0.5, 0.5, 0.5, 1e-8
  theta, m, v = 0.0, 0.0, 0.0
  expected = []
  for k in (1, 2):
    d = -(2.0 - theta) / 2
    m, v = b1 * m + (1 - b1) * d, b2 * v + (1 - b2) * d * d
    theta -= eta * (m / (1 - b1 ** k)) / (math.sqrt(v / (1 - b2 ** k)) + eps)
    expected.append(theta)
  assert abs(expected[0] - 0.5) < 1e-7 and abs(expected[1] - 0.99508) < 1e-5
  np.testing.assert_allclose(two_outer_steps("adam", outer_beta2=b2), expected, rtol=1e-6)


# ---- the inner optimizers --------------------------------------------------------------------
def newton_schulz_scalar(s: float) -> float:
  """Muon's quintic Newton–Schulz map on one singular value, MUON_NS_STEPS times."""
  a, b, c = 3.4445, -4.7750, 2.0315
  for _ in range(MUON_NS_STEPS):
    s = a * s + b * s ** 3 + c * s ** 5
  return s


def test_muon_first_step_by_hand_on_a_diagonal_gradient():
  """G = diag(3, 4): the Nesterov momentum is a multiple of G, the Frobenius normalization
  gives singular values 3/5 and 4/5, the quintic map acts on each, the update is rescaled to
  0.2·sqrt(2) (AdamW's RMS), weight decay is added and the sum scaled by -lr. The vector leaf
  takes optax's Muon-side AdamW, with Nesterov momentum like Muon's: its first bias-corrected
  step is g/|g|·(β1/(1 + β1) + 1), so -lr·(1.47368...·sign(g) + λθ)."""
  lr, wd = 0.01, 0.1
  opt = inner_optimizer_factory(10, 0, clip=False, name="muon")(
      {"inner_lr": lr, "weight_decay": wd, "grad_clip": 0.0, "muon_momentum": 0.95})
  params = {"m": jnp.eye(2), "b": jnp.array([1.0, 1.0])}
  grads = {"m": jnp.diag(jnp.array([3.0, 4.0])), "b": jnp.array([1.0, -2.0])}
  updates, _ = opt.update(grads, opt.init(params), params)
  scale = MUON_CONSISTENT_RMS * math.sqrt(2)
  diag = [-lr * (scale * newton_schulz_scalar(g / 5.0) + wd * 1.0) for g in (3.0, 4.0)]
  np.testing.assert_allclose(np.asarray(updates["m"]), np.diag(diag), rtol=1e-5, atol=1e-9)
  b1 = ADAM_BETAS[0]
  nadam = b1 / (1 + b1) + 1
  np.testing.assert_allclose(np.asarray(updates["b"]), [-lr * (nadam + wd), -lr * (-nadam + wd)], rtol=1e-5)


def test_muon_dimensions_orthogonalize_the_blocks_matrices_only():
  _, params = init_model(get_preset("tiny"), seed=0)
  dims = muon_dimensions(params)
  is_dims = lambda x: x is None or isinstance(x, optax.contrib.MuonDimensionNumbers)
  flat = jax.tree_util.tree_flatten_with_path(dims, is_leaf=is_dims)[0]
  on = sorted(jax.tree_util.keystr(p) for p, d in flat if d is not None)
  assert on == sorted(f"['blocks']['{n}']" for n in ("wq", "wk", "wv", "wo", "w_gate", "w_up", "w_down")
                      if n in params["blocks"])
  assert dims["embed"] is None and dims["blocks"]["attn_norm"] is None


def test_muon_inner_trains_and_differs_from_adamw():
  muon = train(tiny(inner_optimizer="muon", steps=8))
  adamw = train(tiny(steps=8))
  assert np.isfinite(muon.summary["final_eval_loss"]) and muon.summary["final_eval_loss"] != adamw.summary["final_eval_loss"]
  again = train(tiny(inner_optimizer="muon", steps=8, muon_momentum=0.5))
  assert again.summary["final_eval_loss"] != muon.summary["final_eval_loss"]
  key = lambda c: program_key(c, c.model_config())  # β is traced: one program; the name is not
  assert key(tiny(inner_optimizer="muon", muon_momentum=0.5)) == key(tiny(inner_optimizer="muon"))
  assert key(tiny(inner_optimizer="muon")) != key(tiny())


# ---- MaxText's fragment order ----------------------------------------------------------------
def maxtext_schedule(t: int, sync_every: int, fragments: int, delay: int):
  """MaxText's streaming schedule as its train step computes it (maxtext/trainers/diloco,
  ``diloco_train_step``): Δh = max(1, round(H / P)), period P·Δh; a send after step t when
  t > 0 and Δh | t, of fragment (t mod period) // Δh; the apply of the fragment sent at t - V."""
  dh = max(1, round(sync_every / fragments))
  period = fragments * dh
  send = (t // dh) % fragments if t > 0 and t % dh == 0 else None
  u = t - delay
  merge = (u % period) // dh if u > 0 and u % dh == 0 else None
  return send, merge


@pytest.mark.parametrize("sync_every,fragments", [(4, 2), (6, 3), (12, 4), (10, 5), (30, 6), (8, 8)])
def test_embeddings_last_is_maxtexts_schedule(sync_every, fragments):
  for tau in sorted({0, 1, sync_every // fragments, sync_every - 1}):
    ours = schedule_table(sync_every, fragments, tau, 3 * sync_every, order="embeddings-last")
    theirs = [maxtext_schedule(t, sync_every, fragments, tau) for t in range(1, 3 * sync_every + 1)]
    assert [(r["send"], r["merge"]) for r in ours] == theirs, (sync_every, fragments, tau)
  first = schedule_table(sync_every, fragments, 0, sync_every)
  last = schedule_table(sync_every, fragments, 0, sync_every, order="embeddings-last")
  assert [r["send"] for r in last] == [None if r["send"] is None else (r["send"] + 1) % fragments
                                      for r in first]


def test_embeddings_last_sends_a_layer_fragment_first_in_the_step():
  moved, _ = first_update_per_fragment(2, order="embeddings-last")
  assert np.all(moved[0]["emb"] == 0) and np.all(moved[0]["layers"] > 0)
  assert np.all(moved[1]["emb"] > 0) and np.all(moved[1]["layers"] == 0)


def test_adamw_first_step_by_hand():
  """AdamW's first bias-corrected step is g/(|g| + ε) plus the decoupled decay λθ, times -lr
  (no warmup: the cosine schedule starts at the peak)."""
  lr, wd = 0.01, 0.1
  opt = inner_optimizer_factory(10, 0, clip=False)({"inner_lr": lr, "weight_decay": wd, "grad_clip": 0.0})
  params, grads = jnp.array([1.0, -2.0, 0.5]), jnp.array([3.0, -0.5, 0.0])
  updates, _ = opt.update(grads, opt.init(params), params)
  expected = [-lr * (g / (abs(g) + 1e-8) + wd * p) for g, p in zip([3.0, -0.5, 0.0], [1.0, -2.0, 0.5])]
  np.testing.assert_allclose(np.asarray(updates), expected, rtol=1e-6)
