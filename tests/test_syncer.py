"""The syncer rule of issue 52 (spec.syncer, spec.syncer_settings, spec.tape, algorithm.outer_apply),
pinned by hand-computed cases: exact rationals where the claim is exact, float32 bit for bit where
the operations are the trainer's, a stated tolerance where only rounding differs."""

from __future__ import annotations

import dataclasses
import functools
from fractions import Fraction

import drjax
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from diloco_core import DiLoCo, DiLoCoConfig
from diloco_core.algorithm.optimizers import outer_optimizer_factory
from diloco_core.algorithm.outer_apply import (apply_round, delayed_nesterov_init, delayed_nesterov_step,
                                               optax_step, radial_directional_mean, weighted_mean)
from diloco_core.algorithm.state import SendOperands
from diloco_core.spec.syncer import SyncerConfig, dylu_inner_steps, round_weights
from diloco_core.spec.syncer_settings import SYNCER_SETTINGS, syncer_preset
from diloco_core.spec.tape import Committed, Contribution, Dropped, Joined, Lost, Merged, Sent, simulate_tape

NESTEROV = functools.partial(delayed_nesterov_step, lr=1, beta=Fraction(9, 10))


# ---- (a) sequential Nesterov amplifies (Liu et al., Eq. 4-5) ----------------------------------------

def test_four_equal_contributions_in_turn_move_the_params_6_39_times_one_averaged_step():
  """m_k = 0.9 m_{k-1} + g, each step moves g + 0.9 m_k: 1.9, 2.71, 3.439, 4.0951; in all 12.1441 g
  against 1.9 g for one step on the mean of the four: 12.1441 / 1.9 = 6.3916 times as far."""
  theta, g = Fraction(0), Fraction(1)
  moves, state = [], delayed_nesterov_init(theta)
  for _ in range(4):
    new, state = NESTEROV(theta, state, g)
    moves.append(theta - new)
    theta = new
  assert moves == [Fraction(19, 10), Fraction(271, 100), Fraction(3439, 1000), Fraction(40951, 10000)]
  sequential, _ = apply_round(Fraction(0), delayed_nesterov_init(Fraction(0)), [g] * 4, NESTEROV, apply="sequential")
  merged, _ = apply_round(Fraction(0), delayed_nesterov_init(Fraction(0)), [g] * 4, NESTEROV,
                          weights=(Fraction(1, 4),) * 4)
  assert (sequential, merged) == (Fraction(-121441, 10000), Fraction(-19, 10))
  assert sequential / merged == Fraction(121441, 19000) and round(float(sequential / merged), 2) == 6.39


def test_delayed_nesterov_with_activation_spreads_the_momentum_by_hand():
  """N = 2, c = 1/2, β = 1/2, η = 1, four contributions of 1 from θ = 0: moves 1/2 (g/N, m = 0),
  then m = 1 and (1 - cN + c) β m + 1/2 = 3/4, then c β m + 1/2 = 3/4, then m = 3/2 and 7/8."""
  step = functools.partial(delayed_nesterov_step, lr=1, beta=Fraction(1, 2), buffer=2, activation=Fraction(1, 2))
  theta, state, path = Fraction(0), delayed_nesterov_init(Fraction(0)), []
  for _ in range(4):
    theta, state = step(theta, state, Fraction(1))
    path.append(theta)
  assert path == [Fraction(-1, 2), Fraction(-5, 4), Fraction(-2), Fraction(-23, 8)]
  assert state == (Fraction(3, 2), Fraction(0), 4)


# ---- (b) Delayed Nesterov, c = 0, N = M: one Nesterov step on the mean -------------------------------

def test_delayed_nesterov_over_m_contributions_is_one_nesterov_step_on_their_mean_exactly():
  contributions = [Fraction(3), Fraction(-1, 3), Fraction(7, 5), Fraction(2)]
  dn = functools.partial(delayed_nesterov_step, lr=Fraction(7, 10), beta=Fraction(9, 10), buffer=4)
  one = functools.partial(delayed_nesterov_step, lr=Fraction(7, 10), beta=Fraction(9, 10))
  a = b = (Fraction(5, 2), delayed_nesterov_init(Fraction(0)))
  for _ in range(3):  # three rounds: the momentum carried between them agrees too
    a = apply_round(*a, contributions, dn, apply="sequential")
    b = apply_round(*b, contributions, one, weights=(Fraction(1, 4),) * 4)
    assert a[0] == b[0] and a[1].momentum == b[1].momentum
    contributions = [c * Fraction(3, 2) for c in contributions]


def test_delayed_nesterov_over_m_contributions_matches_in_float32_to_1e_6():
  """The same in float32: the M steps of g_i / M round differently from one step on the mean. The
  worst of 200 seeds (3 rounds, |θ| up to 4) differed by 7.2e-7 (6 ulp): tolerance rtol = atol = 1e-6."""
  for seed in range(20):
    rng = np.random.default_rng(seed)
    theta = jnp.asarray(rng.normal(size=64).astype(np.float32))
    cs = [jnp.asarray(0.1 * rng.normal(size=64).astype(np.float32)) for _ in range(4)]
    dn = functools.partial(delayed_nesterov_step, lr=0.7, beta=0.9, buffer=4)
    one = functools.partial(delayed_nesterov_step, lr=0.7, beta=0.9)
    a = b = (theta, delayed_nesterov_init(theta))
    for _ in range(3):
      a = apply_round(*a, cs, dn, apply="sequential")
      b = apply_round(*b, cs, one)
      cs = [c * 1.3 for c in cs]
    np.testing.assert_allclose(np.asarray(a[0]), np.asarray(b[0]), rtol=1e-6, atol=1e-6)
    assert a[0].dtype == jnp.float32


# ---- (c) K = M, merged, uniform: the trainer's synchronous outer step bit for bit --------------------

def test_the_default_syncer_is_the_trainers_synchronous_outer_step_bit_for_bit():
  """Three syncs of a 3-replica DiLoCo (η = 0.7, μ = 0.9) on a two-leaf pytree, through the
  algorithm's own phases; the default syncer's round (every replica, in replica order) gives the
  same mean, global params and momentum, bit for bit."""
  cfg, m = DiLoCoConfig(replicas=3, sync_every=1, outer_lr=0.7, outer_momentum=0.9), 3
  syncer = SyncerConfig()
  syncer.check(m, 1)
  rounds = [e for e in simulate_tape(syncer, (1, 1, 2), 1, 9) if isinstance(e, Committed)]
  assert [[c.replica for c in r.members] for r in rounds] == [[0, 1, 2]] * 3
  assert round_weights(syncer, (1, 1, 1), (0, 0, 0)) is None and syncer.lock_step(m, 1)
  params = {"a": jnp.array([0.3, -1.2, 2.5]), "b": jnp.array([[0.1, 0.7], [-0.4, 1.9]])}
  algo = DiLoCo(lambda w, x: sum(jnp.sum(leaf ** 2) for leaf in jax.tree.leaves(w)), optax.sgd(0.1), cfg)
  hp, run = algo.hyperparams, drjax.program(diloco=m)
  g, o = jax.tree.leaves(params), jax.tree.leaves(algo.init(params).outer_state)
  mine = (g, delayed_nesterov_init(g))
  step = functools.partial(delayed_nesterov_step, lr=hp["outer_lr"], beta=hp["outer_momentum"])
  rng = np.random.default_rng(0)
  for _ in rounds:
    replicas = [x[None] + rng.normal(size=(m, *x.shape)).astype(np.float32) for x in g]
    ops = SendOperands(global_params=g, outer_state=o, replica_params=replicas, ef_residual=None, participation=None)
    sent, _ = run(lambda o: algo.pseudo_gradients("all", None, hp, o))(ops)
    mean = run(lambda s: algo.average(s, None))(sent)
    new = run(lambda o, s, d: algo.outer_step("all", None, hp, o, s, d, None))(ops, sent, mean)
    contributions = [[x[i] for x in sent] for i in range(m)]
    assert all(np.array_equal(a, b) for a, b in zip(weighted_mean(contributions), mean))
    mine = apply_round(*mine, contributions, step)
    g, o = new.global_params, new.outer_state
    assert all(np.array_equal(a, b) for a, b in zip(mine[0], g))
    assert all(np.array_equal(a, b) for a, b in zip(mine[1].momentum, jax.tree.leaves(o)))


def test_delayed_nesterov_with_n_1_is_optax_nesterov_and_optax_step_wraps_any_outer_optimizer():
  hp = {"outer_lr": 0.7, "outer_momentum": 0.9, "outer_beta2": 0.99}
  theta = jnp.array([1.0, -2.0, 0.5])
  grads = [jnp.array([0.3, 0.1, -0.7]), jnp.array([-0.2, 0.4, 0.05])]
  nesterov = outer_optimizer_factory("nesterov")(hp)
  a = apply_round(theta, nesterov.init(theta), grads, optax_step(nesterov), apply="sequential")
  b = apply_round(theta, delayed_nesterov_init(theta), grads, functools.partial(
      delayed_nesterov_step, lr=0.7, beta=0.9), apply="sequential")
  assert np.array_equal(a[0], b[0]) and np.array_equal(a[1][0].trace, b[1].momentum)


# ---- weights and the radial-directional mean ---------------------------------------------------------

def test_round_weights_by_hand():
  tokens = SyncerConfig(weights="tokens")
  # c_tok^2 / c_steps: 8^2 / 4 = 16 and 2^2 / 2 = 2, normalized: 8/9 and 1/9
  assert round_weights(tokens, inner_steps=(4, 2), staleness=(0, 0), tokens=(8, 2)) == (8 / 9, 1 / 9)
  stale = SyncerConfig(late="carry", weights="staleness", staleness_exponent=1.0)
  assert round_weights(stale, (2, 2), (0, 1)) == (2 / 3, 1 / 3)  # 1 and 1/2, normalized
  sequential = dataclasses.replace(stale, apply="sequential", staleness_exponent=0.5)
  assert round_weights(sequential, (2, 2), (0, 3)) == (1.0, 0.5)  # (1 + 3)^-1/2, not normalized
  assert dylu_inner_steps((1.0, 0.5, 0.3), 10) == (10, 5, 3)


def test_radial_directional_mean_and_weighted_merge_by_hand():
  three, four = jnp.array([3.0, 0.0]), jnp.array([0.0, 4.0])
  # norms 3 and 4 -> 3.5; directions (1, 0), (0, 1) -> their mean along (1, 1) / sqrt 2
  np.testing.assert_allclose(radial_directional_mean([three, four]), [3.5 / 2 ** 0.5] * 2, rtol=1e-6)
  # weights 3/4, 1/4: norm 13/4 along (3, 1) / sqrt 10
  np.testing.assert_allclose(radial_directional_mean([three, four], (0.75, 0.25)),
                             np.array([3.0, 1.0]) * 3.25 / 10 ** 0.5, rtol=1e-6)
  assert radial_directional_mean([three, -three]).tolist() == [0.0, 0.0]  # φ(0) = 0
  assert weighted_mean([three, four], (0.75, 0.25)).tolist() == [2.25, 1.0]
  theta, state = apply_round(jnp.zeros(2), delayed_nesterov_init(jnp.zeros(2)), [three, four],
                             functools.partial(delayed_nesterov_step, lr=1.0, beta=0.0), radial=True)
  np.testing.assert_allclose(theta, [-3.5 / 2 ** 0.5] * 2, rtol=1e-6)


# ---- (d) the tape ------------------------------------------------------------------------------------

C = Contribution


def test_tape_of_three_replicas_one_twice_as_slow_quorum_2_grace_1_carry():
  """H = 2, step times 1, 1, 2 ticks, link 1 tick each way, K = 2, G = 1, late contributions
  carried, 16 local steps in all. Round 1 closes at tick 3 + 1 = 4 without replica 2 (its
  contribution arrives at 5); it is carried into round 2 (staleness 1). In round 2 all three that
  can contribute are in at tick 8 (5, 8, 8), before the window of the second arrival ends (9): it
  closes at 8. Round 3 closes at 12 + 1 = 13 without replica 2 (it arrives at 14); then replicas 0
  and 1 have no period left, so round 4 holds everyone it can wait for (n = 1) and closes on arrival."""
  tape = simulate_tape(SyncerConfig(quorum=2, grace=1, late="carry"), (1, 1, 2), 2, 16, latency=1)
  assert tape == (
      Sent(2, 0, 2, 0), Sent(2, 1, 2, 0), Sent(4, 2, 2, 0),
      Committed(4, 1, (C(0, 2, 0, 2), C(1, 2, 0, 2))),
      Merged(5, 0, 2, 1, False), Merged(5, 1, 2, 1, False),
      Sent(7, 0, 4, 1), Sent(7, 1, 4, 1),
      Committed(8, 2, (C(2, 2, 0, 2), C(0, 4, 1, 2), C(1, 4, 1, 2))),
      Merged(9, 0, 4, 2, False), Merged(9, 1, 4, 2, False), Merged(9, 2, 2, 2, False),
      Sent(11, 0, 6, 2), Sent(11, 1, 6, 2), Sent(13, 2, 4, 2),
      Committed(13, 3, (C(0, 6, 2, 2), C(1, 6, 2, 2))),
      Committed(14, 4, (C(2, 4, 2, 2),)),
      Merged(14, 0, 6, 3, False), Merged(14, 1, 6, 3, False),
      Merged(15, 2, 4, 4, False))


def test_the_grace_window_decides_whether_the_slow_replica_is_dropped_or_a_member():
  drop = simulate_tape(SyncerConfig(quorum=2, grace=1), (1, 1, 2), 2, 12, latency=1)
  assert drop[3:8] == (Committed(4, 1, (C(0, 2, 0, 2), C(1, 2, 0, 2))), Dropped(5, 2, 2, 0, 1),
                       Merged(5, 0, 2, 1, False), Merged(5, 1, 2, 1, False), Merged(6, 2, 2, 1, True))
  assert [e for e in drop if isinstance(e, Dropped)] == [Dropped(5, 2, 2, 0, 1), Dropped(11, 2, 4, 1, 1)]
  wide = simulate_tape(SyncerConfig(quorum=2, grace=2), (1, 1, 2), 2, 12, latency=1)
  assert [(e.tick, [c.replica for c in e.members]) for e in wide if isinstance(e, Committed)] == [
      (5, [0, 1, 2]), (11, [0, 1, 2])]  # the K-th arrives at 3, replica 2 at 5 = 3 + G: a member


def test_tape_of_a_lost_replica_that_rejoins_the_elastic_drop_rule():
  """Two replicas, synchronous, H = 2, 12 steps. Replica 1 is lost at tick 3 (its period of steps
  3-4 is spent), round 2 is replica 0's alone; replica 1 rejoins at 5 from version 2 (healed)."""
  tape = simulate_tape(SyncerConfig(), (1, 1), 2, 12, losses=((3, 1),), joins=((5, 1),))
  assert tape == (
      Sent(2, 0, 2, 0), Sent(2, 1, 2, 0), Committed(2, 1, (C(0, 2, 0, 2), C(1, 2, 0, 2))),
      Merged(2, 0, 2, 1, False), Merged(2, 1, 2, 1, False), Lost(3, 1, 2),
      Sent(4, 0, 4, 1), Committed(4, 2, (C(0, 4, 1, 2),)), Merged(4, 0, 4, 2, False),
      Joined(5, 1, 2), Merged(5, 1, 2, 2, True),
      Sent(6, 0, 6, 2), Sent(7, 1, 4, 2), Committed(7, 3, (C(0, 6, 2, 2), C(1, 4, 2, 2))),
      Merged(7, 0, 6, 3, False), Merged(7, 1, 4, 3, False))


def test_the_tape_is_deterministic_and_sorted_by_tick_kind_replica():
  """Four replicas of step times 1, 2, 5, 1 ticks, K = 1, G = 1, carried up to staleness 1, a slow
  link, two losses and a join: the same tape twice, in (tick, kind, replica) order, within budget."""
  args = (SyncerConfig(quorum=1, grace=1, late="carry", max_staleness=1), (1, 2, 5, 1), 4, 200)
  more = dict(latency=2, transfer=3, losses=((17, 3), (60, 0)), joins=((40, 3),))
  first = simulate_tape(*args, **more)
  assert first == simulate_tape(*args, **more) and len(first) == 146
  assert list(first) == sorted(first, key=lambda e: (e.tick, e.KIND, e.replica))
  assert sum(max([e.step for e in first if isinstance(e, Sent) and e.replica == m] or [0]) for m in range(4)) <= 200
  assert {r.version - 1 - c.base for r in first if isinstance(r, Committed) for c in r.members} == {0, 1}
  assert min(e.staleness for e in first if isinstance(e, Dropped)) == 2  # past max_staleness
  assert first[11:13] == (Dropped(25, 2, 4, 0, 2), Committed(25, 3, (C(0, 8, 1, 4),)))


def test_the_settings_table_names_every_algorithm_and_each_preset_is_valid():
  names = [s.name for s in SYNCER_SETTINGS]
  assert {"synchronous DiLoCo", "Streaming DiLoCo", "elastic drop rule", "Decoupled DiLoCo"} <= set(names)
  for name in names:
    cfg = syncer_preset(name, replicas=4, quorum=2, grace=5, speeds=(1.0, 1.0, 0.5, 0.5))
    cfg.check(4, 8, fragments=2 if "Streaming" in name or "Decoupled" in name else 1)
  liu = syncer_preset("asynchronous Local-SGD, Delayed Nesterov + DyLU", replicas=4, speeds=(1.0, 1.0, 0.5, 0.25))
  assert (liu.quorum, liu.late, liu.apply, liu.buffer, liu.inner_steps_of(8, 4)) == (
      1, "carry", "sequential", 4, (8, 8, 4, 2))


# ---- (e) bad input: one line each, naming the option and what is allowed ---------------------------

def _check(**knobs):
  context = {k: knobs.pop(k) for k in ("fragments", "overlap", "reduction", "outer_optimizer", "outer_overlap")
             if k in knobs}
  return lambda: SyncerConfig(**knobs).check(3, 4, **context)


BAD = [
    (_check(quorum=4), "quorum (K=4) must be at most replicas (M=3): use K in 1..3, or None for every live replica."),
    (_check(quorum=0), "quorum (K) must be an integer >= 1 (None: every live replica), got 0."),
    (_check(quorum=2, grace=-1), "grace (G) must be an integer >= 0 (ticks; 0: none), got -1."),
    (_check(grace=2), "grace (G=2) waits after the K-th contribution for the others, and quorum K = M = 3 leaves"
     " none: pass quorum < 3 or drop grace."),
    (_check(speeds=(1.0, 0.0, 1.0)), "speeds (v_m) of replica 1 must be a finite number > 0, got 0.0."),
    (_check(speeds=(1.0, 1.0)), "speeds (v_m) must be a tuple of one value per replica (M=3), got (1.0, 1.0)."),
    (_check(inner_steps=(2, 0, 2)), "inner_steps (H_m) of replica 1 must be an integer >= 1, got 0."),
    (_check(inner_steps=(4, 4, 4), speeds=(1.0, 1.0, 1.0)),
     "inner_steps (H_m) and speeds (DyLU) both set the replicas' inner steps: pass one of them."),
    (_check(inner_steps=(4, 3, 4), fragments=2), "inner_steps (H_m=3 of replica 1) must be a multiple of"
     " fragments (P=2): every replica sends each fragment once per period."),
    (_check(inner_steps=(4, 2, 4), overlap=2), "overlap (τ=2) must be below every replica's inner steps"
     " (min H_m = 2): a fragment merges before it is sent again."),
    (_check(late="later"), "late must be one of ('drop', 'carry'), got 'later'."),
    (_check(max_staleness=2), "max_staleness (2) bounds carried contributions, and late='drop' carries none"
     " (every member has staleness 0): pass late='carry' or drop max_staleness."),
    (_check(late="carry", max_staleness=0),
     "max_staleness must be an integer >= 1 (0 is late='drop'; None: any), got 0."),
    (_check(apply="interleaved"), "apply must be one of ('merged', 'sequential'), got 'interleaved'."),
    (_check(apply="sequential", reduction="reduce-scatter"), "apply='sequential' takes one outer step per"
     " contribution, and reduction 'reduce-scatter' leaves no process holding them, only their re-quantized"
     " mean: use reduction 'all-gather' or apply='merged'."),
    (_check(buffer=0), "buffer (N) must be an integer >= 1, got 0."),
    (_check(buffer=2, activation=0.6), "activation (c) must be a finite number in [0, 0.5], got 0.6."),
    (_check(buffer=2, activation=-0.1), "activation (c) must be a finite number in [0, 0.5], got -0.1."),
    (_check(activation=0.5), "activation (c=0.5) shares the momentum over a buffer, and buffer (N=1) applies"
     " it whole at every step (c has no effect): pass buffer > 1 or drop activation."),
    (_check(buffer=2, outer_optimizer="adam"), "buffer (N=2) is Delayed Nesterov's, an outer Nesterov rule,"
     " and outer_optimizer='adam' is not Nesterov: pass outer_optimizer 'nesterov' or buffer 1."),
    (_check(weights="tokenz"), "weights must be one of ('uniform', 'tokens', 'staleness'), got 'tokenz'."),
    (_check(staleness_exponent=1.0), "staleness_exponent (a=1) discounts stale contributions, and"
     " weights='uniform' does not: pass weights='staleness' or drop staleness_exponent."),
    (_check(late="carry", weights="staleness", staleness_exponent=0.0),
     "staleness_exponent (a) must be a finite number > 0, got 0.0."),
    (_check(weights="staleness"), "weights='staleness' discounts stale contributions, and late='drop' admits"
     " none (every member has staleness 0): pass late='carry' or another weights."),
    (_check(weights="tokens", apply="sequential"), "weights='tokens' are shares of a merged mean, and"
     " apply='sequential' takes one step per contribution: use apply='merged', or weights 'uniform' or"
     " 'staleness'."),
    (_check(radial="yes"), "radial must be True or False, got 'yes'."),
    (_check(radial=True, apply="sequential"), "radial=True averages a round's contributions, and"
     " apply='sequential' averages none: use apply='merged' or drop radial."),
    (_check(quorum=2, outer_overlap="eager"), "outer_overlap='eager' applies each sync's average at the"
     " fragment's next sync, which needs every replica in every sync with the same H and merged apply:"
     " use the syncer's defaults or outer_overlap='none'."),
    (lambda: simulate_tape(SyncerConfig(), (), 2, 4), "step_ticks must be a non-empty tuple of ticks per inner"
     " step, one per replica, got ()."),
    (lambda: simulate_tape(SyncerConfig(), (1, 0), 2, 4), "step_ticks of replica 1 must be an integer >= 1, got 0."),
    (lambda: simulate_tape(SyncerConfig(), (1, 1), 2, 0), "total_steps must be an integer >= 1, got 0."),
    (lambda: simulate_tape(SyncerConfig(), (1, 1), 2, 4, latency=-1), "latency must be an integer >= 0, got -1."),
    (lambda: simulate_tape(SyncerConfig(), (1, 1), 2, 4, losses=(3,)), "losses must be (tick, replica) pairs, got 3."),
    (lambda: simulate_tape(SyncerConfig(), (1, 1), 2, 4, losses=((3, 2),)),
     "losses replica must be an integer in [0, 2), got 2."),
    (lambda: simulate_tape(SyncerConfig(), (1, 1), 2, 4, losses=((3, 1), (5, 1))),
     "losses: replica 1 is lost at tick 5 but was already lost: give it a join in between."),
    (lambda: simulate_tape(SyncerConfig(), (1, 1), 2, 4, joins=((3, 0),)),
     "joins: replica 0 joins at tick 3 but is not lost then: give it an earlier loss."),
    (lambda: simulate_tape(SyncerConfig(quorum=3), (1, 1), 2, 4),
     "quorum (K=3) must be at most replicas (M=2): use K in 1..2, or None for every live replica."),
    (lambda: syncer_preset("async", replicas=2), "syncer_preset name must be one of ('synchronous DiLoCo', 'Streaming DiLoCo',"
     " 'elastic drop rule', \"synchronous DiLoCo with DyLU's H_m\", 'asynchronous Local-SGD, naive',"
     " 'asynchronous Local-SGD, Delayed Nesterov', 'asynchronous Local-SGD, Delayed Nesterov + DyLU',"
     " 'Decoupled DiLoCo'), got 'async'."),
    (lambda: syncer_preset("Decoupled DiLoCo", replicas=3, quorum=2),
     "syncer_preset 'Decoupled DiLoCo' needs grace (G): pass them."),
    (lambda: weighted_mean([jnp.ones(1), jnp.ones(1)], (1.0,)), "weights must be one per contribution (2), got 1."),
    (lambda: apply_round(0.0, None, [1.0], NESTEROV, apply="mixed"),
     "apply must be one of ('merged', 'sequential'), got 'mixed'."),
    (lambda: apply_round(0.0, None, [1.0], NESTEROV, apply="sequential", radial=True),
     "radial=True averages a round's contributions, and apply='sequential' averages none: use apply='merged'"
     " or drop radial."),
]


@pytest.mark.parametrize("call, message", BAD, ids=[m[:40] for _, m in BAD])
def test_every_bad_input_is_one_line_naming_the_option(call, message):
  with pytest.raises(ValueError) as err:
    call()
  assert str(err.value) == message and "\n" not in message


def _commit_ticks(tape):
  return [e.tick for e in tape if isinstance(e, Committed)]


@pytest.mark.parametrize("grace", [0, 4, 8, 100])
def test_a_round_closes_once_everyone_it_can_wait_for_is_in_whatever_the_window(grace):
  """Speeds 1, 1, 1, 0.5 (step ticks 1, 1, 1, 2), H = 4, K = 3: the slow replica lags 4 ticks a
  round. A window of at least the lag catches it and, since everyone is then in, the round closes
  on its arrival: synchronous DiLoCo's rounds, 8/16/24/32, and never later (the tape used to wait
  the window out: 12/24/36/48 at G = 8). A shorter window leaves it out."""
  k3 = simulate_tape(SyncerConfig(quorum=3, grace=grace, late="carry"), (1, 1, 1, 2), 4, 64)
  sync = simulate_tape(SyncerConfig(), (1, 1, 1, 2), 4, 64)
  assert _commit_ticks(sync) == [8, 16, 24, 32]
  if grace >= 4:
    assert k3 == sync
  else:
    assert _commit_ticks(k3)[0] == 4 + grace and len(_commit_ticks(k3)) > len(_commit_ticks(sync))


def test_the_tape_and_the_processes_close_a_round_by_one_rule():
  """The tape commits at close_time; the real processes' decide() returns the members exactly
  from that time on, on every round of random tapes (arrival times read off the tape)."""
  from diloco_core.runtime.quorum import decide
  from diloco_core.spec.quorum_close import close_time
  rng = np.random.default_rng(0)
  checked = 0
  for _ in range(60):
    m = int(rng.integers(2, 5))
    ticks = tuple(int(t) for t in rng.integers(1, 4, size=m))
    k = int(rng.integers(1, m + 1))
    g = int(rng.integers(0, 6)) if k < m else 0  # a window needs K < M
    tape = simulate_tape(SyncerConfig(quorum=k, grace=g, late="carry"), ticks, 2, 12 * m, latency=1)
    sent = {}  # a contribution arrives one tick (latency) after it is sent
    for e in tape:
      if isinstance(e, Sent):
        sent[(e.replica, e.step)] = e.tick + 1
      if isinstance(e, Committed):
        arrivals = {c.replica: sent[(c.replica, c.step)] for c in e.members}
        live = tuple(arrivals)  # no loss: everyone expected of this round is a member or in flight
        if len(live) == m:  # the round waited for no one else: the processes' view is the same
          assert close_time(list(arrivals.values()), m, k, g) == e.tick
          assert decide(arrivals, live, min(k, m), g, e.tick) == tuple(sorted(live))
          assert decide(arrivals, live, min(k, m), g, e.tick - 0.5) is None
          checked += 1
  assert checked > 20
