"""Transformer shape config, presets, parameter counts and training FLOPs per token.

This module is pure Python (no JAX) so that :mod:`analysis` can size models of any
scale, from the built-in tiny test model to a 405B-class dense model or an MoE, with
the very same formulas the trainer reports for the model it actually builds.
"""

from __future__ import annotations

import dataclasses

from diloco_core.spec.validity import check_choice, check_real

#: Position encodings: rotary ("rope") or an absolute embedding table ("learned").
POSITIONS = ("rope", "learned")
_MLPS = ("swiglu", "gelu")
#: Dtypes the forward pass may compute in (params and optimizer states stay float32).
COMPUTE_DTYPES = ("float32", "bfloat16")
#: Attention kernels: "auto" picks cuDNN on a GPU when the shapes and dtype allow, else XLA;
#: "flash" is the Pallas flash-attention kernel JAX ships for TPU (TPU only).
ATTENTIONS = ("auto", "xla", "cudnn", "flash")
#: Rematerialization of the scanned blocks: "block" recomputes each block in the backward pass;
#: "dots" keeps the outputs of the weight matmuls and recomputes the rest (norms, activations,
#: the attention scores): most of the memory saved, little of the compute redone.
REMATS = ("none", "dots", "block")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Shape of a decoder-only transformer (pre-norm RMSNorm, causal attention, MLP).

  The built-in NNX model (:class:`diloco_core.Transformer`) implements every field, the
  mixture of experts included (``num_experts`` E > 1: top-k routed experts in every block,
  :mod:`diloco_core.model.moe`); :mod:`analysis` also sizes models it never trains with them.
  ``compute_dtype``, ``attention``, ``remat`` and ``loss_chunk`` say how the built-in model computes, and
  ``aux_loss_coef`` and ``z_loss_coef`` weigh the MoE auxiliary losses in the training
  objective; they change no shape, count or FLOP formula. ``compute_dtype=None`` and
  ``attention="auto"`` are resolved per backend (:func:`diloco_core.devices.backend.resolve_model_config`).
  """

  vocab_size: int = 256  # tokens in the vocabulary (output classes)
  d_model: int = 64  # residual stream width
  n_layers: int = 4  # L, number of transformer blocks (stacked on a leading axis)
  n_heads: int = 4  # query heads
  n_kv_heads: int | None = None  # key/value heads (grouped-query attention); None = n_heads
  d_ff: int = 256  # hidden width of the MLP (of one expert for MoE)
  max_seq_len: int = 128  # longest sequence (sizes learned positions and RoPE tables)
  positions: str = "rope"  # "rope" (rotary) or "learned" (absolute embedding table)
  mlp: str = "swiglu"  # "swiglu" (3 matrices) or "gelu" (2 matrices)
  tie_embeddings: bool = False  # output head shares the input embedding matrix
  num_experts: int = 1  # MoE experts per layer (1 = dense)
  experts_per_token: int = 1  # experts each token is routed to (top-k)
  d_head: int | None = None  # per-head width; None = d_model // n_heads
  # How the built-in model computes (no effect on shapes, counts or FLOPs):
  compute_dtype: str | None = None  # "float32" / "bfloat16"; None = backend default
  attention: str = "auto"  # attention kernel, one of ATTENTIONS
  remat: str = "none"  # one of REMATS: what the backward pass recomputes (less memory)
  loss_chunk: int = 0  # tokens per chunk of the fused head + cross-entropy; 0: whole logits at once
  # The MoE auxiliary losses in the training objective (no effect on a dense model):
  aux_loss_coef: float = 0.01  # weight of the load-balancing loss E sum_e f_e P_e
  z_loss_coef: float = 0.0  # weight of the router z-loss mean(logsumexp(logits)^2); 0: off

  def __post_init__(self):
    if self.compute_dtype is not None:
      check_choice("ModelConfig.compute_dtype", self.compute_dtype, COMPUTE_DTYPES)
    check_choice("ModelConfig.attention", self.attention, ATTENTIONS)
    check_choice("ModelConfig.remat", self.remat, REMATS)
    if not isinstance(self.loss_chunk, int) or isinstance(self.loss_chunk, bool) or self.loss_chunk < 0:
      raise ValueError(f"ModelConfig.loss_chunk must be an integer >= 0 (0: whole logits), got {self.loss_chunk!r}.")
    for name in ("aux_loss_coef", "z_loss_coef"):
      check_real(f"ModelConfig.{name}", getattr(self, name), low=0.0)
    for name in ("vocab_size", "d_model", "n_layers", "n_heads", "d_ff", "max_seq_len",
                 "num_experts", "experts_per_token"):
      value = getattr(self, name)
      if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"ModelConfig.{name} must be a positive integer, got {value!r}.")
    check_choice("ModelConfig.positions", self.positions, POSITIONS)
    if self.mlp not in _MLPS:
      raise ValueError(f"ModelConfig.mlp must be one of {_MLPS}, got {self.mlp!r}.")
    if self.d_head is None and self.d_model % self.n_heads:
      raise ValueError(
          f"ModelConfig.d_model ({self.d_model}) must be divisible by n_heads ({self.n_heads})"
          " or d_head must be given.")
    if self.kv_heads <= 0 or self.n_heads % self.kv_heads:
      raise ValueError(
          f"ModelConfig.n_kv_heads ({self.n_kv_heads}) must be positive and divide n_heads"
          f" ({self.n_heads}).")
    if self.experts_per_token > self.num_experts:
      raise ValueError(
          f"ModelConfig.experts_per_token ({self.experts_per_token}) must be <= num_experts"
          f" ({self.num_experts}).")
    if self.positions == "rope" and self.head_dim % 2:
      raise ValueError(f"RoPE needs an even head dimension, got {self.head_dim}.")

  @property
  def kv_heads(self) -> int:
    return self.n_heads if self.n_kv_heads is None else self.n_kv_heads

  @property
  def head_dim(self) -> int:
    return self.d_head if self.d_head is not None else self.d_model // self.n_heads


PRESETS: dict[str, ModelConfig] = {
    # A few thousand parameters: the unit tests' model (compiles in about a second).
    "tiny": ModelConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, d_ff=32, max_seq_len=32),
    # `tiny` twice as wide (about 4x the parameters): the claims experiment's model, wide enough
    # that every seed converges near the data's floor on CPU (docs/claims.md).
    "mini": ModelConfig(vocab_size=32, d_model=32, n_layers=2, n_heads=2, d_ff=64, max_seq_len=32),
    # The README demo and notebook model: trains to near the data's floor in minutes on CPU.
    "small": ModelConfig(vocab_size=64, d_model=64, n_layers=4, n_heads=4, d_ff=192, max_seq_len=128),
    # For accelerators (notebooks pick it on TPU/GPU).
    "base": ModelConfig(vocab_size=256, d_model=256, n_layers=8, n_heads=8, d_ff=768, max_seq_len=256),
    # The MoE of the unit tests: 4 experts, top-2, as narrow as `tiny`.
    "moe-tiny": ModelConfig(vocab_size=32, d_model=16, n_layers=2, n_heads=2, d_ff=16, max_seq_len=32,
                            num_experts=4, experts_per_token=2),
    # The CPU MoE demo: `small` with 8 experts of half its MLP width, top-2, so a token uses
    # as many MLP weights as in `small` (active params: `small`'s plus the routers).
    "moe-small": ModelConfig(vocab_size=64, d_model=64, n_layers=4, n_heads=4, d_ff=96, max_seq_len=128,
                             num_experts=8, experts_per_token=2),
}


def check_preset(name, option: str = "model") -> str:
  """``name`` if it is one of :data:`PRESETS`; else a one-line ValueError listing them.

  Args:
    name: the preset's name.
    option: how the message names the option.

  Returns:
    ``name``.

  Examples:
    >>> check_preset("tiny")
    'tiny'
    >>> check_preset("huge")
    Traceback (most recent call last):
    ...
    ValueError: model must be one of ['base', 'mini', 'moe-small', 'moe-tiny', 'small', 'tiny'], got 'huge'.
  """
  if not isinstance(name, str) or name not in PRESETS:
    raise ValueError(f"{option} must be one of {sorted(PRESETS)}, got {name!r}.")
  return name


def get_preset(name: str) -> ModelConfig:
  """Returns the preset called ``name`` (one of :data:`PRESETS`, checked by :func:`check_preset`).

  Examples:
    >>> get_preset("tiny").d_model
    16
  """
  return PRESETS[check_preset(name)]


def _mlp_matrices(cfg: ModelConfig) -> int:
  return 3 if cfg.mlp == "swiglu" else 2


def layer_param_count(cfg: ModelConfig, *, active: bool = False) -> int:
  """Parameters of one transformer block.

  .. math::
     N_\\text{layer} = d\\,(h + 2 h_{kv})\\,d_h + h\\,d_h\\,d
       + E\\,k_\\text{mlp}\\,d\\,d_\\text{ff} + [E > 1]\\,d\\,E + 2d

  with :math:`k_\\text{mlp}` = 3 for SwiGLU, 2 for GELU; with ``active=True`` only
  the :math:`E_\\text{active}` routed experts count.

  Args:
    cfg: the model shape.
    active: count only the experts a token is routed to (compute), not all of them.

  Returns:
    The parameter count of one block.

  Examples:
    >>> layer_param_count(ModelConfig(d_model=8, n_heads=2, d_ff=16))
    656
  """
  d, dh = cfg.d_model, cfg.head_dim
  attn = d * (cfg.n_heads + 2 * cfg.kv_heads) * dh + cfg.n_heads * dh * d
  experts = cfg.experts_per_token if active else cfg.num_experts
  mlp = experts * _mlp_matrices(cfg) * d * cfg.d_ff
  router = d * cfg.num_experts if cfg.num_experts > 1 else 0
  return attn + mlp + router + 2 * d


def param_count(cfg: ModelConfig, *, active: bool = False, embeddings: bool = True) -> int:
  """Total parameter count N of the model (exactly what the NNX model allocates).

  .. math::
     N = V d\\,(2 - [\\text{tied}]) + [\\text{learned}]\\,T_\\max d + L\\,N_\\text{layer} + d

  Args:
    cfg: the model shape.
    active: count only the routed experts (the compute-relevant size of an MoE).
    embeddings: include the input embedding table (and learned positions). The output
      head is a matmul and always counts.

  Returns:
    The number of parameters.

  Examples:
    >>> cfg = ModelConfig(vocab_size=10, d_model=8, n_layers=2, n_heads=2, d_ff=16)
    >>> param_count(cfg)  # 2 * 10 * 8 + 2 * 656 + 8
    1480
  """
  d = cfg.d_model
  n = cfg.n_layers * layer_param_count(cfg, active=active) + d  # blocks + final norm
  n += cfg.vocab_size * d  # output head (shared with the input table when tied)
  if embeddings:
    if not cfg.tie_embeddings:
      n += cfg.vocab_size * d
    if cfg.positions == "learned":
      n += cfg.max_seq_len * d
  return n


def flops_per_token(cfg: ModelConfig, seq_len: int | None = None) -> float:
  """Training FLOPs per token (forward + backward): 6N plus attention.

  Uses the PaLM accounting: every matmul weight costs 6 FLOPs per token (2 forward,
  4 backward) and attention scores and values add :math:`12\\,L\\,h\\,d_h\\,T`
  (no discount for the causal mask):

  .. math::
     C = 6\\,N_\\text{matmul,active} + 12\\,L\\,h\\,d_h\\,T

  where :math:`N_\\text{matmul,active}` excludes the input embedding lookup (a gather)
  and norms, and counts only routed experts. (The built-in model's dense MoE dispatch,
  :mod:`diloco_core.model.moe`, runs every expert on every token: its step costs the FLOPs of
  the same config with ``experts_per_token = num_experts``.)

  Args:
    cfg: the model shape.
    seq_len: context length T; defaults to ``cfg.max_seq_len``.

  Returns:
    FLOPs per trained token.

  Examples:
    >>> cfg = ModelConfig(vocab_size=10, d_model=8, n_layers=2, n_heads=2, d_ff=16)
    >>> flops_per_token(cfg, seq_len=4)  # 6 * (2 * 640 + 80) + 12 * 2 * 8 * 4
    8928.0
  """
  t = cfg.max_seq_len if seq_len is None else seq_len
  matmul = param_count(cfg, active=True, embeddings=False) - cfg.d_model  # final norm
  matmul -= cfg.n_layers * 2 * cfg.d_model  # the two norms of each block
  attention = 12 * cfg.n_layers * cfg.n_heads * cfg.head_dim * t
  return float(6 * matmul + attention)
