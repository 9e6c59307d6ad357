"""The figure of ``python -m diloco_core.compare``: eval loss vs step for DP, DiLoCo, Streaming."""

from __future__ import annotations


def loss_figure(results: dict, floor: float | None):
  """Eval loss of the global params vs step for each algorithm, with the entropy floor.

  Args:
    results: algorithm name -> :class:`~diloco_core.TrainResult` (its ``metrics`` rows).
    floor: the data's entropy floor (nats/token), or None.

  Returns:
    A matplotlib figure.
  """
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots(figsize=(6.4, 4.0))
  for name, r in results.items():
    m = r.metrics.dropna(subset=["eval_loss"])
    ax.plot(m["step"], m["eval_loss"], label=name, marker="o", ms=3)
  if floor is not None:
    ax.axhline(floor, color="k", ls="--", lw=1, label=f"entropy floor {floor:.3f}")
  ax.set_xlabel("inner step")
  ax.set_ylabel("eval loss (nats/token)")
  top = max(float(r.metrics["eval_loss"].dropna().iloc[1]) for r in results.values())
  ax.set_ylim(bottom=0.95 * (floor if floor is not None else 0.0), top=1.05 * top)
  ax.legend()
  ax.grid(alpha=0.3)
  fig.tight_layout()
  return fig
