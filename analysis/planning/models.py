"""Model catalog: the papers' dense sizes and well-known open models, sized exactly.

Every count comes from :mod:`diloco_core.spec.model_config` (the same formulas the trainer
reports), applied to the architecture below; nothing here is a typed-in parameter
count. For a mixture of experts, compute follows the *active* parameters and
communication and memory follow the *total* (see :func:`model_stats`).

The Chinchilla-style presets ("35M" ... "10B", "100B") are our own shapes, chosen so
that the computed total (embeddings included, vocabulary 32,000, untied, GELU MLP with
d_ff = 4 d) lands within about 3% of the nominal size used by the DiLoCo papers; their exact
counts are in :func:`model_table`.
"""

from __future__ import annotations

import dataclasses

import pandas as pd

from diloco_core.spec.model_config import ModelConfig
from diloco_core.spec.model_config import flops_per_token
from diloco_core.spec.model_config import layer_param_count
from diloco_core.spec.model_config import param_count
from diloco_core.spec.validity import check_fragments_divide_layers
from diloco_core.spec.validity import check_int


def _chinchilla(d_model: int, n_layers: int, n_heads: int) -> ModelConfig:
  return ModelConfig(vocab_size=32_000, d_model=d_model, n_layers=n_layers, n_heads=n_heads,
                     d_ff=4 * d_model, mlp="gelu", max_seq_len=2048)


MODELS: dict[str, ModelConfig] = {
    # Chinchilla-style dense models at the DiLoCo scaling-law papers' nominal sizes.
    "35M": _chinchilla(384, 6, 6),
    "100M": _chinchilla(640, 12, 10),
    "180M": _chinchilla(768, 18, 12),
    "330M": _chinchilla(1152, 16, 18),
    "550M": _chinchilla(1280, 24, 20),
    "1.3B": _chinchilla(2048, 24, 16),
    "2.4B": _chinchilla(2560, 28, 20),
    "4B": _chinchilla(3072, 34, 24),
    "10B": _chinchilla(4096, 48, 32),
    "100B": _chinchilla(10240, 80, 80),
    # Open models, from their published configs (Hugging Face config.json). Qwen3's
    # per-head q/k RMSNorms (256 parameters a layer) are not modelled.
    "llama3-8b": ModelConfig(vocab_size=128_256, d_model=4096, n_layers=32, n_heads=32,
                             n_kv_heads=8, d_ff=14_336, max_seq_len=8192),
    "llama3-70b": ModelConfig(vocab_size=128_256, d_model=8192, n_layers=80, n_heads=64,
                              n_kv_heads=8, d_ff=28_672, max_seq_len=8192),
    "llama3.1-405b": ModelConfig(vocab_size=128_256, d_model=16_384, n_layers=126,
                                 n_heads=128, n_kv_heads=8, d_ff=53_248, max_seq_len=8192),
    "qwen3-8b": ModelConfig(vocab_size=151_936, d_model=4096, n_layers=36, n_heads=32,
                            n_kv_heads=8, d_head=128, d_ff=12_288, max_seq_len=4096),
    # MoE: 128 experts of d_ff 768 per layer, 8 routed per token.
    "qwen3-30b-a3b": ModelConfig(vocab_size=151_936, d_model=2048, n_layers=48, n_heads=32,
                                 n_kv_heads=4, d_head=128, d_ff=768, num_experts=128,
                                 experts_per_token=8, max_seq_len=4096),
}

MODEL_ALIASES: dict[str, str] = {
    "8b": "llama3-8b",
    "70b": "llama3-70b",
    "405b": "llama3.1-405b",
    "30b-a3b": "qwen3-30b-a3b",
}


def get_model(model: str | ModelConfig) -> ModelConfig:
  """Returns the catalog model called ``model`` (case-insensitive), or ``model`` itself.

  Args:
    model: a key of ``MODELS``, an alias of ``MODEL_ALIASES`` ("8B" is
      Llama-3-8B, "70B" Llama-3-70B, "405B" Llama-3.1-405B, "30B-A3B" Qwen3-30B-A3B),
      or a :class:`~diloco_core.spec.model_config.ModelConfig`, returned unchanged.

  Returns:
    The :class:`~diloco_core.spec.model_config.ModelConfig`.

  Examples:
    >>> get_model("8B").d_ff
    14336
  """
  if isinstance(model, ModelConfig):
    return model
  by_lower = {k.lower(): k for k in MODELS}
  key = str(model).lower()
  key = MODEL_ALIASES.get(key, key)
  if key not in by_lower:
    allowed = sorted(MODELS) + sorted(k.upper() for k in MODEL_ALIASES)
    raise ValueError(f"model must be one of {allowed}, got {model!r}.")
  return MODELS[by_lower[key]]


def check_model(model, *, optional: bool = False) -> ModelConfig | None:
  """``model`` if it is a ModelConfig (or None when ``optional``); else a one-line ValueError.

  The calculator's functions take resolved models; :func:`get_model` resolves a catalog
  name once, at the entry point (:func:`analysis.planning.plan.plan_run`, the command line).

  Examples:
    >>> check_model("8B")
    Traceback (most recent call last):
    ...
    ValueError: model must be a ModelConfig (analysis.get_model resolves a catalog name), got '8B'.
  """
  if (model is None and optional) or isinstance(model, ModelConfig):
    return model
  raise ValueError(f"model must be a ModelConfig (analysis.get_model resolves a catalog name), "
                   f"got {model!r}.")


@dataclasses.dataclass(frozen=True)
class ModelStats:
  """Sizes that drive the roofline: communication/memory vs. compute."""

  total_params: int  # every parameter (what is communicated and stored)
  active_params: int  # parameters a token touches (routed experts only)
  flops_per_token: float  # training FLOPs per token (forward + backward) at seq_len
  seq_len: int  # context length used for the attention FLOPs


def model_stats(model: str | ModelConfig, seq_len: int | None = None) -> ModelStats:
  """Total and active parameters and training FLOPs per token of a model.

  .. math::
     C_\\text{token} = 6\\,N_\\text{matmul,active} + 12\\,L\\,h\\,d_h\\,T

  (see :func:`diloco_core.spec.model_config.flops_per_token`); an MoE communicates and
  stores :math:`N_\\text{total}` but computes with :math:`N_\\text{active}`.

  Args:
    model: a catalog name or a ModelConfig.
    seq_len: context length T; defaults to the model's ``max_seq_len``.

  Returns:
    A :class:`ModelStats`.

  Examples:
    >>> s = model_stats("qwen3-30b-a3b")
    >>> s.total_params, s.active_params
    (30532110336, 3353020416)
    >>> round(s.total_params / s.active_params, 1)  # bytes sent per FLOP, vs dense
    9.1
  """
  cfg = get_model(model)
  t = cfg.max_seq_len if seq_len is None else check_int("seq_len", seq_len)
  return ModelStats(total_params=param_count(cfg), active_params=param_count(cfg, active=True),
                    flops_per_token=flops_per_token(cfg, t), seq_len=t)


def fragment_sizes(model: str | ModelConfig, fragments: int) -> list[int]:
  """Parameters in each Streaming DiLoCo fragment, as the semantics page (docs/semantics.md) assigns them.

  Fragment 0 holds everything outside the stacked layers (embeddings, final norm,
  head); the :math:`L` layers are split evenly over fragments :math:`1..P-1`. With
  :math:`P = 1` there is one fragment, the whole model.

  Args:
    model: a catalog name or a ModelConfig.
    fragments: P, the number of fragments; (P - 1) must divide the layer count.

  Returns:
    A list of P parameter counts summing to the model's total.

  Examples:
    >>> cfg = ModelConfig(vocab_size=10, d_model=8, n_layers=2, n_heads=2, d_ff=16)
    >>> fragment_sizes(cfg, 3)  # [2*10*8 + 8, 656, 656]
    [168, 656, 656]
  """
  cfg = get_model(model)
  fragments = check_int("fragments (P)", fragments)
  check_fragments_divide_layers(fragments, cfg.n_layers)
  total = param_count(cfg)
  if fragments == 1:
    return [total]
  per_layer = layer_param_count(cfg)
  layers_each = cfg.n_layers // (fragments - 1)
  return [total - cfg.n_layers * per_layer] + [layers_each * per_layer] * (fragments - 1)


def model_table(seq_len: int | None = None) -> pd.DataFrame:
  """The catalog as a table: shape, total and active parameters, FLOPs per token.

  Args:
    seq_len: context length for the attention FLOPs; defaults to each model's own.

  Returns:
    A DataFrame indexed by model name.

  Examples:
    >>> model_table().loc["llama3-8b", "total_params"]
    np.int64(8030261248)
  """
  rows = {}
  for name, cfg in MODELS.items():
    s = model_stats(cfg, seq_len)
    rows[name] = dict(layers=cfg.n_layers, d_model=cfg.d_model, heads=cfg.n_heads,
                      kv_heads=cfg.kv_heads, d_ff=cfg.d_ff, experts=cfg.num_experts,
                      total_params=s.total_params, active_params=s.active_params,
                      seq_len=s.seq_len, flops_per_token=s.flops_per_token)
  return pd.DataFrame.from_dict(rows, orient="index")
