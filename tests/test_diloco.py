"""Exact-number tests of the DiLoCo / Streaming DiLoCo core (the semantics page, docs/semantics.md) on toy pytrees."""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from diloco_core import DataParallel, DiLoCo, DiLoCoConfig, Fragments, schedule_table


def quad_loss(params, target):
  """0.5 * ||params - target||^2 summed over every leaf (target: same pytree)."""
  return 0.5 * sum(jnp.sum((p - t) ** 2) for p, t in zip(jax.tree.leaves(params), jax.tree.leaves(target)))


def run(algo, params, batches):
  state = algo.init(params)
  history = []
  for batch in batches:
    state, m = algo.step(state, batch)
    history.append(jax.device_get(state))
  return state, history


# ---- foundation issue ------------------------------------------------------------------------
def test_one_replica_unit_outer_lr_no_momentum_is_plain_training():
  """M = 1, η = 1, μ = 0: DiLoCo equals plain AdamW training step by step."""
  rng = np.random.default_rng(0)
  params = {"a": jnp.asarray(rng.normal(size=(3,)), jnp.float32), "b": jnp.asarray(rng.normal(size=(2, 2)), jnp.float32)}
  targets = [jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params) for _ in range(9)]
  opt = optax.adamw(0.1, weight_decay=0.01)
  cfg = DiLoCoConfig(replicas=1, sync_every=3, outer_lr=1.0, outer_momentum=0.0)
  algo = DiLoCo(quad_loss, opt, cfg)
  _, hist = run(algo, params, [jax.tree.map(lambda x: x[None], tg) for tg in targets])

  p, s = params, opt.init(params)
  for t, tg in enumerate(targets):
    g = jax.grad(quad_loss)(p, tg)
    u, s = opt.update(g, s, p)
    p = optax.apply_updates(p, u)
    for ours, ref in zip(jax.tree.leaves(hist[t].params), jax.tree.leaves(p)):
      np.testing.assert_allclose(ours[0], ref, rtol=1e-6, atol=1e-6)
    if (t + 1) % 3 == 0:  # right after a sync the global copy is the replica
      for ours, ref in zip(jax.tree.leaves(hist[t].global_params), jax.tree.leaves(p)):
        np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-6)


def test_fedavg_global_is_mean_of_replicas():
  """η = 1, μ = 0: after a sync the global params are the mean of the replicas."""
  cfg = DiLoCoConfig(replicas=3, sync_every=2, outer_lr=1.0, outer_momentum=0.0, alpha=1.0)
  algo = DiLoCo(quad_loss, optax.sgd(0.3), cfg)
  targets = jnp.array([[1.0, -2.0], [4.0, 0.5], [-3.0, 2.0]])
  state, hist = run(algo, jnp.zeros(2), [targets] * 4)
  # α = 1 leaves the replicas untouched, so they are the pre-sync replicas.
  for t in (1, 3):
    np.testing.assert_allclose(hist[t].global_params, hist[t].params.mean(axis=0), rtol=1e-6)
  # and with α = 0 every replica is replaced by that mean.
  algo0 = DiLoCo(quad_loss, optax.sgd(0.3), DiLoCoConfig(replicas=3, sync_every=2, outer_lr=1.0, outer_momentum=0.0))
  _, hist0 = run(algo0, jnp.zeros(2), [targets] * 2)
  np.testing.assert_allclose(hist0[1].params, np.broadcast_to(hist0[1].global_params, (3, 2)))
  np.testing.assert_allclose(hist0[1].global_params, hist[1].global_params, rtol=1e-6)


def test_nesterov_outer_update_by_hand():
  """Two outer rounds on a 2-parameter model, numbers derived by hand.

  loss = 0.5 ||w - x_m||^2, inner SGD lr 0.5 (w <- 0.5 w + 0.5 x_m), H = 1, M = 2,
  x_0 = (2, 0), x_1 = (0, 4), η = 0.5, μ = 0.9, w = 0.
  Round 1: replicas (1, 0), (0, 2); Δ = mean(g - θ_m) = (-0.5, -1); v = (-0.5, -1);
           θ_g = 0 - 0.5 (Δ + 0.9 v) = (0.475, 0.95).
  Round 2: replicas (1.2375, 0.475), (0.2375, 2.475); Δ = (-0.2625, -0.525);
           v = 0.9 (-0.5, -1) + Δ = (-0.7125, -1.425);
           θ_g = (0.475, 0.95) - 0.5 (Δ + 0.9 v) = (0.926875, 1.85375).
  """
  cfg = DiLoCoConfig(replicas=2, sync_every=1, outer_lr=0.5, outer_momentum=0.9)
  algo = DiLoCo(quad_loss, optax.sgd(0.5), cfg)
  x = jnp.array([[2.0, 0.0], [0.0, 4.0]])
  _, hist = run(algo, jnp.zeros(2), [x, x])
  np.testing.assert_allclose(hist[0].global_params, [0.475, 0.95], rtol=1e-6)
  np.testing.assert_allclose(hist[0].outer_state[0].trace, [-0.5, -1.0], rtol=1e-6)
  np.testing.assert_allclose(hist[1].global_params, [0.926875, 1.85375], rtol=1e-6)
  np.testing.assert_allclose(hist[1].outer_state[0].trace, [-0.7125, -1.425], rtol=1e-6)
  np.testing.assert_allclose(hist[1].params, [[0.926875, 1.85375]] * 2, rtol=1e-6)


def test_replicas_start_identical_and_differ_only_through_data():
  cfg = DiLoCoConfig(replicas=4, sync_every=5)
  algo = DiLoCo(quad_loss, optax.adam(0.1), cfg)
  state = algo.init({"w": jnp.arange(3.0)})
  assert np.all(np.asarray(state.params["w"]) == np.arange(3.0))
  same = jnp.ones((4, 3))
  _, hist = run(algo, {"w": jnp.arange(3.0)}, [{"w": same}] * 3)
  w = hist[-1].params["w"]
  assert np.all(w == w[0]) and not np.all(w[0] == np.arange(3.0))
  different = jnp.arange(12.0).reshape(4, 3)
  _, hist = run(algo, {"w": jnp.arange(3.0)}, [{"w": different}] * 3)
  w = hist[-1].params["w"]
  assert len({tuple(row) for row in w.tolist()}) == 4


def test_dp_with_m_replicas_equals_one_model_with_global_batch():
  rng = np.random.default_rng(1)
  xs = jnp.asarray(rng.normal(size=(5, 4, 2, 3)), jnp.float32)  # steps, M, b, features
  ys = jnp.asarray(rng.normal(size=(5, 4, 2)), jnp.float32)
  loss = lambda w, batch: jnp.mean((batch[0] @ w["k"] + w["c"] - batch[1]) ** 2)
  w0 = {"k": jnp.ones(3), "c": jnp.zeros(())}
  opt = optax.adam(0.05)
  dp = DataParallel(loss, opt, DiLoCoConfig(algorithm="dp", replicas=4))
  state = dp.init(w0)
  p, s = w0, opt.init(w0)
  for t in range(5):
    state, _ = dp.step(state, (xs[t], ys[t]))
    g = jax.grad(loss)(p, (xs[t].reshape(8, 3), ys[t].reshape(8)))
    u, s = opt.update(g, s, p)
    p = optax.apply_updates(p, u)
    for a, b in zip(jax.tree.leaves(state.params), jax.tree.leaves(p)):
      np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_one_compiled_program_for_every_step():
  cfg = DiLoCoConfig(algorithm="streaming", replicas=2, sync_every=6, fragments=3, overlap=1)
  params = {"emb": jnp.zeros(2), "layers": jnp.zeros((4, 2))}
  algo = DiLoCo(quad_loss, optax.sgd(0.1), cfg, layer_mask={"emb": False, "layers": True})
  batch = jax.tree.map(lambda x: jnp.ones((2, *x.shape)), params)
  run(algo, params, [batch] * 13)
  assert algo.compiled_programs == 1


# ---- streaming issue ---------------------------------------------------------------------------
LAYERED = {"emb": jnp.array([0.5, -1.0]), "layers": jnp.array([[1.0], [-2.0], [0.25], [3.0]])}
MASK = {"emb": False, "layers": True}


def _targets(steps, M, seed=0):
  rng = np.random.default_rng(seed)
  return [jax.tree.map(lambda x: jnp.asarray(rng.normal(size=(M, *x.shape)), jnp.float32), LAYERED)
          for _ in range(steps)]


def test_streaming_p1_tau0_alpha0_is_vanilla_bit_for_bit():
  targets = _targets(12, 3)
  base = dict(replicas=3, sync_every=4, outer_lr=0.7, outer_momentum=0.9)
  _, a = run(DiLoCo(quad_loss, optax.adam(0.05), DiLoCoConfig(**base)), LAYERED, targets)
  _, b = run(DiLoCo(quad_loss, optax.adam(0.05), DiLoCoConfig(algorithm="streaming", fragments=1, **base),
                    layer_mask=MASK), LAYERED, targets)
  for sa, sb in zip(a, b):
    for x, y in zip(jax.tree.leaves(sa), jax.tree.leaves(sb)):
      np.testing.assert_array_equal(x, y)


def test_alpha_one_never_changes_replicas():
  targets = _targets(12, 2)
  opt = optax.adam(0.05)
  cfg = DiLoCoConfig(algorithm="streaming", replicas=2, sync_every=6, fragments=3, alpha=1.0, overlap=1)
  state, hist = run(DiLoCo(quad_loss, opt, cfg, layer_mask=MASK), LAYERED, targets)
  for m in range(2):  # each replica equals independent plain training on its own data
    p, s = LAYERED, opt.init(LAYERED)
    for t, tg in enumerate(targets):
      g = jax.grad(quad_loss)(p, jax.tree.map(lambda x: x[m], tg))
      u, s = opt.update(g, s, p)
      p = optax.apply_updates(p, u)
      for x, y in zip(jax.tree.leaves(hist[t].params), jax.tree.leaves(p)):
        np.testing.assert_allclose(x[m], y, rtol=1e-6, atol=1e-7)
  assert not np.allclose(hist[-1].global_params["emb"], LAYERED["emb"])
  assert not np.allclose(hist[-1].global_params["layers"], LAYERED["layers"])


def _numpy_streaming(params0, targets, *, M, H, P, tau, alpha, lr, eta, mu, pattern):
  """An independent reference: the semantics page (docs/semantics.md) step by step on a flat float64 vector."""
  L = params0["layers"].shape[0]
  emb_idx = [0, 1]
  layer_idx = lambda i: [2 + i]
  frag = {0: emb_idx} if P > 1 else {0: emb_idx + [2 + i for i in range(L)]}
  for p in range(1, P):
    n = L // (P - 1)
    layers = [i for i in range(L) if i % (P - 1) == p - 1] if pattern == "strided" else list(range((p - 1) * n, p * n))
    frag[p] = sum((layer_idx(i) for i in layers), [])
  flat = lambda tree: np.concatenate([np.asarray(tree["emb"], np.float64), np.asarray(tree["layers"], np.float64).ravel()])
  theta = np.stack([flat(params0)] * M)
  glob, v = flat(params0), np.zeros_like(flat(params0))
  dh = H // P
  out = []
  for t, tg in enumerate(targets, start=1):
    x = np.stack([flat(jax.tree.map(lambda a: a[m], tg)) for m in range(M)])
    theta = theta - lr * (theta - x)
    for p in range(P):
      if t % H == ((p + 1) * dh) % H:
        s = frag[p]
        delta = np.mean(glob[s] - theta[:, s], axis=0)
        v[s] = mu * v[s] + delta
        glob[s] = glob[s] - eta * (delta + mu * v[s])
    for p in range(P):
      if t - tau > 0 and (t - tau) % H == ((p + 1) * dh) % H:
        s = frag[p]
        theta[:, s] = alpha * theta[:, s] + (1 - alpha) * glob[s]
    out.append((theta.copy(), glob.copy()))
  return out


@pytest.mark.parametrize("P,tau,alpha,pattern", [
    (P, tau, alpha, pattern)
    for P, tau, alpha in itertools.product((2, 3), (0, 1), (0.0, 0.5, 1.0))
    for pattern in (("strided", "sequential") if P == 3 else ("strided",))])
def test_streaming_matches_independent_reference_every_step(P, tau, alpha, pattern):
  M, H = 2, 6
  targets = _targets(2 * H, M, seed=3)
  cfg = DiLoCoConfig(algorithm="streaming", replicas=M, sync_every=H, fragments=P, overlap=tau,
                     alpha=alpha, outer_lr=0.6, outer_momentum=0.5, fragment_pattern=pattern)
  _, hist = run(DiLoCo(quad_loss, optax.sgd(0.3), cfg, layer_mask=MASK), LAYERED, targets)
  ref = _numpy_streaming(LAYERED, targets, M=M, H=H, P=P, tau=tau, alpha=alpha, lr=0.3, eta=0.6,
                         mu=0.5, pattern=pattern)
  for t, (state, (theta, glob)) in enumerate(zip(hist, ref), start=1):
    ours = np.concatenate([state.params["emb"], state.params["layers"].reshape(M, -1)], axis=1)
    np.testing.assert_allclose(ours, theta, rtol=1e-5, atol=1e-6, err_msg=f"replicas, step {t}")
    ours_g = np.concatenate([state.global_params["emb"], state.global_params["layers"].ravel()])
    np.testing.assert_allclose(ours_g, glob, rtol=1e-5, atol=1e-6, err_msg=f"global, step {t}")


def test_schedule_table_h6_p3():
  rows = schedule_table(6, 3, overlap=1, steps=12)
  assert [r["send"] for r in rows] == [None, 0, None, 1, None, 2, None, 0, None, 1, None, 2]
  assert [r["merge"] for r in rows] == [None, None, 0, None, 1, None, 2, None, 0, None, 1, None]
  rows0 = schedule_table(6, 3, overlap=0, steps=12)
  assert [r["merge"] for r in rows0] == [r["send"] for r in rows0]


@pytest.mark.parametrize("pattern,expected", [
    ("strided", [[], [0, 3], [1, 4], [2, 5]]),
    ("sequential", [[], [0, 1], [2, 3], [4, 5]]),
])
def test_fragment_maps_l6_p4(pattern, expected):
  f = Fragments([False, True, True], [(10, 4), (6, 4, 4), (6, 4)], fragments=4, pattern=pattern,
                paths=["embed", "blocks/w", "blocks/norm"])
  rows = f.fragment_map()
  assert [r["layers"] for r in rows] == expected
  assert rows[0]["leaves"] == ["embed"] and rows[1]["leaves"] == ["blocks/w", "blocks/norm"]
  assert [r["elements"] for r in rows] == [40, 40, 40, 40]


def test_bytes_vanilla_and_streaming_totals_equal_peak_ratio_p():
  params = {"emb": jnp.zeros(6), "layers": jnp.zeros((4, 3))}  # fragment 0 = 6 = 2 layers x 3
  mask = {"emb": False, "layers": True}
  van = DiLoCo(quad_loss, optax.sgd(0.1), DiLoCoConfig(replicas=2, sync_every=6), layer_mask=mask)
  stm = DiLoCo(quad_loss, optax.sgd(0.1), DiLoCoConfig(algorithm="streaming", replicas=2, sync_every=6,
                                                       fragments=3), layer_mask=mask)
  van.init(params), stm.init(params)
  v = [van.bytes_sent(t) for t in range(1, 25)]
  s = [stm.bytes_sent(t) for t in range(1, 25)]
  assert sum(v) == sum(s) == 4 * 18 * 4  # 4 syncs x 18 floats x 4 bytes
  assert max(v) / max(s) == 3
  fp4 = DiLoCo(quad_loss, optax.sgd(0.1), DiLoCoConfig(replicas=2, sync_every=6, compression="fp4"),
               layer_mask=mask)
  fp4.init(params)
  assert fp4.bytes_sent(6) == (6 * 4 + 32 + 12 * 4 + 32) / 8  # 4 bits each + one fp32 scale per tensor


@pytest.mark.parametrize("fmt", ["bf16", "fp8", "fp4", "e3m0"])
def test_compressed_pseudo_gradients_and_error_feedback(fmt):
  """Δ = mean_m Q(Δ_m + e_m) in float32; e_m keeps what the wire dropped (docs/semantics.md)."""
  from diloco_core import quantize
  x = jnp.array([[0.3, -1.7, 0.05], [2.2, 0.4, -0.9]])
  cfg = DiLoCoConfig(replicas=2, sync_every=1, outer_lr=1.0, outer_momentum=0.0, compression=fmt,
                     error_feedback=True)
  _, hist = run(DiLoCo(quad_loss, optax.sgd(0.5), cfg), jnp.zeros(3), [x, x])
  # step 1: replicas 0.5 x; Δ_m = -0.5 x_m; e_m = Δ_m - Q(Δ_m)
  delta1 = -0.5 * np.asarray(x)
  sent1 = np.stack([np.asarray(quantize(jnp.asarray(d), fmt)) for d in delta1])
  np.testing.assert_allclose(hist[0].global_params, -sent1.mean(0), rtol=1e-6)
  np.testing.assert_allclose(hist[0].ef_residual, delta1 - sent1, rtol=1e-6, atol=1e-7)
  # step 2: from g1 every replica moves half way to x_m; it sends Q(Δ_m + e_m)
  g1 = -sent1.mean(0)
  delta2 = g1 - (0.5 * g1 + 0.5 * np.asarray(x))
  sent2 = np.stack([np.asarray(quantize(jnp.asarray(d + e), fmt)) for d, e in zip(delta2, delta1 - sent1)])
  np.testing.assert_allclose(hist[1].global_params, g1 - sent2.mean(0), rtol=1e-5, atol=1e-6)
