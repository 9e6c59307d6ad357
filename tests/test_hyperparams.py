"""Hyperparameters as step inputs: same numbers as compiled-in constants, one compile per program."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from diloco_core import DataParallel, DiLoCo, DiLoCoConfig
from diloco_core.run.programs import PROGRAMS
from diloco_core.train import clear_program_cache, program_key, train
from tiny_run import tiny


def quad_loss(params, target):
  return 0.5 * sum(jnp.sum((p - t) ** 2) for p, t in zip(jax.tree.leaves(params), jax.tree.leaves(target)))


def _problem(replicas=2, steps=12, seed=0):
  rng = np.random.default_rng(seed)
  params = {"emb": jnp.asarray(rng.normal(size=(3,)), jnp.float32),
            "layers": jnp.asarray(rng.normal(size=(4, 2)), jnp.float32)}
  mask = {"emb": False, "layers": True}
  batches = [jax.tree.map(lambda x: jnp.asarray(rng.normal(size=(replicas, *x.shape)), jnp.float32),
                          params) for _ in range(steps)]
  return params, mask, batches


def _run(algo, params, batches):
  state = algo.init(params)
  for b in batches:
    state, _ = algo.step(state, b)
  return jax.device_get(state)


def _assert_same(a, b):
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


STREAMING = dict(algorithm="streaming", replicas=2, sync_every=6, fragments=3, overlap=1)


@pytest.mark.parametrize("changes", [dict(outer_lr=0.3), dict(outer_momentum=0.0),
                                     dict(alpha=0.5), dict(outer_lr=1.0, outer_momentum=0.5, alpha=0.25),
                                     dict(sync_every=3), dict(overlap=0), dict(sync_every=9, overlap=2)])
def test_with_hyperparams_shares_the_program_and_equals_a_fresh_trainer(changes):
  """A copy with new η / μ / α runs the first object's compiled step (one compile in all) and
  gives bit for bit the numbers of a trainer built from scratch with those values."""
  params, mask, batches = _problem()
  base = DiLoCo(quad_loss, optax.adam(0.05), DiLoCoConfig(**STREAMING), layer_mask=mask)
  _run(base, params, batches)
  copy = base.with_hyperparams(**changes)
  got = _run(copy, params, batches)
  assert copy.program is base.program and base.compiled_programs == 1
  fresh = DiLoCo(quad_loss, optax.adam(0.05), DiLoCoConfig(**{**STREAMING, **changes}), layer_mask=mask)
  _assert_same(got, _run(fresh, params, batches))
  assert copy.config == fresh.config and base.config.outer_lr == DiLoCoConfig().outer_lr


def test_traced_outer_optimizer_equals_the_constant_one():
  """The default outer optimizer (η, μ traced) and optax.sgd(η, μ, nesterov=True) with the
  values compiled in give the same state after syncs with momentum."""
  params, mask, batches = _problem()
  cfg = DiLoCoConfig(**STREAMING, outer_lr=0.7, outer_momentum=0.9)
  traced = _run(DiLoCo(quad_loss, optax.adam(0.05), cfg, layer_mask=mask), params, batches)
  const = _run(DiLoCo(quad_loss, optax.adam(0.05), cfg, layer_mask=mask,
                      outer_optimizer=optax.sgd(0.7, momentum=0.9, nesterov=True)), params, batches)
  for x, y in zip(jax.tree.leaves(traced), jax.tree.leaves(const)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-6, atol=1e-7)


def test_inner_optimizer_factory_reads_extra_hyperparams():
  """A factory ``hp -> optimizer`` sees the extra hyperparameters; changing one reuses the step.
  DP with SGD: w <- w - lr * mean(w - x), so lr = 0.5 then 0.25 from w = 0, x = (1, 3)."""
  dp = DataParallel(lambda w, x: 0.5 * jnp.sum((w - x) ** 2), lambda hp: optax.sgd(hp["lr"]),
                    DiLoCoConfig(algorithm="dp"), hyperparams={"lr": 0.5})
  state, _ = dp.step(dp.init(jnp.zeros(())), jnp.array([1.0, 3.0]))
  assert float(state.params) == 1.0
  dp2 = dp.with_hyperparams(lr=0.25)
  state, _ = dp2.step(dp2.init(jnp.zeros(())), jnp.array([1.0, 3.0]))
  assert float(state.params) == 0.5 and dp2.program is dp.program and dp.compiled_programs == 1
  assert dp2.hyperparams == {"lr": 0.25} and dp.hyperparams == {"lr": 0.5}


def test_new_shapes_compile_a_new_step():
  algo = DiLoCo(quad_loss, optax.sgd(0.1), DiLoCoConfig(sync_every=2))
  algo.init(jnp.zeros(3))
  first = algo.program
  algo.init(jnp.zeros(5))
  assert algo.program is not first


@pytest.mark.parametrize("changes,match", [
    (dict(alpha=2.0), r"alpha \(α\) must be a finite number in \[0, 1\], got 2.0"),
    (dict(outer_momentum=1.0), r"outer_momentum \(μ\) must be a finite number in \[0, 1\)"),
    (dict(sync_every=4), r"sync_every \(H=4\) must be a multiple of fragments \(P=3\)"),
    (dict(overlap=6), r"overlap \(τ\) must be an integer with 0 <= τ < sync_every \(H=6\), got 6"),
    (dict(inner_lr=0.1), r"unknown hyperparameter\(s\) \['inner_lr'\]; allowed: \['alpha', 'error_feedback_decay', 'outer_beta2', 'outer_lr', 'outer_momentum', 'overlap', 'sync_every'\]"),
])
def test_with_hyperparams_bad_values(changes, match):
  algo = DiLoCo(quad_loss, optax.sgd(0.1), DiLoCoConfig(**STREAMING))
  with pytest.raises(ValueError, match=match):
    algo.with_hyperparams(**changes)


@pytest.mark.parametrize("extra,match", [
    ({"outer_lr": 1.0}, r"names must be strings other than \['alpha', 'error_feedback_decay', 'outer_beta2', 'outer_lr', 'outer_momentum', 'overlap', 'sync_every'\], got 'outer_lr'"),
    ({"lr": float("nan")}, r"hyperparams\['lr'\] must be a finite number, got nan"),
    ({"lr": True}, r"hyperparams\['lr'\] must be a finite number, got True"),
])
def test_bad_extra_hyperparams(extra, match):
  with pytest.raises(ValueError, match=match):
    DiLoCo(quad_loss, optax.sgd(0.1), DiLoCoConfig(), hyperparams=extra)


def test_program_key_ignores_exactly_the_traced_values():
  a = tiny()
  same = [dataclasses.replace(a, inner_lr=1e-2, weight_decay=0.0, grad_clip=0.5, seed=3),
          dataclasses.replace(a, algo=dataclasses.replace(a.algo, outer_lr=0.1, outer_momentum=0.0, alpha=0.5)),
          dataclasses.replace(a, algo=dataclasses.replace(a.algo, sync_every=2, overlap=1))]
  different = [dataclasses.replace(a, grad_clip=0.0), dataclasses.replace(a, steps=10),
               dataclasses.replace(a, batch_size=4), dataclasses.replace(a, n_layers=4),
               dataclasses.replace(a, algo=dataclasses.replace(a.algo, replicas=4)),
               dataclasses.replace(a, algo=dataclasses.replace(a.algo, compression="fp8"))]
  key = program_key(a, a.model_config())
  assert all(program_key(c, c.model_config()) == key for c in same)
  assert all(program_key(c, c.model_config()) != key for c in different)


@pytest.mark.parametrize("algo", ["dp", "streaming"])
def test_train_reuses_the_program_with_identical_numbers(algo):
  """train() on configs differing only in learning rates / η / α: the second run compiles
  nothing, and its metrics equal those of the same run with nothing cached."""
  kw = dict(fragments=3, sync_every=6, overlap=1, n_layers=2, steps=12) if algo == "streaming" else {}
  a = tiny(algo, **kw)
  b = dataclasses.replace(a, inner_lr=1e-2, weight_decay=0.0,
                          algo=dataclasses.replace(a.algo, outer_lr=0.5, alpha=0.5, overlap=2)
                          if algo != "dp" else a.algo)
  clear_program_cache()
  train(a)
  warm = train(b)
  cached_algo, _ = PROGRAMS[program_key(b, b.model_config(vocab_size=16))]
  assert cached_algo.compiled_programs == 1 and len(PROGRAMS) == 1
  clear_program_cache()
  cold = train(b)
  cols = ["step", "train_loss", "eval_loss", "bytes_sent"]
  assert warm.metrics[cols].equals(cold.metrics[cols])
  _assert_same(warm.state, cold.state)
  clear_program_cache()
