"""Elastic runs (``elastic``): a lost process does not stop the others.

A background run over several processes normally ends when one process dies (a collective
waits for it; the job resumes from its last checkpoint). With ``elastic``, each sync is an
agreement over the live processes (:mod:`diloco_core.runtime.membership`, through JAX's coordination
service, started with ``jax_enable_recoverability``): a process that dies or is cut off is
left out from the first sync that cannot include it, after at most the service's heartbeat
(:data:`~diloco_core.runtime.option_checks.HEARTBEAT_S`), and its replicas stop counting in the outer average: the average is
over the replicas present, the semantics of ``drop_schedule`` (docs/semantics.md). Every
``settle`` row of the trace says who took part, so
:func:`~diloco_core.run.drops.schedule_from_trace` replays the run as a drop schedule. Below
``min_replicas`` present, the run stops with one line naming the lost processes.

A lost replica produces no losses: its entries in ``metrics.jsonl`` are null from its loss on,
``train_loss`` is the mean over the replicas present, and the byte counters leave out what it
did not send (counted when its sync settles).

**A replacement** (the same command and ``process_id`` started again, e.g. by ``launch
--restart``) rejoins: it takes part in the agreements with nothing until the leader sends it
the state after a log row, and counts from the next sync on
(:mod:`diloco_core.runtime.elastic_runtime`, which states the inner-state policy). The leader's trace
records the heal, :func:`~diloco_core.run.drops.rejoins_from_trace` turns it into the
``rejoin_schedule`` that replays it in-step.

**Checkpoints** (``checkpoint_every``) are written by one process alone (process 0 while it is
there), from every replica's rows gathered through one agreement; the replicas missing from it
are written as their heal would set them, so ``resume`` starts every replica again and equals
the run replayed with them rejoining at the checkpoint
(:meth:`~diloco_core.runtime.elastic_runtime.ElasticRuntime.checkpoint_state`).

**Process 0** hosts JAX's coordination service: losing it ends the run (the others are stopped;
``resume`` goes on from the last checkpoint). With the service in a process of its own
(``launch --own-coordinator``, :mod:`diloco_core.launch.coordination_service`) any process may be
lost, process 0 included: the lowest process left writes the run's files from then on; losing
the service's process ends the run, to go on with ``resume``.

**Size.** The payloads (syncs, log rows, checkpoint rows, heals) cross peer to peer over the
data plane (:mod:`~diloco_core.runtime.data_plane`), in chunks; the coordination service carries
only the agreement's few bytes. The largest elastic run is bounded by memory, which the
pre-flight checks as for any run.

**Reduction.** With ``reduction="all-gather"`` each process receives every member's payload
(:math:`(K - 1) V` bytes for K members); with ``reduction="reduce-scatter"`` a sync is a
reduce-scatter over the members (:mod:`~diloco_core.runtime.plane_reduce`): at most :math:`2V`
per process whatever K, a member lost mid-sync retried without it.

Not yet (one-line refusals, :func:`~diloco_core.runtime.option_checks.check_elastic`): ``eval_replicas``,
``outer_overlap`` other than ``"none"`` (as for simulated drops), a ``quorum`` with
``reduction="reduce-scatter"``. A replacement for process 0 (``launch --restart`` starts the
others again only).
"""

from __future__ import annotations

import jax
import numpy as np

from diloco_core.runtime.option_checks import HEARTBEAT_S, check_elastic  # noqa: F401  (re-exported)



def check_elastic_processes(cfg, processes: int | None = None) -> None:
  """The one-line error for an ``elastic`` run over one process (before anything compiles).

  Args:
    cfg: a :class:`~diloco_core.TrainConfig` whose options :func:`~diloco_core.runtime.option_checks.check_elastic` accepted.
    processes: the process count (default: JAX's; the launcher passes its own).

  Returns:
    None.

  Examples:
    >>> from diloco_core import TrainConfig
    >>> check_elastic_processes(TrainConfig())  # not elastic: nothing to check
    >>> big = TrainConfig(model="base", n_layers=200, communication="background", elastic=True)
    >>> check_elastic_processes(big, processes=2)  # 170 M params: no size limit but memory
    >>> check_elastic_processes(big, processes=1)
    Traceback (most recent call last):
    ...
    ValueError: `elastic` needs several processes: start them with `python -m diloco_core.launch --processes N -- ... --elastic` (or one per host with --coordinator).
  """
  if not cfg.elastic:
    return
  processes = jax.process_count() if processes is None else processes
  if processes == 1:
    raise ValueError("`elastic` needs several processes: start them with `python -m diloco_core.launch"
                     " --processes N -- ... --elastic` (or one per host with --coordinator).")


def replica_means(step_losses: np.ndarray) -> np.ndarray:
  """Each replica's mean loss over the steps of a log row, ``[steps, M]`` -> ``[M]``; a lost
  replica's steps are NaN and left out (NaN when it has none).

  Examples:
    >>> replica_means(np.array([[1.0, 2.0], [3.0, np.nan]])).tolist()
    [2.0, 2.0]
    >>> replica_means(np.array([[1.0, np.nan]])).tolist()
    [1.0, nan]
  """
  means = step_losses.mean(axis=0)  # the exact means of the replicas with every step
  for m in np.flatnonzero(np.isnan(means)):
    column = step_losses[:, m][~np.isnan(step_losses[:, m])]
    means[m] = column.mean() if column.size else np.nan
  return means
