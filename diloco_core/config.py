"""Algorithm configuration and its validation: the one place that raises the clear errors.

Every check runs in plain Python before anything is traced or compiled, and every
message is one line that names the option and what is allowed. Values are never
rounded: ``sync_every=10, fragments=3`` is an error, not ``Δh = 3``.
"""

from __future__ import annotations

import dataclasses
import math

ALGORITHMS = ("dp", "diloco", "streaming")
FRAGMENT_PATTERNS = ("strided", "sequential")
COMPRESSIONS = ("none", "bf16", "fp8", "fp4", "e3m0")


def _is_int(x) -> bool:
  return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@dataclasses.dataclass(frozen=True)
class DiLoCoConfig:
  """Outer-loop settings of DP, DiLoCo and Streaming DiLoCo (symbols as in SPEC.md).

  ``algorithm="diloco"`` is Streaming DiLoCo with ``fragments=1``; ``"streaming"`` is the
  same code with any P. ``"dp"`` ignores every outer field but ``replicas``.
  """

  algorithm: str = "diloco"  # "dp" | "diloco" | "streaming"
  replicas: int = 2  # M, replicas each training on their own data shard
  sync_every: int = 50  # H, inner steps between two syncs of the same parameters
  outer_lr: float = 0.7  # η, outer SGD learning rate
  outer_momentum: float = 0.9  # μ, outer Nesterov momentum, in [0, 1)
  fragments: int = 1  # P, parameter fragments synced in turn every Δh = H / P steps
  fragment_pattern: str = "strided"  # how layers are dealt to fragments 1..P-1
  overlap: int = 0  # τ, steps between sending a fragment and merging the result; 0 <= τ < H
  alpha: float = 0.0  # merge blend: local <- α·local + (1-α)·global
  compression: str = "none"  # wire format of each replica's pseudo-gradient
  error_feedback: bool = False  # keep each replica's compression residual and resend it
  compression_block: int | None = None  # elements per quantization scale; None = per tensor

  def __post_init__(self):
    self.validate()

  @property
  def sync_interval(self) -> int:
    """Δh = H / P, the number of steps between two fragment sends (exact by validation)."""
    return self.sync_every // self.fragments

  def validate(self, num_layers: int | None = None) -> None:
    """Raises ``ValueError`` (one line, naming the option) on any invalid setting.

    Args:
      num_layers: L, when known; checks that (P - 1) divides L.

    Examples:
      >>> DiLoCoConfig(algorithm="streaming", sync_every=10, fragments=3)
      Traceback (most recent call last):
      ...
      ValueError: sync_every (H=10) must be a multiple of fragments (P=3): choose H in {9, 12, ...} or P among the divisors of 10 [1, 2, 5, 10].
    """
    if self.algorithm not in ALGORITHMS:
      raise ValueError(f"algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}.")
    if not _is_int(self.replicas) or self.replicas < 1:
      raise ValueError(f"replicas (M) must be an integer >= 1, got {self.replicas!r}.")
    if not _is_int(self.sync_every) or self.sync_every < 1:
      raise ValueError(f"sync_every (H) must be an integer >= 1, got {self.sync_every!r}.")
    if not _is_real(self.outer_lr) or self.outer_lr < 0:
      raise ValueError(f"outer_lr (η) must be a finite number >= 0, got {self.outer_lr!r}.")
    if not _is_real(self.outer_momentum) or not 0 <= self.outer_momentum < 1:
      raise ValueError(f"outer_momentum (μ) must be in [0, 1), got {self.outer_momentum!r}.")
    if not _is_int(self.fragments) or self.fragments < 1:
      raise ValueError(f"fragments (P) must be an integer >= 1, got {self.fragments!r}.")
    if self.algorithm == "diloco" and self.fragments != 1:
      raise ValueError(
          f"fragments (P={self.fragments}) needs algorithm='streaming'; 'diloco' is P = 1.")
    if self.sync_every % self.fragments:
      h, p = self.sync_every, self.fragments
      divisors = [d for d in range(1, h + 1) if h % d == 0]
      lo = (h // p) * p
      raise ValueError(
          f"sync_every (H={h}) must be a multiple of fragments (P={p}): choose H in"
          f" {{{lo or p}, {lo + p}, ...}} or P among the divisors of {h} {divisors}.")
    if self.fragment_pattern not in FRAGMENT_PATTERNS:
      raise ValueError(
          f"fragment_pattern must be one of {FRAGMENT_PATTERNS}, got {self.fragment_pattern!r}.")
    if not _is_int(self.overlap) or not 0 <= self.overlap < self.sync_every:
      raise ValueError(
          f"overlap (τ) must be an integer with 0 <= τ < sync_every (H={self.sync_every}),"
          f" got {self.overlap!r}.")
    if not _is_real(self.alpha) or not 0 <= self.alpha <= 1:
      raise ValueError(f"alpha (α) must be in [0, 1], got {self.alpha!r}.")
    if self.compression not in COMPRESSIONS:
      raise ValueError(f"compression must be one of {COMPRESSIONS}, got {self.compression!r}.")
    if not isinstance(self.error_feedback, bool):
      raise ValueError(f"error_feedback must be True or False, got {self.error_feedback!r}.")
    if self.compression_block is not None and (
        not _is_int(self.compression_block) or self.compression_block < 1):
      raise ValueError(
          f"compression_block must be None (per tensor) or an integer >= 1,"
          f" got {self.compression_block!r}.")
    if num_layers is not None and self.fragments > 1 and num_layers % (self.fragments - 1):
      ok = [p + 1 for p in range(1, num_layers + 1) if num_layers % p == 0]
      raise ValueError(
          f"fragments (P={self.fragments}): P - 1 must divide the number of layers"
          f" (L={num_layers}); allowed P for this model: {[1] + ok}.")
