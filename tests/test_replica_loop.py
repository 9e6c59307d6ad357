"""The replicas' inner steps as one vectorized program or as a loop of one model's step: the same numbers."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from diloco_core import DiLoCo, DiLoCoConfig, get_preset, init_model, layer_mask, lm_loss
from diloco_core.devices.mesh import make_mesh

#: After 8 AdamW steps (lr 1e-2) the two programs' params differ by float32 reassociation only:
#: measured 1.3e-7 on XLA:CPU (entries of order 0.02 to 1), and a changed computation would move
#: them by the learning rate, 1e-2.
ATOL = 1e-6


def _run(loop: str, config: DiLoCoConfig, steps: int = 8):
  with jax.default_matmul_precision("highest"):
    cfg = dataclasses.replace(get_preset("tiny"), compute_dtype="float32")
    apply_fn, params = init_model(cfg, 0)
    algo = DiLoCo(lambda p, x: lm_loss(apply_fn, p, x), optax.adamw(1e-2), config,
                  layer_mask=layer_mask(params), replica_loop=loop)
    state = algo.init(params)
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(steps):
      state, m = algo.step(state, algo.place_batch(rng.integers(0, 32, (config.replicas, 2, 9)).astype(np.int32)))
      losses.append(np.asarray(m["loss"]))
  return jax.tree.leaves(state), np.stack(losses)


@pytest.mark.parametrize("config", [DiLoCoConfig(replicas=4, sync_every=3),
                                    DiLoCoConfig(algorithm="streaming", replicas=2, sync_every=4, fragments=2,
                                                 overlap=1)], ids=["diloco", "streaming"])
def test_sequential_replicas_compute_what_the_vectorized_step_does(config):
  vec, vec_loss = _run("vectorized", config)
  seq, seq_loss = _run("sequential", config)
  np.testing.assert_allclose(seq_loss, vec_loss, rtol=0, atol=ATOL)
  for a, b in zip(vec, seq):
    np.testing.assert_allclose(np.asarray(b, np.float64), np.asarray(a, np.float64), rtol=0, atol=ATOL)


def test_replica_loop_bad_values_are_one_line():
  loss = lambda w, x: jnp.sum((w - x) ** 2)
  with pytest.raises(ValueError, match=r"replica_loop must be one of \('vectorized', 'sequential'\), got 'auto'"):
    DiLoCo(loss, optax.sgd(0.1), DiLoCoConfig(replicas=2), replica_loop="auto")


@pytest.mark.needs_cpu_devices(2)
def test_sequential_replicas_need_shared_devices():
  with pytest.raises(ValueError, match="replica_loop 'sequential' needs the replicas on shared devices"):
    DiLoCo(lambda w, x: jnp.sum((w - x) ** 2), optax.sgd(0.1), DiLoCoConfig(replicas=2),
           mesh=make_mesh({"diloco": 2, "data": 1}), replica_loop="sequential")
