"""A small decoder-only transformer in Flax NNX with layer-stacked parameters.

Every block's weights live in one :class:`flax.nnx.Param` per kind with a leading
layer axis of length L (``blocks/wq`` has shape ``[L, d, h, d_h]``, and so on), and the
forward pass runs :func:`jax.lax.scan` over that axis. This is what lets Streaming
DiLoCo take "every third layer" as one fragment with a single traced index instead of
P separately compiled branches. The params pytree the DiLoCo core sees is the plain
nested dict :func:`split_params` returns; ``blocks/*`` are the stacked-layer leaves
(:func:`layer_mask`).

Precision: params are float32 and stay so (they are the masters the optimizers update);
the forward pass casts them to ``cfg.compute_dtype`` (bfloat16 by default on GPU/TPU,
float32 on CPU, see :mod:`diloco_core.devices.backend`), computes norms, RoPE angles and the
attention softmax in float32, and returns float32 logits, so the loss is float32 too.
Attention is :func:`jax.nn.dot_product_attention` (causal; XLA or cuDNN) or, with
``cfg.attention = "flash"`` on a TPU, the Pallas flash-attention kernel JAX ships;
``cfg.remat = "block"`` recomputes each scanned block in the backward pass and ``"dots"``
everything but the weight matmuls' outputs; ``cfg.loss_chunk`` > 0 fuses the output head with
the cross-entropy (:mod:`diloco_core.model.fused_loss`), so the logits are never held whole.

Mixture of experts: with ``cfg.num_experts`` E > 1 every block's MLP is E routed experts
(:mod:`diloco_core.model.moe`), their weights stacked as ``[L, E, ...]`` with a float32 router
``blocks/router`` ``[L, d, E]``; :func:`train_loss` adds their auxiliary losses to the LM
loss, and :func:`lm_loss` (the evaluation loss) is the LM loss alone.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from optax.contrib import MuonDimensionNumbers
from flax import nnx

from diloco_core.model import embedding, fused_loss, moe
from diloco_core.devices.backend import resolve_model_config
from diloco_core.spec.model_config import ModelConfig


def _normal_draw(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
  """``jax.random.normal(key, shape, float32)``, drawn as a power-of-two-long vector and cut.

  The same numbers: JAX's random bits (``jax_threefry_partitionable``, its default) depend on
  the key and an element's flat index only, so a longer draw begins with this one
  (``tests/test_model.py`` checks a dense and an MoE model's draws). Drawn this way, a model's
  leaves share a few compiled programs, one per power of two, instead of one per shape: the
  draw is the costliest program of the initialisation to compile (about 0.5 s each on a CPU
  core), and every new shape, model and device would compile it again.

  Examples:
    >>> key = jax.random.key(0)
    >>> bool((_normal_draw(key, (3, 5)) == jax.random.normal(key, (3, 5), jnp.float32)).all())
    True
  """
  n = math.prod(shape)
  return jax.random.normal(key, (1 << max(n - 1, 0).bit_length(),), jnp.float32)[:n].reshape(shape)


def _rms_norm(x: jax.Array, scale: jax.Array, eps: float = 1e-6) -> jax.Array:
  """RMSNorm computed in float32, returned in the dtype of ``x``."""
  x32 = x.astype(jnp.float32)
  normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  return (normed * scale.astype(jnp.float32)).astype(x.dtype)


def _rope(x: jax.Array, positions: jax.Array) -> jax.Array:
  """Rotary embedding on ``x[..., T, heads, d_h]`` (rotate-half convention)."""
  half = x.shape[-1] // 2
  freqs = 1.0 / (10000.0 ** (jnp.arange(half, dtype=jnp.float32) / half))
  angles = positions[:, None].astype(jnp.float32) * freqs[None, :]  # [T, half]
  sin, cos = jnp.sin(angles)[:, None, :], jnp.cos(angles)[:, None, :]
  x1, x2 = x[..., :half], x[..., half:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def _attention(cfg: ModelConfig, x: jax.Array, w: dict[str, jax.Array]) -> jax.Array:
  """``x + attn(norm(x))``: the attention half of a block, in the dtype of ``w``.

  ``cfg`` must be resolved (:func:`~diloco_core.devices.backend.resolve_model_config`):
  ``cfg.attention`` is ``"xla"`` or ``"cudnn"``.
  """
  t = x.shape[-2]
  h = _rms_norm(x, w["attn_norm"])
  q = jnp.einsum("btd,dhk->bthk", h, w["wq"])
  k = jnp.einsum("btd,dhk->bthk", h, w["wk"])
  v = jnp.einsum("btd,dhk->bthk", h, w["wv"])
  if cfg.positions == "rope":
    pos = jnp.arange(t)
    q, k = _rope(q, pos), _rope(k, pos)
  # Causal attention without a materialized mask; GQA groups query heads n with kv head
  # n // (n_heads / kv_heads). Scores, softmax and its sums are float32 (XLA) or fused (cuDNN,
  # the Pallas flash kernel).
  if cfg.attention == "flash":
    attn = _flash_attention(q, k, v)
  else:
    attn = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation=cfg.attention)
  return x + jnp.einsum("bthk,hkd->btd", attn, w["wo"])


#: The Pallas flash kernel's tile: query and key blocks of this many positions (the largest
#: divisor of the sequence up to it). On a TPU v5e (2026-12-06, 16 heads of 64, batch 4 of 1,024
#: tokens) the 336M model's step took 102 ms with 512, 105 ms with 1,024 and 119 ms with 256.
FLASH_BLOCK = 512


def _flash_attention(q: jax.Array, k: jax.Array, v: jax.Array) -> jax.Array:
  """Causal attention by the Pallas flash-attention kernel JAX ships for TPU, ``[b, t, h, d_h]``.

  The kernel takes ``[b, h, t, d_h]`` with as many key/value heads as query heads, so GQA's
  key/value heads are repeated (query head n reads kv head ``n // (h / h_kv)``, as XLA's
  attention). It runs the softmax online in float32 over key blocks of :data:`FLASH_BLOCK`
  positions and never holds the ``[t, t]`` scores; its backward pass is the kernel's own.
  """
  from jax.experimental.pallas.ops.tpu import flash_attention as pallas_flash  # TPU only

  groups = q.shape[2] // k.shape[2]
  if groups > 1:
    k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
  t = q.shape[1]
  blk = t if t <= 128 else math.gcd(t, FLASH_BLOCK)
  if blk % 128 and blk != t:
    raise ValueError(f"attention 'flash' needs a sequence length that is at most 128 or a multiple of 128"
                     f" (the kernel's tiles), got {t}; use attention 'xla' or another `seq_len`.")
  sizes = pallas_flash.BlockSizes(
      block_q=blk, block_k_major=blk, block_k=blk, block_b=1, block_q_major_dkv=blk,
      block_k_major_dkv=blk, block_k_dkv=blk, block_q_dkv=blk, block_k_major_dq=blk, block_k_dq=blk,
      block_q_dq=blk)
  swap = lambda a: jnp.swapaxes(a, 1, 2)
  out = pallas_flash.flash_attention(swap(q), swap(k), swap(v), causal=True,
                                     sm_scale=1.0 / math.sqrt(q.shape[-1]), block_sizes=sizes)
  return swap(out)


def _block(cfg: ModelConfig, x: jax.Array, w: dict[str, jax.Array]) -> jax.Array:
  """One dense pre-norm block: x + attn(norm(x)), then x + mlp(norm(x)), in the dtype of ``w``."""
  x = _attention(cfg, x, w)
  h = _rms_norm(x, w["mlp_norm"])
  if cfg.mlp == "swiglu":
    hidden = jax.nn.silu(h @ w["w_gate"]) * (h @ w["w_up"])
  else:
    hidden = jax.nn.gelu(h @ w["w_up"])
  return x + hidden @ w["w_down"]


def _moe_block(cfg: ModelConfig, x: jax.Array, w: dict[str, jax.Array]
               ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """One MoE pre-norm block: attention as :func:`_block`, then x + moe(norm(x)) (:mod:`diloco_core.model.moe`).

  Returns the new ``x`` and the layer's auxiliary losses ``{"balance", "z"}``.
  """
  x = _attention(cfg, x, w)
  out, aux = moe.moe_mlp(_rms_norm(x, w["mlp_norm"]), w, cfg.experts_per_token, cfg.mlp)
  return x + out, aux


class StackedBlocks(nnx.Module):
  """The L transformer blocks, each weight stacked on a leading layer axis."""

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    L, d, f, dh = cfg.n_layers, cfg.d_model, cfg.d_ff, cfg.head_dim
    std = 0.02
    out_std = std / math.sqrt(2 * L)  # GPT-2 style scaling of residual projections

    def normal(shape, s):
      return nnx.Param(s * _normal_draw(rngs.params(), (L, *shape)))

    self.attn_norm = nnx.Param(jnp.ones((L, d), jnp.float32))
    self.wq = normal((d, cfg.n_heads, dh), std)
    self.wk = normal((d, cfg.kv_heads, dh), std)
    self.wv = normal((d, cfg.kv_heads, dh), std)
    self.wo = normal((cfg.n_heads, dh, d), out_std)
    self.mlp_norm = nnx.Param(jnp.ones((L, d), jnp.float32))
    experts = (cfg.num_experts,) if cfg.num_experts > 1 else ()  # MoE: [L, E, ...]
    if cfg.mlp == "swiglu":
      self.w_gate = normal((*experts, d, f), std)
    self.w_up = normal((*experts, d, f), std)
    self.w_down = normal((*experts, f, d), out_std)
    if experts:
      self.router = normal((d, cfg.num_experts), std)
    self.cfg = cfg

  def __call__(self, x: jax.Array) -> tuple[jax.Array, dict[str, jax.Array] | None]:
    """Runs the L blocks; returns ``x`` and, for MoE, the per-layer aux losses (``[L]`` each)."""
    names = ["attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_up", "w_down"]
    if self.cfg.mlp == "swiglu":
      names.append("w_gate")
    dtype = jnp.dtype(self.cfg.compute_dtype)
    stacked = {n: getattr(self, n)[...].astype(dtype) for n in names}
    is_moe = self.cfg.num_experts > 1
    if is_moe:
      stacked["router"] = self.router[...]  # float32: the router computes in float32

    def body(carry, w):
      return _moe_block(self.cfg, carry, w) if is_moe else (_block(self.cfg, carry, w), None)

    if self.cfg.remat == "block":  # keep only each block's input; recompute the rest
      body = jax.checkpoint(body, prevent_cse=False)
    elif self.cfg.remat == "dots":  # keep the weight matmuls' outputs; recompute the rest
      body = jax.checkpoint(body, prevent_cse=False,
                            policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    return jax.lax.scan(body, x, stacked)


class Transformer(nnx.Module):
  """Decoder-only transformer: embeddings, L stacked pre-norm blocks, final norm, head.

  Examples:
    >>> from diloco_core.spec.model_config import get_preset, param_count
    >>> model = Transformer(get_preset("tiny"), rngs=nnx.Rngs(0))
    >>> model(jnp.zeros((2, 8), jnp.int32)).shape
    (2, 8, 32)
    >>> params = split_params(model)[1]
    >>> sum(x.size for x in jax.tree.leaves(params)) == param_count(get_preset("tiny"))
    True
  """

  def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
    cfg = resolve_model_config(cfg)
    self.cfg = cfg
    self.embed = nnx.Param(0.02 * _normal_draw(rngs.params(), (cfg.vocab_size, cfg.d_model)))
    if cfg.positions == "learned":
      self.pos_embed = nnx.Param(
          0.02 * _normal_draw(rngs.params(), (cfg.max_seq_len, cfg.d_model)))
    self.blocks = StackedBlocks(cfg, rngs=rngs)
    self.final_norm = nnx.Param(jnp.ones((cfg.d_model,), jnp.float32))
    if not cfg.tie_embeddings:
      self.head = nnx.Param(0.02 * _normal_draw(rngs.params(), (cfg.d_model, cfg.vocab_size)))

  def __call__(self, tokens: jax.Array, *, with_aux: bool = False, targets: jax.Array | None = None):
    """Maps int tokens ``[..., T]`` to float32 logits ``[..., T, V]`` (or their mean cross-entropy).

    Every param is cast to ``cfg.compute_dtype`` here (the float32 masters are untouched,
    and their gradients come back float32); norms and softmax compute in float32 and the
    head accumulates into float32 logits. The MoE router computes in float32.

    Args:
      tokens: int token ids ``[..., T]``.
      with_aux: also return the auxiliary loss term of the objective
        (:func:`diloco_core.model.moe.aux_loss`: the weighted load-balancing and z-losses, a
        float32 scalar), or None for a dense model.
      targets: int token ids shaped like ``tokens``: return the mean cross-entropy of the
        logits against them instead of the logits; with ``cfg.loss_chunk`` > 0 the head and
        the loss run fused, that many tokens at a time
        (:func:`~diloco_core.model.fused_loss.chunked_cross_entropy`).

    Returns:
      The logits (or the loss, given ``targets``), or ``(logits, aux)`` with ``with_aux``.
    """
    t = tokens.shape[-1]
    if t > self.cfg.max_seq_len:
      raise ValueError(f"sequence length {t} exceeds the model's max_seq_len {self.cfg.max_seq_len}.")
    dtype = jnp.dtype(self.cfg.compute_dtype)
    embed = self.embed[...].astype(dtype)
    x = embedding.embed_lookup(embed, tokens)  # embed[tokens], its gradient kept [M, V, d] under vmap
    if self.cfg.positions == "learned":
      x = x + self.pos_embed[...][:t].astype(dtype)
    x, per_layer = self.blocks(x)
    x = _rms_norm(x, self.final_norm[...])
    head = embed.T if self.cfg.tie_embeddings else self.head[...].astype(dtype)
    if targets is not None and self.cfg.loss_chunk:
      out = fused_loss.chunked_cross_entropy(x, head, targets, self.cfg.loss_chunk)
    else:
      out = jnp.matmul(x, head, preferred_element_type=jnp.float32)  # the logits
      if targets is not None:
        out = optax.softmax_cross_entropy_with_integer_labels(out, targets).mean()
    if not with_aux:
      return out
    if per_layer is None:
      return out, None
    return out, moe.aux_loss(per_layer, self.cfg.aux_loss_coef, self.cfg.z_loss_coef)


def split_params(model: nnx.Module) -> tuple[nnx.GraphDef, dict[str, Any]]:
  """Splits an NNX model into its graph and a plain nested dict of parameter arrays."""
  graphdef, state = nnx.split(model, nnx.Param)
  return graphdef, nnx.to_pure_dict(state)


def layer_mask(params: dict[str, Any]) -> dict[str, Any]:
  """Marks the stacked-layer leaves (``blocks/*``, leading axis L) with True."""
  return {k: jax.tree.map(lambda _: k == "blocks", v) for k, v in params.items()}


#: Muon's matrix axes of each block weight, (reduction, output) counted from the end; the
#: leading layer (and expert) axes are batch axes. Every other leaf takes AdamW's update.
MUON_AXES = {"wq": ((-3,), (-2, -1)), "wk": ((-3,), (-2, -1)), "wv": ((-3,), (-2, -1)),
             "wo": ((-3, -2), (-1,)), "w_gate": ((-2,), (-1,)), "w_up": ((-2,), (-1,)),
             "w_down": ((-2,), (-1,))}


def muon_dimensions(params: dict[str, Any]) -> dict[str, Any]:
  """For each params leaf, how Muon orthogonalizes it: the blocks' matrices, by :data:`MUON_AXES`.

  The attention projections are matrices from ``d`` to heads × head_dim (and back for
  ``wo``), the MLP weights plain matrices; the norms, the router, the embeddings and the
  head get None (AdamW's update), as in MuLoCo (arXiv 2505.23725) and Muon's own recipe.

  Args:
    params: the model's params (or updates shaped like them).

  Returns:
    A tree shaped like ``params`` of ``optax.contrib.MuonDimensionNumbers`` or None.

  Examples:
    >>> from diloco_core.spec.model_config import get_preset
    >>> dims = muon_dimensions(init_model(get_preset("tiny"), seed=0)[1])
    >>> dims["blocks"]["wo"], dims["embed"]
    (MuonDimensionNumbers(reduction_axis=(-3, -2), output_axis=(-1,)), None)
  """
  def one(path, _):
    keys = [getattr(k, "key", None) for k in path]
    axes = MUON_AXES.get(keys[-1]) if keys[0] == "blocks" else None
    return None if axes is None else MuonDimensionNumbers(*axes)

  return jax.tree_util.tree_map_with_path(one, params)


def init_model(cfg: ModelConfig, seed: int) -> tuple[Callable, dict[str, Any]]:
  """Builds the model and returns ``(apply_fn, params)``.

  ``apply_fn(params, tokens) -> logits`` is a pure function of the plain params dict;
  ``apply_fn(params, tokens, with_aux=True)`` also returns the MoE auxiliary loss
  (see :class:`Transformer`).

  Args:
    cfg: the model shape.
    seed: the parameter-initialisation seed.

  Returns:
    The pure apply function and the initial params (a nested dict of float32 arrays).

  Examples:
    >>> from diloco_core.spec.model_config import get_preset
    >>> apply_fn, params = init_model(get_preset("tiny"), seed=0)
    >>> apply_fn(params, jnp.ones((1, 4), jnp.int32)).shape
    (1, 4, 32)
  """
  graphdef, params = split_params(Transformer(cfg, rngs=nnx.Rngs(seed)))

  def apply_fn(p, tokens, **kwargs):
    return nnx.merge(graphdef, p)(tokens, **kwargs)

  return apply_fn, params


def lm_loss(apply_fn: Callable, params: Any, tokens: jax.Array) -> jax.Array:
  """Mean next-token cross-entropy (nats) of ``tokens[..., :-1] -> tokens[..., 1:]``.

  ``apply_fn`` is :func:`init_model`'s: the model computes the loss itself (``targets=``), so
  that ``ModelConfig.loss_chunk`` can fuse the head with it.
  """
  return apply_fn(params, tokens[..., :-1], targets=tokens[..., 1:])


def train_loss(apply_fn: Callable, params: Any, tokens: jax.Array):
  """The training objective: :func:`lm_loss`, plus the MoE auxiliary losses for an MoE model.

  .. math::
     \\mathcal{L} = \\mathcal{L}_\\text{LM} + \\mathcal{L}_\\text{aux}

  with :math:`\\mathcal{L}_\\text{aux}` from :func:`diloco_core.model.moe.aux_loss`.

  Args:
    apply_fn: as returned by :func:`init_model`.
    params: the params.
    tokens: int tokens ``[..., T + 1]``.

  Returns:
    For a dense model, the LM loss alone (the same computation as :func:`lm_loss`). For an
    MoE, ``(objective, {"loss": LM loss, "aux_loss": aux term})``: the form of loss function
    output the algorithms accept (:func:`diloco_core.algorithm.base.loss_and_grad`), which report
    the LM loss as ``loss`` and the auxiliary term beside it.

  Examples:
    >>> from diloco_core.spec.model_config import get_preset
    >>> apply_fn, params = init_model(get_preset("moe-tiny"), seed=0)
    >>> tokens = jnp.arange(18).reshape(2, 9) % 32
    >>> objective, metrics = train_loss(apply_fn, params, tokens)
    >>> bool(objective == metrics["loss"] + metrics["aux_loss"])
    True
    >>> bool(metrics["loss"] == lm_loss(apply_fn, params, tokens))
    True
  """
  lm, aux = apply_fn(params, tokens[..., :-1], with_aux=True, targets=tokens[..., 1:])
  if aux is None:
    return lm
  return lm + aux, {"loss": lm, "aux_loss": aux}
