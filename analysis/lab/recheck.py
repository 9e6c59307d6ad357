r"""The docs build's re-check of the stored experiments: exact on the CPU that stored them, two
measured checks on any other.

Every build trains a fixed sample of each stored experiment's runs again (:func:`verify_all`)
and compares it with the stored numbers. What can be promised depends on the CPU
(:func:`~analysis.lab.cpu_kind.cpu_fingerprint`):

* **The same kind of CPU** as a stored file of the experiment (the main file, or a second
  *realization* trained under another instruction set, :func:`analysis.lab.stored.realizations`):
  CPU runs are deterministic there, so every checked number and the whole eval-loss curve must
  equal the stored ones to :data:`RTOL` (``check`` = ``"exact"``).
* **Another kind of CPU**: XLA compiles kernels for other instruction sets that round
  differently, and a run of thousands of steps drifts to another realization of the same
  experiment. Two different things are checked instead (``check`` = ``"another CPU"``):

  1. *the code computes the same function*: the counts (bytes, tokens, parameters) are equal,
     and the logged train and eval losses of the first :data:`PREFIX_STEPS` steps, before the
     rounding differences have grown, agree to :data:`PREFIX_RTOL`;
  2. *the result is the same experiment*: the final eval loss moved by at most
     :data:`SPREAD_Z` standard deviations of the difference of two realizations,
     :math:`|\Delta| \le z\,\sqrt{2}\,\max(\sigma_E, \sigma_c)` (:func:`~analysis.lab.realizations.run_scales`), where
     :math:`\sigma_c` is the seed spread of the run's configuration (the standard deviation of the
     final loss over its seeds, made median-unbiased: two seeds and eight give one scale) and :math:`\sigma_E` the experiment's (:func:`~analysis.lab.realizations.seed_spread`: the
     median of :math:`\sigma_c` over its configurations). A configuration noisier than typical
     is judged by its own spread; the experiment's is the floor, since a spread of two seeds
     can be small by luck. An experiment with one seed per configuration has no spread to judge
     by: its final loss is reported, and only the counts and the prefix decide.

The sample (:func:`sample_indices`) is drawn from the runs of *stable* configurations
(:func:`~analysis.lab.realizations.stable_runs`): a configuration whose seeds spread by more than :data:`~analysis.lab.realizations.UNSTABLE` times
the experiment's typical spread sits in a corner where any rounding difference grows, and must
not decide whether the site builds.

The bounds are measured, not chosen: the experiments page computes them from the stored
``claims`` experiment and its second realization trained under ``--xla_cpu_max_isa=AVX2``
(:func:`~analysis.lab.realizations.realization_drift`).
"""

from __future__ import annotations

import concurrent.futures
import math
import multiprocessing
import os
import tempfile
from typing import Sequence

import pandas as pd

from analysis.lab import experiments
from analysis.lab import stored as store
from analysis.lab.cpu_kind import cap_in_effect, cpu_fingerprint
from analysis.lab.realizations import UNSTABLE  # noqa: F401  (re-exported: the re-check's bound)
from analysis.lab.realizations import rel
from analysis.lab.realizations import run_scales
from analysis.lab.realizations import seed_spread  # noqa: F401
from analysis.lab.realizations import stable_runs
from analysis.lab.sweeps import run_one
from diloco_core.spec.validity import check_int

#: Largest relative difference between a stored number and the same run trained again on the
#: kind of CPU that stored it (CPU runs are deterministic there: any drift is a change of the
#: trainer's numerics, which must be run and stored again).
RTOL = 1e-6
#: Runs of each experiment the docs build trains again: one each, the cheapest stable run, so
#: the build stays in CI's budget. ``python -m analysis experiments verify --sample K`` checks more.
SAMPLE = 1
#: Experiments that re-check another number of runs than :data:`SAMPLE` (none at present).
SAMPLE_SIZES: dict[str, int] = {}
#: The prefix of a run compared on another CPU: its logged losses at steps up to this one.
#: Measured (the experiments page): under another instruction set the train loss is still equal
#: or one float32 rounding apart at step 20, and within about 1e-5 at step 40 even in the
#: least stable runs; by step 100 the differences have grown to 1e-3 and beyond.
PREFIX_STEPS = 40
#: Relative tolerance of the prefix on another CPU (ten times the largest difference measured
#: at :data:`PREFIX_STEPS` between the two stored realizations of ``claims``; a changed learning
#: rate, optimizer or outer step moves these losses by far more).
PREFIX_RTOL = 1e-4
#: How many standard deviations of the difference of two realizations the final eval loss may
#: move on another CPU (see the module docstring). Under a normal law a stable run passes with
#: probability 0.99994.
SPREAD_Z = 4.0
#: Experiments whose sampled run the re-check trains only up to this step (its schedule still
#: that of the whole run, :func:`diloco_core.run.loop.train`'s ``until``), unless whole runs are
#: asked for: ``methods``' runs are 1,500 steps of the ``small`` preset, the longest sample of
#: the re-check (the experiments page computes what it would cost whole). Its logged losses and byte counters up to
#: here are compared: to :data:`RTOL` on the CPU kind that stored it, and on another CPU the byte
#: counters exactly and the losses up to :data:`PREFIX_STEPS` within :data:`PREFIX_RTOL` (its one
#: seed per configuration gives no spread: there the final loss decides nothing either).
PREFIX_ONLY: dict[str, int] = {"methods": 150}
#: The counts of a run, equal on every CPU.
COUNTS = ("total_bytes_per_replica", "peak_bytes_per_step", "tokens", "params")
#: The numbers of a run compared by the exact check (wall times are not reproducible).
CHECKED = ("final_eval_loss", "gap_to_floor") + COUNTS


def sample_indices(costs: Sequence[float], k: int = SAMPLE,
                   eligible: Sequence[bool] | None = None) -> list[int]:
  """``k`` run indices spread evenly over the eligible runs ordered by cost, cheapest first.

  ``costs`` are the stored runs' wall times: one run is the cheapest, two are the cheapest and
  the dearest, three add the median, and so on. The choice depends on the stored file only,
  so every build checks the same runs.

  Args:
    costs: one cost per run.
    k: how many runs.
    eligible: which runs may be drawn (default: all; :func:`~analysis.lab.realizations.stable_runs`).

  Examples:
    >>> sample_indices([5.0, 1.0, 9.0, 3.0], 1), sample_indices([5.0, 1.0, 9.0, 3.0], 2)
    ([1], [1, 2])
    >>> sample_indices([5.0, 1.0, 9.0, 3.0], 3), sample_indices([2.0], 2)
    ([1, 0, 2], [0])
    >>> sample_indices([5.0, 1.0, 9.0, 3.0], 1, eligible=[True, False, True, True])
    [3]
  """
  check_int("sample size", k, low=1)
  allowed = range(len(costs)) if eligible is None else [i for i, ok in enumerate(eligible) if ok]
  order = sorted(allowed, key=lambda i: (costs[i], i))
  if len(order) <= k:
    return order
  if k == 1:
    return order[:1]
  return [order[j] for j in sorted({round(i * (len(order) - 1) / (k - 1)) for i in range(k)})]


def prefix_diff(was: dict, now: dict, steps: int = PREFIX_STEPS, replica_step_tokens: int | None = None) -> float:
  """Largest relative difference of the logged train and eval losses at steps ``<= steps``.

  A row's step is its ``step``, except in a run played from a syncer tape (its rows carry
  ``tick``: one row per committed round, ``step`` the round's version), where it is the local
  steps per replica played by then, ``tokens / replica_step_tokens``.

  Args:
    was: stored metrics (column -> values, with ``step``).
    now: the same columns of the run trained again.
    steps: the last step compared.
    replica_step_tokens: a tape run's tokens of one local step of all M replicas
      (:math:`M \\cdot b \\cdot T`); None for a lock-step run.

  Examples:
    >>> was = {"step": [0, 20, 40, 60], "train_loss": [None, 2.0, 1.5, 1.2], "eval_loss": [3.0, None, 1.6, 1.3]}
    >>> now = {"step": [0, 20, 40, 60], "train_loss": [None, 2.0, 1.5003, 1.0], "eval_loss": [3.0, None, 1.6, 1.0]}
    >>> round(prefix_diff(was, now), 6)
    0.0002
    >>> tape = {"step": [0, 1, 2], "tick": [0, 24, 48], "tokens": [0, 96, 192], "eval_loss": [3.0, 2.0, 1.0]}
    >>> prefix_diff(tape, {**tape, "eval_loss": [3.0, 2.0, 1.1]}, steps=40, replica_step_tokens=4)  # rows at 0, 24 of 48
    0.0
  """
  if list(was.get("step", [])) != list(now.get("step", [])):
    return math.inf
  position = was["step"]
  if replica_step_tokens is not None and "tick" in was:
    position = [t / replica_step_tokens for t in was["tokens"]]
  worst = 0.0
  for col in ("train_loss", "eval_loss"):
    for step, a, b in zip(position, was.get(col, []), now.get(col, [])):
      if step <= steps:
        worst = max(worst, rel(a, b))
  return worst


def _replica_step_tokens(config: dict) -> int:
  """:math:`M \\cdot b \\cdot T` of a stored run's config (:func:`prefix_diff`)."""
  return int(config["algo"]["replicas"]) * int(config["batch_size"]) * int(config["seq_len"])


def same_kind(provenance: dict) -> bool:
  """Whether a stored file's runs were computed on this kind of CPU: the same fingerprint
  (:func:`~analysis.lab.cpu_kind.cpu_fingerprint`) *and* the same ``--xla_cpu_max_isa`` cap.

  An instruction-set cap that hides some of the host's sets is an emulation
  (:func:`~analysis.lab.cpu_kind.cap_in_effect`): XLA compiles for the older CPU, but a run
  capped at AVX2 on an AVX-512 machine is not bit for bit a run on a real AVX2 machine with the
  same fingerprint (measured on an AVX2 EPYC: runs of ``claims`` end in other realizations than
  the capped ones). A file stored under such a cap is exact only under the same emulation; on
  a real AVX2 machine a cap of AVX2 hides nothing and counts as none.

  Examples:
    >>> same_kind({"cpu": "another CPU; sse4_2", "max_isa": None})
    False
  """
  return provenance.get("cpu") == cpu_fingerprint() and provenance.get("max_isa") == cap_in_effect()


def same_cpu_file(name: str, scale: str = "cpu", path: str | os.PathLike | None = None):
  """The stored file of ``name`` computed on this kind of CPU (the main one or a realization,
  :func:`same_kind`), or None."""
  main = store.load(name, scale=scale, path=path)
  if same_kind(main.provenance):
    return main
  for realization in store.realizations(name, path=path):
    other = store.load(name, scale=scale, realization=realization, path=path)
    if same_kind(other.provenance):
      return other
  return None


def verify(name: str, *, k: int = SAMPLE, scale: str = "cpu", rtol: float = RTOL,
           path: str | os.PathLike | None = None, raise_on_error: bool = True,
           cache: str | os.PathLike | bool = False, whole: bool = False) -> pd.DataFrame:
  """Trains ``k`` runs of a stored experiment again and compares them with the stored numbers.

  The runs are :func:`sample_indices` of the stable runs (:func:`~analysis.lab.realizations.stable_runs`), by stored wall
  time, trained from scratch. On the kind of CPU of a stored file (:func:`same_cpu_file`) every
  :data:`CHECKED` number and the eval-loss curve must match it to ``rtol``; on another, the
  two checks of the module docstring apply (the counts and the prefix; the final loss within
  the seed spread).

  Args:
    name: the experiment.
    k: how many runs to re-train.
    scale: its scale.
    rtol: the exact check's relative tolerance.
    path: read this file instead of :func:`analysis.lab.stored.path_of` (tests).
    raise_on_error: raise :class:`~analysis.lab.stored.StoredResultError` on a failed check.
    cache: a sweep cache to share runs between experiments (``False``: train every run).
    whole: train the runs of a :data:`PREFIX_ONLY` experiment to their end too.

  Returns:
    One row per re-trained run: ``experiment``, ``index``, ``key``, ``against`` (the stored
    file compared), ``check`` (``"exact"`` or ``"another CPU"``), ``max_rel_diff`` (the
    largest relative difference of every checked number and the curve), ``worst`` (its
    field), ``prefix_rel_diff``, ``final_rel_diff``, ``spread_z`` (None without seeds), ``ok``,
    ``steps`` (the last step trained: the run's, or :data:`PREFIX_ONLY`'s).
  """
  main = store.load(name, scale=scale, path=path)
  ref = same_cpu_file(name, scale=scale, path=path)
  exact_ref = ref if ref is not None else main
  scales = run_scales(main.runs)
  configs = experiments.named_sweep(name, scale)
  costs = [float(r["row"].get("wall_time_s") or 0.0) for r in main.runs]
  out = []
  until = None if whole else PREFIX_ONLY.get(name)
  for i in sample_indices(costs, k, eligible=stable_runs(main.runs)):
    if until is not None and until < configs[i].steps:
      out.append(_verify_prefix(name, i, configs[i], main, exact_ref, ref is not None, until, rtol))
      continue
    summary, metrics, _ = run_one(configs[i], cache=cache)
    now_row = store.plain(summary)
    now_metrics = {c: store.plain(metrics[c].tolist()) for c in store.METRIC_COLUMNS if c in metrics.columns}
    stored_run = exact_ref.runs[i]
    diffs = {c: rel(stored_run["row"].get(c), now_row.get(c)) for c in CHECKED}
    was, now = stored_run["metrics"].get("eval_loss", []), now_metrics.get("eval_loss", [])
    diffs["eval_loss curve"] = (math.inf if len(was) != len(now)
                                else max((rel(a, b) for a, b in zip(was, now)), default=0.0))
    worst = max(diffs, key=diffs.get)
    first = main.runs[i]
    final = rel(first["row"].get("final_eval_loss"), now_row.get("final_eval_loss"))
    z = None
    if scales[i]:
      z = abs(float(now_row["final_eval_loss"]) - float(first["row"]["final_eval_loss"])) / (math.sqrt(2) * scales[i])
    row = {"experiment": name, "index": i, "key": first["key"], "against": exact_ref.path.name,
           "check": "exact", "max_rel_diff": diffs[worst], "worst": worst,
           "prefix_rel_diff": prefix_diff(first["metrics"], now_metrics, replica_step_tokens=_replica_step_tokens(first["config"])), "final_rel_diff": final,
           "spread_z": z, "ok": diffs[worst] <= rtol, "steps": configs[i].steps}
    if not row["ok"] and ref is None:
      counts_equal = all(rel(first["row"].get(c), now_row.get(c)) == 0.0 for c in COUNTS)
      row.update(check="another CPU", against=main.path.name,
                 ok=counts_equal and row["prefix_rel_diff"] <= PREFIX_RTOL and (z is None or z <= SPREAD_Z))
      if not counts_equal:
        row["worst"] = next(c for c in COUNTS if rel(first["row"].get(c), now_row.get(c)) != 0.0)
    out.append(row)
  report = pd.DataFrame(out)
  bad = report[~report["ok"]]
  if raise_on_error and len(bad):
    raise store.StoredResultError(failure(bad.iloc[0], rtol))
  return report


def _verify_prefix(name: str, i: int, cfg, main, exact_ref, same_cpu: bool, until: int, rtol: float) -> dict:
  """:func:`verify`'s row for run ``i`` trained up to step ``until`` only (:data:`PREFIX_ONLY`)."""
  _, metrics, _ = run_one(cfg, until=until)
  now = {c: store.plain(metrics[c].tolist()) for c in store.METRIC_COLUMNS if c in metrics.columns}
  first = main.runs[i]

  def upto(m: dict) -> dict:  # the logged columns at steps <= until
    return {c: [x for s, x in zip(m.get("step", []), v) if s <= until] for c, v in m.items()}

  was, now = upto(exact_ref.runs[i]["metrics"]), upto(now)
  diffs = {col: (math.inf if was["step"] != now["step"] or len(was.get(col, [])) != len(now.get(col, []))
                 else max((rel(a, b) for a, b in zip(was.get(col, []), now.get(col, []))), default=0.0))
           for col in ("train_loss", "eval_loss", "total_bytes_sent")}
  worst = max(diffs, key=diffs.get)
  truncated = upto(first["metrics"])
  row = {"experiment": name, "index": i, "key": first["key"], "against": exact_ref.path.name, "check": "exact",
         "max_rel_diff": diffs[worst], "worst": f"{worst} of the first {until} steps",
         "prefix_rel_diff": prefix_diff(truncated, now, replica_step_tokens=_replica_step_tokens(first["config"])),
         "final_rel_diff": None, "spread_z": None, "ok": diffs[worst] <= rtol, "steps": until}
  if not row["ok"] and not same_cpu:
    counts_equal = truncated.get("total_bytes_sent") == now.get("total_bytes_sent")
    row.update(check="another CPU", against=main.path.name, ok=counts_equal and row["prefix_rel_diff"] <= PREFIX_RTOL)
    if not counts_equal:
      row["worst"] = f"total_bytes_sent of the first {until} steps"
  return row


def failure(r, rtol: float = RTOL) -> str:
  """The one-line message of a failed check (a row of :func:`verify`'s report)."""
  head = f"stored experiment {r['experiment']!r}: run {r['index']} ({r['key']}) trained again"
  fix = (f"the trainer's numbers changed: run `python -m analysis experiments run {r['experiment']}`"
         " and commit the result.")
  if r["check"] == "exact":
    return (f"{head} differs from {r['against']} in {r['worst']} by {r['max_rel_diff']:.3g}"
            f" (relative; allowed {rtol:g} on the kind of CPU that stored it); {fix}")
  if r["worst"] in COUNTS:
    why = f"its {r['worst']} differs (counts are equal on every CPU)"
  elif r["prefix_rel_diff"] > PREFIX_RTOL:
    why = (f"its losses of the first {PREFIX_STEPS} steps differ by {r['prefix_rel_diff']:.3g}"
           f" (relative; allowed {PREFIX_RTOL:g} on another CPU)")
  else:
    why = (f"its final eval loss moved by {r['spread_z']:.2f} standard deviations of two"
           f" realizations (allowed {SPREAD_Z:g} on another CPU)")
  return f"{head} on another CPU than {r['against']}'s: {why}; {fix}"


def sample_size(name: str) -> int:
  """How many runs of ``name`` the docs build trains again (:data:`SAMPLE_SIZES`, else :data:`SAMPLE`)."""
  return SAMPLE_SIZES.get(name, SAMPLE)


def _verify_sample(args: tuple[str, int, str, bool]) -> pd.DataFrame:
  name, k, cache, whole = args
  return verify(name, k=k, cache=cache, whole=whole)


def _cost(name: str, whole: bool = False) -> float:
  """A stored experiment's seconds per run (its provenance), to hand out the longest first (a
  :data:`PREFIX_ONLY` one's share of its steps, unless ``whole``)."""
  main = store.load(name)
  p = main.provenance
  share = 1.0
  if not whole and name in PREFIX_ONLY:
    share = PREFIX_ONLY[name] / max(int(main.runs[0]["config"].get("steps", 1)), 1)
  return share * float(p.get("wall_time_s", 0.0)) / max(int(p.get("runs", 1)), 1)


def verify_all(names: Sequence[str] | None = None, *, workers: int = 1,
               k: int | None = None, whole: bool = False) -> pd.DataFrame:
  """:func:`verify` for every stored experiment (or ``names``), :func:`sample_size` runs each.

  A run sampled by two experiments (the same config) is trained once: the workers share a
  temporary sweep cache.

  Args:
    names: the experiments (default: every stored one).
    workers: processes that re-train at once (started with ``spawn``, so JAX starts afresh in
      each; the numbers do not depend on it). The longest experiments (stored seconds per run)
      are handed out first. A failed check raises as with one worker.
    k: runs per experiment (default :func:`sample_size`).
    whole: train the runs of a :data:`PREFIX_ONLY` experiment to their end too.

  Returns:
    :func:`verify`'s rows for every experiment, in the order of ``names``.
  """
  names = store.stored_names() if names is None else list(names)
  workers = check_int("workers", workers, low=1)
  with tempfile.TemporaryDirectory(prefix="recheck-") as cache:
    jobs = {n: (n, sample_size(n) if k is None else k, cache, whole) for n in names}
    if workers == 1 or len(names) < 2:
      return pd.concat([_verify_sample(jobs[n]) for n in names], ignore_index=True)
    order = sorted(names, key=lambda n: _cost(n, whole), reverse=True)
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(min(workers, len(names)), mp_context=ctx) as pool:
      done = dict(zip(order, pool.map(_verify_sample, [jobs[n] for n in order])))
  return pd.concat([done[n] for n in names], ignore_index=True)



def summary_line(report: pd.DataFrame) -> str:
  """One line for one experiment's rows of :func:`verify`: the runs, the check, the figures.

  Examples:
    >>> print(summary_line(pd.DataFrame([{"experiment": "h_m", "index": 8, "check": "exact",
    ...     "against": "h_m.json", "max_rel_diff": 0.0, "prefix_rel_diff": 0.0,
    ...     "final_rel_diff": 0.0, "spread_z": 0.0, "ok": True}])))
    h_m: run 8 trained again, exact against h_m.json: largest relative difference 0 (allowed 1e-06)
    >>> print(summary_line(pd.DataFrame([{"experiment": "methods", "index": 0, "check": "exact",
    ...     "against": "methods.json", "max_rel_diff": 0.0, "prefix_rel_diff": 0.0,
    ...     "final_rel_diff": None, "spread_z": None, "ok": True, "steps": 150}])))
    methods: run 0 trained again up to step 150 (PREFIX_ONLY), exact against methods.json: largest relative difference 0 (allowed 1e-06)
  """
  name = report["experiment"].iloc[0]
  runs = ", ".join(str(i) for i in report["index"])
  until = PREFIX_ONLY.get(name)
  partial = until is not None and "steps" in report and (report["steps"] == until).any()
  head = (f"{name}: run{'s' if len(report) > 1 else ''} {runs} trained again"
          + (f" up to step {until} (PREFIX_ONLY)" if partial else ""))
  parts = []
  for check, sub in report.groupby("check", sort=False):
    if check == "exact":
      parts.append(f"exact against {sub['against'].iloc[0]}: largest relative difference "
                   f"{sub['max_rel_diff'].max():.3g} (allowed {RTOL:g})")
    else:
      z = sub["spread_z"].dropna()
      spread = (f"final loss within {z.max():.2f} sd of two realizations (allowed {SPREAD_Z:g})"
                if len(z) else "no seed spread stored (final loss not judged)")
      parts.append(f"another CPU than {sub['against'].iloc[0]}'s: counts equal, first {PREFIX_STEPS}"
                   f" steps within {sub['prefix_rel_diff'].max():.3g} (allowed {PREFIX_RTOL:g}),"
                   f" {spread}" + ("" if partial else f"; final loss moved {sub['final_rel_diff'].max():.2%}"))
  return f"{head}, " + "; ".join(parts)
