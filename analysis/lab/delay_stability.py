r"""Why an outer step one sync late is unstable at a large η·μ: a linear recurrence on a quadratic.

The model. On a quadratic loss, take one eigendirection and write :math:`x_k` for the outer
parameters' distance to the minimum along it after the :math:`k`-th outer step. An inner phase
started from :math:`x_k` returns the pseudo-gradient :math:`\Delta = \lambda x_k`, where
:math:`\lambda` is the share of the way to the minimum the :math:`H` inner steps cover
(:math:`\lambda = 1 - (1 - \gamma h)^H` for gradient descent with step :math:`\gamma` on curvature
:math:`h`; :math:`\lambda \to 1` in the directions the inner phase converges). The outer step is
Nesterov SGD as ``optax.sgd(η, μ, nesterov=True)``:

.. math::

   m_{k+1} = \mu m_k + g_k, \qquad x_{k+1} = x_k - \eta\,(g_k + \mu\, m_{k+1}),

with the outer gradient :math:`g_k = \lambda\,(c\,x_k + (1 - c)\,x_{k-1})`: :math:`c = 1` without
overlap (``none``), :math:`c = 0` for ``delayed`` (the average of the previous sync), and
:math:`c = 1/M` for the mean of the ``eager`` replicas (their own current share :math:`1/M`, the
others' :math:`(M-1)/M` one sync late; identical replicas on a quadratic). Eliminating
:math:`m` gives a linear recurrence whose characteristic polynomial, with :math:`a = \eta\lambda`,
is (:func:`characteristic_polynomial`)

.. math::

   p(z) = z\,(z - 1)(z - \mu) + a\,(c z + 1 - c)\,\big((1 + \mu) z - \mu\big).

It is stable when every root lies inside the unit circle (:func:`spectral_radius` < 1). Without
overlap that holds for :math:`0 < a < 2(1+\mu)/(1+2\mu)`; one sync late (:math:`c = 0`,
:math:`p = z^3 - (1+\mu) z^2 + (\mu + a(1+\mu)) z - a\mu`) Jury's test leaves
:math:`a^2\mu^2 + a(1 - \mu^2) < 1 - \mu`, a bound that falls from 1 at :math:`\mu = 0` towards 0 as
:math:`\mu \to 1`. :func:`stability_limit` finds the bound for any :math:`c` numerically.
"""

from __future__ import annotations

import numpy as np


def characteristic_polynomial(step: float, momentum: float, current: float = 0.0) -> np.ndarray:
  r"""The coefficients (highest power first) of :math:`p(z)` above.

  Args:
    step: :math:`a = \eta\lambda`, the outer LR times the share of the way the inner phase covers.
    momentum: the outer momentum :math:`\mu`.
    current: :math:`c`, the share of the outer gradient that is current (1: no overlap,
      0: ``delayed``, :math:`1/M`: the mean of ``eager``).

  Examples:
    >>> characteristic_polynomial(0.5, 0.0).tolist()  # z^3 - z^2 + 0.5 z: z(z^2 - z + 0.5)
    [1.0, -1.0, 0.5, 0.0]
  """
  loop = np.polymul(np.polymul([1.0, 0.0], [1.0, -1.0]), [1.0, -momentum])
  push = step * np.polymul([current, 1.0 - current], [1.0 + momentum, -momentum])
  return np.polyadd(loop, push)


def spectral_radius(step: float, momentum: float, current: float = 0.0) -> float:
  """The largest modulus of a root of :func:`characteristic_polynomial`: the recurrence decays
  below 1 and grows above it.

  Examples:
    >>> round(spectral_radius(0.5, 0.0), 4)  # z^2 - z + 0.5: |z|^2 = 0.5
    0.7071
  """
  return float(np.max(np.abs(np.roots(characteristic_polynomial(step, momentum, current)))))


def stability_limit(momentum: float, current: float = 0.0, *, largest: float = 4.0) -> float:
  r"""The smallest :math:`a = \eta\lambda > 0` at which the recurrence stops decaying (a root
  reaches the unit circle): the outer step is stable in every direction when :math:`\eta`
  times the largest :math:`\lambda` (about 1) stays below it.

  Args:
    momentum: the outer momentum :math:`\mu`, in [0, 1).
    current: the current share :math:`c` of the outer gradient (see
      :func:`characteristic_polynomial`).
    largest: search :math:`a` in (0, largest].

  Returns:
    The bound, to about 1e-12.

  Raises:
    ValueError: the recurrence is stable on the whole range.

  Examples:
    >>> round(stability_limit(0.9, current=1.0), 4)  # no overlap: 2(1 + μ) / (1 + 2μ)
    1.3571
    >>> round(stability_limit(0.0), 4), round(stability_limit(0.9), 4)  # one sync late
    (1.0, 0.2531)
    >>> round(stability_limit(0.9, current=1 / 4), 4)  # eager, M = 4
    0.416
  """
  grid = np.linspace(0.0, largest, 4001)[1:]
  unstable = [a for a in grid if spectral_radius(a, momentum, current) >= 1.0]
  if not unstable:
    raise ValueError(f"stable for every a in (0, {largest:g}] at momentum {momentum:g}, current {current:g}.")
  hi = unstable[0]
  lo = hi - grid[0]
  while hi - lo > 1e-12:
    mid = (lo + hi) / 2
    lo, hi = (lo, mid) if spectral_radius(mid, momentum, current) >= 1.0 else (mid, hi)
  return float(hi)


def current_share(mode: str, replicas: int) -> float:
  """The current share :math:`c` of the outer gradient of an ``--outer-overlap`` mode: 1 for
  ``none``, 0 for ``delayed``, :math:`1/M` for ``eager`` (see :func:`characteristic_polynomial`).

  Examples:
    >>> current_share("none", 4), current_share("delayed", 4), current_share("eager", 4)
    (1.0, 0.0, 0.25)
  """
  shares = {"none": 1.0, "delayed": 0.0, "eager": 1.0 / replicas}
  if mode not in shares:
    raise ValueError(f"outer_overlap must be one of {tuple(shares)}, got {mode!r}.")
  return shares[mode]


def fastest_rate(momentum: float, current: float = 0.0, *, points: int = 2000) -> tuple[float, float]:
  r"""The :math:`a = \eta\lambda` below :func:`stability_limit` at which the recurrence decays
  fastest, and that rate (its :func:`spectral_radius`): the most one outer step can shrink the
  distance to the minimum in a direction of this :math:`\lambda`, whatever the outer LR.

  Args:
    momentum: the outer momentum :math:`\mu`.
    current: the current share :math:`c` of the outer gradient.
    points: the grid over (0, limit) searched.

  Examples:
    >>> a, rate = fastest_rate(0.0, current=1.0)  # no overlap, no momentum: a = 1 lands on the minimum
    >>> round(a, 3), round(rate, 3)
    (1.0, 0.0)
  """
  grid = np.linspace(0.0, stability_limit(momentum, current), points + 1)[1:-1]
  radii = [spectral_radius(a, momentum, current) for a in grid]
  best = int(np.argmin(radii))
  return float(grid[best]), float(radii[best])
