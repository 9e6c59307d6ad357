"""Whole-outer-step overlap (``outer_overlap``): the trainer against a float64 numpy
reference written from the update rules of the semantics page (docs/semantics.md,
"Overlapping a whole outer step", after arXiv 2502.12996)."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from diloco_core import DiLoCo, DiLoCoConfig
from diloco_core.store import checkpoint as ckpt
from diloco_core.spec.fields import must_match_fields

L = 2  # stacked layers: with P = 3 (strided) fragment 1 is layer 0, fragment 2 is layer 1
MASK = {"emb": False, "layers": True}
INIT = {"emb": np.array([0.5, -1.0]), "layers": np.array([[1.0, 2.0], [-0.5, 0.25]])}
INNER_LR, ETA, MU = 0.1, 0.7, 0.9


def quad_loss(params, batch):
  return sum(jnp.sum((params[k] - batch[k]) ** 2) for k in params)


def targets(steps, replicas, seed=0):
  """Per step, per replica quadratic targets, shaped like the params (leading axes t, m)."""
  rng = np.random.default_rng(seed)
  return {k: rng.normal(size=(steps, replicas, *v.shape)).astype(np.float32) for k, v in INIT.items()}


def flat(tree):
  return np.concatenate([np.asarray(tree["emb"], np.float64).reshape(-1),
                         np.asarray(tree["layers"], np.float64).reshape(-1)])


def fragment_ids(P):
  """The fragment of every element of ``flat(params)`` (strided layers, embeddings in 0)."""
  layer = [0] * 2 + [1 + (i % (P - 1)) if P > 1 else 0 for i in range(L) for _ in range(2)]
  return np.array(layer)


def reference(mode, M, P, H, alpha, data, steps):
  """float64 numpy reference of the semantics page's rules; returns (θ_g, θ_m) per step."""
  frag, dh = fragment_ids(P), H // P
  x = np.stack([np.concatenate([data["emb"][:, m].reshape(steps, -1),
                                data["layers"][:, m].reshape(steps, -1)], axis=1)
                for m in range(M)], axis=1).astype(np.float64)  # [t, m, n]
  g = flat(INIT)
  theta = np.tile(g, (M, 1))
  v = np.zeros_like(g)
  in_flight = np.zeros_like(g)  # delayed: the average sent at the previous sync
  own_g, own_v, others = np.tile(g, (M, 1)), np.zeros((M, g.size)), np.zeros((M, g.size))
  out = []
  for t in range(1, steps + 1):
    theta = theta - INNER_LR * 2 * (theta - x[t - 1])
    due = [p for p in range(P) if t % H == ((p + 1) * dh) % H]
    for p in due:
      i = frag == p
      start = own_g if mode == "eager" else np.tile(g, (M, 1))
      delta_m = start[:, i] - theta[:, i]
      mean = delta_m.mean(axis=0)
      if mode == "eager":
        grad = delta_m / M + others[:, i]
        others[:, i] = mean - delta_m / M
        own_v[:, i] = MU * own_v[:, i] + grad
        own_g[:, i] = own_g[:, i] - ETA * (grad + MU * own_v[:, i])
        theta[:, i] = alpha * theta[:, i] + (1 - alpha) * own_g[:, i]
        g[i] = own_g[:, i].mean(axis=0)
      else:
        grad = mean
        if mode == "delayed":
          grad, in_flight[i] = in_flight[i].copy(), mean
        v[i] = MU * v[i] + grad
        g[i] = g[i] - ETA * (grad + MU * v[i])
        theta[:, i] = alpha * theta[:, i] + (1 - alpha) * g[i]
    out.append((g.copy(), theta.copy()))
  return out


def make(mode, M, P, H, alpha=0.0, **kw):
  cfg = DiLoCoConfig(algorithm="streaming" if P > 1 else "diloco", replicas=M, sync_every=H,
                     fragments=P, outer_lr=ETA, outer_momentum=MU, alpha=alpha,
                     outer_overlap=mode, **kw)
  return DiLoCo(quad_loss, optax.sgd(INNER_LR), cfg, layer_mask=MASK)


def init(algo):
  return algo.init(jax.tree.map(jnp.asarray, {k: v.astype(np.float32) for k, v in INIT.items()}))


def batch(data, t):
  return {k: jnp.asarray(v[t]) for k, v in data.items()}


def run(algo, data, steps, state=None, start=0):
  state = init(algo) if state is None else state
  hist = []
  for t in range(start, steps):
    state, _ = algo.step(state, batch(data, t))
    hist.append((flat(state.global_params),
                 np.stack([flat(jax.tree.map(lambda a: a[m], state.params))
                           for m in range(algo.config.replicas)])))
  return state, hist


@pytest.mark.parametrize("mode", ["none", "delayed", "eager"])
@pytest.mark.parametrize("M", [1, 2, 3])
@pytest.mark.parametrize("P", [1, 3])
def test_matches_the_numpy_reference(mode, M, P):
  H, steps = 3, 13  # four outer periods and one more step: every fragment synced 4 times
  data = targets(steps, M)
  _, hist = run(make(mode, M, P, H), data, steps)
  for t, ((g, th), (g_ref, th_ref)) in enumerate(zip(hist, reference(mode, M, P, H, 0.0, data, steps)), 1):
    np.testing.assert_allclose(g, g_ref, rtol=2e-5, atol=2e-5, err_msg=f"θ_g at step {t}")
    np.testing.assert_allclose(th, th_ref, rtol=2e-5, atol=2e-5, err_msg=f"θ_m at step {t}")


@pytest.mark.parametrize("mode", ["delayed", "eager"])
def test_alpha_blend_matches_the_reference(mode):
  M, P, H, steps = 2, 3, 6, 20
  data = targets(steps, M, seed=1)
  _, hist = run(make(mode, M, P, H, alpha=0.3), data, steps)
  ref = reference(mode, M, P, H, 0.3, data, steps)
  for (g, th), (g_ref, th_ref) in zip(hist, ref):
    np.testing.assert_allclose(g, g_ref, rtol=2e-5, atol=2e-5)
    np.testing.assert_allclose(th, th_ref, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("P", [1, 3])
@pytest.mark.parametrize("wire", [{}, {"compression": "bf16", "error_feedback": True}])
def test_eager_with_one_replica_is_vanilla_bit_for_bit(P, wire):
  steps = 13
  data = targets(steps, 1, seed=2)
  _, eager = run(make("eager", 1, P, 3, **wire), data, steps)
  _, plain = run(make("none", 1, P, 3, **wire), data, steps)
  for (g, th), (g0, th0) in zip(eager, plain):
    np.testing.assert_array_equal(g, g0)
    np.testing.assert_array_equal(th, th0)


def test_delayed_differs_from_none_and_applies_nothing_at_the_first_sync():
  steps = 7
  data = targets(steps, 2, seed=3)
  _, delayed = run(make("delayed", 2, 1, 3), data, steps)
  _, plain = run(make("none", 2, 1, 3), data, steps)
  np.testing.assert_array_equal(delayed[2][0], flat(INIT).astype(np.float32))  # first sync: Δ^(0) = 0
  assert not np.allclose(delayed[2][1], plain[2][1]) and not np.allclose(delayed[-1][0], plain[-1][0])


def test_state_holds_the_in_flight_gradient_and_bytes_are_unchanged():
  algos = {m: make(m, 2, 3, 3) for m in ("none", "delayed", "eager")}
  states = {m: init(a) for m, a in algos.items()}
  assert states["none"].in_flight is None
  assert jax.tree.structure(states["delayed"].in_flight) == jax.tree.structure(states["none"].global_params)
  assert states["eager"].in_flight.outer_params["layers"].shape == (2, L, 2)
  assert algos["eager"].fragment_bytes == algos["none"].fragment_bytes == algos["delayed"].fragment_bytes
  assert [algos["eager"].bytes_sent(t) for t in range(1, 7)] == [algos["none"].bytes_sent(t) for t in range(1, 7)]


@pytest.mark.parametrize("kw, match", [
    ({"overlap": 1}, r"outer_overlap='eager' .* needs overlap \(τ\) = 0, got τ=1"),
    ({"outer_overlap": "async"}, r"outer_overlap must be one of \('none', 'delayed', 'eager'\)"),
])
def test_bad_combinations_are_one_line_errors(kw, match):
  with pytest.raises(ValueError, match=match):
    DiLoCoConfig(**{"outer_overlap": "eager", **kw})


def test_replica_drops_are_refused_with_overlap():
  algo = make("delayed", 2, 1, 3)
  state = init(algo)
  with pytest.raises(ValueError, match=r"participation .* not supported with outer_overlap='delayed'"):
    algo.step(state, batch(targets(1, 2), 0), jnp.array([1.0, 0.0]))


@pytest.mark.parametrize("mode", ["delayed", "eager"])
def test_checkpoint_round_trip_mid_flight_is_bit_exact(mode, tmp_path):
  M, P, H, steps, cut = 2, 3, 3, 12, 7  # step 7: fragments sent at 5, 6, 7 still in flight
  data = targets(steps, M, seed=4)
  algo = make(mode, M, P, H, compression="fp8", error_feedback=True)
  _, straight = run(algo, data, steps)
  state, _ = run(algo, data, cut)
  writer = ckpt.CheckpointWriter(str(tmp_path), keep=1)
  config = {"algo": dataclasses.asdict(algo.config)}
  writer.save(cut, state, {"config": config})
  writer.close()
  fresh = init(make(mode, M, P, H, compression="fp8", error_feedback=True))
  restored = ckpt.restore_latest(str(tmp_path), fresh, config, must_match_fields(DiLoCoConfig))
  assert restored.step == cut
  for a, b in zip(jax.tree.leaves(restored.state.in_flight), jax.tree.leaves(state.in_flight)):
    np.testing.assert_array_equal(a, b)
  _, resumed = run(algo, data, steps, state=restored.state, start=cut)
  for (g, th), (g0, th0) in zip(resumed, straight[cut:]):
    np.testing.assert_array_equal(g, g0)
    np.testing.assert_array_equal(th, th0)


def test_a_checkpoint_of_another_outer_overlap_is_refused(tmp_path):
  algo = make("none", 2, 1, 3)
  state = init(algo)
  writer = ckpt.CheckpointWriter(str(tmp_path), keep=1)
  writer.save(0, state, {"config": {"algo": dataclasses.asdict(algo.config)}})
  writer.close()
  eager = make("eager", 2, 1, 3)
  with pytest.raises(ValueError, match=r"outer_overlap='none' but this run has outer_overlap='eager'"):
    ckpt.restore_latest(str(tmp_path), init(eager), {"algo": dataclasses.asdict(eager.config)},
                        ["algo." + f for f in must_match_fields(DiLoCoConfig)])


def test_trainer_refuses_drops_with_outer_overlap_before_training():
  from diloco_core.train import TrainConfig
  with pytest.raises(ValueError, match=r"drop_prob are not supported with outer_overlap='eager'"):
    TrainConfig(algo=DiLoCoConfig(outer_overlap="eager"), drop_prob=0.1).validate()


def test_a_checkpoint_from_before_outer_overlap_is_refused_with_the_clear_error(tmp_path):
  # Its state has the same leaves (in_flight is None for "none"); its config lacks the field.
  algo = make("none", 2, 1, 3)
  state = init(algo)
  old = {k: v for k, v in dataclasses.asdict(algo.config).items() if k != "outer_overlap"}
  writer = ckpt.CheckpointWriter(str(tmp_path), keep=1)
  writer.save(0, state, {"config": {"algo": old}})
  writer.close()
  with pytest.raises(ValueError, match=r"written with outer_overlap='<missing>' but this run has"
                                       r" outer_overlap='none'"):
    ckpt.restore_latest(str(tmp_path), init(algo), {"algo": dataclasses.asdict(algo.config)},
                        ["algo." + f for f in must_match_fields(DiLoCoConfig)])
