"""The ``stragglers`` experiment read back: the syncer's settings on a pool with one replica two
times slower, in loss, in simulated time and in goodput, and the papers' claims about them.

The experiment (:mod:`analysis.lab.straggler_arms`) plays every arm from its tape at equal total
local steps with paired seeds. :func:`frame` reads its stored runs and adds, per run, the
simulated time of each commit in **fast steps** (ticks over the fast replicas' step ticks),
its time to the **target loss** (:func:`target_loss`: :data:`TARGET_FACTOR` times the mean
final eval loss of ``sync``, computed from the stored file), and the arm's **goodput** from its
tape (:func:`tape_goodput`: local steps merged per fast step, over the ideal pool's Σ v_m / v_max).
:func:`summary` is one row per arm; :data:`CLAIMS` are three published findings tested with the
claims page's machinery (:mod:`analysis.lab.claims`: paired differences, 95% intervals).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from analysis.lab.arm_frames import arm_frame
from analysis.lab.claims import (AGREES, DISAGREES, NOT_RESOLVED, TOLERANCE, Claim, Outcome, Paired, combine,
                                 did_not_train, interval, no_worse, paired, positive)
from analysis.lab.straggler_arms import REFERENCE, SAME_AS, straggler_arms

#: The experiment's name (:data:`analysis.lab.experiments.SWEEPS`).
NAME = "stragglers"
#: The target loss: this factor times ``sync``'s mean final eval loss (1% above where it ends).
TARGET_FACTOR = 1.01
#: Close to synchronous, in claim 10: at most this many percent above ``sync``'s final loss.
CLOSE = 1.0


def tape_goodput(cfg) -> tuple[float, float]:
  """``(merged local steps per fast step, that over the ideal pool's)`` of ``cfg``'s tape: every
  committed contribution's inner steps over the last commit's tick, in the fast replicas' step
  time; the ideal pool never waits and merges Σ v_m / v_max steps per fast step."""
  from diloco_core.runtime.tape_player import speed_ticks, tape_for  # here: it imports JAX
  from diloco_core.spec.tape import Committed
  m, opts = cfg.algo.replicas, cfg.syncer
  speeds = opts.replica_speeds(m)
  tape = tape_for(cfg, opts.syncer_config(m), speeds, latency=opts.latency, transfer=opts.transfer)
  commits = [e for e in tape if isinstance(e, Committed)]
  merged = sum(c.inner_steps for e in commits for c in e.members)
  rate = merged / commits[-1].tick * min(speed_ticks(tuple(speeds)))
  return rate, rate / sum(v / max(speeds) for v in speeds)


def last_full_ticks(cfg) -> int:
  """The tick of the last commit of ``cfg``'s tape whose round holds a contribution of a fastest
  replica: after it, at equal total local steps, only slower replicas finish their share of the
  budget (in a merged round, one outer step on their contributions alone)."""
  from diloco_core.runtime.tape_player import tape_for  # here: it imports JAX
  from diloco_core.spec.tape import Committed
  m, opts = cfg.algo.replicas, cfg.syncer
  speeds = opts.replica_speeds(m)
  fast = {k for k, v in enumerate(speeds) if v == max(speeds)}
  tape = tape_for(cfg, opts.syncer_config(m), speeds, latency=opts.latency, transfer=opts.transfer)
  return max(e.tick for e in tape if isinstance(e, Committed) and any(c.replica in fast for c in e.members))


def loss_at(metrics, tick: int) -> float:
  """The eval loss of the commit at ``tick``.

  Examples:
    >>> loss_at({"tick": [24, 48], "eval_loss": [2.0, 1.0]}, 24)
    2.0
  """
  return float(metrics["eval_loss"][list(metrics["tick"]).index(tick)])


def target_loss(df: pd.DataFrame) -> float:
  """:data:`TARGET_FACTOR` times the mean over seeds of ``sync``'s final eval loss.

  Examples:
    >>> round(target_loss(pd.DataFrame({"arm": ["sync", "sync", "x"], "final_eval_loss": [1.0, 2.0, 9.0]})), 4)
    1.515
  """
  return TARGET_FACTOR * float(df.loc[df["arm"] == REFERENCE, "final_eval_loss"].mean())


def time_to(metrics, target: float, fast: int) -> float:
  """The simulated time (fast steps) of the first commit whose eval loss is at most ``target``
  (inf if none).

  Examples:
    >>> time_to({"tick": [24, 48, 72], "eval_loss": [2.0, 1.0, 0.9]}, 1.0, 2)
    24.0
  """
  for tick, loss in zip(metrics["tick"], metrics["eval_loss"]):
    if loss is not None and loss == loss and loss <= target:
      return tick / fast
  return float("inf")


def frame(realization: str | None = None) -> pd.DataFrame:
  """The stored runs by arm (:func:`~analysis.lab.arm_frames.arm_frame`) with ``goodput_steps``,
  ``goodput`` (:func:`tape_goodput`), ``end_time`` (the last commit, fast steps), ``target`` and
  ``time_to_target`` (fast steps; inf: not reached), ``full_loss`` (the eval loss at
  :func:`last_full_ticks`: before the budget's tail) and ``tail_rounds`` (the commits after it)."""
  from analysis.lab import experiments, stored  # here: they import the trainer's config
  from diloco_core.runtime.tape_player import speed_ticks
  e = stored.load(NAME, realization=realization)
  arms = straggler_arms(experiments.base_config(e.scale))
  df = arm_frame(e, arms)
  good = {name: tape_goodput(cfg) for name, cfg in arms.items()}
  fast = {name: min(speed_ticks(tuple(cfg.syncer.replica_speeds(cfg.algo.replicas)))) for name, cfg in arms.items()}
  target = target_loss(df)
  df["goodput_steps"] = [good[a][0] for a in df["arm"]]
  df["goodput"] = [good[a][1] for a in df["arm"]]
  df["end_time"] = [r["metrics"]["tick"][-1] / fast[r["arm"]] for _, r in df.iterrows()]
  df["target"] = target
  df["time_to_target"] = [time_to(r["metrics"], target, fast[r["arm"]]) for _, r in df.iterrows()]
  full = {name: last_full_ticks(cfg) for name, cfg in arms.items()}
  df["full_loss"] = [loss_at(r["metrics"], full[r["arm"]]) for _, r in df.iterrows()]
  df["tail_rounds"] = [sum(t > full[r["arm"]] for t in r["metrics"]["tick"]) for _, r in df.iterrows()]
  return df


def curves(df: pd.DataFrame) -> pd.DataFrame:
  """Eval loss against simulated time, long format: ``arm``, ``seed``, ``time`` (fast steps), ``eval_loss``."""
  rows = []
  for _, r in df.iterrows():
    scale = r["end_time"] / r["metrics"]["tick"][-1]
    rows += [{"arm": r["arm"], "seed": r["seed"], "time": t * scale, "eval_loss": x}
             for t, x in zip(r["metrics"]["tick"], r["metrics"]["eval_loss"])]
  return pd.DataFrame(rows)


def summary(df: pd.DataFrame) -> pd.DataFrame:
  """One row per arm (``K=4`` left out: it is ``sync``'s runs, :data:`~analysis.lab.straggler_arms.SAME_AS`).

  Returns:
    Indexed by arm, in the experiment's order: ``mean`` and ``sd`` of the final eval loss over
    seeds, ``seeds``, ``diverged`` (:func:`~analysis.lab.claims.did_not_train`), ``vs_sync``
    (the paired difference to ``sync`` in percent, :class:`~analysis.lab.claims.Paired`; None
    for ``sync``), ``reached`` (seeds that reached the target), ``time_to_target`` (mean over
    seeds, fast steps; inf unless every seed reached it), ``end_time``, ``goodput``, ``full_loss``
    (mean eval loss at the last commit a fast replica took part in), ``tail_rounds`` (commits after
    it) and ``full_vs_sync`` (``full_loss``'s paired difference to ``sync``).
  """
  failed = did_not_train(df)
  out = {}
  for arm in [a for a in dict.fromkeys(df["arm"]) if a not in SAME_AS]:
    sel = df[df["arm"] == arm]
    t = sel["time_to_target"].astype(float)
    out[arm] = {"mean": sel["final_eval_loss"].mean(), "sd": sel["final_eval_loss"].std(), "seeds": len(sel),
                "diverged": int(failed[sel.index].sum()),
                "vs_sync": None if arm == REFERENCE else paired(df, {arm: 1, REFERENCE: -1}, REFERENCE,
                                                                f"{arm} − {REFERENCE}"),
                "reached": int(np.isfinite(t).sum()), "time_to_target": float(t.mean()),
                "end_time": float(sel["end_time"].mean()), "goodput": float(sel["goodput"].iloc[0]),
                "full_loss": sel["full_loss"].mean(), "tail_rounds": int(sel["tail_rounds"].iloc[0]),
                "full_vs_sync": None if arm == REFERENCE else paired(df, {arm: 1, REFERENCE: -1}, REFERENCE,
                                                                     f"{arm} − {REFERENCE} before the tail", "full_loss")}
  return pd.DataFrame.from_dict(out, orient="index")


#: The loss the quality conditions of claims 10 and 11 compare: the eval loss at the last commit
#: a fast replica took part in (``full_loss``, before the budget's tail). Every arm spends the
#: same local steps, so an arm that waits less ends with its slow replica's share alone at the
#: end (the tail: one lone contribution's outer step), which the papers' runs do not have; the
#: final loss would measure that design, not the syncer.
QUALITY = "full_loss"


def _worse(df, arm: str, label: str, metric: str = "final_eval_loss"):
  """``arm`` − ``sync`` > 0, paired, over the seeds where both trained. A diverged run (loss ≥
  ln V or not finite) measures nothing and is never read as agreement (the claims page's rule):
  every run of ``arm`` diverged, or one of ``sync``, leaves the condition not resolved; some runs
  of ``arm`` did, the interval is over the other seeds and says how many were left out. The
  condition and its verdict."""
  failed = did_not_train(df)
  bad = sorted(df.loc[failed & (df["arm"] == arm), "seed"])
  sel = df[df["arm"].isin([arm, REFERENCE]) & ~df["seed"].isin(bad)] if len(bad) < (df["arm"] == arm).sum() else df
  when = " before the tail" if metric == QUALITY else ""
  p = paired(df if not bad else sel, {arm: 1, REFERENCE: -1}, REFERENCE, f"{arm} − {REFERENCE}{when}", metric)
  if bad and len(bad) == (df["arm"] == arm).sum():  # every run diverged: no paired value at all
    p = Paired(p.label, float("nan"), float("nan"), float("nan"), float("nan"), 0)
  if failed[df["arm"] == REFERENCE].any() or (bad and len(bad) == (df["arm"] == arm).sum()):
    verdict = NOT_RESOLVED
  else:
    verdict = positive(p)
  note = (f" [{len(bad)} of the {arm} runs diverged (loss ≥ ln V): not a result, left out of the interval]"
          if bad else "")
  return (label + note, dataclasses.replace(p, diverged=((arm, len(bad)),) if bad else p.diverged), verdict)


def _times(df, a: str, b: str) -> Paired:
  """Paired time to target, ``a`` − ``b`` in percent of ``b``'s, over the seeds where ``b``
  reached it (``a`` not reaching it on a seed: an infinite difference, so no interval)."""
  ta = df[df["arm"] == a].set_index("seed")["time_to_target"]
  tb = df[df["arm"] == b].set_index("seed")["time_to_target"]
  seeds = [s for s in tb.index if np.isfinite(tb[s])]
  if len(seeds) < 2 or not np.isfinite(ta[seeds]).all():
    return Paired(f"time to target {a} − {b}", np.nan, np.nan, np.nan, np.nan, len(seeds))
  mean, low, high, sd = interval(100.0 * (ta[seeds].to_numpy() - tb[seeds].to_numpy()) / tb[seeds].to_numpy())
  return Paired(f"time to target {a} − {b}", mean, low, high, sd, len(seeds))


def next_fastest(df, arm: str) -> str:
  """The arm ``arm`` is raced against: of the other arms (each config once), the one that reaches
  the target on the most seeds, then of least mean time over the seeds where it does.

  Examples:
    >>> inf = float("inf")
    >>> df = pd.DataFrame({"arm": ["a", "a", "b", "b", "c", "c"], "time_to_target": [5, inf, 9, 8, 1, inf]})
    >>> next_fastest(df, "a")  # c is faster where it gets there, b gets there on every seed
    'b'
  """
  others = df[~df["arm"].isin(list(SAME_AS) + [arm])].groupby("arm")["time_to_target"]
  reached = others.apply(lambda t: int(np.isfinite(t).sum()))
  mean = others.apply(lambda t: float(t[np.isfinite(t)].mean()) if np.isfinite(t).any() else np.inf)
  return min(reached.index, key=lambda a: (-reached[a], mean[a]))


def _first(df, arm: str):
  """``arm`` reaches the target before every other arm: against the next fastest
  (:func:`next_fastest`), paired. ``arm`` misses the target on every seed: disagrees; on some:
  not resolved (a mixed result)."""
  runner = next_fastest(df, arm)
  missed = int((~np.isfinite(df.loc[df["arm"] == arm, "time_to_target"])).sum())
  seeds = int((df["arm"] == arm).sum())
  p = _times(df, runner, arm)
  what = f"{arm} reaches the target loss before the next fastest arm ({runner})"
  if missed == seeds:
    return (f"{what} [it misses the target on every seed]", p, DISAGREES)
  if missed:
    return (f"{what} [it misses the target on {missed} of {seeds} seeds]", p, NOT_RESOLVED)
  if not np.isfinite(p.mean):  # every other arm misses it on some seed: no paired time to compare
    return (f"{what} [every other arm misses it on some seed]", p, NOT_RESOLVED)
  return (what, p, positive(p))


def _c9(df):
  c = _worse(df, "async naive", "naive asynchronous is worse than sync")
  return Outcome(c[2], (c,), "an outer learning rate at which naive asynchronous trains (a diverged run"
                 " measures nothing), then more seeds")


def _c10(df):
  dn = "async DN+DyLU"
  p = paired(df, {dn: 1, REFERENCE: -1}, REFERENCE, f"{dn} − {REFERENCE} before the tail", QUALITY)
  close = (f"Delayed Nesterov + DyLU is within {CLOSE:g}% of sync before the tail", p,
           no_worse(p, CLOSE) if not p.diverged else NOT_RESOLVED)
  first = _first(df, dn)
  return Outcome(combine([close[2], first[2]]), (close, first), "more seeds")


def _goodput(df, a: str, b: str):
  ga, gb = (float(df.loc[df["arm"] == x, "goodput"].iloc[0]) for x in (a, b))
  d = 100.0 * (ga - gb) / gb
  return (f"{a} has a higher goodput than {b} (from the tape: exact, no seeds)",
          Paired(f"goodput {a} − {b}", d, d, d, 0.0, 1), AGREES if ga > gb else DISAGREES)


def _c11(df):
  k1 = _worse(df, "K=1", "K = 1 loses quality against K = 4 before the tail", QUALITY)
  g = paired(df, {"K=1+grace": 1, "K=4": -1}, "K=4", "K=1+grace − K=4 before the tail", QUALITY)
  keep = (f"K = 1 + grace is within {TOLERANCE:g}% of K = 4 before the tail", g,
          no_worse(g, TOLERANCE) if not g.diverged else NOT_RESOLVED)
  conds = (_goodput(df, "K=1", "K=4"), k1, _goodput(df, "K=1+grace", "K=4"), keep)
  return Outcome(combine([c[2] for c in conds]), conds, "more seeds; a grace window that catches a straggler"
                 " whose lag varies (the tape's speeds are constant)")


#: The claims this experiment tests (numbers after :data:`analysis.lab.claims.CLAIMS`').
CLAIMS: tuple[Claim, ...] = (
    Claim(9, "Naive asynchronous Local-SGD (one outer Nesterov step per arriving contribution) is "
             "clearly worse than synchronous DiLoCo on heterogeneous replicas.",
          "Liu et al. 2024, arXiv 2401.09135 (Table 1)", "heterogeneous workers, outer Nesterov",
          "the naive asynchronous run has a clearly higher perplexity than the synchronous one",
          "async naive − sync, M = 4, one replica 2× slower, equal total local steps", _c9, experiment=NAME),
    Claim(10, "Delayed Nesterov with DyLU is close to synchronous DiLoCo in loss and reaches a target "
              "loss first in wall time.",
          "Liu et al. 2024, arXiv 2401.09135 (Table 1)", "heterogeneous workers",
          "about synchronous DiLoCo's perplexity, in less wall time",
          f"async DN+DyLU − sync before the budget's tail (≤ {CLOSE:g}%); time to {TARGET_FACTOR:g} × sync's final"
          " loss against the next fastest arm", _c10, experiment=NAME),
    Claim(11, "A quorum K = 1 keeps goodput but loses quality; a grace window keeps both.",
          "Decoupled DiLoCo, arXiv 2604.21428 (abstract)", "learners of unequal speeds",
          "K = M loses goodput, K = 1 quality; K = 1 with a grace window keeps both",
          "goodput from the tapes; K=1 and K=1+grace − K=4 (= sync) before the budget's tail", _c11, experiment=NAME,
          source="abstract"),
)
