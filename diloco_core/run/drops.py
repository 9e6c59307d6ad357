"""Simulated replica drops: which replicas take part in each sync, a pure function of the run.

A run with ``drop_schedule`` or ``drop_prob`` (:class:`~diloco_core.TrainConfig`) passes a
participation mask to :meth:`DiLoCo.step <diloco_core.DiLoCo.step>`; the semantics of a
dropped replica (left out of the average, healed at the merge) are on the semantics page
(docs/semantics.md). The background runtime records who took part in each sync in its trace;
:func:`schedule_from_trace` turns that record back into a ``drop_schedule`` that replays it,
and :func:`rejoins_from_trace` an elastic run's heals into a ``rejoin_schedule``.
"""

from __future__ import annotations

import numpy as np

from diloco_core.run.config import TrainConfig
from diloco_core.spec.schedule import sent_fragment

_DROP_STREAM = 0x64726F70  # "drop": keeps the drop draws apart from every other use of the seed


def participation(cfg: TrainConfig, t: int) -> np.ndarray | None:
  """Which replicas take part in the sync after step ``t`` (simulated drops), or None.

  A pure function of ``(cfg, t)`` (``drop_prob`` draws from ``(seed, t)``), so a resumed
  run drops exactly the same replicas as an uninterrupted one.

  Args:
    cfg: the run (``drop_schedule``, ``drop_prob``, ``seed``).
    t: the inner step just done (1-based).

  Returns:
    None when no drops are configured, else a float32 [M] mask (1 present, 0 dropped;
    all ones at steps without a sync).

  Examples:
    >>> from diloco_core.algorithm.config import DiLoCoConfig
    >>> cfg = TrainConfig(algo=DiLoCoConfig(replicas=3, sync_every=4), steps=8, drop_schedule=((4, 1),))
    >>> participation(cfg, 4).tolist(), participation(cfg, 8).tolist()
    ([1.0, 0.0, 1.0], [1.0, 1.0, 1.0])
  """
  if not cfg.drop_schedule and not cfg.drop_prob:
    return None
  present = np.ones(cfg.algo.replicas, np.float32)
  if not sent_fragment(t, cfg.algo.sync_every, cfg.algo.fragments)[0]:
    return present
  for step, replica in cfg.drop_schedule:
    if step == t:
      present[replica] = 0.0
  if cfg.drop_prob:
    u = np.random.default_rng([_DROP_STREAM, cfg.seed, t]).random(cfg.algo.replicas)
    present[u < cfg.drop_prob] = 0.0
  return present


def schedule_from_trace(rows, replicas: int) -> tuple[tuple[int, int], ...]:
  """The ``drop_schedule`` that replays the participation a background run recorded.

  Each sync of the run left one row in its trace (``<out>/trace/process-<rank>.jsonl``, the
  same on every process): ``settle`` (``sent_at``: the step that sent it; ``present``: the [M]
  mask, or None for everyone) or ``skip`` (``step``: nobody took part). Passed as
  ``drop_schedule`` (with no ``drop_prob``), the result makes any run of the same config,
  in either runtime, leave out the same replicas at the same syncs.

  Args:
    rows: the trace's rows (dicts; rows of other kinds are ignored).
    replicas: M, the run's replica count (a skipped sync drops every replica).

  A run resumed from a checkpoint (elastic runs write a ``resumed`` row with the checkpoint's
  step into the same trace) replays as the resumed run: the syncs its earlier life made
  after that step are dropped from the record.

  Returns:
    ``(step, replica)`` pairs, sorted.

  Raises:
    ValueError: two rows disagree on one sync, or a mask is not M long.

  Examples:
    >>> schedule_from_trace([{"kind": "settle", "sent_at": 4, "present": [1.0, 0.0]},
    ...                      {"kind": "skip", "step": 8, "fragment": 0},
    ...                      {"kind": "settle", "sent_at": 12, "present": None}], replicas=2)
    ((4, 1), (8, 0), (8, 1))
    >>> schedule_from_trace([{"kind": "settle", "sent_at": 4, "present": [1.0, 0.0]},
    ...                      {"kind": "settle", "sent_at": 8, "present": [1.0, 0.0]},
    ...                      {"kind": "resumed", "step": 4, "replicas": [1], "source": 0},
    ...                      {"kind": "settle", "sent_at": 8, "present": None}], replicas=2)
    ((4, 1),)
  """
  missed: dict[int, tuple[int, ...]] = {}
  for row in rows:
    if row.get("kind") == "resumed":  # the run before it stopped: its syncs after the checkpoint are undone
      missed = {s: a for s, a in missed.items() if s <= row["step"]}
      continue
    if row.get("kind") == "skip":
      step, absent = row["step"], tuple(range(replicas))
    elif row.get("kind") == "settle":
      step, present = row["sent_at"], row.get("present")
      if present is not None and len(present) != replicas:
        raise ValueError(f"the trace's sync of step {step} lists {len(present)} replicas; the run has {replicas}.")
      absent = () if present is None else tuple(m for m, on in enumerate(present) if not on > 0)
    else:
      continue
    if missed.setdefault(step, absent) != absent:
      raise ValueError(f"the trace records the sync of step {step} twice, with different replicas"
                       f" ({missed[step]} and {absent} absent).")
  return tuple(sorted((step, m) for step, absent in missed.items() for m in absent))


def rejoins_from_trace(rows) -> tuple[tuple[int, int, int], ...]:
  """The ``rejoin_schedule`` that replays the replacements an elastic run healed.

  The leader's trace has one ``heal`` row per heal (``step``: the step whose state it sent;
  ``replicas``: the replacement's; ``source``: the replica whose inner optimizer state it
  sent). A ``resumed`` row (the run went on from its checkpoint of ``step``) is a heal too:
  that checkpoint holds the replicas left out of it (``replicas``) as their heal would set
  them (:meth:`~diloco_core.runtime.elastic_runtime.ElasticRuntime.checkpoint_state`); the heals the
  earlier life made from that step on are undone. With the drop schedule of
  :func:`schedule_from_trace`, an in-step run of the same config then follows the elastic run.

  Examples:
    >>> rejoins_from_trace([{"kind": "heal", "step": 12, "replicas": [2], "source": 0},
    ...                     {"kind": "settle", "sent_at": 12, "present": None}])
    ((12, 2, 0),)
    >>> rejoins_from_trace([{"kind": "heal", "step": 12, "replicas": [2], "source": 0},
    ...                     {"kind": "resumed", "step": 8, "replicas": [1], "source": 0}])
    ((8, 1, 0),)
  """
  rejoins: list[tuple[int, int, int]] = []
  for row in rows:
    if row.get("kind") == "resumed":
      rejoins = [r for r in rejoins if r[0] < row["step"]]
    if row.get("kind") in ("heal", "resumed"):
      rejoins += [(row["step"], m, row["source"]) for m in row["replicas"]]
  return tuple(sorted(rejoins))
