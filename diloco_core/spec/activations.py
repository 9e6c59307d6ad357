"""Activation memory of one training step of the built-in transformer: what each ``remat`` keeps.

The training state (params, gradients, optimizer and outer state) is
:func:`diloco_core.spec.footprint.replica_state_bytes`; this module sizes the rest of a step's
memory, which is what ``remat``, ``attention``, ``loss_chunk`` and the batch change. It is a
model, written out term by term so that a reader can check it against the code of
:mod:`diloco_core.model.transformer`; the accelerator benchmark prints it beside XLA's own
count for the compiled program (``memory_analysis()``), which is the one that decides. Pure
Python (no JAX), so the planning library can size runs it never compiles.
"""

from __future__ import annotations

import dataclasses

from diloco_core.spec.model_config import ModelConfig, param_count

#: Bytes per value of each compute dtype.
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
#: The Pallas flash kernel keeps its softmax statistics (the running max and sum) as float32
#: rows of this many lanes per query and head.
FLASH_STAT_LANES = 128


@dataclasses.dataclass(frozen=True)
class StepMemory:
  """Bytes of one step beyond the training state (see :func:`step_activation_bytes`)."""

  saved: float  # what the forward pass keeps for the backward pass, all layers
  layer: float  # one layer's activations and their gradients, live while it is (re)computed
  logits: float  # the head's float32 logits and their gradient (one chunk with loss_chunk)
  weights: float  # the compute-dtype copies of the params and their gradients

  @property
  def total(self) -> float:
    return self.saved + self.layer + self.logits + self.weights


def per_token_layer_bytes(cfg: ModelConfig, seq_len: int, remat: str | None = None) -> dict[str, float]:
  """Bytes one token keeps in one block for the backward pass, by what the block recomputes.

  With c the compute dtype's bytes, q = h·d_h and kv = h_kv·d_h:

  .. math::
     \\text{none} = c\\,(4d + 4q + 3kv + 4d_\\text{ff}) + 8d + A, \\qquad
     \\text{dots} = c\\,(q + 2kv + 3d + 2d_\\text{ff}), \\qquad
     \\text{block} = c\\,d

  ``none`` keeps the block input, both norms' outputs (and their float32 inputs, 8d), q, k, v
  and the rotated q, k, the attention output, the residual after attention and the four
  MLP activations (gate, up, SiLU(gate), their product); A is the attention's own: the
  float32 probabilities (4·h·T) and their compute-dtype copy (c·h·T) for XLA, the output
  layout copy (c·q) and the float32 statistics (8·h·:data:`FLASH_STAT_LANES`) for flash.
  ``dots`` keeps the outputs of the weight matmuls (q, k, v, the output projection, gate,
  up, down) and the block input; ``block`` keeps the block input alone. (MoE: every expert
  counts, as the dense dispatch computes them all.)

  Args:
    cfg: the model (its ``remat``, ``attention`` and ``compute_dtype`` unless given).
    seq_len: T.
    remat: overrides ``cfg.remat``.

  Returns:
    ``{"kept": bytes kept per token and layer, "full": bytes of the whole block (the none case)}``.

  Examples:
    >>> cfg = ModelConfig(d_model=8, n_heads=2, d_ff=16, compute_dtype="bfloat16", attention="xla")
    >>> per_token_layer_bytes(cfg, 4, "block")["kept"], per_token_layer_bytes(cfg, 4, "dots")["kept"]
    (16, 160)
    >>> per_token_layer_bytes(cfg, 4, "none")["kept"]  # 2 (32 + 32 + 24 + 64) + 64 + (4 + 2) 2 4
    416
  """
  c = DTYPE_BYTES[cfg.compute_dtype or "float32"]
  d, f = cfg.d_model, cfg.d_ff * max(cfg.num_experts, 1)
  q, kv = cfg.n_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim
  if cfg.attention == "flash":
    attention = c * q + 8 * cfg.n_heads * FLASH_STAT_LANES
  else:
    attention = (4 + c) * cfg.n_heads * seq_len
  full = c * (4 * d + 4 * q + 3 * kv + 4 * f) + 8 * d + attention
  kept = {"none": full, "dots": c * (q + 2 * kv + 3 * d + 2 * f), "block": c * d}[remat or cfg.remat]
  return {"kept": kept, "full": full}


def step_activation_bytes(cfg: ModelConfig, batch: int, seq_len: int, *, remat: str | None = None,
                          loss_chunk: int | None = None) -> StepMemory:
  """The bytes one replica's training step needs beyond its state, for ``batch`` sequences.

  .. math::
     \\text{saved} = L\\,bT\\,k_\\text{kept}, \\quad
     \\text{layer} = 2\\,bT\\,k_\\text{full}\\,[\\text{remat} \\neq \\text{none}], \\quad
     \\text{logits} = 2 \\cdot 4\\,V \\min(bT, \\text{chunk}), \\quad
     \\text{weights} = 2\\,c\\,N

  with :math:`k` from :func:`per_token_layer_bytes`. A lower bound on what XLA allocates
  (it may keep a layout copy more), and a fair estimate: the benchmark prints both.

  Args:
    cfg: the model.
    batch: sequences per replica (b).
    seq_len: T.
    remat: overrides ``cfg.remat``.
    loss_chunk: overrides ``cfg.loss_chunk`` (0: the whole logits).

  Returns:
    A :class:`StepMemory`.

  Examples:
    >>> cfg = ModelConfig(vocab_size=10, d_model=8, n_layers=2, n_heads=2, d_ff=16, compute_dtype="bfloat16",
    ...                   attention="xla", remat="block")
    >>> m = step_activation_bytes(cfg, batch=1, seq_len=4)
    >>> m.saved, m.logits, m.weights  # 2 x 4 x 16;  2 x 4 x 10 x 4;  2 x 2 x 1480
    (128, 320, 5920)
  """
  remat = remat or cfg.remat
  chunk = cfg.loss_chunk if loss_chunk is None else loss_chunk
  tokens = batch * seq_len
  k = per_token_layer_bytes(cfg, seq_len, remat)
  c = DTYPE_BYTES[cfg.compute_dtype or "float32"]
  return StepMemory(saved=cfg.n_layers * tokens * k["kept"],
                    layer=0 if remat == "none" else 2 * tokens * k["full"],
                    logits=2 * 4 * cfg.vocab_size * (min(tokens, chunk) if chunk else tokens),
                    weights=2 * c * param_count(cfg))
