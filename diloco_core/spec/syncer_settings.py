"""Which setting of the syncer rule reproduces which algorithm: the table, and its presets.

Every algorithm below is one setting of :class:`~diloco_core.spec.syncer.SyncerConfig`
(:data:`SYNCER_SETTINGS`; the docs' table is read from it). A knob's value is a number, a choice, or a
placeholder the run fills in (:func:`syncer_preset`): ``"M"`` the replicas, ``"K"`` a quorum, ``"G"`` a
grace window in ticks, ``"v"`` the replicas' speeds.

=====================================================  =========================================================
setting                                                knobs (the others at their defaults)
=====================================================  =========================================================
synchronous DiLoCo                                     none
Streaming DiLoCo                                       none (the run's P, τ, α)
elastic drop rule                                      none (a lost replica leaves the quorum)
synchronous DiLoCo with DyLU's :math:`H_m`             ``speeds=v``
asynchronous Local-SGD, naive (Liu et al.)             ``quorum=1, late="carry", apply="sequential"``
asynchronous Local-SGD, Delayed Nesterov               the same, ``buffer=M``
asynchronous Local-SGD, Delayed Nesterov + DyLU        the same, ``buffer=M, speeds=v``
Decoupled DiLoCo                                       ``quorum=K, grace=G, late="carry", weights="tokens", radial=True``
=====================================================  =========================================================

Choices of this project where a paper says nothing, stated in each row's note: Delayed
Nesterov's buffer N = M (one momentum update per M contributions, the equivalence of
``tests/test_syncer.py``) and c = 0 (Liu et al.'s default); Decoupled DiLoCo's late
contributions carried to the next round, and its grace window a fixed G ticks (the paper's
window adapts to the step and sync times).

The trainer plays a non-default setting from its tape (:mod:`~diloco_core.runtime.tape_player`, P = 1, τ = 0, the
in-step runtime); the background runtime keeps the lock step.

Examples:
  >>> syncer_preset("asynchronous Local-SGD, Delayed Nesterov", replicas=4)
  SyncerConfig(inner_steps=None, speeds=None, quorum=1, grace=0, late='carry', max_staleness=None, apply='sequential', buffer=4, activation=0.0, weights='uniform', staleness_exponent=0.5, radial=False)
  >>> [s.name for s in SYNCER_SETTINGS if not s.knobs]
  ['synchronous DiLoCo', 'Streaming DiLoCo', 'elastic drop rule']
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

from diloco_core.spec.syncer import SyncerConfig

__all__ = ["SYNCER_SETTINGS", "SyncerSetting", "syncer_preset"]


class SyncerSetting(NamedTuple):
  """One row of the table: an algorithm as a setting of the syncer rule."""

  name: str
  knobs: dict  # SyncerConfig field -> value or placeholder ("M", "K", "G", "v")
  flags: str  # the run's other options that it takes
  source: str  # where the algorithm is published, and this project's choices
  note: str = ""


_NAIVE = {"quorum": 1, "late": "carry", "apply": "sequential"}
_LIU = "Liu et al. 2024, Asynchronous Local-SGD Training for Language Modeling, arXiv 2401.09135"

#: The table (module docstring), in the order of the docs' table.
SYNCER_SETTINGS = (
    SyncerSetting("synchronous DiLoCo", {}, "--algorithm diloco",
            "Douillard et al. 2023, arXiv 2311.08105"),
    SyncerSetting("Streaming DiLoCo", {}, "--algorithm streaming --fragments P --overlap τ --alpha α",
            "Douillard et al. 2025, arXiv 2501.18512"),
    SyncerSetting("elastic drop rule", {}, "--communication background --elastic",
            "this project's semantics page (replica drops)",
            "a lost replica leaves the quorum (K counts live replicas); a replacement merges θ_g"),
    SyncerSetting("synchronous DiLoCo with DyLU's H_m", {"speeds": "v"}, "--algorithm diloco",
            _LIU + " (DyLU), in synchronous rounds",
            "every round still waits for every replica; the slow ones run fewer inner steps"),
    SyncerSetting("asynchronous Local-SGD, naive", dict(_NAIVE), "--algorithm diloco", _LIU,
            "every arrival is one outer Nesterov step on the current θ_g"),
    SyncerSetting("asynchronous Local-SGD, Delayed Nesterov", {**_NAIVE, "buffer": "M"}, "--algorithm diloco",
            _LIU + ", Algorithm 3", "N = M and c = 0 are this project's choice (c = 0: the paper's default)"),
    SyncerSetting("asynchronous Local-SGD, Delayed Nesterov + DyLU", {**_NAIVE, "buffer": "M", "speeds": "v"},
            "--algorithm diloco", _LIU + ", Algorithm 3 and DyLU", "as above"),
    SyncerSetting("Decoupled DiLoCo",
            {"quorum": "K", "grace": "G", "late": "carry", "weights": "tokens", "radial": True},
            "--algorithm streaming --fragments P", "Decoupled DiLoCo, arXiv 2604.21428",
            "late contributions carried is this project's choice; the paper's grace window adapts,"
            " here it is a fixed G ticks; its learners train on while a fragment is in flight, the"
            " tape's replicas wait for their round (τ = 0) until the runtimes adopt the rule"),
)


def syncer_preset(name: str, replicas: int, *, quorum: int | None = None, grace: int | None = None,
           speeds: tuple | None = None) -> SyncerConfig:
  """The :class:`~diloco_core.spec.syncer.SyncerConfig` of one row of :data:`SYNCER_SETTINGS`.

  Args:
    name: the row's ``name``.
    replicas: M (fills ``"M"``).
    quorum: K (fills ``"K"``).
    grace: G (fills ``"G"``).
    speeds: the replicas' speeds (fills ``"v"``).

  Returns:
    The config (not checked: call its ``check``).

  Examples:
    >>> syncer_preset("Decoupled DiLoCo", replicas=3, quorum=2, grace=5).grace
    5
    >>> syncer_preset("Decoupled DiLoCo", replicas=3)
    Traceback (most recent call last):
    ...
    ValueError: syncer_preset 'Decoupled DiLoCo' needs quorum (K), grace (G): pass them.
  """
  rows = {s.name: s for s in SYNCER_SETTINGS}
  if name not in rows:
    raise ValueError(f"syncer_preset name must be one of {tuple(rows)}, got {name!r}.")
  fill = {"M": replicas, "K": quorum, "G": grace, "v": speeds}
  words = {"K": "quorum (K)", "G": "grace (G)", "v": "speeds (v)"}
  missing = [words[x] for x in rows[name].knobs.values() if isinstance(x, str) and x in words and fill[x] is None]
  if missing:
    raise ValueError(f"syncer_preset {name!r} needs {', '.join(missing)}: pass them.")
  knobs = {k: fill[x] if isinstance(x, str) and x in fill else x for k, x in rows[name].knobs.items()}
  return dataclasses.replace(SyncerConfig(), **knobs)
