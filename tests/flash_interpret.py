"""The Pallas flash-attention kernel against XLA's attention (``tests/test_precision.py``).

``python tests/flash_interpret.py KV_HEADS`` checks it off a TPU under Pallas's TPU interpret
mode, with 128-position blocks to keep it quick, in a process of its own, and prints
``flash matches XLA (kv_heads=K)``; on a TPU the test calls :func:`check_flash_against_xla` itself.
The XLA references are computed before the interpreted kernel runs, and each result is waited
for before the next program starts: nothing else runs beside the interpretation.
"""

import contextlib
import sys

import jax
import jax.numpy as jnp
import numpy as np


def flash_tolerance(v) -> float:
  """|flash - XLA| bound for bfloat16 attention: each path rounds its probabilities (2^-9
  relative, at most max|v| in the output) and its output (2^-9 of |out| <= max|v|) once:
  4 x 2^-9 x max|v| = 2^-7 max|v| in all."""
  return 2.0 ** -7 * float(jnp.max(jnp.abs(v.astype(jnp.float32))))


def check_flash_against_xla(kv_heads: int) -> None:
  """Forward and backward of ``_flash_attention`` against ``jax.nn.dot_product_attention`` (XLA).

  The forward bound is :func:`flash_tolerance`. The kernel's own backward pass: dq, dk, dv are
  sums over T of products of two bfloat16 factors (a probability or its gradient, and k, q or v);
  each path rounds each factor and the result once (3 x 2^-9 relative), both paths together
  6 x 2^-9 < 2^-6 of the largest entry (measured under interpretation: 2^-7.6 at most).
  """
  from diloco_core.model.transformer import _flash_attention
  rng = np.random.default_rng(0)
  q = jnp.asarray(rng.normal(size=(1, 256, 2, 128)), jnp.bfloat16)
  k, v = (jnp.asarray(rng.normal(size=(1, 256, kv_heads, 128)), jnp.bfloat16) for _ in range(2))
  w = jnp.asarray(rng.normal(size=q.shape), jnp.float32)
  xla_attention = lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
  grads = lambda f: jax.jit(jax.grad(lambda *a: jnp.sum(f(*a).astype(jnp.float32) * w), argnums=(0, 1, 2)))(q, k, v)
  xla = np.asarray(jax.jit(xla_attention)(q, k, v).astype(jnp.float32))
  xla_grads = [np.asarray(g.astype(jnp.float32)) for g in grads(xla_attention)]
  interpret = contextlib.nullcontext()
  if jax.default_backend() != "tpu":
    from jax.experimental.pallas import tpu as pltpu
    interpret = pltpu.force_tpu_interpret_mode()
  with interpret:
    flash = np.asarray(jax.block_until_ready(jax.jit(_flash_attention)(q, k, v)).astype(jnp.float32))
    flash_grads = [np.asarray(g.astype(jnp.float32)) for g in jax.block_until_ready(grads(_flash_attention))]
  np.testing.assert_allclose(flash, xla, rtol=0, atol=flash_tolerance(v))
  for a, b in zip(flash_grads, xla_grads, strict=True):
    np.testing.assert_allclose(a, b, rtol=0, atol=2.0 ** -6 * np.abs(b).max())


def main(argv) -> int:
  from diloco_core.model import transformer
  if jax.default_backend() != "tpu":
    transformer.FLASH_BLOCK = 128
  kv_heads = int(argv[0])
  with jax.default_matmul_precision("default"):
    check_flash_against_xla(kv_heads)
  print(f"flash matches XLA (kv_heads={kv_heads})")
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
