"""The ``overlap_eta`` experiment read back: each whole-outer-step overlap mode over the outer LR.

The experiment (:func:`analysis.lab.experiments.overlap_eta_arms`) trains ``none``, ``delayed``
and ``eager`` at several outer LRs η with the outer momentum μ = 0.9, and at one η with μ = 0.
:func:`summary` gives one row per arm: its final loss over the paired seeds, how many runs
diverged (:func:`analysis.lab.claims.did_not_train`), whether it is its mode's best η (claim 7's
choice, :func:`analysis.lab.claims.overlap_best`), and what the quadratic model of
:mod:`analysis.lab.delay_stability` predicts for it.
"""

from __future__ import annotations

import pandas as pd

from analysis.lab.arm_frames import arm_frame
from analysis.lab.claims import did_not_train, overlap_best
from analysis.lab.delay_stability import current_share, stability_limit

#: The experiment's name (:data:`analysis.lab.experiments.SWEEPS`).
NAME = "overlap_eta"


def frame(realization: str | None = None) -> pd.DataFrame:
  """The stored runs of the experiment by arm (:func:`~analysis.lab.arm_frames.arm_frame`), from
  its main file or a second realization."""
  from analysis.lab import experiments, stored  # here: they import the trainer's config
  e = stored.load(NAME, realization=realization)
  return arm_frame(e, experiments.overlap_eta_arms(e.scale))


def summary(df: pd.DataFrame) -> pd.DataFrame:
  """One row per arm, by mode, then μ (largest first), then η.

  Args:
    df: :func:`frame` (or any frame with ``arm``, ``seed``, ``outer_overlap``, ``outer_momentum``,
      ``outer_lr``, ``replicas`` and ``final_eval_loss``, the modes' grids named as
      :func:`~analysis.lab.experiments.overlap_arm`).

  Returns:
    Indexed by arm: ``mode``, ``mu``, ``eta``, ``mean`` and ``sd`` of the final eval loss over
    seeds, ``seeds``, ``diverged`` (runs that did not train), ``best`` (the mode's arm at its own
    best η with μ = 0.9, claim 7's), ``limit`` (the largest stable η·λ of the mode at that μ and
    M, :func:`~analysis.lab.delay_stability.stability_limit`) and ``predicted_stable``
    (η < ``limit``: stable even where the inner phase converges, λ = 1).

  Examples:
    >>> rows = [{"arm": f"{m}_eta_{e:g}", "seed": s, "outer_overlap": m, "outer_momentum": 0.9,
    ...          "outer_lr": e, "replicas": 4, "final_eval_loss": 1.0 + e * (m != "none") + s / 10}
    ...         for m in ("none", "delayed", "eager") for e in (0.1, 0.5) for s in (0, 1)]
    >>> t = summary(pd.DataFrame(rows))
    >>> t.loc[t["best"], "eta"].tolist(), bool(t.loc["delayed_eta_0.5", "predicted_stable"])
    ([0.1, 0.1, 0.1], False)
  """
  failed = did_not_train(df)
  g = df.assign(_failed=failed).groupby("arm")
  out = pd.DataFrame({
      "mode": g["outer_overlap"].first(), "mu": g["outer_momentum"].first().astype(float),
      "eta": g["outer_lr"].first().astype(float), "mean": g["final_eval_loss"].mean(),
      "sd": g["final_eval_loss"].std(), "seeds": g.size(), "diverged": g["_failed"].sum().astype(int)})
  out["best"] = out.index.isin(overlap_best(df).values())
  replicas = g["replicas"].first()
  out["limit"] = [stability_limit(mu, current_share(mode, int(replicas[arm])))
                  for arm, mode, mu in zip(out.index, out["mode"], out["mu"])]
  out["predicted_stable"] = out["eta"] < out["limit"]
  order = {"none": 0, "delayed": 1, "eager": 2}
  return out.sort_values(["mode", "mu", "eta"], key=lambda c: c.map(order) if c.name == "mode" else
                         (-c if c.name == "mu" else c))
