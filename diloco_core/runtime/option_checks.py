"""The runtimes' checks of a run's options alone, and the elastic heartbeat: no JAX, no device asked.

:meth:`TrainConfig.validate <diloco_core.TrainConfig.validate>` refuses here, in one line, the
options a runtime cannot carry whatever the devices: :func:`check_background` for
``communication="background"`` (:mod:`diloco_core.runtime.background_mesh` lays such a run out)
and :func:`check_elastic` for ``elastic`` (:mod:`diloco_core.runtime.elastic`), and
:func:`check_playable` for a run played from a syncer tape (:mod:`diloco_core.runtime.tape_player`). What the processes
and devices can hold is the pre-flight's part
(:func:`~diloco_core.runtime.background_mesh.check_background_processes`,
:func:`~diloco_core.runtime.elastic.check_elastic_processes`). Kept apart from those modules so
that the run's config and its flags (``python -m diloco_core.launch --help``) load without JAX.
"""

from __future__ import annotations

from diloco_core.spec import validity as v
from diloco_core.spec.syncer import SyncerConfig

#: Seconds without a heartbeat after which the coordination service declares a process of an
#: elastic run lost: the longest the others wait for a dead one at a sync.
HEARTBEAT_S = 10


def check_background(cfg) -> None:
  """One-line errors for options that cannot use ``communication="background"`` (no process or
  device is asked): DP, drops with reduce-scatter.

  Args:
    cfg: a :class:`~diloco_core.TrainConfig` with ``communication="background"``.

  Returns:
    None.

  Examples:
    >>> from diloco_core import TrainConfig, DiLoCoConfig
    >>> check_background(TrainConfig(communication="background", algo=DiLoCoConfig(algorithm="dp")))
    Traceback (most recent call last):
    ...
    ValueError: `communication` background needs algorithm diloco or streaming; dp all-reduces every step (use `communication` in-step).
  """
  if cfg.algo.algorithm == "dp":
    raise ValueError("`communication` background needs algorithm diloco or streaming; dp all-reduces"
                     " every step (use `communication` in-step).")
  if (cfg.drop_schedule or cfg.drop_prob) and cfg.algo.reduction == "reduce-scatter":
    raise ValueError("`communication` background simulates replica drops with `reduction` all-gather"
                     " only (the reduce-scatter's owners average every replica); use `reduction`"
                     " all-gather or `communication` in-step.")


def check_elastic(cfg) -> None:
  """One-line errors for ``elastic``, ``min_replicas`` and ``heal_wait``: the options alone (no
  process or device is asked; :func:`~diloco_core.runtime.elastic.check_elastic_processes` is the pre-flight's part).

  Args:
    cfg: a :class:`~diloco_core.TrainConfig`.

  Returns:
    None.

  Examples:
    >>> from diloco_core import TrainConfig
    >>> check_elastic(TrainConfig(elastic=True))
    Traceback (most recent call last):
    ...
    ValueError: `elastic` needs `communication` background (in-step runs every replica in one program: no process to lose); pass `communication` background.
  """
  v.check_bool("elastic", cfg.elastic)
  M, k = cfg.algo.replicas, cfg.min_replicas
  if not v.is_int(k) or not 1 <= k <= M:
    raise ValueError(f"`min_replicas` must be an integer in [1, replicas={M}], got {k!r}.")
  v.check_real("heal_wait", cfg.heal_wait, low=0.0)
  if not cfg.elastic:
    for name, value, default in (("min_replicas", k, 1), ("heal_wait", cfg.heal_wait, 0.0)):
      if value != default:
        raise ValueError(f"`{name}` applies to `elastic` runs only: add `elastic`, or drop `{name}`.")
    return
  if cfg.communication != "background":
    raise ValueError("`elastic` needs `communication` background (in-step runs every replica in one"
                     " program: no process to lose); pass `communication` background.")
  a = cfg.algo
  refused = [("eval_replicas", cfg.eval_replicas, cfg.eval_replicas, "a lost replica has no params to evaluate"),
             ("outer_overlap", a.outer_overlap, a.outer_overlap != "none", "as for simulated drops: only 'none'")]
  for name, value, bad, why in refused:
    if bad:
      shown = "" if isinstance(value, bool) else f" {value!r}"
      raise ValueError(f"`elastic` does not support `{name}`{shown} ({why}); drop `elastic` or `{name}`.")


def _refuse(name: str, value, allowed: str) -> None:
  raise ValueError(f"{name}={value!r} is not supported by the tape player yet (P = 1, τ = 0, float32"
                   f" whole-model sync): use {allowed}.")


def check_playable(cfg, syncer: SyncerConfig) -> None:
  """Raises a one-line ``ValueError`` naming the option for a run the tape player cannot play
  (:class:`~diloco_core.runtime.tape_player.TapePlay`), and :meth:`~diloco_core.spec.syncer.SyncerConfig.check`'s
  errors; before anything is compiled.

  Args:
    cfg: the run (a :class:`~diloco_core.run.config.TrainConfig`).
    syncer: the syncer's knobs.

  Examples:
    >>> from diloco_core.run.config import TrainConfig
    >>> from diloco_core.algorithm.config import DiLoCoConfig
    >>> check_playable(TrainConfig(algo=DiLoCoConfig(overlap=1)), SyncerConfig())
    Traceback (most recent call last):
    ...
    ValueError: `overlap`=1 is not supported by the tape player yet (P = 1, τ = 0, float32 whole-model sync): use 0.
  """
  a = cfg.algo
  for name, value, ok, allowed in (
      ("`algorithm`", a.algorithm, a.algorithm in ("diloco", "streaming"), "'diloco'"),
      ("`fragments`", a.fragments, a.fragments == 1, "1"),
      ("`overlap`", a.overlap, a.overlap == 0, "0"),
      ("`outer_overlap`", a.outer_overlap, a.outer_overlap == "none", "'none'"),
      ("`compression`", a.compression, a.compression == "none", "'none'"),
      ("`topk`", a.topk, a.topk is None, "None (no top-k)"),
      ("`error_feedback`", a.error_feedback, not a.error_feedback, "False"),
      ("`reduction`", a.reduction, a.reduction == "all-gather", "'all-gather'"),
      ("`communication`", cfg.communication, cfg.communication == "in-step", "'in-step'"),
      ("`mesh`", cfg.mesh, cfg.mesh is None, "None (one device)"),
      ("`drop_schedule`", cfg.drop_schedule, not cfg.drop_schedule, "() (a tape's losses instead)"),
      ("`drop_prob`", cfg.drop_prob, not cfg.drop_prob, "0"),
      ("`rejoin_schedule`", cfg.rejoin_schedule, not cfg.rejoin_schedule, "() (a tape's joins instead)"),
      ("`elastic`", cfg.elastic, not cfg.elastic, "False"),
      ("`checkpoint_every`", cfg.checkpoint_every, not cfg.checkpoint_every, "0"),
      ("`resume`", cfg.resume, not cfg.resume, "False"),
      ("`eval_replicas`", cfg.eval_replicas, not cfg.eval_replicas, "False")):
    if not ok:
      _refuse(name, value, allowed)
  syncer.check(a.replicas, a.sync_every, fragments=a.fragments, overlap=a.overlap, reduction=a.reduction,
               outer_optimizer=a.outer_optimizer, outer_overlap=a.outer_overlap)
