"""Decoupled DiLoCo's published goodputs (analysis.planning.published_goodput): the numbers are
what the sources print, cited, and our model's values in their setting are pinned by hand."""

from __future__ import annotations

import dataclasses
import math

import pytest

from analysis.planning import published_goodput as pg
from analysis.planning.goodput import Failures

# One year of 365.25 days is 365.25 · 24 · 3600 = 31,557,600 s; over 1,200,000 chips the
# cluster fails every 31,557,600 / 1,200,000 = 26.298 s (Λ = 1 / 26.298 s).
MTBF_S = 26.298


def test_the_setting_is_fig_5():
  s = pg.SETTING
  assert (s.chips, s.mtbi_chip_years, s.where) == (1_200_000, 1.0, "Fig. 5, as readings of the paper quote it")
  assert (s.sync_every, s.fragments, s.overlap, s.quorum) == (24, 24, 2, 1)
  assert "5B" in s.workload and "1T tokens" in s.workload
  assert pg.cluster_mtbf_s() == pytest.approx(MTBF_S, abs=1e-9)


def test_the_published_numbers_are_the_sources_and_cited():
  got = {r.method: (r.learners, r.goodput, r.where, r.kind) for r in pg.PUBLISHED}
  assert got == {
      "data-parallel": (1, 0.27, "DeepMind's blog post on the paper, as news pages quote it", "restart"),
      "elastic data-parallel": (1, 0.58, "Fig. 5, as readings of the paper quote it", "elastic_dp"),
      "Decoupled DiLoCo, M = 8": (8, 0.88, "Fig. 5, as readings of the paper quote it", "learners"),
      "Decoupled DiLoCo, M = 16": (16, 0.93, "two readings of the paper (figure not located)", "learners"),
  }
  for row in pg.PUBLISHED:
    assert all(getattr(row, f.name) not in (None, "") for f in dataclasses.fields(row)), row
  assert pg.NOT_PUBLISHED and all(isinstance(x, str) and x for x in pg.NOT_PUBLISHED)
  with pytest.raises(ValueError, match="kind"):
    pg.PublishedGoodput("x", 1, 0.5, "Fig. 5", "guess")


def test_restart_is_dalys_formula_in_their_setting():
  # R = 0 and C = 1 / Λ: ΛC = 1, so C / E = ΛC / (e^{ΛC} - 1) = 1 / (e - 1) = 0.581977.
  f = Failures(0.0, restart_s=0.0, checkpoint_every_s=pg.cluster_mtbf_s())
  assert pg.model_goodput(pg.PUBLISHED[0], f) == pytest.approx(1 / (math.e - 1), abs=1e-12)
  # The defaults (R = 600 s, C = 3600 s) are many failures long: nothing is kept.
  assert pg.model_goodput(pg.PUBLISHED[0]) < 1e-60
  # 27% needs R = -ln(0.27) / Λ = 1.309333 · 26.298 = 34.4328 s at most (checkpoints continuous).
  assert pg.implied_s(pg.PUBLISHED[0]) == pytest.approx(34.4328, abs=1e-4)


def test_learners_are_the_elastic_formula_in_their_setting():
  m16 = pg.PUBLISHED[3]
  # A learner of 1.2M / 16 chips fails every 16 · 26.298 = 420.768 s. Per failure (K = 1, no
  # grace): w = H s / 2 = 12 s, v = H s / (2P) = 0.5 s, plus J.
  assert pg.model_goodput(m16, Failures(0.0, rejoin_s=0.0)) == pytest.approx(1 - 12.5 / 420.768, abs=1e-9)
  # The default J = 300 s: f = 312.5 / 420.768 = 0.742689.
  assert pg.model_goodput(m16) == pytest.approx(1 - 312.5 / 420.768, abs=1e-9)
  # M = 8: a failure every 210.384 s, cost 312.5 s: more than all of it.
  assert pg.model_goodput(pg.PUBLISHED[2]) == 0.0
  # 88% at M = 8 needs 0.12 · 8 · 26.298 = 25.2461 learner-seconds per failure.
  assert pg.implied_s(pg.PUBLISHED[2]) == pytest.approx(25.2461, abs=1e-4)


def test_elastic_dp_is_the_many_replicas_limit():
  # f = Λ g: g = 13.149 s is half a cluster MTBF.
  row = pg.PUBLISHED[1]
  assert pg.model_goodput(row, Failures(0.0, grace_s=MTBF_S / 2)) == pytest.approx(0.5, abs=1e-9)
  assert pg.implied_s(row) == pytest.approx(0.42 * MTBF_S, abs=1e-9)  # 11.0452 s


def test_the_learner_law_and_the_table():
  assert pg.scale_learners(0.88, 8, 16) == 0.94  # 1 - 0.12 · 8 / 16
  assert pg.scale_learners(0.88, 8, 1) == 0.04
  assert pg.scale_learners(0.5, 8, 1) == 0.0  # floored
  table = pg.comparison()
  assert list(table.columns) == ["setting", "method", "where", "published", "model", "difference", "implied_s", "implied"]
  assert list(table["published"]) == [r.goodput for r in pg.PUBLISHED]
  assert (table["difference"] == table["model"] - table["published"]).all()
  assert table["setting"].str.contains("1.2M chips").all()
