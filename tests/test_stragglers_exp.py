"""The ``stragglers`` experiment (issue 52): its configs (arms, paired seeds, equal total local
steps), its read-back on the stored file (shapes, the target rule, goodput from the tape), and
its claims with computed verdicts."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analysis import claims, experiments, stored, straggler_arms, stragglers
from diloco_core.runtime.tape_player import tape_for
from diloco_core.spec.tape import Sent

ARMS = {"sync", "sync+DyLU", "async naive", "async DN", "async DN+DyLU", "K=1", "K=1+grace", "K=4"}


def test_the_arms_are_the_issues_with_paired_seeds_and_equal_local_steps():
  base = experiments.base_config()
  arms = straggler_arms.straggler_arms(base)
  assert set(arms) == ARMS and arms["K=4"] == arms["sync"]
  runs = experiments.named_sweep("stragglers")
  distinct = {repr(c) for c in arms.values()}
  assert len(runs) == len(distinct) * straggler_arms.STRAGGLER_SEEDS == 7 * 8
  for cfg in arms.values():
    seeds = sorted(r.seed for r in runs if r.syncer == cfg.syncer)
    assert seeds == list(range(straggler_arms.STRAGGLER_SEEDS)) and seeds.__len__() >= 3
    assert (cfg.steps, cfg.algo.sync_every, cfg.algo.replicas, cfg.syncer.speeds) == (
        base.steps, base.algo.sync_every, 4, straggler_arms.SPEEDS)
    assert (cfg.inner_lr, cfg.algo.outer_lr, cfg.model) == (base.inner_lr, base.algo.outer_lr, base.model)
    tape = tape_for(cfg, cfg.syncer.syncer_config(4), straggler_arms.SPEEDS)
    sent = sum(e.step - prev for e, prev in _periods(tape))
    assert sent == 4 * cfg.steps, cfg.syncer  # the same total of local steps in every arm
  s = {name: cfg.syncer for name, cfg in arms.items()}
  assert s["async naive"].apply == "sequential" and s["async naive"].quorum == 1 and s["async naive"].late == "carry"
  assert s["async DN"].buffer == 4 and not s["async DN"].dylu and s["async DN+DyLU"].dylu and s["sync+DyLU"].dylu
  assert s["K=1"].apply == "merged" and s["K=1+grace"].grace == straggler_arms.grace_ticks(24) == 12


def _periods(tape):
  last = {}
  for e in tape:
    if isinstance(e, Sent):
      yield e, last.get(e.replica, 0)
      last[e.replica] = e.step


@pytest.fixture(scope="module")
def df():
  return stragglers.frame()


def test_the_stored_file_reads_back_with_the_target_rule(df):
  e = stored.load("stragglers")
  n = straggler_arms.STRAGGLER_SEEDS
  assert e.provenance["runs"] == len(e.runs) == 7 * n
  assert len(df) == 8 * n and set(df["arm"]) == ARMS
  sync = df[df["arm"] == "sync"]["final_eval_loss"]
  assert df["target"].iloc[0] == pytest.approx(stragglers.TARGET_FACTOR * sync.mean()) == stragglers.target_loss(df)
  for _, r in df.iterrows():
    ticks, losses = r["metrics"]["tick"], r["metrics"]["eval_loss"]
    assert ticks == sorted(ticks) and len(ticks) == len(losses)
    t = r["time_to_target"]
    assert math.isinf(t) or (t <= r["end_time"] and min(x for x in losses if x == x) <= r["target"])
  t = stragglers.summary(df)
  assert list(t.index) == ["sync", "sync+DyLU", "async naive", "async DN", "async DN+DyLU", "K=1", "K=1+grace"]
  assert t.loc["sync", "vs_sync"] is None and t.loc["K=1", "vs_sync"].n == n
  # goodput from the tape: synchronous waits for the slow replica (2 of the ideal 3.5 steps per fast
  # step); DyLU merges every local step too, in less time (all but its last lone round balanced)
  assert t.loc["sync", "goodput"] == pytest.approx(2 / 3.5)
  for arm in ("sync", "sync+DyLU"):
    assert t.loc[arm, "goodput"] == pytest.approx(4 * 1200 / t.loc[arm, "end_time"] / 3.5)
  assert 0.95 < t.loc["sync+DyLU", "goodput"] < 1 and t.loc["K=1", "goodput"] > t.loc["sync", "goodput"]
  # the budget's tail: synchronous has none; DyLU ends with one lone round of the slow replica
  assert t.loc["sync", "tail_rounds"] == 0 and t.loc["sync+DyLU", "tail_rounds"] == 1
  assert t.loc["sync", "full_loss"] == pytest.approx(t.loc["sync", "mean"], rel=1e-7)  # the file rounds its metrics
  c = stragglers.curves(df)
  assert set(c["arm"]) == ARMS and (c.groupby(["arm", "seed"]).size() > 1).all()


def test_the_claims_have_computed_verdicts(df):
  out = claims.evaluate_all({"stragglers": df}, stragglers.CLAIMS)
  assert out["claim"].tolist() == [9, 10, 11]
  assert set(out["verdict"]) <= {claims.AGREES, claims.DISAGREES, claims.NOT_RESOLVED}
  assert all(len(o.conditions) >= 1 for o in out["outcome"])
  v = out.set_index("claim")["verdict"]
  naive_failed = claims.did_not_train(df[df["arm"] == "async naive"]).all()
  assert not naive_failed or v[9] == claims.NOT_RESOLVED  # every naive run diverged: no measurement
  quorum = out.set_index("claim").loc[11, "outcome"].conditions
  assert quorum[0][2] == quorum[2][2] == claims.AGREES  # goodput up twice (exact, from the tapes)
  # quality is read before the budget's tail (the design's lone last contribution), not at the end
  assert all("before the tail" in c[0] and c[1].label.endswith("before the tail") for c in (quorum[1], quorum[3]))
  assert [c[0] for c in out.set_index("claim").loc[10, "outcome"].conditions][0].endswith("before the tail")
  # claim 11 quotes Decoupled DiLoCo's abstract: never resolved against the paper, the runs' reading said
  row = out.set_index("claim").loc[11]
  assert row["source"] == "abstract" and v[11] == claims.NOT_RESOLVED and "abstract only" in row["resolve"]
  assert (out.set_index("claim").loc[[9, 10], "source"] == "tables").all()


def _fake(losses):
  return pd.DataFrame([{"arm": a, "seed": s, "final_eval_loss": x, "data_vocab_size": 8}
                       for a, xs in losses.items() for s, x in enumerate(xs)])


def test_a_diverged_arm_or_reference_resolves_nothing():
  """A diverged run is never read as agreement: all of an arm's runs diverged leaves the claim
  not resolved; some did, the interval is over the other seeds."""
  worse = stragglers.CLAIMS[0].check(_fake({"sync": [1.0, 1.01, 0.99], "async naive": [30.0, np.nan, 40.0]}))
  assert worse.verdict == claims.NOT_RESOLVED and "outer learning rate" in worse.resolve
  some = stragglers.CLAIMS[0].check(_fake({"sync": [1.0, 1.01, 0.99, 1.0], "async naive": [30.0, 1.1, 1.12, 1.11]}))
  assert some.verdict == claims.AGREES and "1 of the async naive runs diverged" in some.conditions[0][0]
  assert some.conditions[0][1].n == 3  # the three seeds where both trained
  better = stragglers.CLAIMS[0].check(_fake({"sync": [1.0, 1.01, 0.99], "async naive": [0.9, 0.91, 0.89]}))
  assert better.verdict == claims.DISAGREES
  ref = stragglers.CLAIMS[0].check(_fake({"sync": [1.0, 9.0, 0.99], "async naive": [30.0, 31.0, 40.0]}))
  assert ref.verdict == claims.NOT_RESOLVED
