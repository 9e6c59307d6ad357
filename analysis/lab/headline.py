"""The site's one figure for what DiLoCo costs against DP, and its words.

The landing page, the quickstart, the tutorial and the claims page quote the same estimate
(:func:`diloco_cost`), computed from the stored claims experiment.
"""

from __future__ import annotations

import pandas as pd

from analysis.lab.claims import Paired, paired


def diloco_cost(df: pd.DataFrame) -> Paired:
  """The site's one figure for what DiLoCo costs: its final eval loss over DP's, paired by
  seed, in percent of DP's, with a 95% interval, in the claims experiment's reference setting
  (the arms ``diloco`` and ``dp`` of :func:`~analysis.lab.experiments.claims_arms`: the same
  model, data, replicas, batch and steps; :data:`~analysis.lab.experiments.CLAIM_STEPS`).

  Examples:
    >>> df = pd.DataFrame({"arm": ["dp"] * 3 + ["diloco"] * 3, "seed": [0, 1, 2] * 2,
    ...                    "final_eval_loss": [2.0, 2.0, 2.0, 2.02, 2.0, 2.01]})
    >>> p = diloco_cost(df)
    >>> round(p.mean, 2), p.n
    (0.5, 3)
  """
  return paired(df, {"diloco": 1, "dp": -1}, "dp", "DiLoCo − DP")


def cost_phrase(p: Paired) -> str:
  """``+0.32% (95% interval −0.09% to +0.72%, 8 paired seeds)``: a :class:`~analysis.lab.claims.Paired` in words.

  Examples:
    >>> cost_phrase(Paired("x", 0.315, -0.091, 0.7215, 0.5, 8))
    '+0.32% (95% interval -0.09% to +0.72%, 8 paired seeds)'
  """
  return f"{p.mean:+.2f}% (95% interval {p.low:+.2f}% to {p.high:+.2f}%, {p.n} paired seeds)"
