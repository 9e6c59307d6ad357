"""The stability bound of an outer step one sync late: closed forms, and the optimizer itself."""

from __future__ import annotations

import numpy as np
import optax
import pytest

from analysis.lab import delay_stability as ds


@pytest.mark.parametrize("mu", [0.0, 0.5, 0.9, 0.95])
def test_the_bound_matches_the_closed_forms(mu):
  # No overlap: z^2 - (1 + mu)(1 - a) z + mu (1 - a), stable for a < 2 (1 + mu) / (1 + 2 mu).
  assert ds.stability_limit(mu, current=1.0) == pytest.approx(2 * (1 + mu) / (1 + 2 * mu), abs=1e-9)
  # One sync late: Jury's test on z^3 - (1 + mu) z^2 + (mu + a (1 + mu)) z - a mu leaves
  # a^2 mu^2 + a (1 - mu^2) < 1 - mu (a < 1 at mu = 0).
  q = 1 - mu ** 2
  late = (np.sqrt(q ** 2 + 4 * mu ** 2 * (1 - mu)) - q) / (2 * mu ** 2) if mu else 1.0
  assert ds.stability_limit(mu) == pytest.approx(late, abs=1e-9)


def test_eager_lies_between_delayed_and_none_and_is_none_at_one_replica():
  late, none = ds.stability_limit(0.9), ds.stability_limit(0.9, current=1.0)
  eager = [ds.stability_limit(0.9, ds.current_share("eager", m)) for m in (8, 4, 2)]
  assert late < eager[0] < eager[1] < eager[2] < none
  assert ds.stability_limit(0.9, ds.current_share("eager", 1)) == pytest.approx(none, abs=1e-9)
  with pytest.raises(ValueError, match="outer_overlap must be one of"):
    ds.current_share("async", 4)


def _run(mode, eta, mu, lam=1.0, syncs=600, replicas=4):
  """|x| after ``syncs`` outer steps of optax's Nesterov SGD on the quadratic model: pseudo-gradient
  lam * x of the inner phase started at x, applied at once (none), one sync late (delayed), or its
  own 1/M share now and the rest late (the mean of eager)."""
  opt = optax.sgd(eta, momentum=mu, nesterov=True)
  x, prev = np.float64(1.0), np.float64(0.0)  # Delta^(0) = 0: the first delayed sync applies nothing
  state = opt.init(x)
  c = ds.current_share(mode, replicas)
  for _ in range(syncs):
    g = lam * (c * x + (1 - c) * prev)  # prev: where the previous sync's inner phase started
    prev = x
    update, state = opt.update(g, state)
    x = optax.apply_updates(x, update)
    if abs(float(x)) > 1e6:  # grown: stop before float32 overflows
      break
  return abs(float(x))


@pytest.mark.parametrize("mode", ["none", "delayed", "eager"])
def test_the_optimizer_decays_below_the_bound_and_grows_above_it(mode):
  """The recurrence is the project's outer step (optax.sgd, nesterov): 20% either side of the bound
  (where the slowest root's modulus is about 0.98 and 1.02 one sync late)."""
  limit = ds.stability_limit(0.9, ds.current_share(mode, 4))
  assert _run(mode, 0.8 * limit, 0.9) < 1e-3
  assert _run(mode, 1.2 * limit, 0.9) > 1e3


def test_the_fastest_rate_one_sync_late():
  # mu = 0: z^2 - z + a, real roots (1 ± sqrt(1 - 4a)) / 2 below a = 1/4, modulus sqrt(a) above it:
  # the fastest decay is 1/2, at a = 1/4.
  a, rate = ds.fastest_rate(0.0)
  assert a == pytest.approx(0.25, abs=1e-3) and rate == pytest.approx(0.5, abs=1e-3)
  # with heavy momentum no outer LR beats about sqrt(mu) one sync late; without overlap a = 1 is exact
  assert ds.fastest_rate(0.9)[1] == pytest.approx(0.9 ** 0.5, abs=1e-3)
  assert ds.fastest_rate(0.9, current=1.0)[1] < 0.05
