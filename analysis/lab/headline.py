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


def cost_scale(df: pd.DataFrame) -> dict:
  """The scale a :func:`diloco_cost` figure was measured at, from the same runs: the model's
  parameters and the data's vocabulary (one value each over the ``dp`` and ``diloco`` arms),
  the paired seeds and on how many of them DP ended lower.

  Examples:
    >>> df = pd.DataFrame({"arm": ["dp"] * 2 + ["diloco"] * 2, "seed": [0, 1] * 2, "params": [100] * 4,
    ...                    "data_vocab_size": [8] * 4, "final_eval_loss": [2.0, 2.0, 2.02, 1.99]})
    >>> cost_scale(df)
    {'params': 100, 'vocab': 8, 'seeds': 2, 'dp_lower': 1}
  """
  both = df[df["arm"].isin(["dp", "diloco"])]
  params, vocab = both["params"].unique(), both["data_vocab_size"].unique()
  if len(params) != 1 or len(vocab) != 1:
    raise ValueError(f"the dp and diloco arms differ in model or data: params {params}, vocabulary {vocab}.")
  loss = both.pivot_table(index="seed", columns="arm", values="final_eval_loss").dropna()
  return {"params": int(params[0]), "vocab": int(vocab[0]), "seeds": len(loss),
          "dp_lower": int((loss["dp"] < loss["diloco"]).sum())}


def scale_phrase(scale: dict) -> str:
  """Where a cost figure comes from, in words (:func:`cost_scale`'s dict).

  Examples:
    >>> scale_phrase({"params": 21152, "vocab": 8, "seeds": 8, "dp_lower": 7})
    'on a 21,152-parameter model and a synthetic language of 8 symbols (DP ended lower on 7 of the 8 seeds)'
  """
  return (f"on a {scale['params']:,}-parameter model and a synthetic language of {scale['vocab']} symbols"
          f" (DP ended lower on {scale['dp_lower']} of the {scale['seeds']} seeds)")

