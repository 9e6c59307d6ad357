"""Tests for diloco_core.data.sources: exact entropies, determinism, sharding (file data: test_grain_data.py)."""

import json
import math

import numpy as np
import pytest

from diloco_core.data import sources as data_module
from diloco_core.data.sources import DataConfig
from diloco_core.data.sources import MarkovSource
from diloco_core.data.sources import make_dataset


def _dense(src: MarkovSource) -> np.ndarray:
  """P[c, y] built directly from the source's tables (the definition of the source)."""
  p = np.zeros((src.vocab_size**src.order, src.vocab_size))
  rows = np.repeat(np.arange(p.shape[0]), src.next_tokens.shape[1])
  np.add.at(p, (rows, src.next_tokens.ravel()), src.probs.ravel())
  return p


def _checked_stationary(src: MarkovSource) -> np.ndarray:
  """The source's stationary distribution, after checking pi P = pi independently."""
  v, pi = src.vocab_size, src.stationary
  p = _dense(src)
  nxt = np.zeros_like(pi)
  succ = (np.arange(pi.size)[:, None] % (pi.size // v)) * v + np.arange(v)[None, :]
  np.add.at(nxt, succ.ravel(), (pi[:, None] * p).ravel())
  assert pi.min() >= 0 and math.isclose(pi.sum(), 1.0, abs_tol=1e-12)
  assert np.abs(nxt - pi).sum() < 1e-10
  return pi


def _neg_log_probs(src: MarkovSource, x: np.ndarray) -> np.ndarray:
  """-log P(x_j | x_<j) of sequences x [N, L] at every position j, for an order-2 source.

  Positions 0 and 1 use the marginals of the stationary start distribution.
  """
  assert src.order == 2
  v = src.vocab_size
  pi = _checked_stationary(src).reshape(v, v)
  p = _dense(src)
  out = np.empty(x.shape)
  out[:, 0] = -np.log(pi.sum(1)[x[:, 0]])
  out[:, 1] = -np.log(pi[x[:, 0], x[:, 1]] / pi.sum(1)[x[:, 0]])
  ctx = x[:, :-2].astype(np.int64) * v + x[:, 1:-1]
  out[:, 2:] = -np.log(p[ctx, x[:, 2:]])
  return out


def _assert_within_3se(per_sequence: np.ndarray, exact: float) -> float:
  mean = per_sequence.mean()
  se = per_sequence.std(ddof=1) / math.sqrt(per_sequence.size)
  assert se < 0.01, se  # the check must be sharp to mean anything
  assert abs(mean - exact) < 3 * se, (mean, exact, se)
  return mean


# ----------------------------------------------------------------------------- 1. exactness


def test_entropy_rate_matches_monte_carlo():
  ds = make_dataset(DataConfig(seed=3), replicas=4, batch_size=16, seq_len=128)
  (src,) = ds.sources
  x = np.concatenate([ds.train_batch(s).reshape(-1, 129) for s in range(25)])
  assert x.size >= 200_000
  nll = _neg_log_probs(src, x)[:, src.order:]  # positions j >= k: the entropy rate
  _assert_within_3se(nll.mean(1), src.entropy_rate)
  assert ds.entropy_rate == src.entropy_rate
  assert 0 < src.entropy_rate < math.log(4)


def test_iid_loss_floor_matches_monte_carlo():
  seq_len = 4  # short, so the start positions (j < k) weigh in the floor
  ds = make_dataset(DataConfig(eval_sequences=6000, concentration=0.3, seed=1), replicas=1,
                    batch_size=1, seq_len=seq_len)
  (src,) = ds.sources
  x = ds.eval_batch()
  nll = _neg_log_probs(src, x)[:, 1:]  # scored positions 1..T
  _assert_within_3se(nll.mean(1), ds.loss_floor)
  # The documented formula: mean over positions 1..T of H(X_j | X_<j).
  e = src.position_entropies(seq_len + 1)
  assert math.isclose(ds.loss_floor, e[1:].mean(), rel_tol=1e-12)
  assert e[1] > src.entropy_rate  # the first scored position sees a single token of context
  np.testing.assert_allclose(ds.position_floor, e[1:], rtol=1e-12)


def test_non_iid_loss_floor_matches_monte_carlo():
  seq_len, replicas = 4, 3
  ds = make_dataset(DataConfig(distribution="non-iid", eval_sequences=6000, seed=2),
                    replicas=replicas, batch_size=1, seq_len=seq_len)
  assert len(ds.sources) == replicas
  x = ds.eval_batch()
  tags = x[:, 0]
  np.testing.assert_array_equal(tags, np.arange(x.shape[0]) % replicas)  # uniform mixture
  nll = np.empty((x.shape[0], seq_len))
  for m, src in enumerate(ds.sources):
    nll[tags == m] = _neg_log_probs(src, x[tags == m, 1:])  # the tag is only ever an input
  _assert_within_3se(nll.mean(1), ds.loss_floor)
  floors = [src.position_entropies(seq_len).mean() for src in ds.sources]
  assert math.isclose(ds.loss_floor, np.mean(floors), rel_tol=1e-12)
  assert math.isclose(ds.entropy_rate, np.mean([s.entropy_rate for s in ds.sources]),
                      rel_tol=1e-12)
  assert len({round(s.entropy_rate, 9) for s in ds.sources}) == replicas  # distinct sources


# ----------------------------------------------------------------------------- 2. by hand


def test_deterministic_source_has_rate_zero():
  v, seq_len = 64, 128
  ds = make_dataset(DataConfig(branching=1, vocab_size=v), replicas=2, batch_size=8,
                    seq_len=seq_len)
  assert ds.entropy_rate == 0.0
  # The only deterministic chain through all V^k contexts is a cycle: pi is uniform, so
  # position 1 costs log V and every later position is free.
  np.testing.assert_allclose(ds.sources[0].stationary, 1.0 / v**2, rtol=1e-9)
  assert math.isclose(ds.loss_floor, math.log(v) / seq_len, rel_tol=1e-9)
  x = ds.train_batch(0).reshape(-1, seq_len + 1)
  ctx = x[:, :-2] * v + x[:, 1:-1]
  nxt = ds.sources[0].next_tokens[:, 0]
  np.testing.assert_array_equal(x[:, 2:], nxt[ctx])


@pytest.mark.parametrize("branching", [1, 2, 5])
def test_uniform_branching_has_rate_log_b(branching):
  ds = make_dataset(DataConfig(branching=branching, concentration=math.inf, vocab_size=16,
                               order=3), replicas=1, batch_size=4, seq_len=16)
  assert math.isclose(ds.entropy_rate, math.log(branching), rel_tol=1e-12, abs_tol=1e-15)
  assert np.all(ds.sources[0].probs == 1.0 / branching)
  assert np.all(np.sort(ds.sources[0].next_tokens, 1)[:, 1:] != np.sort(
      ds.sources[0].next_tokens, 1)[:, :-1])  # b distinct successors


def test_two_token_chain_by_hand():
  a, c = 0.2, 0.6  # P(0 -> 1) = a, P(1 -> 0) = c
  src = MarkovSource.from_matrix(np.array([[1 - a, a], [c, 1 - c]]), order=1)
  pi0 = c / (a + c)  # balance: pi0 * a = pi1 * c
  assert pi0 == pytest.approx(0.75)
  np.testing.assert_allclose(src.stationary, [0.75, 0.25], rtol=1e-12)

  def h2(p):
    return -p * math.log(p) - (1 - p) * math.log(1 - p)

  rate = 0.75 * h2(0.2) + 0.25 * h2(0.6)  # = 0.6059...
  assert src.entropy_rate == pytest.approx(rate, rel=1e-12)
  np.testing.assert_allclose(src.position_entropies(3), [h2(0.75), rate, rate], rtol=1e-12)
  x = src.sample(np.random.default_rng(0), 2000, 50)
  assert abs((x == 0).mean() - 0.75) < 0.01
  frm, to = x[:, :-1].ravel(), x[:, 1:].ravel()
  assert abs(to[frm == 0].mean() - a) < 0.01 and abs(1 - to[frm == 1].mean() - c) < 0.01


def test_order_two_chain_by_hand():
  # x_t copies x_{t-2}, flipped with probability eps: each context's successor law is
  # doubly stochastic, so pi is uniform; H(X_0) = H(X_1 | X_0) = log 2, then H2(eps).
  eps = 0.1
  m = np.array([[1 - eps, eps], [1 - eps, eps], [eps, 1 - eps], [eps, 1 - eps]])  # rows (a, b)
  src = MarkovSource.from_matrix(m, order=2)
  np.testing.assert_allclose(src.stationary, 0.25, rtol=1e-12)
  h = -eps * math.log(eps) - (1 - eps) * math.log(1 - eps)
  np.testing.assert_allclose(src.position_entropies(4), [math.log(2)] * 2 + [h] * 2, rtol=1e-12)
  x = src.sample(np.random.default_rng(1), 500, 40)
  assert abs((x[:, 2:] != x[:, :-2]).mean() - eps) < 0.01


def test_reducible_chain_is_rejected():
  with pytest.raises(ValueError, match="irreducible"):
    MarkovSource.from_matrix(np.eye(2))


# ----------------------------------------------------------------------------- 3. determinism


def test_batches_are_pure_functions_of_seed_replica_step():
  cfg = DataConfig(distribution="non-iid")
  a = make_dataset(cfg, replicas=4, batch_size=16, seq_len=128)
  b = make_dataset(cfg, replicas=4, batch_size=16, seq_len=128)
  x = a.train_batch(3)
  assert x.shape == (4, 16, 129) and x.dtype == np.int32
  assert x.min() >= 0 and x.max() < a.vocab_size
  b.train_batch(10)  # call order does not matter (exact resume)
  np.testing.assert_array_equal(b.train_batch(3), x)
  assert not np.array_equal(a.train_batch(4), x)
  assert not np.array_equal(x[0], x[1])
  other = make_dataset(DataConfig(distribution="non-iid", seed=1), replicas=4, batch_size=16,
                       seq_len=128)
  assert not np.array_equal(other.train_batch(3), x)
  # A replica's stream does not depend on how many replicas there are (iid).
  one = make_dataset(DataConfig(), replicas=1, batch_size=16, seq_len=128)
  four = make_dataset(DataConfig(), replicas=4, batch_size=16, seq_len=128)
  np.testing.assert_array_equal(one.train_batch(7)[0], four.train_batch(7)[0])
  np.testing.assert_array_equal(one.eval_batch(), four.eval_batch())
  with pytest.raises(ValueError, match="step must be an integer >= 0"):
    a.train_batch(-1)


@pytest.mark.parametrize("distribution", ["iid", "non-iid"])
def test_batches_drawn_in_blocks_equal_batches_drawn_one_by_one(distribution, monkeypatch):
  cfg = DataConfig(vocab_size=16, distribution=distribution)
  blocked = make_dataset(cfg, replicas=3, batch_size=5, seq_len=17)
  assert blocked.block_steps == 16
  steps = [16, 0, 15, 31, 17, 3, 40]
  got = [blocked.train_batch(s) for s in steps]
  got[0][...] = -1  # a returned batch is the caller's own copy
  monkeypatch.setattr(data_module, "_BLOCK_TOKENS", 1)
  single = make_dataset(cfg, replicas=3, batch_size=5, seq_len=17)
  assert single.block_steps == 1
  for s, x in zip(steps[1:], got[1:]):
    np.testing.assert_array_equal(single.train_batch(s), x)
  np.testing.assert_array_equal(single.train_batch(16), blocked.train_batch(16))


def test_iid_replicas_share_one_source():
  ds = make_dataset(DataConfig(), replicas=4, batch_size=16, seq_len=64)
  (src,) = ds.sources
  allowed = _dense(src) > 0
  x = ds.train_batch(0)
  for r in range(4):
    ctx = x[r, :, :-2] * 64 + x[r, :, 1:-1]
    assert allowed[ctx, x[r, :, 2:]].all()


def _bigram_tv(x: np.ndarray, v: int) -> np.ndarray:
  """Total-variation distances between the replicas' bigram histograms, [M, M]."""
  h = np.stack([np.bincount((xr[:, :-1] * v + xr[:, 1:]).ravel(), minlength=v * v) for xr in x])
  h = h / h.sum(1, keepdims=True)
  return 0.5 * np.abs(h[:, None] - h[None]).sum(-1)


def test_non_iid_replicas_differ_while_iid_agree():
  v, m = 8, 4
  stats = {}
  for dist in ("iid", "non-iid"):
    cfg = DataConfig(distribution=dist, vocab_size=v, order=1, branching=2, concentration=math.inf)
    ds = make_dataset(cfg, replicas=m, batch_size=32, seq_len=64)
    x = np.concatenate([ds.train_batch(s) for s in range(5)], axis=1)[..., 1:]  # drop tags
    tv = _bigram_tv(x, v)
    stats[dist] = tv[np.triu_indices(m, 1)]
  assert stats["iid"].max() < 0.05, stats
  assert stats["non-iid"].min() > 0.4, stats


def test_non_iid_tags_and_shares():
  m, share = 4, 0.9
  ds = make_dataset(DataConfig(distribution="non-iid", non_iid_share=share), replicas=m,
                    batch_size=16, seq_len=32)
  x = np.concatenate([ds.train_batch(s) for s in range(50)], axis=1)  # [M, 800, 33]
  for r in range(m):
    tags = x[r, :, 0]
    own = (tags == r).mean()
    p = share + (1 - share) / m  # own sub-source, or the uniform mixture's pick of it
    assert abs(own - p) < 3 * math.sqrt(p * (1 - p) / tags.size)
    for k in range(m):  # each tagged body follows exactly its own sub-source's transitions
      body = x[r, tags == k, 1:]
      if body.size:
        ctx = body[:, :-2] * 64 + body[:, 1:-1]
        assert (_dense(ds.sources[k]) > 0)[ctx, body[:, 2:]].all()
  full = make_dataset(DataConfig(distribution="non-iid", non_iid_share=1.0), replicas=m,
                      batch_size=16, seq_len=8)
  tags = full.train_batch(0)[..., 0]
  np.testing.assert_array_equal(tags, np.broadcast_to(np.arange(m)[:, None], tags.shape))


def test_batch_is_fast():
  import time
  ds = make_dataset(DataConfig(), replicas=4, batch_size=16, seq_len=128)
  ds.train_batch(0)
  start = time.perf_counter()
  for s in range(20):
    ds.train_batch(s)
  assert (time.perf_counter() - start) / 20 < 0.02  # a few ms in practice


# ----------------------------------------------------------------------------- 4. eval set


def test_eval_set_is_fixed_and_disjoint_from_training():
  ds = make_dataset(DataConfig(), replicas=4, batch_size=16, seq_len=32)
  e = ds.eval_batch()
  assert e.shape == (64, 33) and e.dtype == np.int32
  e[:] = 0  # callers get a copy
  e = ds.eval_batch()
  np.testing.assert_array_equal(e, make_dataset(DataConfig(), replicas=2, batch_size=3,
                                                seq_len=32).eval_batch())
  assert not np.array_equal(e, make_dataset(DataConfig(seed=1), replicas=4, batch_size=16,
                                            seq_len=32).eval_batch())
  train = {row.tobytes() for s in range(50) for row in ds.train_batch(s).reshape(-1, 33)}
  assert len(train) == 50 * 64
  assert not train & {row.tobytes() for row in e}
  doc = ds.describe()
  json.dumps(doc, allow_nan=False)
  assert doc["kind"] == "synthetic" and doc["loss_floor"] == ds.loss_floor
  assert doc["vocab_size"] == 64 and doc["contexts"] == 64**2


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("kwargs,match", [
    ({"distribution": "noniid"}, "DataConfig.distribution must be one of \\('iid', 'non-iid'\\)"),
    ({"vocab_size": 1}, "DataConfig.vocab_size must be an integer >= 2"),
    ({"vocab_size": 8.0}, "DataConfig.vocab_size must be an integer >= 2"),
    ({"order": 0}, "DataConfig.order must be an integer >= 1"),
    ({"branching": 0}, "DataConfig.branching must be an integer >= 1"),
    ({"branching": 65}, "DataConfig.branching must be in \\[1, vocab_size=64\\]"),
    ({"concentration": 0.0}, "DataConfig.concentration must be > 0"),
    ({"concentration": math.nan}, "DataConfig.concentration must be > 0"),
    ({"non_iid_share": 1.5}, "DataConfig.non_iid_share must be in \\[0, 1\\]"),
    ({"non_iid_share": -0.1}, "DataConfig.non_iid_share must be in \\[0, 1\\]"),
    ({"eval_sequences": 0}, "DataConfig.eval_sequences must be an integer >= 1"),
    ({"seed": -1}, "DataConfig.seed must be an integer >= 0"),
    ({"source": ""}, "DataConfig.source must be 'synthetic' or a path"),
    ({"vocab_size": 1024, "order": 3}, "= 1073741824 contexts exceeds the limit 1048576"),
    ({"vocab_size": 1024, "order": 2, "branching": 32}, "table entries exceeds the limit"),
])
def test_config_errors(kwargs, match):
  with pytest.raises(ValueError, match=match):
    DataConfig(**kwargs)


@pytest.mark.parametrize("kwargs,match", [
    ({"replicas": 0}, "replicas must be an integer >= 1"),
    ({"batch_size": 0}, "batch_size must be an integer >= 1"),
    ({"seq_len": 0}, "seq_len must be an integer >= 1"),
    ({"model_vocab_size": 32}, "model vocab_size \\(32\\) is smaller than DataConfig.vocab_size"),
    ({"replicas": 65, "distribution": "non-iid"}, "needs replicas \\(65\\) <= DataConfig.vocab_size"),
])
def test_make_dataset_errors(kwargs, match):
  args = {"replicas": 2, "batch_size": 2, "seq_len": 8}
  dist = kwargs.pop("distribution", "iid")
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    make_dataset(DataConfig(distribution=dist), **args)


def test_short_sequences_and_tiny_vocab():
  # seq_len < order and V = 2 still give exact floors and valid batches.
  ds = make_dataset(DataConfig(vocab_size=2, order=3, branching=2), replicas=2, batch_size=3,
                    seq_len=1)
  assert ds.train_batch(0).shape == (2, 3, 2)
  assert math.isclose(ds.loss_floor, ds.sources[0].position_entropies(2)[1], rel_tol=1e-12)
  nd = make_dataset(DataConfig(vocab_size=2, order=3, branching=2, distribution="non-iid"),
                    replicas=2, batch_size=3, seq_len=1)
  assert nd.train_batch(0).shape == (2, 3, 2)
  assert math.isclose(nd.loss_floor, np.mean([s.position_entropies(1)[0] for s in nd.sources]),
                      rel_tol=1e-12)
