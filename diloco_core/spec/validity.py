"""The validity rules of a (Streaming) DiLoCo schedule and of plain option values, written once.

Every package checks its inputs with these functions: the trainer's configs
(:class:`~diloco_core.DiLoCoConfig`, the run config), :class:`~diloco_core.Fragments`,
and the planning library (``analysis.planning.roofline``, ``analysis.planning.plan``). A value is validated
once, where it enters; the messages are one line, name the option (with its symbol) and say
what is allowed. Values are never rounded: ``H = 10, P = 3`` is an error, not ``Δh = 3``.

The schedule rules (see the docs' semantics page):

.. math::

   H \\bmod P = 0, \\qquad 0 \\le \\tau < H, \\qquad (P - 1) \\mid L \\ \\text{when } P > 1.

Examples:
  >>> check_schedule(100, 5, 1, num_layers=8)
  (100, 5, 1)
  >>> check_schedule(10, 3)
  Traceback (most recent call last):
  ...
  ValueError: sync_every (H=10) must be a multiple of fragments (P=3): choose H in {9, 12, ...} or P among the divisors of 10 [1, 2, 5, 10].
  >>> allowed_fragments(4)
  [1, 2, 3, 5]
"""

from __future__ import annotations

import math

import numpy as np

#: How layers are dealt to fragments 1..P−1 (the trainer's and the simulator's patterns).
FRAGMENT_PATTERNS = ("strided", "sequential")
#: How the replicas' fragments cross between replicas: inside the step that sends them (one SPMD
#: program) or on a communication thread while training goes on (:mod:`diloco_core.runtime.background`).
COMMUNICATIONS = ("in-step", "background")
#: Whole-outer-step overlap modes (arXiv 2502.12996; semantics page, docs/semantics.md).
OUTER_OVERLAPS = ("none", "delayed", "eager")
#: Which fragment a send picks: the semantics page's order (embeddings first) or MaxText's.
FRAGMENT_ORDERS = ("embeddings-first", "embeddings-last")
#: How the replicas' payloads are averaged across processes: every process gathers every payload
#: (the exact mean of what was sent), or a reduce-scatter of chunks whose mean is re-quantized to
#: the wire format, then an all-gather (2 (N - 1) / N of a payload per process; semantics page).
REDUCTIONS = ("all-gather", "reduce-scatter")
#: The inner optimizers of the trainer (:mod:`diloco_core.algorithm.optimizers`).
INNER_OPTIMIZERS = ("adamw", "muon")
#: The outer optimizers of the trainer (:mod:`diloco_core.algorithm.optimizers`).
OUTER_OPTIMIZERS = ("nesterov", "sgd", "adam")


def is_int(value) -> bool:
  """True for a Python or numpy integer (never a bool)."""
  return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_real(value) -> bool:
  """True for a finite Python or numpy real number (never a bool)."""
  return (isinstance(value, (int, float, np.integer, np.floating))
          and not isinstance(value, (bool, np.bool_)) and math.isfinite(value))


def check_int(name: str, value, *, low: int = 1, high: int | None = None, what: str = "") -> int:
  """``value`` as an ``int`` if it is an integer in ``[low, high)``; else a one-line ValueError.

  Args:
    name: the option's name (with its symbol, e.g. ``"replicas (M)"``).
    value: the user's value.
    low: the smallest allowed value.
    high: one past the largest allowed value (None: unbounded).
    what: an optional note appended to the message (e.g. ``" (0: never)"``).

  Examples:
    >>> check_int("replicas (M)", 4)
    4
    >>> check_int("replicas (M)", 0)
    Traceback (most recent call last):
    ...
    ValueError: replicas (M) must be an integer >= 1, got 0.
  """
  if not is_int(value) or value < low or (high is not None and value >= high):
    bound = f">= {low}" if high is None else f"in [{low}, {high})"
    raise ValueError(f"{name} must be an integer {bound}{what}, got {value!r}.")
  return int(value)


def check_real(name: str, value, *, low: float | None = None, high: float | None = None,
               low_open: bool = False, high_open: bool = True) -> float:
  """``value`` as a ``float`` if it is a finite real within the bounds; else a one-line ValueError.

  Examples:
    >>> check_real("outer_momentum (μ)", 0.9, low=0.0, high=1.0)
    0.9
    >>> check_real("alpha (α)", 2, low=0.0, high=1.0, high_open=False)
    Traceback (most recent call last):
    ...
    ValueError: alpha (α) must be a finite number in [0, 1], got 2.
  """
  ok = is_real(value)
  if ok and low is not None:
    ok = value > low if low_open else value >= low
  if ok and high is not None:
    ok = value < high if high_open else value <= high
  if not ok:
    if low is not None and high is not None:
      bound = f" in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    elif low is not None:
      bound = f" {'>' if low_open else '>='} {low:g}"
    elif high is not None:
      bound = f" {'<' if high_open else '<='} {high:g}"
    else:
      bound = ""
    raise ValueError(f"{name} must be a finite number{bound}, got {value!r}.")
  return float(value)


def check_choice(name: str, value, allowed) -> str:
  """``value`` if it is one of ``allowed``; else a one-line ValueError listing them.

  Examples:
    >>> check_choice("compression", "fp3", ("none", "bf16"))
    Traceback (most recent call last):
    ...
    ValueError: compression must be one of ('none', 'bf16'), got 'fp3'.
  """
  if not isinstance(value, str) or value not in allowed:
    raise ValueError(f"{name} must be one of {tuple(allowed)}, got {value!r}.")
  return value


def check_bool(name: str, value) -> bool:
  """``value`` if it is True or False; else a one-line ValueError."""
  if not isinstance(value, (bool, np.bool_)):
    raise ValueError(f"{name} must be True or False, got {value!r}.")
  return bool(value)


def check_sync_every_fragments(sync_every: int, fragments: int) -> None:
  """H must be a multiple of P (Δh = H / P exactly); the message suggests valid H and P."""
  if sync_every % fragments:
    h, p = sync_every, fragments
    divisors = [d for d in range(1, h + 1) if h % d == 0]
    lo = (h // p) * p
    raise ValueError(
        f"sync_every (H={h}) must be a multiple of fragments (P={p}): choose H in"
        f" {{{lo or p}, {lo + p}, ...}} or P among the divisors of {h} {divisors}.")


def allowed_fragments(num_layers: int) -> list[int]:
  """Every P for which (P − 1) divides L, plus P = 1 (fragment 0 is the non-layer params)."""
  return [1] + [p + 1 for p in range(1, num_layers + 1) if num_layers % p == 0]


def check_fragments_divide_layers(fragments: int, num_layers: int) -> None:
  """(P − 1) must divide L when P > 1; the message lists the allowed P for this L."""
  if fragments > 1 and num_layers % (fragments - 1):
    raise ValueError(
        f"fragments (P={fragments}): P - 1 must divide the number of layers"
        f" (L={num_layers}); allowed P for this model: {allowed_fragments(num_layers)}.")


def check_overlap(overlap, sync_every: int) -> int:
  """τ must be an integer with 0 <= τ < H (a fragment is merged before it is sent again)."""
  if not is_int(overlap) or not 0 <= overlap < sync_every:
    raise ValueError(
        f"overlap (τ) must be an integer with 0 <= τ < sync_every (H={sync_every}),"
        f" got {overlap!r}.")
  return int(overlap)


def check_outer_overlap(outer_overlap, overlap) -> str:
  """``outer_overlap`` must be one of ``OUTER_OVERLAPS``; other than "none" it needs τ = 0.

  Examples:
    >>> check_outer_overlap("eager", 1)
    Traceback (most recent call last):
    ...
    ValueError: outer_overlap='eager' overlaps a whole outer step and needs overlap (τ) = 0, got τ=1.
  """
  check_choice("outer_overlap", outer_overlap, OUTER_OVERLAPS)
  if outer_overlap != "none" and overlap != 0:
    raise ValueError(f"outer_overlap={outer_overlap!r} overlaps a whole outer step and needs"
                     f" overlap (τ) = 0, got τ={overlap}.")
  return outer_overlap


def check_schedule(sync_every, fragments=1, overlap=0, *, num_layers: int | None = None
                   ) -> tuple[int, int, int]:
  """Checks H, P, τ (and L when known) together; returns them as ints.

  Args:
    sync_every: H >= 1.
    fragments: P >= 1 with H % P == 0.
    overlap: τ with 0 <= τ < H.
    num_layers: L, when known: (P − 1) | L is checked too.

  Returns:
    ``(H, P, τ)``.
  """
  h = check_int("sync_every (H)", sync_every)
  p = check_int("fragments (P)", fragments)
  check_sync_every_fragments(h, p)
  tau = check_overlap(overlap, h)
  if num_layers is not None:
    check_fragments_divide_layers(p, num_layers)
  return h, p, tau
