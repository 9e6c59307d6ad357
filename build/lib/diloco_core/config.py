"""Algorithm configuration and its validation: the one place that raises the clear errors.

Every check runs in plain Python before anything is traced or compiled, and every
message is one line that names the option and what is allowed. Values are never
rounded: ``sync_every=10, fragments=3`` is an error, not ``Δh = 3``.
"""

from __future__ import annotations

import dataclasses

from diloco_core import validity as v
from diloco_core.compression import FORMATS

ALGORITHMS = ("dp", "diloco", "streaming")
FRAGMENT_PATTERNS = v.FRAGMENT_PATTERNS
COMPRESSIONS = FORMATS  # the wire formats of diloco_core.compression


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
    v.check_choice("algorithm", self.algorithm, ALGORITHMS)
    v.check_int("replicas (M)", self.replicas)
    v.check_int("sync_every (H)", self.sync_every)
    v.check_real("outer_lr (η)", self.outer_lr, low=0.0)
    v.check_real("outer_momentum (μ)", self.outer_momentum, low=0.0, high=1.0)
    v.check_int("fragments (P)", self.fragments)
    if self.algorithm == "diloco" and self.fragments != 1:
      raise ValueError(
          f"fragments (P={self.fragments}) needs algorithm='streaming'; 'diloco' is P = 1.")
    v.check_sync_every_fragments(self.sync_every, self.fragments)
    v.check_choice("fragment_pattern", self.fragment_pattern, FRAGMENT_PATTERNS)
    v.check_overlap(self.overlap, self.sync_every)
    v.check_real("alpha (α)", self.alpha, low=0.0, high=1.0, high_open=False)
    v.check_choice("compression", self.compression, COMPRESSIONS)
    v.check_bool("error_feedback", self.error_feedback)
    if self.compression_block is not None and (
        not v.is_int(self.compression_block) or self.compression_block < 1):
      raise ValueError(f"compression_block must be None (per tensor) or an integer >= 1,"
                       f" got {self.compression_block!r}.")
    if num_layers is not None:
      v.check_fragments_divide_layers(self.fragments, num_layers)
