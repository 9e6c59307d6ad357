"""The mixture-of-experts MLP of the built-in transformer: router, dispatch, auxiliary losses.

A block of a model with ``num_experts`` E > 1 replaces the dense MLP by E experts of the same
kind (SwiGLU or GELU, hidden width ``d_ff`` each) and a linear router. For a token with
normalized hidden state :math:`h \\in \\mathbb{R}^d` (Qwen3-MoE style, computed in float32):

.. math::
   z = h\\,W_r \\in \\mathbb{R}^E, \\qquad p = \\operatorname{softmax}(z), \\qquad
   S = \\operatorname{top}_k(p), \\qquad
   y = \\sum_{e \\in S} \\frac{p_e}{\\sum_{j \\in S} p_j}\\,\\operatorname{MLP}_e(h),

so the k gates of a token sum to 1. Every expert's weights are stacked on the layer axis of
the model like the dense ones (``blocks/w_up`` has shape ``[L, E, d, d_ff]``, the router
``blocks/router`` ``[L, d, E]``): Streaming DiLoCo's fragments still split the model by
layer, and a fragment's bytes are its total (not active) parameters.

Dispatch. Dropless (no token is ever dropped, no capacity factor) and written as a dense
einsum over the expert axis: every expert runs on every token and the outputs are summed
with the gates, which are exactly 0 for the unrouted experts (so they receive exactly zero
gradient). This is exact and simple, and on CPU with the small E of the presets it costs
E/k times the active MLP FLOPs, which is acceptable there; the compiled step's FLOPs are
therefore :func:`~diloco_core.spec.model_config.flops_per_token` of the config with k = E, while
``flops_per_token(cfg)`` counts the active experts only. For large E the efficient path is to
sort the token-expert pairs by expert and run :func:`jax.lax.ragged_dot` over the groups
(active FLOPs only); it is not implemented here. Nothing has to divide E: the experts are
not sharded over devices (there is no expert-parallel mesh axis; within a replica they are
replicated like every other weight), so the only rule is :math:`1 \\le k \\le E`.

Auxiliary losses (each averaged over the L layers, weighted by its coefficient,
``aux_loss_coef`` or ``z_loss_coef`` of :class:`~diloco_core.spec.model_config.ModelConfig`, and
added to the training objective):

.. math::
   \\mathcal{L}_\\text{balance} = E \\sum_{e=1}^{E} f_e\\,P_e, \\qquad
   \\mathcal{L}_z = \\frac{1}{N} \\sum_{n=1}^{N} \\Big(\\log \\sum_e e^{z_{n,e}}\\Big)^2,

where, over the N tokens of the batch, :math:`f_e` is the fraction of the N·k top-k
assignments that go to expert e and :math:`P_e` the mean router probability of e (Switch
Transformer, arXiv 2101.03961; z-loss: ST-MoE, arXiv 2202.08906). A perfectly balanced router
has :math:`\\mathcal{L}_\\text{balance} = 1`.

Examples:
  >>> import jax.numpy as jnp
  >>> r = route(jnp.log(jnp.array([[0.5, 0.3, 0.2]])), k=2)
  >>> [round(float(g), 4) for g in r.combine[0]]  # 0.5 / 0.8, 0.3 / 0.8, not routed
  [0.625, 0.375, 0.0]
  >>> round(float(load_balance_loss(r.probs, r.experts)), 4)  # 3 * (0.5 * 0.5 + 0.5 * 0.3)
  1.2
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class Routing(NamedTuple):
  """The router's decision for a batch of tokens ``[..., E]``.

  ``probs``: softmax of the router logits (float32, ``[..., E]``); ``experts``: the k chosen
  experts of each token (int32 ``[..., k]``, by decreasing probability); ``combine``: the
  renormalized gates spread over the E experts (float32 ``[..., E]``, zero for the unrouted
  ones, the k routed ones sum to 1).
  """

  probs: jax.Array
  experts: jax.Array
  combine: jax.Array


def route(logits: jax.Array, k: int) -> Routing:
  """Softmax over all E experts, top-k, gates renormalized over the k chosen (Qwen3 style).

  Args:
    logits: router logits ``[..., E]`` (computed in float32).
    k: experts per token.

  Returns:
    The :class:`Routing`: :math:`p = \\operatorname{softmax}(z)`, the top-k indices, and the
    gates :math:`p_e / \\sum_{j \\in S} p_j` at the chosen experts (0 elsewhere).
  """
  probs = jax.nn.softmax(logits.astype(jnp.float32), axis=-1)
  top, experts = jax.lax.top_k(probs, k)
  gates = top / jnp.sum(top, axis=-1, keepdims=True)
  one_hot = jax.nn.one_hot(experts, probs.shape[-1], dtype=jnp.float32)  # [..., k, E]
  return Routing(probs, experts, jnp.einsum("...k,...ke->...e", gates, one_hot))


def load_balance_loss(probs: jax.Array, experts: jax.Array) -> jax.Array:
  """The Switch / Qwen load-balancing loss :math:`E \\sum_e f_e P_e` of one layer's tokens.

  Args:
    probs: router probabilities ``[..., E]`` (every leading axis is a token axis).
    experts: the chosen experts ``[..., k]`` (``Routing.experts``).

  Returns:
    A float32 scalar: 1 for a perfectly balanced router, up to E when every token sends all
    its probability and its k choices to the same experts. Gradients flow through
    :math:`P_e` only (:math:`f_e` counts discrete choices).
  """
  num_experts, k = probs.shape[-1], experts.shape[-1]
  counts = jnp.sum(jax.nn.one_hot(experts, num_experts, dtype=jnp.float32), axis=-2)  # [..., E]
  f = jnp.mean(counts.reshape(-1, num_experts), axis=0) / k
  p = jnp.mean(probs.reshape(-1, num_experts), axis=0)
  return num_experts * jnp.sum(f * p)


def z_loss(logits: jax.Array) -> jax.Array:
  """The router z-loss: the mean over tokens of :math:`(\\log \\sum_e e^{z_e})^2` (float32)."""
  return jnp.mean(jax.nn.logsumexp(logits.astype(jnp.float32), axis=-1) ** 2)


def experts_mlp(h: jax.Array, combine: jax.Array, w: dict[str, jax.Array], mlp: str) -> jax.Array:
  """Every expert on every token, summed with the gates (the dense dropless dispatch).

  Args:
    h: normalized hidden states ``[..., d]`` in the compute dtype.
    combine: gates ``[..., E]`` (``Routing.combine``).
    w: ``w_up`` and ``w_down`` (``[E, d, f]``, ``[E, f, d]``), and ``w_gate`` for SwiGLU.
    mlp: ``"swiglu"`` or ``"gelu"`` (as the dense MLP).

  Returns:
    :math:`\\sum_e c_e\\,\\operatorname{MLP}_e(h)`, shaped like ``h``.
  """
  up = jnp.einsum("...d,edf->...ef", h, w["w_up"])
  if mlp == "swiglu":
    hidden = jax.nn.silu(jnp.einsum("...d,edf->...ef", h, w["w_gate"])) * up
  else:
    hidden = jax.nn.gelu(up)
  hidden = hidden * combine[..., None].astype(hidden.dtype)
  return jnp.einsum("...ef,efd->...d", hidden, w["w_down"])


def moe_mlp(h: jax.Array, w: dict[str, jax.Array], k: int, mlp: str
            ) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The MoE MLP of one block: route in float32, run the experts, and the layer's aux losses.

  Args:
    h: normalized hidden states ``[..., d]`` in the compute dtype.
    w: the block's expert weights (see :func:`experts_mlp`) and ``router`` ``[d, E]``.
    k: experts per token.
    mlp: ``"swiglu"`` or ``"gelu"``.

  Returns:
    ``(output shaped like h, {"balance": L_balance, "z": L_z})`` (float32 scalars).
  """
  logits = jnp.einsum("...d,de->...e", h.astype(jnp.float32), w["router"].astype(jnp.float32))
  r = route(logits, k)
  out = experts_mlp(h, r.combine, w, mlp)
  return out, {"balance": load_balance_loss(r.probs, r.experts), "z": z_loss(logits)}


def aux_loss(per_layer: dict[str, jax.Array], aux_coef: float, z_coef: float) -> jax.Array:
  """The auxiliary term of the objective: the layers' mean losses, weighted.

  .. math::
     \\mathcal{L}_\\text{aux} = c_\\text{aux}\\,\\overline{\\mathcal{L}_\\text{balance}}
       + c_z\\,\\overline{\\mathcal{L}_z}

  Args:
    per_layer: ``{"balance": [L], "z": [L]}`` as :func:`moe_mlp` returns them, stacked by the
      layer scan.
    aux_coef: :math:`c_\\text{aux}`, the load-balancing coefficient.
    z_coef: :math:`c_z`, the z-loss coefficient (0: the z-loss is left out).

  Returns:
    A float32 scalar.
  """
  out = aux_coef * jnp.mean(per_layer["balance"])
  if z_coef:
    out = out + z_coef * jnp.mean(per_layer["z"])
  return out
