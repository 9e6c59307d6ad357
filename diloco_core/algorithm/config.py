"""Algorithm configuration and its validation: the one place that raises the clear errors.

Every check runs in plain Python before anything is traced or compiled, and every
message is one line that names the option and what is allowed. Values are never
rounded: ``sync_every=10, fragments=3`` is an error, not ``Δh = 3``.
"""

from __future__ import annotations

import dataclasses

from diloco_core.spec import fields
from diloco_core.spec import validity as v
from diloco_core.spec.wire_formats import DEFAULT_CHUNK, FORMATS, check_topk, check_topk_block

ALGORITHMS = ("dp", "diloco", "streaming")
FRAGMENT_PATTERNS = v.FRAGMENT_PATTERNS
OUTER_OVERLAPS = v.OUTER_OVERLAPS
FRAGMENT_ORDERS = v.FRAGMENT_ORDERS
OUTER_OPTIMIZERS = v.OUTER_OPTIMIZERS
REDUCTIONS = v.REDUCTIONS
COMPRESSIONS = FORMATS  # the wire formats of diloco_core.wire.compression


def _field(default, **kw):
  """An outer-loop field: in the CLI's algorithm group; every one must match on resume, and
  every one that is not traced is compiled into the step."""
  return fields.field(default, group="algorithm", must_match=True,
                      program=not kw.get("traced"), **kw)


@dataclasses.dataclass(frozen=True)
class DiLoCoConfig:
  """Outer-loop settings of DP, DiLoCo and Streaming DiLoCo.

  The symbols are those of the semantics page (docs/semantics.md); each field's metadata
  (:mod:`diloco_core.spec.fields`) says whether it is a traced input of the step (H and τ as
  int32; η, μ, α, Adam's β2 and the error-feedback decay β as float32) or compiled in.

  ``algorithm="diloco"`` is Streaming DiLoCo with ``fragments=1``; ``"streaming"`` is the
  same code with any P. ``"dp"`` ignores every outer field but ``replicas``.
  """

  algorithm: str = _field("diloco", flag="algorithm", help=f"one of {ALGORITHMS}")
  replicas: int = _field(2, flag="replicas", symbol="M", help="replicas, each on its own data shard")
  sync_every: int = _field(50, flag="sync-every", symbol="H", traced="int32",
                           help="inner steps between two syncs of the same parameters")
  outer_optimizer: str = _field(
      "nesterov", flag="outer-optimizer",
      help=f"outer optimizer of the global copy, one per fragment: one of {OUTER_OPTIMIZERS}")
  outer_lr: float = _field(0.7, flag="outer-lr", symbol="η", traced="float32",
                           help="outer learning rate")
  outer_momentum: float = _field(0.9, flag="outer-momentum", symbol="μ", traced="float32",
                                 help="outer momentum (nesterov, sgd) or Adam's β1 (adam), in [0, 1)")
  outer_beta2: float = _field(0.99, flag="outer-beta2", symbol="β2", traced="float32",
                              help="outer adam only: second-moment decay, in [0, 1)")
  fragments: int = _field(1, flag="fragments", symbol="P",
                          help="fragments synced in turn every Δh = H/P steps (streaming)")
  fragment_pattern: str = _field("strided", flag="fragment-pattern",
                                 help=f"layers to fragments 1..P-1: one of {FRAGMENT_PATTERNS}")
  fragment_order: str = _field(
      "embeddings-first", flag="fragment-order",
      help=f"which fragment each send picks: one of {FRAGMENT_ORDERS}"
           " (embeddings-last: MaxText's order)")
  overlap: int = _field(0, flag="overlap", symbol="τ", traced="int32",
                        help="steps between sending a fragment and merging it, 0 <= τ < H")
  alpha: float = _field(0.0, flag="alpha", symbol="α", traced="float32",
                        help="merge blend, local <- α·local + (1-α)·global")
  outer_overlap: str = _field(
      "none", flag="outer-overlap",
      help=f"apply each sync's average at the next sync of its fragment: one of {OUTER_OVERLAPS}")
  compression: str = _field("none", flag="compression",
                            help=f"pseudo-gradient wire format: one of {COMPRESSIONS}")
  error_feedback: bool = _field(False, flag="error-feedback",
                                help="keep and resend each replica's compression residual")
  compression_block: int | None = _field(
      None, flag="compression-block", parse=int,
      help="elements per quantization scale (default: one scale per tensor)")
  topk: int | None = _field(
      None, flag="topk", parse=int, symbol="k",
      help="sparse pseudo-gradients (SparseLoCo): send the k largest-magnitude entries of each"
           " chunk, values in --compression's format (default: dense)")
  topk_chunk: int = _field(DEFAULT_CHUNK, flag="topk-chunk", symbol="C",
                           help="elements per top-k chunk (indices take ⌈log2 C⌉ bits)")
  error_feedback_decay: float = _field(
      1.0, flag="error-feedback-decay", symbol="β", traced="float32",
      help="residual decay e <- Δ + β·e - sent, in (0, 1] (SparseLoCo: β < 1 in place of outer momentum)")
  reduction: str = _field(
      "all-gather", flag="reduction",
      help=f"how the payloads are averaged: one of {REDUCTIONS} (reduce-scatter: the mean is"
           " re-quantized to --compression's format; 2(N-1)/N of a payload per process)")

  def __post_init__(self):
    self.validate()

  @property
  def sync_interval(self) -> int:
    """Δh = H / P, the number of steps between two fragment sends (exact by validation)."""
    return self.sync_every // self.fragments

  @property
  def wire(self) -> dict:
    """The wire format's keyword arguments for :mod:`diloco_core.wire.compression` (besides its
    name, ``compression``): ``block_size``, ``topk`` and ``topk_chunk``."""
    return {"block_size": self.compression_block, "topk": self.topk, "topk_chunk": self.topk_chunk}

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
    v.check_choice("`outer_optimizer`", self.outer_optimizer, OUTER_OPTIMIZERS)
    v.check_real("outer_beta2 (β2)", self.outer_beta2, low=0.0, high=1.0)
    v.check_int("fragments (P)", self.fragments)
    if self.algorithm == "diloco" and self.fragments != 1:
      raise ValueError(
          f"fragments (P={self.fragments}) needs algorithm='streaming'; 'diloco' is P = 1.")
    v.check_sync_every_fragments(self.sync_every, self.fragments)
    v.check_choice("fragment_pattern", self.fragment_pattern, FRAGMENT_PATTERNS)
    v.check_choice("`fragment_order`", self.fragment_order, FRAGMENT_ORDERS)
    v.check_overlap(self.overlap, self.sync_every)
    v.check_real("alpha (α)", self.alpha, low=0.0, high=1.0, high_open=False)
    v.check_outer_overlap(self.outer_overlap, self.overlap)
    v.check_choice("compression", self.compression, COMPRESSIONS)
    v.check_bool("error_feedback", self.error_feedback)
    if self.compression_block is not None and (
        not v.is_int(self.compression_block) or self.compression_block < 1):
      raise ValueError(f"compression_block must be None (per tensor) or an integer >= 1,"
                       f" got {self.compression_block!r}.")
    if self.topk is not None:
      check_topk(self.topk, self.topk_chunk)
      check_topk_block(self.compression_block)
    v.check_real("error_feedback_decay (β)", self.error_feedback_decay, low=0.0, high=1.0,
                 low_open=True, high_open=False)
    v.check_choice("`reduction`", self.reduction, REDUCTIONS)
    if self.reduction == "reduce-scatter" and self.topk is not None:
      raise ValueError(f"`reduction` reduce-scatter re-quantizes the mean of dense payloads, and topk"
                       f" (k={self.topk}) sends sparse ones (their mean is not sparse): use `reduction`"
                       " all-gather or drop `topk`.")
    self._check_no_dead_options()
    if num_layers is not None:
      v.check_fragments_divide_layers(self.fragments, num_layers)

  def _check_no_dead_options(self) -> None:
    """Refuses options that would change nothing, instead of ignoring them silently: the
    outer-loop options with DP (no outer step), error feedback and a block size with no
    compression (no residual, no scale)."""
    if self.algorithm == "dp":
      dead = [name for name, off in _OFF_UNDER_DP.items() if getattr(self, name) != off]
      if dead:
        values = ", ".join(f"`{name}` {getattr(self, name)!r}" for name in dead)
        raise ValueError(f"{values} has no effect with algorithm 'dp' (no outer step, nothing"
                         f" compressed): drop {' and '.join(f'`{name}`' for name in dead)} or use"
                         " `algorithm` diloco or streaming.")
      return
    if self.fragments == 1 and self.fragment_order != _OFF_UNDER_DP["fragment_order"]:
      raise ValueError(f"`fragment_order` {self.fragment_order!r} orders fragments, and fragments"
                       " (P=1) has one: pass `fragments` > 1 (algorithm streaming) or drop"
                       " `fragment_order`.")
    if self.outer_optimizer != "adam" and self.outer_beta2 != _DEFAULT_BETA2:
      raise ValueError(f"`outer_beta2` {self.outer_beta2!r} is Adam's second-moment decay, and"
                       f" outer_optimizer={self.outer_optimizer!r} has none: pass `outer_optimizer`"
                       " adam or drop `outer_beta2`.")
    if self.topk is None and self.topk_chunk != _OFF_UNDER_DP["topk_chunk"]:
      raise ValueError(f"`topk_chunk` {self.topk_chunk!r} sets the top-k chunk, and topk is None (dense):"
                       " pass `topk` or drop `topk_chunk`.")
    if not self.error_feedback and self.error_feedback_decay != 1.0:
      raise ValueError(f"`error_feedback_decay` {self.error_feedback_decay!r} decays the error-feedback"
                       " residual: pass `error_feedback` or drop `error_feedback_decay`.")
    if self.compression == "none" and self.topk is None and self.error_feedback:
      raise ValueError("`error_feedback` resends the compression residual, and compression='none' leaves"
                       " none: pass `compression` (one of"
                       f" {[c for c in COMPRESSIONS if c != 'none']}) or drop `error_feedback`.")
    if self.compression == "none" and self.compression_block is not None and self.topk is None:
      raise ValueError(f"`compression_block` {self.compression_block!r} sets the quantization scale's"
                       " block, and compression='none' quantizes nothing: pass `compression` or drop"
                       " `compression_block`.")


#: The outer-loop options that DP has no use for; each must keep its default ("off") there.
_OFF_UNDER_DP_FIELDS = ("overlap", "alpha", "outer_overlap", "compression", "error_feedback",
                        "compression_block", "topk", "topk_chunk", "error_feedback_decay",
                        "outer_optimizer", "outer_beta2", "fragment_order", "reduction")
_OFF_UNDER_DP = {f.name: f.default for f in dataclasses.fields(DiLoCoConfig)
                 if f.name in _OFF_UNDER_DP_FIELDS}
_DEFAULT_BETA2 = _OFF_UNDER_DP["outer_beta2"]
