"""The syncer rule: one rule from synchronous DiLoCo to a K-of-M quorum, stale contributions
and per-replica inner steps, as a frozen config and its checks.

The rule, per fragment (the simulated-time tape of :mod:`~diloco_core.spec.tape` plays it):

1. Replica m runs :math:`H_m` inner steps from the global version b it last merged, then sends
   its contribution :math:`\\Delta_m = \\theta_g^{(b)} - \\theta_m` (base b) and waits.
2. The syncer holds version v and one open round, which makes version v + 1. A contribution with
   base b = v is *fresh* and joins the round. One with b < v is *late* (its own round, b + 1, has
   committed): ``late="drop"`` discards it and the replica restarts from
   :math:`\\theta_g^{(v)}` (the elastic drop rule's heal); ``late="carry"`` lets it join the open
   round with staleness :math:`s = v - b`, unless s exceeds ``max_staleness``. Staleness counts
   versions (committed rounds), in both apply modes. Under ``apply="sequential"`` Liu et al.
   count each member's application as a server update instead, so there a contribution is as
   stale as the outer steps applied since its base: at least s, more when rounds had several
   members. The trainer keeps one count for both modes so that a contribution's staleness,
   ``max_staleness`` and the ``"staleness"`` weights do not change with ``apply``.
3. The round commits G = ``grace`` ticks after the arrival of its :math:`\\min(K, n)`-th
   contribution, n the live replicas that can still contribute (a quorum never waits for a lost
   replica), or as soon as all n are in, whichever comes first
   (:func:`~diloco_core.spec.quorum_close.close_time`, the real processes' rule too); every
   contribution arrived by then is a member, in arrival order.
4. The commit's outer step. ``apply="merged"``: one step on :math:`\\sum_i w_i \\Delta_i`
   (:math:`\\sum_i w_i = 1`; uniform weights: the float32 mean, the trainer's reduction).
   ``apply="sequential"``: one step per member, in arrival order (Liu et al. 2024, arXiv
   2401.09135), on :math:`\\hat w_i \\Delta_i` (:math:`\\hat w_i = 1`, or the staleness discount).
   The step is Delayed Nesterov with buffer N and momentum activation c
   (:mod:`~diloco_core.algorithm.outer_apply`); N = 1 is the trainer's Nesterov.
5. Each member merges the new version when it arrives, then runs its next period.

The knobs at their defaults (K = M, G = 0, :math:`H_m = H`, merged, uniform, N = 1) put every
replica in every round and take one outer step on the mean: synchronous DiLoCo.

Per-replica inner steps are explicit (``inner_steps``) or DyLU's (Liu et al., dynamic local
updates, from the replicas' speeds v: steps per unit of time):

.. math:: H_m = \\max\\bigl(1, \\lfloor H\\, v_m / \\max_k v_k \\rfloor\\bigr)

(the floor taken in exact rational arithmetic, a float read as the decimal it prints as; Liu
et al.'s Eq. 6 has the bare floor, which gives 0 steps to a replica more than H times slower
than the fastest: the max keeps it contributing, and the two agree whenever :math:`H v_m \\ge \\max_k v_k`).
Contribution weights: ``"uniform"``; ``"tokens"`` (Decoupled DiLoCo, arXiv 2604.21428, as its
secondary descriptions state it: tokens times tokens per step,
:math:`w \\propto c_\\text{tok}^2 / c_\\text{steps}`; with equal batches this is
:math:`w \\propto H_m`); ``"staleness"``: the polynomial discount
:math:`(1 + s)^{-a}` (FedAsync, Xie et al. 2019, arXiv 1903.03934), normalized in a merged round,
a plain factor in sequential apply. ``radial=True``: radial-directional averaging of a merged
round (:func:`~diloco_core.algorithm.outer_apply.radial_directional_mean`).

Choices where the papers say nothing: a late contribution's fate is a knob (``late``); a
contribution counts once sent (a replica lost afterwards does not recall it); ``sequential``
apply with Streaming fragments is allowed (each fragment is its own syncer, its members applied
in turn to its own outer state), with ``reduction="reduce-scatter"`` it is refused (no process
holds the separate contributions, only their re-quantized mean).

The trainer plays it from a tape (:mod:`~diloco_core.runtime.tape_player`: P = 1, τ = 0, the in-step
runtime; the background runtime keeps the lock step). Which
setting reproduces which published algorithm: :mod:`~diloco_core.spec.syncer_settings`.

Examples:
  >>> cfg = SyncerConfig()
  >>> cfg.check(replicas=3, sync_every=4); cfg.inner_steps_of(4, 3), cfg.quorum_of(3)
  ((4, 4, 4), 3)
  >>> SyncerConfig(speeds=(1.0, 1.0, 0.5)).inner_steps_of(5, 3)  # DyLU: floor(5 * 0.5) = 2
  (5, 5, 2)
  >>> SyncerConfig(quorum=4).check(replicas=3, sync_every=4)
  Traceback (most recent call last):
  ...
  ValueError: quorum (K=4) must be at most replicas (M=3): use K in 1..3, or None for every live replica.
"""

from __future__ import annotations

import dataclasses
import math
from fractions import Fraction


from diloco_core.spec import validity as v

#: How a round's members are applied: one outer step on their weighted mean, or one each.
APPLY_MODES = ("merged", "sequential")
#: What happens to a contribution whose own round has committed before it arrived.
LATE_POLICIES = ("drop", "carry")
#: How a round's members are weighted.
WEIGHTINGS = ("uniform", "tokens", "staleness")
#: The polynomial staleness discount's default exponent a (FedAsync's).
STALENESS_EXPONENT = 0.5

#: The syncer options a run over real processes acts on (``communication`` background with
#: ``elastic``: :mod:`diloco_core.runtime.quorum`): a K-of-M quorum, its grace in seconds and a
#: straggler's delay. Every other option off its default (DyLU, late contributions carried,
#: sequential apply, Delayed Nesterov, weights, the tape's grace in ticks, ...) runs on the tape
#: player only.
PROCESS_KNOBS = ("quorum", "grace_s", "step_delay")

__all__ = ["APPLY_MODES", "LATE_POLICIES", "PROCESS_KNOBS", "STALENESS_EXPONENT", "SyncerConfig", "WEIGHTINGS",
           "dylu_inner_steps", "exact_decimal", "round_weights", "tape_only_knobs"]


def tape_only_knobs(knobs: dict, defaults: dict) -> tuple[str, ...]:
  """The options of ``knobs`` that only the tape player runs: off their default in ``defaults``
  and not among :data:`PROCESS_KNOBS` (an empty tuple: the setting runs on real processes too).

  Examples:
    >>> tape_only_knobs({"quorum": 2, "late": "carry"}, {"quorum": None, "late": "drop"})
    ('late',)
    >>> tape_only_knobs({"quorum": 2, "grace_s": 0.5, "late": "drop"}, {"quorum": None, "late": "drop"})
    ()
  """
  return tuple(k for k, value in knobs.items() if k not in PROCESS_KNOBS and value != defaults.get(k))


def exact_decimal(value) -> Fraction:
  """``value`` as an exact rational, a float (or NumPy float) read as the decimal it prints as.

  The one rule by which speeds and seconds become exact numbers (DyLU's floor, a tape's ticks,
  the planner's seconds): 0.3 is 3/10, not the binary fraction just below it.

  Args:
    value: an int, a float, a NumPy scalar or a Fraction.

  Returns:
    The Fraction.

  Examples:
    >>> exact_decimal(0.3), exact_decimal(2), exact_decimal(Fraction(1, 3))
    (Fraction(3, 10), Fraction(2, 1), Fraction(1, 3))
  """
  if isinstance(value, Fraction):
    return value
  return Fraction(str(value)) if isinstance(value, float) or hasattr(value, "dtype") else Fraction(value)


def dylu_inner_steps(speeds, sync_every: int) -> tuple[int, ...]:
  """DyLU's inner steps: :math:`H_m = \\max(1, \\lfloor H v_m / \\max_k v_k \\rfloor)`.

  Args:
    speeds: each replica's speed :math:`v_m > 0` (steps per unit of time). A float is read as
      the decimal it prints as (0.3 is 3/10, not the binary fraction just below it), so the
      floor is exact: speeds (1.0, 0.3) and H = 10 give 3 steps, never 2.
    sync_every: H, the fastest replica's inner steps.

  Returns:
    :math:`(H_1, \\dots, H_M)`.

  Examples:
    >>> dylu_inner_steps((3.0, 1.0, 0.2), 10)  # 10, floor(10/3) = 3, max(1, floor(2/3)) = 1
    (10, 3, 1)
    >>> dylu_inner_steps((1.0, 0.3), 10)
    (10, 3)
  """
  exact = [exact_decimal(s) for s in speeds]
  fastest = max(exact)
  return tuple(max(1, math.floor(sync_every * s / fastest)) for s in exact)


@dataclasses.dataclass(frozen=True)
class SyncerConfig:
  """The syncer rule's knobs (module docstring); the defaults are synchronous DiLoCo.

  Attributes:
    inner_steps: :math:`(H_1, \\dots, H_M)`, each replica's inner steps per contribution; None:
      every replica H (or DyLU's, with ``speeds``).
    speeds: each replica's speed :math:`v_m` for DyLU (:func:`dylu_inner_steps`); None: no DyLU.
    quorum: K, the contributions a round waits for; None: every live replica (K = M).
    grace: G, ticks (the tape's unit of simulated time) the round stays open after its K-th
      contribution (0: none).
    late: ``"drop"`` or ``"carry"`` (:data:`LATE_POLICIES`).
    max_staleness: with ``late="carry"``, the largest staleness s admitted (None: any).
    apply: ``"merged"`` or ``"sequential"`` (:data:`APPLY_MODES`).
    buffer: Delayed Nesterov's N (1: the trainer's Nesterov).
    activation: Delayed Nesterov's momentum activation c, in :math:`[0, 1/N]`.
    weights: ``"uniform"``, ``"tokens"`` or ``"staleness"`` (:data:`WEIGHTINGS`).
    staleness_exponent: a of the discount :math:`(1 + s)^{-a}` (``weights="staleness"``).
    radial: radial-directional averaging of a merged round.
  """

  inner_steps: tuple[int, ...] | None = None
  speeds: tuple[float, ...] | None = None
  quorum: int | None = None
  grace: int = 0
  late: str = "drop"
  max_staleness: int | None = None
  apply: str = "merged"
  buffer: int = 1
  activation: float = 0.0
  weights: str = "uniform"
  staleness_exponent: float = STALENESS_EXPONENT
  radial: bool = False

  def quorum_of(self, replicas: int) -> int:
    """K for M = ``replicas`` (None means M)."""
    return replicas if self.quorum is None else self.quorum

  def inner_steps_of(self, sync_every: int, replicas: int) -> tuple[int, ...]:
    """:math:`(H_1, \\dots, H_M)`: explicit, DyLU's from ``speeds``, or H for every replica."""
    if self.inner_steps is not None:
      return tuple(self.inner_steps)
    if self.speeds is not None:
      return dylu_inner_steps(self.speeds, sync_every)
    return (sync_every,) * replicas

  def lock_step(self, replicas: int, sync_every: int) -> bool:
    """Every replica in every round, with the same H, one merged step: the trainer's sync."""
    return (self.quorum_of(replicas) == replicas and self.late == "drop" and self.apply == "merged"
            and set(self.inner_steps_of(sync_every, replicas)) == {sync_every})

  def check(self, replicas: int, sync_every: int, *, fragments: int = 1, overlap: int = 0,
            reduction: str = "all-gather", outer_optimizer: str = "nesterov",
            outer_overlap: str = "none") -> None:
    """Raises a one-line ``ValueError`` naming the option on any invalid knob or combination,
    before anything is compiled.

    Args:
      replicas: M.
      sync_every: H.
      fragments: P (each :math:`H_m` must be a multiple of it).
      overlap: τ (below every :math:`H_m`: a fragment merges before it is sent again).
      reduction: the run's ``reduction`` (``"reduce-scatter"`` refuses sequential apply).
      outer_optimizer: the run's outer optimizer (Delayed Nesterov needs ``"nesterov"``).
      outer_overlap: the run's ``outer_overlap`` (other than ``"none"`` needs lock step).
    """
    m = v.check_int("replicas (M)", replicas)
    h = v.check_int("sync_every (H)", sync_every)
    self._check_inner_steps(m, h, fragments, overlap)
    self._check_membership(m)
    self._check_outer_step(reduction, outer_optimizer)
    self._check_weights()
    if outer_overlap != "none" and not self.lock_step(m, h):
      raise ValueError(f"outer_overlap={outer_overlap!r} applies each sync's average at the fragment's next"
                       " sync, which needs every replica in every sync with the same H and merged apply:"
                       " use the syncer's defaults or outer_overlap='none'.")

  def _check_inner_steps(self, m: int, h: int, fragments: int, overlap: int) -> None:
    if self.inner_steps is not None and self.speeds is not None:
      raise ValueError("inner_steps (H_m) and speeds (DyLU) both set the replicas' inner steps:"
                       " pass one of them.")
    for name, values, low in (("inner_steps (H_m)", self.inner_steps, 1), ("speeds (v_m)", self.speeds, 0)):
      if values is None:
        continue
      if not isinstance(values, tuple) or len(values) != m:
        raise ValueError(f"{name} must be a tuple of one value per replica (M={m}), got {values!r}.")
      for i, x in enumerate(values):
        if low:
          v.check_int(f"{name} of replica {i}", x, low=low)
        else:
          v.check_real(f"{name} of replica {i}", x, low=0.0, low_open=True)
    steps = self.inner_steps_of(h, m)
    for i, hm in enumerate(steps):
      if hm % fragments:
        raise ValueError(f"inner_steps (H_m={hm} of replica {i}) must be a multiple of fragments"
                         f" (P={fragments}): every replica sends each fragment once per period.")
    if overlap >= min(steps):
      raise ValueError(f"overlap (τ={overlap}) must be below every replica's inner steps (min H_m ="
                       f" {min(steps)}): a fragment merges before it is sent again.")

  def _check_membership(self, m: int) -> None:
    if self.quorum is not None:
      k = v.check_int("quorum (K)", self.quorum, what=" (None: every live replica)")
      if k > m:
        raise ValueError(f"quorum (K={k}) must be at most replicas (M={m}): use K in 1..{m}, or None"
                         " for every live replica.")
    grace = v.check_int("grace (G)", self.grace, low=0, what=" (ticks; 0: none)")
    if grace and self.quorum_of(m) == m:
      raise ValueError(f"grace (G={grace}) waits after the K-th contribution for the others, and quorum"
                       f" K = M = {m} leaves none: pass quorum < {m} or drop grace.")
    v.check_choice("late", self.late, LATE_POLICIES)
    if self.late == "drop" and self.max_staleness is not None:
      raise ValueError(f"max_staleness ({self.max_staleness!r}) bounds carried contributions, and"
                       " late='drop' carries none (every member has staleness 0): pass late='carry'"
                       " or drop max_staleness.")
    if self.max_staleness is not None:
      v.check_int("max_staleness", self.max_staleness, what=" (0 is late='drop'; None: any)")

  def _check_outer_step(self, reduction: str, outer_optimizer: str) -> None:
    v.check_choice("apply", self.apply, APPLY_MODES)
    if self.apply == "sequential" and reduction == "reduce-scatter":
      raise ValueError("apply='sequential' takes one outer step per contribution, and reduction"
                       " 'reduce-scatter' leaves no process holding them, only their re-quantized"
                       " mean: use reduction 'all-gather' or apply='merged'.")
    n = v.check_int("buffer (N)", self.buffer)
    c = v.check_real("activation (c)", self.activation, low=0.0, high=1.0 / n, high_open=False)
    if n == 1 and c != 0:
      raise ValueError(f"activation (c={c:g}) shares the momentum over a buffer, and buffer (N=1)"
                       " applies it whole at every step (c has no effect): pass buffer > 1 or drop"
                       " activation.")
    if n > 1 and outer_optimizer != "nesterov":
      raise ValueError(f"buffer (N={n}) is Delayed Nesterov's, an outer Nesterov rule, and"
                       f" outer_optimizer={outer_optimizer!r} is not Nesterov: pass outer_optimizer"
                       " 'nesterov' or buffer 1.")

  def _check_weights(self) -> None:
    v.check_choice("weights", self.weights, WEIGHTINGS)
    a = v.check_real("staleness_exponent (a)", self.staleness_exponent, low=0.0, low_open=True)
    if self.weights != "staleness" and a != STALENESS_EXPONENT:
      raise ValueError(f"staleness_exponent (a={a:g}) discounts stale contributions, and"
                       f" weights={self.weights!r} does not: pass weights='staleness' or drop"
                       " staleness_exponent.")
    if self.weights == "staleness" and self.late == "drop":
      raise ValueError("weights='staleness' discounts stale contributions, and late='drop' admits"
                       " none (every member has staleness 0): pass late='carry' or another weights.")
    if self.weights == "tokens" and self.apply == "sequential":
      raise ValueError("weights='tokens' are shares of a merged mean, and apply='sequential' takes"
                       " one step per contribution: use apply='merged', or weights 'uniform' or"
                       " 'staleness'.")
    v.check_bool("radial", self.radial)
    if self.radial and self.apply == "sequential":
      raise ValueError("radial=True averages a round's contributions, and apply='sequential'"
                       " averages none: use apply='merged' or drop radial.")


def round_weights(config: SyncerConfig, inner_steps, staleness, tokens=None) -> tuple[float, ...] | None:
  """The weights of one round's members, in member order (one rule for both apply modes).

  Args:
    config: the syncer config (its ``weights``, ``apply`` and ``staleness_exponent``).
    inner_steps: each member's :math:`c_\\text{steps}`, the inner steps it sums (its :math:`H_m`).
    staleness: each member's staleness s (version made minus 1, minus its base).
    tokens: each member's :math:`c_\\text{tok}`, tokens it trained on; None: equal batches,
      :math:`c_\\text{tok} = c_\\text{steps}` (the weights are scale-free).

  Returns:
    None for uniform weights (merged: the plain mean; sequential: every member whole). Merged:
    :math:`w_i = r_i / \\sum_j r_j` with :math:`r = c_\\text{tok}^2 / c_\\text{steps}` (tokens)
    or :math:`(1 + s)^{-a}` (staleness). Sequential: the factors :math:`(1 + s_i)^{-a}` as they
    are (FedAsync's polynomial staleness function).

  Examples:
    >>> round_weights(SyncerConfig(weights="tokens"), inner_steps=(4, 2), staleness=(0, 0))
    (0.6666666666666666, 0.3333333333333333)
    >>> round_weights(SyncerConfig(late="carry", apply="sequential", weights="staleness",
    ...                            staleness_exponent=1.0), inner_steps=(4, 4), staleness=(0, 3))
    (1.0, 0.25)
  """
  if config.weights == "uniform":
    return None
  if config.weights == "tokens":
    toks = inner_steps if tokens is None else tokens
    raw = [Fraction(t) ** 2 / Fraction(h) for t, h in zip(toks, inner_steps)]
    total = sum(raw)
    return tuple(float(r / total) for r in raw)
  raw = [(1.0 + s) ** -config.staleness_exponent for s in staleness]
  if config.apply == "sequential":
    return tuple(raw)
  total = math.fsum(raw)
  return tuple(r / total for r in raw)
