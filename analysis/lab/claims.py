"""The papers' findings as tests: paired differences over seeds, 95% intervals, computed verdicts.

Each :class:`Claim` is one published finding (the paper, its setting, its number) and a test
on the stored ``claims`` experiment (:func:`analysis.lab.experiments.claims_arms`; claim 7: on
``overlap_eta``): every arm is trained with the same seeds, so each comparison is a **paired**
difference (arm b minus arm a, seed by seed, in percent of arm a's loss), summarised by its mean
and a 95% Student-t interval (:func:`paired`). A verdict is computed from the intervals, never typed in:

* a "costs nothing" finding (*b is no worse than a, within the paper's tolerance*)
  **agrees** when the whole interval lies below the tolerance, **disagrees** when the whole
  interval lies above it, and is **not resolved** otherwise;
* a "b is worse" (or better) finding agrees when the interval excludes zero on the paper's
  side and disagrees when it excludes zero on the other side.

A claim with several conditions agrees when all agree, disagrees when any disagrees, and is
not resolved otherwise; :func:`evaluate_all` returns one row per claim.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy import stats as _stats

from analysis.lab.arm_frames import arm_frame  # noqa: F401 (claims.arm_frame: the claims page's frame)

AGREES, DISAGREES, NOT_RESOLVED = "agrees", "disagrees", "not resolved"
#: A condition's verdict as the end of a sentence about its measured value.
VERDICT_WORDS = {AGREES: "which agrees", DISAGREES: "which disagrees", NOT_RESOLVED: "which does not resolve it"}
#: The confidence level of every interval on the claims page.
LEVEL = 0.95


@dataclasses.dataclass(frozen=True)
class Paired:
  """A paired difference over seeds, in percent (see :func:`paired`)."""

  label: str
  mean: float
  low: float
  high: float
  sd: float
  n: int
  diverged: tuple = ()  # (arm, runs that did not train) of the arms compared: no measurement

  def text(self) -> str:
    """``+0.12% [−0.05, +0.29]`` (mean and 95% interval), ``+72.41% (exact)`` for a value with no
    spread (computed, not sampled over seeds), or ``no paired value`` when there is none."""
    if not np.isfinite(self.mean) or self.low == self.mean == self.high:
      return f"{self.mean:+.2f}% (exact)" if np.isfinite(self.mean) else "no paired value"
    return f"{self.mean:+.2f}% [{self.low:+.2f}, {self.high:+.2f}]"


def did_not_train(df: pd.DataFrame) -> pd.Series:
  r"""Runs that diverged: a final loss that is not finite, or at least a uniform guess over
  the vocabulary, :math:`\ln V` (``vocab_size``, else the data's ``data_vocab_size``; a frame
  without either counts every finite loss as trained).

  Examples:
    >>> df = pd.DataFrame({"final_eval_loss": [0.9, 5.2, float("nan")], "data_vocab_size": [8, 8, 8]})
    >>> did_not_train(df).tolist()
    [False, True, True]
  """
  loss = df["final_eval_loss"].astype(float)
  vocab = None
  for column in ("vocab_size", "data_vocab_size"):
    if column in df:
      vocab = df[column] if vocab is None else vocab.fillna(df[column])
  over = loss >= np.log(vocab.astype(float)) if vocab is not None else False
  return ~np.isfinite(loss) | over


def interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float, float]:
  """Mean, lower and upper bound of the Student-t interval, and standard deviation.

  Examples:
    >>> [round(v, 4) for v in interval([1.0, 2.0, 3.0])]  # t(0.975, 2) = 4.3027
    [2.0, -0.4841, 4.4841, 1.0]
  """
  x = np.asarray(values, dtype=float)
  if x.size < 2:
    raise ValueError(f"a paired interval needs at least 2 seeds, got {x.size}.")
  mean, sd = float(x.mean()), float(x.std(ddof=1))
  half = float(_stats.t.ppf(0.5 + level / 2, x.size - 1)) * sd / np.sqrt(x.size)
  return mean, float(mean - half), float(mean + half), sd


def per_seed(df: pd.DataFrame, arm: str, metric: str = "final_eval_loss") -> pd.Series:
  """The metric of one arm, indexed by seed."""
  sel = df[df["arm"] == arm]
  if sel.empty:
    raise ValueError(f"no run of arm {arm!r}; arms: {sorted(df['arm'].unique())}.")
  return sel.set_index("seed")[metric].sort_index()


def paired(df: pd.DataFrame, weights: Mapping[str, float], base: str, label: str,
           metric: str = "final_eval_loss") -> Paired:
  """A paired linear combination of arms, per seed, in percent of arm ``base``.

  ``weights = {"b": 1, "a": -1}`` is the difference b − a; any combination whose weights sum
  to zero compares losses (e.g. claim 7's "eager recovers more than half the delay's cost").
  Only seeds present in every arm are used.

  Examples:
    >>> df = pd.DataFrame({"arm": ["a"] * 3 + ["b"] * 3, "seed": [0, 1, 2] * 2,
    ...                    "final_eval_loss": [2.0, 2.0, 2.0, 2.02, 2.04, 2.0]})
    >>> p = paired(df, {"b": 1, "a": -1}, base="a", label="b - a")
    >>> round(p.mean, 3), p.n
    (1.0, 3)
  """
  series = {arm: per_seed(df, arm, metric) for arm in set(weights) | {base}}
  seeds = sorted(set.intersection(*(set(s.index) for s in series.values())))
  combo = sum(w * series[arm].loc[seeds].to_numpy() for arm, w in weights.items())
  values = 100.0 * combo / series[base].loc[seeds].to_numpy()
  mean, low, high, sd = interval(values)
  failed = did_not_train(df)
  diverged = tuple((arm, int(failed[df["arm"] == arm].sum())) for arm in sorted(series)
                   if failed[df["arm"] == arm].any())
  return Paired(label, mean, low, high, sd, len(seeds), diverged)


def no_worse(p: Paired, tolerance: float) -> str:
  """Verdict of "b costs at most ``tolerance`` %": the whole interval below, above, or neither.

  Examples:
    >>> no_worse(Paired("x", 0.1, -0.2, 0.4, 0.3, 5), 0.5), no_worse(Paired("x", 1, 0.6, 1.4, 1, 5), 0.5)
    ('agrees', 'disagrees')
  """
  if p.high <= tolerance:
    return AGREES
  if p.low > tolerance:
    return DISAGREES
  return NOT_RESOLVED


def positive(p: Paired) -> str:
  """Verdict of "the combination is > 0" (b worse than a): agrees when the interval is above 0.

  Examples:
    >>> positive(Paired("x", 1, 0.2, 1.8, 1, 5)), positive(Paired("x", -1, -1.8, -0.2, 1, 5))
    ('agrees', 'disagrees')
  """
  if p.low > 0:
    return AGREES
  if p.high < 0:
    return DISAGREES
  return NOT_RESOLVED


def combine(verdicts: Sequence[str]) -> str:
  """All agree: agrees; any disagrees: disagrees; else not resolved.

  Examples:
    >>> combine([AGREES, AGREES]), combine([AGREES, NOT_RESOLVED]), combine([DISAGREES, NOT_RESOLVED])
    ('agrees', 'not resolved', 'disagrees')
  """
  if any(v == DISAGREES for v in verdicts):
    return DISAGREES
  if all(v == AGREES for v in verdicts):
    return AGREES
  return NOT_RESOLVED


@dataclasses.dataclass(frozen=True)
class Outcome:
  """What a claim's test found: its verdict and each condition with its interval."""

  verdict: str
  conditions: tuple  # of (description, Paired, verdict)
  resolve: str  # what would resolve it (shown when not resolved)


@dataclasses.dataclass(frozen=True)
class Claim:
  """One published finding and the test of it on the ``claims`` experiment."""

  number: int
  finding: str
  paper: str
  setting: str
  paper_result: str
  test: str
  check: Callable[[pd.DataFrame], Outcome]
  experiment: str = "claims"  # the stored experiment whose runs it tests
  source: str = "tables"  # paper_result from the paper's "tables", or its "abstract" only: never resolved


#: What a diverged run is, and what would resolve a condition over it (unless a claim says).
DIVERGED = ("a final loss at or above ln V", "a setting in which every arm trains (a diverged run measures nothing)")


def _outcome(conditions, resolve: str, diverged: tuple[str, str] = DIVERGED) -> Outcome:
  """A claim's outcome; a condition over an arm whose runs diverged (:func:`did_not_train`) is
  no measurement: it is not resolved, whatever its interval says, and says why (``diverged``)."""
  checked = []
  for description, p, verdict in conditions:
    if p.diverged:
      runs = ", ".join(f"{k} of the {arm} runs" for arm, k in p.diverged)
      description = f"{description} [not a result: {runs} diverged, {diverged[0]}]"
      verdict = NOT_RESOLVED
      resolve = diverged[1]
    checked.append((description, p, verdict))
  return Outcome(combine([v for _, _, v in checked]), tuple(checked), resolve)


#: Tolerance (percent of the loss) of the "costs nothing" findings 1-3 and of DiLoCo M = 1 vs DP.
TOLERANCE = 0.5
#: Findings 4: what "grows slowly" allows for four times fewer syncs (percent; this project's
#: reading of the papers' curves, where 4x larger H costs a few tenths of a percent to ~2%).
SLOW_GROWTH = 2.0


def _c1(df):
  p = paired(df, {"streaming": 1, "diloco": -1}, "diloco", "Streaming − DiLoCo")
  return _outcome([(f"Streaming (P fragments) costs ≤ {TOLERANCE}%", p, no_worse(p, TOLERANCE))],
                  "more seeds (the interval shrinks as 1/√n)")


def _c2(df):
  conds = []
  for arm in ("tau1", "tau5"):
    p = paired(df, {arm: 1, "streaming": -1}, "streaming", f"{arm.replace('tau', 'τ = ')} − τ = 0")
    conds.append((f"overlap {arm.replace('tau', 'τ = ')} costs ≤ {TOLERANCE}%", p, no_worse(p, TOLERANCE)))
  return _outcome(conds, "more seeds")


def _c3(df):
  p = paired(df, {"e3m0": 1, "diloco": -1}, "diloco", "E3M0 − float32")
  return _outcome([(f"4-bit E3M0 costs ≤ {TOLERANCE}%", p, no_worse(p, TOLERANCE))], "more seeds")


def loss_at_bytes(metrics: Mapping[str, Sequence], budget: float) -> float:
  """The last logged eval loss of a run whose cumulative bytes per replica were <= ``budget``.

  Examples:
    >>> loss_at_bytes({"eval_loss": [3.0, None, 2.0, 1.0], "total_bytes_sent": [0, 5, 10, 20]}, 15)
    2.0
  """
  best = None
  for loss, sent in zip(metrics["eval_loss"], metrics["total_bytes_sent"]):
    if sent <= budget and loss is not None and loss == loss:
      best = loss
  if best is None:
    raise ValueError(f"no eval row within {budget} bytes.")
  return float(best)


def _c4(df):
  p = paired(df, {"h48": 1, "h12": -1}, "h12", "H = 48 − H = 12")
  # Per byte: H = 6 evaluated when it had sent what H = 24 sent in the whole run.
  ref = df[df["arm"] == "diloco"].set_index("seed")
  rows = []
  for _, r in df[df["arm"] == "h6"].iterrows():
    rows.append({"arm": "h6 at equal bytes", "seed": r["seed"], "final_eval_loss": loss_at_bytes(
        r["metrics"], ref.loc[r["seed"], "total_bytes_per_replica"])})
  at_bytes = pd.concat([df, pd.DataFrame(rows)], ignore_index=True)
  q = paired(at_bytes, {"h6 at equal bytes": 1, "diloco": -1}, "diloco", "H = 6 at H = 24's bytes − H = 24")
  return _outcome([(f"4× larger H (12 → 48, 4× fewer bytes) costs < {SLOW_GROWTH}%", p, no_worse(p, SLOW_GROWTH)),
                   ("per byte, frequent sync is not better: H = 6, when it has sent H = 24's total bytes,"
                    " is behind H = 24", q, positive(q))],
                  "more seeds, or a longer run")


def _c5(df):
  m1 = paired(df, {"m1": 1, "dp": -1}, "dp", "M = 1 − DP")
  g21 = paired(df, {"m2": 1, "m1": -1}, "dp", "M = 2 − M = 1")
  g42 = paired(df, {"diloco": 1, "m2": -1}, "dp", "M = 4 − M = 2")
  return _outcome([
      (f"DiLoCo M = 1 is at most {TOLERANCE}% above DP", m1, no_worse(m1, TOLERANCE)),
      ("the penalty grows from M = 1 to M = 2", g21, positive(g21)),
      ("the penalty grows from M = 2 to M = 4", g42, positive(g42))], "more seeds")


def _c6(df):
  r = per_seed(df, "replica", "final_replica_eval_loss")
  g = per_seed(df, "replica", "final_eval_loss")
  mean, low, high, sd = interval(100.0 * (r.to_numpy() - g.to_numpy()) / g.to_numpy())
  p = Paired("one replica − global params", mean, low, high, sd, len(g))
  return _outcome([("the global params beat one replica", p, positive(p))], "more seeds")


def eta_arms(df: pd.DataFrame, grid: str) -> dict[float, str]:
  """The arms of an outer-LR grid, named ``{grid}{η}`` (``"eta_h12_"``: the claims experiment's
  at H = 12; :func:`~analysis.lab.experiments.overlap_grid`: a mode's in ``overlap_eta``): η -> arm."""
  sel = df[df["arm"].str.startswith(grid)]
  return {float(a[len(grid):]): a for a in sorted(sel["arm"].unique())}


def best_eta(df: pd.DataFrame, grid: str) -> float:
  """The η of grid ``grid`` (:func:`eta_arms`) with the lowest mean final loss over seeds.

  Examples:
    >>> df = pd.DataFrame({"arm": ["g_0.1", "g_0.1", "g_0.3", "g_0.3"], "seed": [0, 1, 0, 1],
    ...                    "final_eval_loss": [1.0, 1.2, 1.1, 1.0]})
    >>> best_eta(df, "g_")  # means 1.1 and 1.05
    0.3
  """
  arms = eta_arms(df, grid)
  means = {eta: per_seed(df, arm).mean() for eta, arm in arms.items()}
  return min(means, key=means.get)


def overlap_best(df: pd.DataFrame) -> dict[str, str]:
  """Each whole-outer-step overlap mode's arm at its own best η (:func:`best_eta` on its grid in
  the ``overlap_eta`` experiment, :func:`~analysis.lab.experiments.overlap_eta_arms`): mode -> arm."""
  from analysis.lab.experiments import OVERLAP_MODES, overlap_arm, overlap_grid  # here: it imports the trainer
  return {mode: overlap_arm(mode, best_eta(df, overlap_grid(mode))) for mode in OVERLAP_MODES}


#: Claim 7's reading of a diverged run: the instability of a one-sync-late momentum step.
DELAY_DIVERGED = ("a final loss at or above ln V: the instability expected of an outer step one sync late at a "
                  "large η·μ (analysis.lab.delay_stability), not a failed reproduction",
                  "a smaller η or μ for that mode (a step one sync late is stable only below a bound on η·λ)")


def _c7(df):
  a = overlap_best(df)
  name = {mode: f"{mode} η = {arm.rsplit('_', 1)[1]}" for mode, arm in a.items()}
  d = paired(df, {a["delayed"]: 1, a["none"]: -1}, a["none"], f"{name['delayed']} − {name['none']}")
  rec = paired(df, {a["delayed"]: 0.5, a["eager"]: -1, a["none"]: 0.5}, a["none"],
               f"({name['delayed']} − {name['eager']}) − ½({name['delayed']} − {name['none']})")
  return _outcome([("each mode at its own best η: the naive delayed outer gradient hurts", d, positive(d)),
                   ("eager recovers more than half of it", rec, positive(rec))], "more seeds", DELAY_DIVERGED)


def _c8(df):
  conds = []
  best = {}
  hs = sorted({int(a.split("_")[1][1:]) for a in df["arm"].unique() if a.startswith("eta_h")})
  for h in hs:
    arms = eta_arms(df, f"eta_h{h}_")
    b = best[h] = best_eta(df, f"eta_h{h}_")
    if 0.3 <= b <= 0.9:
      for eta in (min(arms), max(arms)):
        if eta < 0.3 or eta > 0.9:
          p = paired(df, {arms[eta]: 1, arms[b]: -1}, arms[b], f"H = {h}: η = {eta:g} − η = {b:g}")
          conds.append((f"at H = {h}, η = {b:g} (best) beats η = {eta:g} (outside 0.3–0.9)", p, positive(p)))
    else:
      inside = min((e for e in arms if 0.3 <= e <= 0.9), key=lambda e: per_seed(df, arms[e]).mean())
      p = paired(df, {arms[inside]: 1, arms[b]: -1}, arms[b], f"H = {h}: η = {inside:g} − η = {b:g}")
      conds.append((f"at H = {h}, the best η ({b:g}) is outside 0.3–0.9; the best inside ({inside:g}) "
                    "is worse", p, {AGREES: DISAGREES, DISAGREES: AGREES}.get(positive(p), NOT_RESOLVED)))
  lo, hi = hs[0], hs[-1]
  a_hi = eta_arms(df, f"eta_h{hi}_")
  p = paired(df, {a_hi[best[lo]]: 1, a_hi[best[hi]]: -1}, a_hi[best[hi]],
             f"H = {hi}: η = {best[lo]:g} − η = {best[hi]:g}")
  if best[hi] > best[lo]:
    grows = positive(p)
  elif best[hi] < best[lo]:
    grows = {AGREES: DISAGREES}.get(positive(p), NOT_RESOLVED)
  else:
    grows = NOT_RESOLVED
  conds.append((f"the best η grows with H (H = {lo}: {best[lo]:g}, H = {hi}: {best[hi]:g}); at "
                f"H = {hi} the larger is better", p, grows))
  return _outcome(conds, "a finer η grid and more seeds (the best grid point is uncertain "
                         "when neighbouring η differ by less than the noise)")


#: The papers' claims tested on the stored experiments, in the claims page's order.
CLAIMS: tuple[Claim, ...] = (
    Claim(1, "Streaming DiLoCo (P fragments, same H) reaches about vanilla DiLoCo's loss while it "
             "sends one fragment at a time (a peak per sync P times smaller for equal fragments).",
          "Streaming DiLoCo, arXiv 2501.18512", "up to 4B params, M = 2, H = 100, P up to 10",
          "evaluation losses within ~0.5% of DiLoCo's", "Streaming (P = 3, τ = 0) − DiLoCo, same H",
          _c1),
    Claim(2, "Overlapping the communication of a fragment with a few inner steps (τ ≤ 5, α = 0.5) "
             "costs almost nothing.",
          "Streaming DiLoCo, arXiv 2501.18512", "τ ∈ {1, 2, 5} inner steps of overlap, α = 0.5",
          "< 0.5% loss", "Streaming τ = 1 and τ = 5 (α = 0.5) − τ = 0", _c2),
    Claim(3, "Pseudo-gradients sent in 4 bits (E3M0) lose nothing against float32.",
          "Streaming DiLoCo, arXiv 2501.18512", "E3M0 (1 sign, 3 exponent bits), no error feedback",
          "no loss increase", "DiLoCo with E3M0 − float32 pseudo-gradients", _c3),
    Claim(4, "The loss grows only slowly with H; very frequent syncs buy little.",
          "DiLoCo, arXiv 2311.08105; scaling laws, arXiv 2503.09799", "H from 50 to 1000 (DiLoCo)",
          "a few tenths of a percent to ~2% for several times larger H",
          "DiLoCo H = 48 − H = 12; H = 6 at H = 24's bytes − H = 24", _c4),
    Claim(5, "At a fixed global batch the penalty grows with M; DiLoCo with M = 1 is at least as "
             "good as DP.",
          "scaling laws, arXiv 2503.09799 (Table 4)", "35M–2.4B params, H = 30, fixed global batch",
          "M = 1 slightly below DP at every size; M = 2 / 4 / 8: +0.7 / +2.0 / +3.9% at 35M",
          "DiLoCo M = 1, 2, 4 (global batch fixed) − DP", _c5),
    Claim(6, "Evaluating the outer (global) parameters beats evaluating one replica.",
          "DiLoCo, arXiv 2311.08105", "the averaged outer model vs the inner models",
          "the outer model has the lower loss", "replica 0 before the last merge − global params",
          _c6),
    Claim(7, "The naive delayed outer gradient (the whole outer step overlapped) hurts clearly; "
             "eager updates recover most of it.",
          "eager updates, arXiv 2502.12996 (Table 2)", "500M params, H = 30",
          "loss 2.67 (no overlap), 3.01 (delayed), 2.69 (eager)",
          "DiLoCo delayed and eager − no overlap, each at its own best outer LR (the overlap_eta "
          "experiment)", _c7, experiment="overlap_eta"),
    Claim(8, "The best outer learning rate lies in 0.3–0.9 and grows with H.",
          "MaxText's DiLoCo guide; scaling laws, arXiv 2503.09799", "Nesterov μ = 0.9",
          "η ∈ [0.3, 0.9], larger for larger H", "grid of η at H = 12 and H = 48", _c8),
)


def evaluate_all(frames: pd.DataFrame | Mapping[str, pd.DataFrame], claims: Sequence[Claim] = ()) -> pd.DataFrame:
  """One row per claim: number, finding, verdict, the conditions' text, what would resolve it,
  where the paper's figure comes from (``source``; one from an abstract is not resolved).

  Args:
    frames: the arms' runs (:func:`~analysis.lab.arm_frames.arm_frame`): one frame with every
      claim's arms, or a frame per stored experiment by name, each claim tested on its
      ``Claim.experiment``'s (a claim whose experiment is not given is left out).
    claims: more claims after :data:`CLAIMS` (e.g. :data:`analysis.lab.stragglers.CLAIMS`).
  """
  rows = []
  for c in CLAIMS + tuple(claims):
    df = frames if isinstance(frames, pd.DataFrame) else frames.get(c.experiment)
    if df is None:
      continue
    o = c.check(df)
    verdict, resolve = o.verdict, o.resolve
    if c.source != "tables":  # quoted from an abstract: the runs' reading stays in the conditions
      verdict, resolve = NOT_RESOLVED, f"the paper's own figures (quoted from its {c.source} only; the runs read '{o.verdict}')"
    rows.append({"claim": c.number, "finding": c.finding, "verdict": verdict,
                 "measured": "; ".join(f"{d}: {p.text()}, {VERDICT_WORDS[v]}" for d, p, v in o.conditions),
                 "outcome": o, "resolve": resolve, "source": c.source})
  return pd.DataFrame(rows)
