"""Memory one replica holds during DP, DiLoCo or Streaming DiLoCo training (activations excluded).

Parameters, gradients and inner optimizer state for every method; DiLoCo adds the global
parameters and the outer optimizer's state (the trainer's rule,
:func:`diloco_core.spec.footprint.replica_state_bytes`); Streaming DiLoCo holds the pseudo-gradients of the
fragments sent and not yet merged (:func:`memory_per_replica`).
"""

from __future__ import annotations

import dataclasses
import math

from analysis.planning import _checks
from analysis.planning.models import fragment_sizes
from analysis.planning.roofline import METHODS
from diloco_core.spec.footprint import replica_state_bytes
from diloco_core.spec.model_config import ModelConfig
from diloco_core.spec.model_config import param_count
from diloco_core.spec.validity import check_choice
from diloco_core.spec.validity import check_schedule
from diloco_core.spec.validity import is_int


@dataclasses.dataclass(frozen=True)
class ReplicaMemory:
  """Bytes one replica (one slice, summed over its chips) holds during training."""

  params: float  # local parameters θ_m
  grads: float  # one gradient buffer
  optimizer: float  # inner AdamW first and second moments
  outer_params: float  # global parameters θ_g (DiLoCo / Streaming only)
  outer_momentum: float  # outer optimizer state: Nesterov/SGD momentum, Adam m and v (DiLoCo / Streaming only)
  in_flight: float  # pseudo-gradient buffers of fragments sent and not yet merged

  @property
  def total(self) -> float:
    return (self.params + self.grads + self.optimizer + self.outer_params
            + self.outer_momentum + self.in_flight)


def memory_per_replica(model, *, method="diloco", sync_every=1, fragments=1, overlap=0,
                       param_bytes=4, grad_bytes=4, optimizer_bytes=8, outer_bytes=4,
                       buffer_bytes=4, outer_optimizer="nesterov") -> ReplicaMemory:
  """Memory per replica for DP, DiLoCo or Streaming DiLoCo (activations excluded).

  .. math::
     M = N(b_\\theta + b_g + b_\\text{Adam})
       + [\\text{DiLoCo}]\\,(1 + k_\\text{outer}) N b_\\text{outer}
       + n_\\text{flight}\\,\\max_p |\\text{fragment}_p|\\, b_\\text{buf},
     \\quad n_\\text{flight} = \\min\\!\\left(P, \\left\\lceil
       \\frac{\\tau+1}{H/P} \\right\\rceil\\right)

  :math:`n_\\text{flight}` counts the fragments sent in any :math:`\\tau + 1`
  consecutive steps (an upper bound on those held at once); :math:`k_\\text{outer}` is the
  outer optimizer's model-sized state copies (1 for Nesterov and SGD, 2 for Adam:
  :data:`diloco_core.spec.footprint.OUTER_STATE_COPIES`); fragment sizes follow the
  semantics page, docs/semantics.md (:func:`~analysis.planning.models.fragment_sizes`) for a
  ModelConfig and are equal for a bare parameter count. The outer state is held once per
  replica.

  Args:
    model: a ModelConfig (resolve a catalog name with
      :func:`~analysis.planning.models.get_model`) or a parameter count.
    method: "dp", "diloco" or "streaming" ("diloco" is streaming with P = 1).
    sync_every, fragments, overlap: H, P, τ (ignored for "dp").
    param_bytes: bytes per local parameter (4: fp32 master weights).
    grad_bytes: bytes per gradient value.
    optimizer_bytes: bytes of inner optimizer state per parameter (8: Adam m, v in fp32).
    outer_bytes: bytes per value of θ_g and of each outer state copy.
    buffer_bytes: bytes per value of an in-flight pseudo-gradient (fp32 accumulation).
    outer_optimizer: "nesterov", "sgd" or "adam" (the trainer's ``outer_optimizer``).

  Returns:
    A :class:`ReplicaMemory` in bytes.

  Examples:
    >>> m = memory_per_replica(1_000_000, method="diloco", sync_every=100)
    >>> m.total / 1e6  # 4 + 4 + 8 + 4 + 4 bytes/param, + one fp32 full-model buffer
    28.0
    >>> m = memory_per_replica(1_000_000, method="diloco", sync_every=100, outer_optimizer="adam")
    >>> m.outer_momentum, m.total / 1e6  # Adam's m and v: 2 x 4 bytes/param; 28 + 4
    (8000000.0, 32.0)
    >>> m = memory_per_replica(1_000_000, method="streaming", sync_every=100, fragments=10,
    ...                        overlap=1)
    >>> m.in_flight  # one fragment of 100,000 values in flight at a time
    400000.0
  """
  check_choice("method", method, METHODS)
  cfg = check_model_or_count(model)
  n_total = float(param_count(cfg)) if isinstance(cfg, ModelConfig) else float(cfg)
  byte_args = dict(param_bytes=param_bytes, grad_bytes=grad_bytes,
                   optimizer_bytes=optimizer_bytes, outer_bytes=outer_bytes,
                   buffer_bytes=buffer_bytes)
  for name, value in byte_args.items():
    _checks.nonneg(name, value)
  state = replica_state_bytes(n_total, outer=method != "dp", outer_optimizer=outer_optimizer,
                              param_bytes=param_bytes,
                              grad_bytes=grad_bytes, optimizer_bytes=optimizer_bytes,
                              outer_bytes=outer_bytes)
  if method == "dp":
    return ReplicaMemory(**state, in_flight=0.0)
  if method == "diloco":
    fragments = 1
  layers = cfg.n_layers if isinstance(cfg, ModelConfig) else None
  h, p, tau = check_schedule(sync_every, fragments, overlap, num_layers=layers)
  sizes = fragment_sizes(cfg, p) if layers is not None else [n_total / p] * p
  n_flight = min(p, math.ceil((tau + 1) / (h / p)))
  return ReplicaMemory(**state, in_flight=float(n_flight * max(sizes) * buffer_bytes))


def check_model_or_count(model) -> ModelConfig | int:
  """``model`` if it is a ModelConfig or a positive parameter count; else a one-line ValueError."""
  if isinstance(model, ModelConfig):
    return model
  if not is_int(model) or model < 1:
    raise ValueError(f"model must be a ModelConfig (analysis.get_model resolves a catalog "
                     f"name) or a positive parameter count, got {model!r}.")
  return int(model)
