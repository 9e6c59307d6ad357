"""The token-embedding lookup, with a gradient that fuses with a replica-stacked update.

The lookup is a gather, ``x = E[tokens]``, and its gradient a scatter-add of the rows'
cotangents into a zero table. Under :func:`jax.vmap` (the M replicas of a DiLoCo step are one
program with a leading replica axis) JAX batches that scatter, and XLA lowers it as one scatter
into a flattened ``[M·V, d]`` table. The optimizer update that reads the gradient is shaped
``[M, V, d]``, and on a TPU v5e XLA did not fuse the two across that reshape: AdamW's moments of
the embedding took a separate pass over float32 copies (``benchmarks/accelerator.py``'s
profile; the performance page shows the one after this fix).

:func:`embed_lookup` is the same gather with the same gradient; when the program runs on one
accelerator (:func:`stacked_scatter`) its batched gradient is M scatters of one replica each,
stacked (:func:`jax.custom_batching.custom_vmap`), which XLA fuses into the update as in one
model's step. On a mesh of several devices it stays JAX's batched scatter, which the SPMD
partitioner splits along a sharded replica axis without communication (stacked slices would
make it gather them). On a CPU it stays JAX's batched scatter too: the two add a row's
duplicate cotangents in an order of XLA's choosing, and on a CPU with AVX-512 that order
differs for some shapes (a stored 2,400-step CPU experiment moved by 23% of its gap to the
floor), while the CPU's numbers are promised bit for bit from run to run and against the
stored experiments. On an accelerator the stacked form's numbers are those of a scatter of each
replica alone, which may differ from the batched scatter's in the last bits.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import custom_batching


def _one_device() -> bool:
  """Whether the program being traced runs on one device: no mesh set (``jax.set_mesh``), or a
  mesh of one device."""
  mesh = jax.sharding.get_abstract_mesh()
  return mesh.empty or mesh.size == 1


def stacked_scatter() -> bool:
  """Whether :func:`embed_lookup`'s batched gradient is one scatter per replica, stacked: on one
  device (no mesh set, or a mesh of one) of an accelerator (see the module docstring).

  Examples:
    >>> jax.default_backend() != "cpu" or stacked_scatter()
    False
  """
  return _one_device() and jax.default_backend() != "cpu"


def _scatter_rows(vocab: int, tokens: jax.Array, g: jax.Array) -> jax.Array:
  """``zeros([vocab, d]).at[tokens].add(g)``: the gradient of one table's lookup."""
  d = g.shape[-1]
  return jnp.zeros((vocab, d), g.dtype).at[tokens.reshape(-1)].add(g.reshape(-1, d))


def _rows_grad(vocab: int, tokens: jax.Array, g: jax.Array) -> jax.Array:
  """:func:`_scatter_rows`, batched over a leading axis as the module docstring says."""
  scatter = custom_batching.custom_vmap(lambda t, x: _scatter_rows(vocab, t, x))

  @scatter.def_vmap
  def _batched(axis_size, in_batched, tokens, g):
    tokens, g = (x if b else jnp.broadcast_to(x, (axis_size, *x.shape)) for x, b in zip((tokens, g), in_batched))
    if stacked_scatter():
      return jnp.stack([_scatter_rows(vocab, tokens[m], g[m]) for m in range(axis_size)]), True
    return jax.vmap(lambda t, x: _scatter_rows(vocab, t, x))(tokens, g), True

  return scatter(tokens, g)


@jax.custom_vjp
def _lookup(table, tokens):
  return table[tokens]


def embed_lookup(table: jax.Array, tokens: jax.Array) -> jax.Array:
  """The rows of ``table`` at ``tokens``: ``table[tokens]``, shaped ``[*tokens.shape, d]``.

  .. math::
     x_{\\ldots} = E_{t_{\\ldots}}, \\qquad
     \\frac{\\partial \\mathcal{L}}{\\partial E_v} = \\sum_{i:\\, t_i = v} \\frac{\\partial \\mathcal{L}}{\\partial x_i}

  Under :func:`jax.vmap` on one accelerator the gradient is one scatter per replica, stacked
  (:func:`stacked_scatter`, the module docstring); elsewhere it is ``table[tokens]``'s own.

  Args:
    table: the embedding table ``[V, d]`` (any float dtype; the gradient has its dtype).
    tokens: int token ids, any shape.

  Returns:
    The rows, ``[*tokens.shape, d]``.

  Examples:
    >>> table = jnp.arange(6.0).reshape(3, 2)
    >>> tokens = jnp.array([[2, 0, 2]])
    >>> embed_lookup(table, tokens).tolist()
    [[[4.0, 5.0], [0.0, 1.0], [4.0, 5.0]]]
    >>> jax.grad(lambda e: embed_lookup(e, tokens).sum())(table).tolist()
    [[1.0, 1.0], [0.0, 0.0], [2.0, 2.0]]
    >>> stacked = jnp.stack([table, 10 * table])
    >>> jax.vmap(jax.grad(lambda e, t: (embed_lookup(e, t) ** 2).sum()))(stacked, jnp.array([[0], [1]])).tolist()
    [[[0.0, 2.0], [0.0, 0.0], [0.0, 0.0]], [[0.0, 0.0], [40.0, 60.0], [0.0, 0.0]]]
  """
  return _lookup(table, tokens)


def _fwd(table, tokens):
  return table[tokens], (tokens, table.shape[0])


def _bwd(res, g):
  tokens, vocab = res
  return _rows_grad(vocab, tokens, g), None


_lookup.defvjp(_fwd, _bwd)
