"""Live sweeps: say how many runs a sweep will train and about how long, then train them.

A notebook with ``LIVE = True`` trains its sweep instead of reading the stored experiment.
:func:`live_sweep` first states the plan (:func:`plan_live`): how many runs the sweep holds,
how many are already in the sweep cache (they cost nothing), and an estimate of the time on
this backend *from a measurement*. A probe (:func:`probe`) trains the first run to be
trained for three sync periods of :math:`p = \\max(H, 10)` steps, logging after each, and
reads off its compile time :math:`c`, the time of one step :math:`s` (the second period: one
sync included, warm) and of one evaluation :math:`e` (the third period's excess). With
:math:`G` distinct compiled programs among the runs to train, run :math:`i` taking
:math:`S_i` steps of :math:`f_i` FLOPs each (:func:`diloco_core.spec.model_config.flops_per_token`,
the probe's :math:`f_0`) and evaluating every :math:`E_i` steps,

.. math:: \\hat T = G\\,c + \\sum_i \\Big( S_i\\, s\\, \\frac{f_i}{f_0}
          + \\big(\\lfloor S_i / E_i \\rfloor + 1\\big)\\, e \\Big)

(start-up and the probe itself are not in it). It then trains with a progress bar and ends
by printing the time it took beside the estimate. ``max_runs`` trains at most that many new
runs per call: they are cached, so calling again goes on where it stopped.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence

import pandas as pd

from analysis.lab.sweep_cache import cache_root
from analysis.lab.sweep_cache import is_cached
from analysis.lab.sweeps import program_groups
from analysis.lab.sweeps import run_sweep
from analysis.lab.sweeps import training_order
from analysis.lab.sweeps import with_values
from diloco_core.spec.model_config import flops_per_token
from diloco_core.spec.validity import check_int

#: Steps of the probe run (fewer when a run is shorter; at least H and the warmup plus one).
PROBE_STEPS = 20


@dataclasses.dataclass(frozen=True)
class Trained:
  """A live sweep trained to its end in this process (see :data:`TRAINED`).

  Attributes:
    desc: the sweep's label (``live_sweep``'s ``desc``).
    plan: its :class:`LivePlan`, the estimate included.
    took_s: the seconds its training took, measured as the estimate was (the probe excluded).
    frame: its rows.
  """

  desc: str
  plan: "LivePlan"
  took_s: float
  frame: pd.DataFrame


#: Every live sweep that trained to its end in this process, in order: what
#: ``benchmarks/notebooks.py`` stores for each notebook (the estimate beside the time it took).
TRAINED: list[Trained] = []


class LiveLimitReached(RuntimeError):
  """``max_runs`` new runs were trained and the sweep still has runs left (all cached)."""


@dataclasses.dataclass(frozen=True)
class Probe:
  """What a probe measured on this backend (see the module docstring).

  Attributes:
    compile_s: compile time of the run's program, c.
    step_s: time of one training step, s (a sync period's average).
    eval_s: time of one evaluation, e.
    step_flops: FLOPs of one step of the probed run, f_0.
  """

  compile_s: float
  step_s: float
  eval_s: float
  step_flops: float = 1.0


@dataclasses.dataclass(frozen=True)
class LivePlan:
  """What a live sweep will train, and the estimate of its time on this backend.

  Attributes:
    runs: runs in the sweep.
    cached: runs already in the sweep cache (read back, not trained).
    to_train: runs to train now (at most ``max_runs``).
    programs: distinct compiled programs among them (each compiles once), G.
    steps: their training steps, the sum of :math:`S_i f_i / f_0` (in the probe's steps).
    evals: their evaluations, the sum of :math:`\\lfloor S_i / E_i \\rfloor + 1`.
    flops: their training FLOPs.
    backend: where they train, e.g. ``"1 x cpu"``.
    probe: the probe's measurement (None without one).
  """

  runs: int
  cached: int
  to_train: int
  programs: int
  steps: float
  evals: int
  flops: float
  backend: str
  probe: Probe | None = None

  @property
  def estimate_s(self) -> float | None:
    """:math:`\\hat T` in seconds (None without a probe)."""
    if self.to_train == 0:
      return 0.0
    if self.probe is None:
      return None
    p = self.probe
    return self.programs * p.compile_s + self.steps * p.step_s + self.evals * p.eval_s

  def text(self) -> str:
    """One line for the user: the counts and the estimate with its basis.

    Examples:
      >>> probe = Probe(compile_s=30.0, step_s=0.05, eval_s=2.0)
      >>> print(LivePlan(runs=12, cached=4, to_train=8, programs=2, steps=8 * 3000.0, evals=8 * 31,
      ...                flops=3.6e14, backend="1 x TPU v5 lite", probe=probe).text())
      12 runs: 4 cached, 8 to train (2 programs) on 1 x TPU v5 lite; estimated 29.3 min (measured by a probe: compile 30 s, 50 ms a step, 2 s an evaluation)
    """
    head = (f"{self.runs} runs: {self.cached} cached, {self.to_train} to train"
            f" ({self.programs} program{'s' * (self.programs != 1)}) on {self.backend}")
    if self.to_train == 0:
      return f"{head}; nothing to train"
    if self.probe is None:
      return f"{head}; no estimate (no probe)"
    p = self.probe
    return (f"{head}; estimated {duration(self.estimate_s)} (measured by a probe: compile"
            f" {p.compile_s:.0f} s, {p.step_s * 1e3:.3g} ms a step, {p.eval_s:.3g} s an evaluation)")


def duration(seconds: float) -> str:
  """A duration as people say it.

  Examples:
    >>> duration(42), duration(420), duration(4200 * 3)
    ('42 s', '7.0 min', '3.5 h')
  """
  if seconds < 100:
    return f"{seconds:.0f} s"
  if seconds < 6000:
    return f"{seconds / 60:.1f} min"
  return f"{seconds / 3600:.1f} h"


def run_flops(cfg) -> float:
  """Training FLOPs of one run: steps × M·b·T tokens × FLOPs per token of its model.

  Examples:
    >>> from diloco_core.train import TrainConfig
    >>> from diloco_core.spec.model_config import get_preset
    >>> cfg = TrainConfig(model="tiny", steps=10, batch_size=2, seq_len=8)
    >>> run_flops(cfg) == 10 * cfg.algo.replicas * 2 * 8 * flops_per_token(cfg.model_config(), 8)
    True
  """
  tokens = cfg.steps * cfg.algo.replicas * cfg.batch_size * cfg.seq_len
  return tokens * flops_per_token(cfg.model_config(), cfg.seq_len)


def _backend() -> str:
  import jax
  devices = jax.devices()
  return f"{len(devices)} x {devices[0].device_kind}"


def step_flops(cfg) -> float:
  """FLOPs of one training step of a run, f: M·b·T tokens × FLOPs per token."""
  return run_flops(cfg) / cfg.steps


def probe(cfg) -> Probe:
  """Trains three sync periods of ``cfg`` and measures c, s and e (see the module docstring).

  Runs shorter than three periods are probed whole, with the evaluation counted as steps.
  """
  from diloco_core.train import train  # the trainer (JAX): only when a probe runs
  period = max(cfg.algo.sync_every, 10)
  steps = 3 * period if cfg.steps >= 3 * period else cfg.steps
  short = with_values(cfg, {"steps": steps, "warmup_steps": min(cfg.warmup, steps - 1),
                            "eval_every": steps, "log_every": period if steps > period else steps})
  result = train(dataclasses.replace(short, out=None, progress=False))
  compile_s = float(result.summary["compile_time_s"])
  wall = dict(zip(result.metrics["step"], result.metrics["wall_time_s"]))
  if steps == 3 * period:
    step_s = (wall[2 * period] - wall[period]) / period
    eval_s = max(wall[3 * period] - wall[2 * period] - step_s * period, 0.0)
  else:
    step_s, eval_s = (float(result.summary["wall_time_s"]) - compile_s) / steps, 0.0
  return Probe(compile_s=compile_s, step_s=step_s, eval_s=eval_s, step_flops=step_flops(short))


def runs_to_train(configs: Sequence, root) -> list[int]:
  """Indices of the runs not in the cache folder ``root``, in training order."""
  return [i for i in training_order(configs) if not is_cached(configs[i], root)]


def plan_live(configs: Sequence, *, cache=None, max_runs: int | None = None,
              measure: bool = True) -> LivePlan:
  """Counts what a sweep will train and estimates its time (see the module docstring).

  Args:
    configs: the sweep's TrainConfigs.
    cache: the sweep cache (default :func:`~analysis.lab.sweep_cache.cache_dir`); ``False``: none.
    max_runs: train at most this many new runs.
    measure: run the probe (a few steps of the first run to train) for the estimate.

  Returns:
    The :class:`LivePlan`.
  """
  configs = list(configs)
  left = runs_to_train(configs, cache_root(cache))
  train = [configs[i] for i in left[:max_runs]]
  measured = probe(train[0]) if measure and train else None
  f0 = measured.step_flops if measured else 1.0
  return LivePlan(runs=len(configs), cached=len(configs) - len(left), to_train=len(train),
                  programs=len(program_groups(train)) if train else 0,
                  steps=float(sum(c.steps * step_flops(c) / f0 for c in train)),
                  evals=sum(c.steps // c.eval_every + 1 for c in train),
                  flops=float(sum(run_flops(c) for c in train)), backend=_backend(), probe=measured)


def live_sweep(configs: Sequence, *, max_runs: int | None = None, cache=None,
               desc: str = "sweep", measure: bool = True, progress: bool = True) -> pd.DataFrame:
  """Trains a sweep in a notebook: states the plan, trains with a progress bar, reports the time.

  Args:
    configs: the sweep's TrainConfigs.
    max_runs: train at most this many new runs in this call (None: all). When runs remain,
      :class:`LiveLimitReached` says how many; they are cached, so calling again goes on.
    cache: the sweep cache (as :func:`~analysis.lab.sweeps.run_sweep`).
    desc: the progress bar's label.
    measure: probe the backend for the time estimate.
    progress: show the progress bar.

  Returns:
    One row per run, as :func:`~analysis.lab.sweeps.run_sweep`.

  Raises:
    LiveLimitReached: after training ``max_runs`` runs, when the sweep has more to train.
  """
  if max_runs is not None:
    check_int("max_runs (MAX_RUNS)", max_runs, low=0)
  configs = list(configs)
  plan = plan_live(configs, cache=cache, max_runs=max_runs, measure=measure)
  print(f"{desc}: {plan.text()}", flush=True)
  start = time.perf_counter()
  left = plan.runs - plan.cached
  if plan.to_train < left:
    todo = runs_to_train(configs, cache_root(cache))[:plan.to_train]
    run_sweep([configs[i] for i in todo], cache=cache, desc=desc, progress=progress)
    raise LiveLimitReached(
        f"{desc}: trained {plan.to_train} of the {left} runs left in {duration(time.perf_counter() - start)}"
        f" (max_runs / MAX_RUNS={max_runs}); {left - plan.to_train} remain: run the cell again to"
        " train the next ones (finished runs are cached) or raise MAX_RUNS.")
  df = run_sweep(configs, cache=cache, desc=desc, progress=progress)
  took = time.perf_counter() - start
  estimate = "" if plan.estimate_s is None else f" (estimated {duration(plan.estimate_s)})"
  print(f"{desc}: trained {plan.to_train} runs in {duration(took)}{estimate}", flush=True)
  TRAINED.append(Trained(desc=desc, plan=plan, took_s=took, frame=df))
  return df
