"""Training data: a seeded synthetic language with an exact loss floor, or a local file.

Two kinds of data, both sharded over the :math:`M` DiLoCo replicas and both pure numpy
(the trainer converts batches to JAX arrays):

* **Synthetic** (``DataConfig.source="synthetic"``): a random sparse :math:`k`-th order
  Markov source over a vocabulary of :math:`V` tokens (:class:`MarkovSource`). Its
  stationary distribution is solved to machine precision, so the *entropy rate* and the
  Bayes-optimal cross-entropy of the eval set (the **loss floor** no model can beat)
  are exact numbers, not estimates.
* **A local file** (``DataConfig.source="path/to/file"``): UTF-8 text read as bytes
  (vocabulary 256), or a 1-D integer ``.npy`` array of token ids. Nothing is ever
  downloaded. The last 10% of the tokens are held out for evaluation.

Every batch is a pure function of ``(seed, replica, step)``: each replica's sequences
come from a counter-based generator ``np.random.default_rng([stream, seed, replica,
step])`` with distinct stream ids for the source tables, training and eval, so resuming
at step :math:`t` reproduces the exact batches and train and eval never share draws.

Sharding over replicas (``DataConfig.distribution``):

* ``"iid"``: every replica draws an independent stream of the same distribution (one
  Markov source; for a file, random crops of the whole training split).
* ``"non-iid"``: the heterogeneous setting of the DiLoCo paper. Synthetic data has
  :math:`M` independently drawn sub-sources, one per replica; each of replica
  :math:`m`'s sequences comes from sub-source :math:`m` with probability
  :math:`s` = ``non_iid_share`` and otherwise from a sub-source drawn uniformly from
  all :math:`M` (so :math:`s = 0` is the i.i.d. version of the very same data and
  :math:`s = 1` fully disjoint shards). Every non-iid sequence starts with a *tag*
  token (token id :math:`m` for sub-source :math:`m`) that is only ever an input, so
  the floor stays exact; the eval set is the uniform mixture of the sub-sources. For a
  file, replica :math:`m` crops only from its own contiguous :math:`1/M` of the
  training split.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

import numpy as np
import scipy.sparse
import scipy.sparse.csgraph
import scipy.sparse.linalg

from diloco_core import fields

_DISTRIBUTIONS = ("iid", "non-iid")

# Stream ids: the first word of every generator key, so the source tables, the
# training batches and the eval set are drawn from disjoint random streams.
_TRAIN_STREAM = 0
_EVAL_STREAM = 1
_SOURCE_STREAM = 2

MAX_STATES = 2**20  # largest number of contexts V**k of a synthetic source
MAX_TABLE_ENTRIES = 2**24  # largest V**k * branching (the transition tables' size)
EVAL_FRACTION = 0.1  # share of a file's tokens held out for evaluation
_SMOOTHING = 1e-3  # share of uniform mass mixed into every context's next-token law
_STATIONARY_TOL = 1e-12  # required L1 residual of the stationary distribution


def _field(default, **kw):
  """A data field (:mod:`diloco_core.fields`): in the CLI's data group, must match on resume."""
  return fields.field(default, group="data", must_match=True, **kw)


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """What data to train on and how to shard it over replicas.

  The synthetic-source fields (``vocab_size``, ``order``, ``branching``,
  ``concentration``) are ignored for file data but still validated.
  """

  source: str = _field("synthetic", flag="data", help="'synthetic', or a local .txt (UTF-8, byte tokens) or .npy (token ids) file")
  distribution: str = _field("iid", flag="distribution", help="iid or non-iid replica shards")
  vocab_size: int = _field(64, flag="data-vocab", help="synthetic: vocabulary size V (text files: 256; .npy: the model's)")
  order: int = _field(2, flag="data-order", help="synthetic: Markov order k")
  branching: int = _field(4, flag="data-branching", help="synthetic: allowed next tokens per context")
  concentration: float = _field(0.5, help="Dirichlet concentration of next-token probabilities; inf = uniform")
  non_iid_share: float = _field(0.9, help="non-iid: share of a replica's sequences from its own sub-source")
  eval_sequences: int = _field(64, help="sequences in the fixed held-out eval set")
  seed: int = _field(0, flag="data-seed", help="seed of the synthetic source and of the sampling (independent of the model-init seed)")

  def __post_init__(self):
    if not isinstance(self.source, (str, pathlib.PurePath)) or not str(self.source):
      raise ValueError(
          f"DataConfig.source must be 'synthetic' or a path to a .txt/.npy file, got {self.source!r}.")
    if self.distribution not in _DISTRIBUTIONS:
      raise ValueError(
          f"DataConfig.distribution must be one of {_DISTRIBUTIONS}, got {self.distribution!r}.")
    for name, low in (("vocab_size", 2), ("order", 1), ("branching", 1), ("eval_sequences", 1),
                      ("seed", 0)):
      value = getattr(self, name)
      if not _is_int(value) or value < low:
        raise ValueError(f"DataConfig.{name} must be an integer >= {low}, got {value!r}.")
    if self.branching > self.vocab_size:
      raise ValueError(
          f"DataConfig.branching must be in [1, vocab_size={self.vocab_size}], got {self.branching!r}.")
    c = self.concentration
    if not _is_real(c) or math.isnan(c) or c <= 0:
      raise ValueError(f"DataConfig.concentration must be > 0 (or inf for uniform), got {c!r}.")
    s = self.non_iid_share
    if not _is_real(s) or not 0.0 <= s <= 1.0:
      raise ValueError(f"DataConfig.non_iid_share must be in [0, 1], got {s!r}.")
    if self.is_synthetic:
      states = self.vocab_size**self.order
      if states > MAX_STATES:
        raise ValueError(
            f"DataConfig.vocab_size**order = {self.vocab_size}**{self.order} = {states} contexts"
            f" exceeds the limit {MAX_STATES}; lower vocab_size or order.")
      if states * self.branching > MAX_TABLE_ENTRIES:
        raise ValueError(
            f"DataConfig.vocab_size**order * branching = {states * self.branching} table entries"
            f" exceeds the limit {MAX_TABLE_ENTRIES}; lower vocab_size, order or branching.")

  @property
  def is_synthetic(self) -> bool:
    return str(self.source) == "synthetic"


def _is_int(value) -> bool:
  return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_real(value) -> bool:
  return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
      value, (bool, np.bool_))


def _entropy(p: np.ndarray, axis: int = -1) -> np.ndarray:
  """Shannon entropy in nats along ``axis`` (with 0 log 0 = 0)."""
  p = np.asarray(p, dtype=np.float64)
  logp = np.log(np.where(p > 0, p, 1.0))
  return -(p * logp).sum(axis=axis)


def de_bruijn(vocab_size: int, order: int) -> np.ndarray:
  """A de Bruijn sequence: a cyclic sequence in which every k-gram appears exactly once.

  Built from the Lyndon words over :math:`\\{0..V-1\\}` whose length divides :math:`k`,
  in lexicographic order (Fredricksen-Kessler-Maiorana). Read cyclically, its
  :math:`V^k` windows of length :math:`k` are all distinct, so "next token after each
  window" is a single cycle through every context of a :math:`k`-th order source.

  Args:
    vocab_size: alphabet size V >= 1.
    order: window length k >= 1.

  Returns:
    int64 array of length :math:`V^k`.

  Examples:
    >>> de_bruijn(2, 3).tolist()
    [0, 0, 0, 1, 0, 1, 1, 1]
  """
  seq = []
  word = [-1]
  while word:
    word[-1] += 1
    m = len(word)
    if order % m == 0:
      seq.extend(word)
    while len(word) < order:
      word.append(word[-m])
    while word and word[-1] == vocab_size - 1:
      word.pop()
  return np.asarray(seq, dtype=np.int64)


def _stationary(next_tokens: np.ndarray, probs: np.ndarray, vocab_size: int) -> np.ndarray:
  """Stationary distribution of the context chain, to an L1 residual below 1e-12.

  Solves :math:`(I - P^\\top + u\\mathbf{1}^\\top)\\pi = u` with :math:`u = \\mathbf{1}/S`
  (non-singular for an irreducible chain, and solved exactly by the stationary
  :math:`\\pi` with :math:`\\sum\\pi = 1`) by BiCGSTAB, falling back to LGMRES and then
  to power iteration of the lazy chain.
  """
  states, b = next_tokens.shape
  rows = np.repeat(np.arange(states, dtype=np.int64), b)
  cols = (rows % (states // vocab_size)) * vocab_size + next_tokens.reshape(-1)
  pt = scipy.sparse.csr_matrix((probs.reshape(-1), (cols, rows)), shape=(states, states))
  u = np.full(states, 1.0 / states)

  def residual(pi):
    return float(np.abs(pt @ pi - pi).sum())

  def finish(pi):
    pi = np.clip(pi, 0.0, None)
    return pi / pi.sum()

  if states == 1:
    return np.ones(1)
  op = scipy.sparse.linalg.LinearOperator(
      (states, states), matvec=lambda x: x - pt @ x + u * x.sum(), dtype=np.float64)
  best = u
  for solver, kwargs in ((scipy.sparse.linalg.bicgstab, {"maxiter": 20 * states + 1000}),
                         (scipy.sparse.linalg.lgmres, {"maxiter": 2000})):
    try:
      pi, _ = solver(op, u, x0=u.copy(), rtol=1e-15, atol=0.0, **kwargs)
    except (ArithmeticError, ValueError):  # a breakdown: try the next solver
      continue
    if np.all(np.isfinite(pi)) and pi.sum() > 0:
      pi = finish(pi)
      if residual(pi) < _STATIONARY_TOL:
        return pi
      best = pi if residual(pi) < residual(best) else best
  pi = best
  for _ in range(200_000):  # lazy power iteration: always converges, if slowly
    pi = 0.5 * (pi + pt @ pi)
    if residual(pi) < _STATIONARY_TOL:
      return finish(pi)
  raise ValueError(
      "could not solve the synthetic source's stationary distribution to 1e-12; raise"
      " DataConfig.concentration or branching.")


class MarkovSource:
  """A :math:`k`-th order Markov source over :math:`V` tokens with exact entropies.

  The state is the context :math:`c = (x_{t-k}, \\ldots, x_{t-1})`, indexed
  :math:`c = \\sum_i x_{t-k+i} V^{k-1-i}` (oldest token most significant); context
  :math:`c` allows the ``b`` next tokens ``next_tokens[c]`` with probabilities
  ``probs[c]``. Sequences start from the stationary distribution :math:`\\pi` of the
  context chain, which makes the token process stationary, so the exact per-position
  Bayes losses are (with :math:`\\pi_{(j)}` the marginal of :math:`\\pi` on the first
  :math:`j` tokens, :math:`H(\\pi_{(0)}) = 0`):

  .. math::
     H(X_j \\mid X_{<j}) =
     \\begin{cases}
       H(\\pi_{(j+1)}) - H(\\pi_{(j)}) & j < k \\\\
       h = \\sum_c \\pi(c)\\, H\\big(P(\\cdot \\mid c)\\big) & j \\ge k
     \\end{cases}

  where :math:`h` is the entropy rate.

  Args:
    next_tokens: int array [V**k, b], the allowed next tokens of each context.
    probs: float array [V**k, b], their probabilities (rows sum to 1).
    vocab_size: V.
    order: k.

  Examples:
    >>> src = MarkovSource.from_matrix(np.array([[0.5, 0.5], [1.0, 0.0]]), order=1)
    >>> src.stationary.round(4).tolist()
    [0.6667, 0.3333]
    >>> round(src.entropy_rate / math.log(2), 4)  # 2/3 of a bit
    0.6667
  """

  def __init__(self, next_tokens: np.ndarray, probs: np.ndarray, *, vocab_size: int, order: int):
    next_tokens = np.asarray(next_tokens)
    probs = np.asarray(probs, dtype=np.float64)
    states = vocab_size**order
    if next_tokens.ndim != 2 or next_tokens.shape[0] != states or probs.shape != next_tokens.shape:
      raise ValueError(
          f"MarkovSource tables must both have shape [vocab_size**order={states}, b], got"
          f" {next_tokens.shape} and {probs.shape}.")
    if next_tokens.min() < 0 or next_tokens.max() >= vocab_size:
      raise ValueError(f"MarkovSource next_tokens must be in [0, {vocab_size}).")
    if probs.min() < 0 or not np.allclose(probs.sum(1), 1.0, rtol=0, atol=1e-9):
      raise ValueError("MarkovSource probs must be non-negative with rows summing to 1.")
    self.vocab_size = int(vocab_size)
    self.order = int(order)
    self.next_tokens = next_tokens.astype(np.int32)
    self.probs = probs / probs.sum(1, keepdims=True)
    cum = np.cumsum(self.probs, axis=1)
    self._cum = cum / cum[:, -1:]  # last column exactly 1.0, so a draw u < 1 always lands
    b = self.next_tokens.shape[1]
    rows = np.repeat(np.arange(states), b)
    cols = (rows % (states // vocab_size)) * vocab_size + self.next_tokens.reshape(-1)
    graph = scipy.sparse.csr_matrix(
        (self.probs.reshape(-1) > 0, (rows, cols)), shape=(states, states))
    if scipy.sparse.csgraph.connected_components(graph, connection="strong")[0] != 1:
      raise ValueError("MarkovSource: the context chain must be irreducible (one communicating"
                       " class), so that its stationary distribution is unique.")
    self.stationary = _stationary(self.next_tokens, self.probs, self.vocab_size)
    cum_pi = np.cumsum(self.stationary)
    self._cum_stationary = cum_pi / cum_pi[-1]
    self.entropy_rate = max(0.0, float(np.dot(self.stationary, _entropy(self.probs))))

  @classmethod
  def random(cls, *, vocab_size: int, order: int, branching: int, concentration: float,
             seed) -> "MarkovSource":
    """A random sparse source (the synthetic language).

    Each context allows ``branching`` distinct next tokens: its successor on a
    randomly relabelled de Bruijn cycle (:func:`de_bruijn`, which makes the context
    chain irreducible, so :math:`\\pi` is unique and every token occurs) plus
    ``branching - 1`` others drawn uniformly. Their probabilities are
    :math:`(1-\\epsilon)\\,\\mathrm{Dir}(\\alpha \\mathbf{1}_b) + \\epsilon/b` with
    :math:`\\alpha` = ``concentration`` (``inf``: uniform :math:`1/b`) and
    :math:`\\epsilon = 10^{-3}` (keeps every allowed transition possible).

    Args:
      vocab_size: V >= 2.
      order: k >= 1.
      branching: b in [1, V].
      concentration: Dirichlet concentration > 0; small values give peaked, low-entropy
        next-token laws, ``math.inf`` the uniform law (entropy rate exactly log b).
      seed: anything ``np.random.default_rng`` accepts.

    Returns:
      The source.

    Examples:
      >>> src = MarkovSource.random(vocab_size=8, order=2, branching=3,
      ...                           concentration=math.inf, seed=0)
      >>> bool(np.isclose(src.entropy_rate, np.log(3)))
      True
    """
    rng = np.random.default_rng(seed)
    states = vocab_size**order
    cycle = rng.permutation(vocab_size)[de_bruijn(vocab_size, order)]
    ext = np.concatenate([cycle, cycle[:order]])
    contexts = np.zeros(states, dtype=np.int64)
    for i in range(order):
      contexts = contexts * vocab_size + ext[i:i + states]
    backbone = np.empty(states, dtype=np.int64)
    backbone[contexts] = ext[order:order + states]
    # b - 1 distinct others out of the V - 1 non-backbone tokens (Floyd's algorithm).
    m, n = branching - 1, vocab_size - 1
    others = np.empty((states, m), dtype=np.int64)
    for i, j in enumerate(range(n - m, n)):
      t = rng.integers(0, j + 1, size=states)
      others[:, i] = np.where((others[:, :i] == t[:, None]).any(1), j, t)
    others += others >= backbone[:, None]
    next_tokens = np.concatenate([backbone[:, None], others], axis=1)
    if math.isinf(concentration):
      probs = np.full((states, branching), 1.0 / branching)
    else:
      probs = rng.dirichlet(np.full(branching, float(concentration)), size=states)
      probs = (1.0 - _SMOOTHING) * probs + _SMOOTHING / branching
    return cls(next_tokens, probs, vocab_size=vocab_size, order=order)

  @classmethod
  def from_matrix(cls, matrix: np.ndarray, *, order: int = 1) -> "MarkovSource":
    """A source from a dense transition matrix ``matrix[c, y] = P(y | c)``, shape [V**k, V].

    Args:
      matrix: row-stochastic [V**order, V] array.
      order: k.

    Returns:
      The source (its contexts must form one irreducible chain).

    Examples:
      >>> MarkovSource.from_matrix(np.array([[0.0, 1.0], [1.0, 0.0]])).entropy_rate
      0.0
    """
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]**order:
      raise ValueError(f"matrix must have shape [V**order, V], got {matrix.shape}.")
    b = max(1, int((matrix > 0).sum(1).max()))
    next_tokens = np.argsort(matrix, axis=1, kind="stable")[:, -b:]  # zeros (if any) first
    probs = np.take_along_axis(matrix, next_tokens, axis=1)
    return cls(next_tokens, probs, vocab_size=matrix.shape[1], order=order)

  def position_entropies(self, length: int) -> np.ndarray:
    """Exact :math:`H(X_j \\mid X_{<j})` for :math:`j = 0..\\text{length}-1`, in nats.

    Args:
      length: number of positions.

    Returns:
      float64 array [length]: position 0 is the entropy of the first token, positions
      :math:`\\ge k` equal the entropy rate.

    Examples:
      >>> src = MarkovSource.from_matrix(np.full((4, 2), 0.5), order=2)
      >>> (src.position_entropies(4) / np.log(2)).round(6).tolist()
      [1.0, 1.0, 1.0, 1.0]
    """
    v, k = self.vocab_size, self.order
    marginal_entropy = [0.0] + [
        float(_entropy(self.stationary.reshape(v**j, v**(k - j)).sum(1))) for j in range(1, k + 1)
    ]
    out = np.full(length, self.entropy_rate)
    for j in range(min(k, length)):
      out[j] = max(0.0, marginal_entropy[j + 1] - marginal_entropy[j])
    return out

  def sample(self, rng: np.random.Generator, num: int, length: int) -> np.ndarray:
    """``num`` independent stationary sequences of ``length`` tokens.

    Args:
      rng: a numpy generator.
      num: number of sequences.
      length: tokens per sequence.

    Returns:
      int32 array [num, length].

    Examples:
      >>> src = MarkovSource.from_matrix(np.array([[0.0, 1.0], [1.0, 0.0]]))
      >>> x = src.sample(np.random.default_rng(0), 3, 5)
      >>> bool(np.all(x[:, 1:] == 1 - x[:, :-1]))
      True
    """
    u_start = rng.random(num)
    u_next = rng.random((num, max(0, length - self.order)))
    return _Tables([self]).sample(np.zeros(num, dtype=np.int64), u_start, u_next)[:, :length]


class _Tables:
  """The next-token tables of one or more sources of equal (V, k, b), stacked for sampling."""

  def __init__(self, sources: list[MarkovSource]):
    first = sources[0]
    self.vocab_size, self.order = first.vocab_size, first.order
    self.states = self.vocab_size**self.order
    self.sources = sources
    self.next_tokens = np.concatenate([s.next_tokens for s in sources])
    self.cum = np.concatenate([s._cum for s in sources])

  def sample(self, which: np.ndarray, u_start: np.ndarray, u_next: np.ndarray) -> np.ndarray:
    """Sequences [N, k + L] of sources ``which`` [N] from uniforms [N] and [N, L]."""
    n, steps = u_next.shape
    v, k, s = self.vocab_size, self.order, self.states
    state = np.empty(n, dtype=np.int64)
    for m in np.unique(which):
      mask = which == m
      state[mask] = np.searchsorted(self.sources[m]._cum_stationary, u_start[mask], side="right")
    out = np.empty((n, k + steps), dtype=np.int32)
    c = state.copy()
    for i in range(k - 1, -1, -1):  # decode the start context into its k tokens
      out[:, i] = c % v
      c //= v
    offset = which.astype(np.int64) * s
    for t in range(steps):
      row = offset + state
      choice = (self.cum[row] <= u_next[:, t, None]).sum(1)
      token = self.next_tokens[row, choice]
      out[:, k + t] = token
      state = (state % (s // v)) * v + token
    return out


class Dataset:
  """Batches for M replicas: ``train_batch(step)`` and a fixed ``eval_batch()``.

  Attributes:
    vocab_size: token ids are in ``[0, vocab_size)``.
    replicas: M.
    batch_size: sequences per replica per step.
    seq_len: T; every sequence has T + 1 tokens (inputs ``x[..., :-1]``, targets
      ``x[..., 1:]``).
    loss_floor: exact Bayes-optimal mean cross-entropy (nats/token) over the T scored
      positions of the eval sequences; None for file data.
    entropy_rate: entropy rate of the eval source in nats/token; None for file data.
  """

  vocab_size: int
  replicas: int
  batch_size: int
  seq_len: int
  loss_floor: float | None = None
  entropy_rate: float | None = None

  def train_batch(self, step: int) -> np.ndarray:
    """int32 [M, batch_size, seq_len + 1], a pure function of (seed, replica, step)."""
    raise NotImplementedError

  def eval_batch(self) -> np.ndarray:
    """int32 [eval_sequences, seq_len + 1], the same held-out set on every call."""
    raise NotImplementedError

  def describe(self) -> dict:
    """A JSON-able summary of the data."""
    raise NotImplementedError


def _check_step(step) -> int:
  if not _is_int(step) or step < 0:
    raise ValueError(f"train_batch step must be an integer >= 0, got {step!r}.")
  return int(step)


class SyntheticDataset(Dataset):
  """The synthetic Markov language (see the module docstring and :class:`MarkovSource`).

  For ``"iid"`` every sequence is :math:`T+1` tokens of one source and the floor
  averages positions :math:`1..T`; for ``"non-iid"`` token 0 is the tag of the
  sequence's sub-source and tokens :math:`1..T` are that sub-source's sequence, all
  scored (the first given only the tag). With :math:`e^{(m)}_j` the
  :meth:`MarkovSource.position_entropies` of the eval sequence's source :math:`m_i`
  (eval sequence :math:`i` uses sub-source :math:`i \\bmod M`):

  .. math::
     L^* = \\frac{1}{N}\\sum_{i=1}^{N} \\frac{1}{T} \\sum_{j=1}^{T}
       \\begin{cases} e^{(m_i)}_j & \\text{iid} \\\\ e^{(m_i)}_{j-1} & \\text{non-iid}
       \\end{cases}
  """

  def __init__(self, cfg: DataConfig, *, replicas: int, batch_size: int, seq_len: int):
    self.config = cfg
    self.replicas, self.batch_size, self.seq_len = replicas, batch_size, seq_len
    self.vocab_size = cfg.vocab_size
    self.tagged = cfg.distribution == "non-iid"
    if self.tagged and replicas > cfg.vocab_size:
      raise ValueError(
          f"non-iid synthetic data tags each sequence with its sub-source's token id, so it"
          f" needs replicas ({replicas}) <= DataConfig.vocab_size ({cfg.vocab_size}).")
    num_sources = replicas if self.tagged else 1
    self.sources = [
        MarkovSource.random(vocab_size=cfg.vocab_size, order=cfg.order, branching=cfg.branching,
                            concentration=cfg.concentration, seed=[_SOURCE_STREAM, cfg.seed, m, 0])
        for m in range(num_sources)
    ]
    self._tables = _Tables(self.sources)
    self._body = seq_len if self.tagged else seq_len + 1  # tokens drawn from the source
    self._steps = max(0, self._body - cfg.order)

    # Per-position floors of each source over the T scored positions.
    floors = []
    for src in self.sources:
      e = src.position_entropies(self._body)
      floors.append(e if self.tagged else e[1:])
    n = cfg.eval_sequences
    self._eval_which = np.arange(n) % num_sources
    weights = np.bincount(self._eval_which, minlength=num_sources) / n  # eval share of each
    self.position_floor = sum(w * f for w, f in zip(weights, floors))
    self.loss_floor = float(self.position_floor.mean())
    self.entropy_rate = float(sum(w * s.entropy_rate for w, s in zip(weights, self.sources)))
    rng = np.random.default_rng([_EVAL_STREAM, cfg.seed, 0, 0])
    self._eval = self._draw(self._eval_which, rng.random(n), rng.random((n, self._steps)))

  def _draw(self, which, u_start, u_next) -> np.ndarray:
    body = self._tables.sample(which, u_start, u_next)[:, :self._body]
    if not self.tagged:
      return body
    return np.concatenate([which.astype(np.int32)[:, None], body], axis=1)

  def train_batch(self, step: int) -> np.ndarray:
    """Training sequences of every replica at ``step``.

    Args:
      step: the global training (inner) step, >= 0.

    Returns:
      int32 array [replicas, batch_size, seq_len + 1].
    """
    step = _check_step(step)
    cfg, b = self.config, self.batch_size
    which, u_start, u_next = [], [], []
    for r in range(self.replicas):
      rng = np.random.default_rng([_TRAIN_STREAM, cfg.seed, r, step])
      if self.tagged:
        own = rng.random(b) < cfg.non_iid_share
        which.append(np.where(own, r, rng.integers(0, self.replicas, size=b)))
      else:
        which.append(np.zeros(b, dtype=np.int64))
      u_start.append(rng.random(b))
      u_next.append(rng.random((b, self._steps)))
    x = self._draw(np.concatenate(which), np.concatenate(u_start), np.concatenate(u_next))
    return x.reshape(self.replicas, b, self.seq_len + 1)

  def eval_batch(self) -> np.ndarray:
    return self._eval.copy()

  def describe(self) -> dict:
    cfg = self.config
    c = cfg.concentration
    out = {
        "kind": "synthetic",
        "distribution": cfg.distribution,
        "vocab_size": self.vocab_size,
        "order": cfg.order,
        "branching": cfg.branching,
        "concentration": float(c) if math.isfinite(c) else "inf",
        "contexts": cfg.vocab_size**cfg.order,
        "sub_sources": len(self.sources),
        "source_entropy_rates": [s.entropy_rate for s in self.sources],
        "entropy_rate": self.entropy_rate,
        "loss_floor": self.loss_floor,
        "eval_sequences": cfg.eval_sequences,
        "eval_tokens": cfg.eval_sequences * self.seq_len,
        "tokens_available": None,  # unlimited
        "replicas": self.replicas,
        "batch_size": self.batch_size,
        "seq_len": self.seq_len,
        "tokens_per_step": self.replicas * self.batch_size * self.seq_len,
        "seed": cfg.seed,
    }
    if self.tagged:
      out["non_iid_share"] = float(cfg.non_iid_share)
    return out


def _load_tokens(source: str, model_vocab_size: int | None) -> tuple[np.ndarray, str, int]:
  """Reads a text or .npy file into int32 token ids; returns (tokens, kind, vocab_size)."""
  path = pathlib.Path(source)
  hint = "use 'synthetic' or a path to a UTF-8 text file or an .npy file of token ids"
  if not path.exists():
    raise FileNotFoundError(f"DataConfig.source: no such file {str(path)!r} ({hint}).")
  if not path.is_file():
    raise ValueError(f"DataConfig.source: {str(path)!r} is not a regular file ({hint}).")
  if path.suffix.lower() == ".npy":
    kind = "npy"
    try:
      ids = np.load(path, allow_pickle=False)
    except Exception as e:  # noqa: BLE001 - any failure to parse is one clear error
      raise ValueError(
          f"DataConfig.source: cannot read {str(path)!r} as .npy ({type(e).__name__}:"
          f" {str(e).splitlines()[0] if str(e) else ''}).") from None
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
      raise ValueError(
          f"DataConfig.source: {str(path)!r} must hold a 1-D integer array of token ids, got"
          f" shape {ids.shape} dtype {ids.dtype}.")
    if ids.size == 0:
      raise ValueError(f"DataConfig.source: {str(path)!r} is empty (no tokens).")
    low, high = int(ids.min()), int(ids.max())
    if low < 0:
      raise ValueError(f"DataConfig.source: {str(path)!r} has token id {low} < 0.")
    vocab = model_vocab_size if model_vocab_size is not None else high + 1
    if high >= vocab or high >= 2**31 - 1:
      raise ValueError(
          f"DataConfig.source: {str(path)!r} has token id {high} outside the model vocabulary"
          f" [0, {vocab}).")
  else:
    kind = "text"
    try:
      data = path.read_bytes()
    except OSError as e:
      raise ValueError(f"DataConfig.source: cannot read {str(path)!r} ({e.strerror}).") from None
    if not data:
      raise ValueError(f"DataConfig.source: {str(path)!r} is empty (no tokens).")
    try:
      data.decode("utf-8")
    except UnicodeDecodeError as e:
      raise ValueError(
          f"DataConfig.source: {str(path)!r} is not valid UTF-8 text (byte {e.start}: {e.reason});"
          " save it as UTF-8 or pass token ids as .npy.") from None
    ids = np.frombuffer(data, dtype=np.uint8)
    vocab = 256
    high = int(ids.max())
    if model_vocab_size is not None and high >= model_vocab_size:
      raise ValueError(
          f"DataConfig.source: {str(path)!r} has byte token {high} outside the model vocabulary"
          f" [0, {model_vocab_size}); byte-level text needs vocab_size 256.")
  return ids.astype(np.int32), kind, int(vocab)


class FileDataset(Dataset):
  """Random crops of a local token file; the last 10% (at least T + 1 tokens) is eval.

  The eval set is ``eval_sequences`` evenly spaced windows of the held-out tail
  (overlapping when the tail is short). Training windows are crops whose start is
  drawn uniformly by each replica's generator: from the whole training split for
  ``"iid"``, from replica m's own contiguous 1/M of it for ``"non-iid"``.
  """

  def __init__(self, cfg: DataConfig, *, replicas: int, batch_size: int, seq_len: int,
               model_vocab_size: int | None):
    self.config = cfg
    self.replicas, self.batch_size, self.seq_len = replicas, batch_size, seq_len
    self.path = str(cfg.source)
    tokens, self.kind, self.vocab_size = _load_tokens(self.path, model_vocab_size)
    n, w = tokens.size, seq_len + 1
    n_eval = max(math.ceil(EVAL_FRACTION * n), w)
    n_train = n - n_eval
    if n_train < w:
      raise ValueError(
          f"DataConfig.source: {self.path!r} has {n} tokens, too short for seq_len {seq_len}: need"
          f" at least {n_eval + w} ({w} to train on plus {n_eval} held out for eval).")
    self.tokens = tokens
    self.train_tokens, self.eval_tokens = n_train, n_eval
    if cfg.distribution == "non-iid":
      bounds = [m * n_train // replicas for m in range(replicas + 1)]
      self._shard_start = np.asarray(bounds[:-1], dtype=np.int64)
      self._shard_len = np.diff(bounds)
      if self._shard_len.min() < w:
        raise ValueError(
            f"DataConfig.source: non-iid shards of {self.path!r} hold {int(self._shard_len.min())}"
            f" training tokens, fewer than seq_len + 1 = {w}; use fewer replicas, a shorter"
            f" seq_len, more data or distribution='iid'.")
    else:
      self._shard_start = np.zeros(replicas, dtype=np.int64)
      self._shard_len = np.full(replicas, n_train)
    starts = np.round(np.linspace(0, n_eval - w, cfg.eval_sequences)).astype(np.int64) + n_train
    self._eval = tokens[starts[:, None] + np.arange(w)]

  def train_batch(self, step: int) -> np.ndarray:
    """Training crops of every replica at ``step``.

    Args:
      step: training step, >= 0.

    Returns:
      int32 array [replicas, batch_size, seq_len + 1].
    """
    step = _check_step(step)
    w = self.seq_len + 1
    starts = np.stack([
        self._shard_start[r] + np.random.default_rng([_TRAIN_STREAM, self.config.seed, r, step])
        .integers(0, self._shard_len[r] - w + 1, size=self.batch_size)
        for r in range(self.replicas)
    ])
    return self.tokens[starts[..., None] + np.arange(w)]

  def eval_batch(self) -> np.ndarray:
    return self._eval.copy()

  def describe(self) -> dict:
    out = {
        "kind": self.kind,
        "path": self.path,
        "distribution": self.config.distribution,
        "vocab_size": self.vocab_size,
        "loss_floor": None,
        "entropy_rate": None,
        "tokens_available": int(self.tokens.size),
        "train_tokens": int(self.train_tokens),
        "eval_tokens": int(self.eval_tokens),
        "eval_sequences": self.config.eval_sequences,
        "replicas": self.replicas,
        "batch_size": self.batch_size,
        "seq_len": self.seq_len,
        "tokens_per_step": self.replicas * self.batch_size * self.seq_len,
        "seed": self.config.seed,
    }
    if self.config.distribution == "non-iid":
      out["shard_tokens"] = [int(x) for x in self._shard_len]
    return out


def make_dataset(cfg: DataConfig, *, replicas: int, batch_size: int, seq_len: int,
                 model_vocab_size: int | None = None) -> Dataset:
  """Builds the dataset described by ``cfg`` for ``replicas`` x ``batch_size`` sequences.

  Args:
    cfg: the data config.
    replicas: M, number of DiLoCo replicas (data shards).
    batch_size: sequences per replica per step.
    seq_len: T, scored positions per sequence (each sequence has T + 1 tokens).
    model_vocab_size: the model's vocabulary; token ids must be below it (for .npy it
      is also the dataset's vocabulary).

  Returns:
    A :class:`SyntheticDataset` or :class:`FileDataset`.

  Examples:
    >>> ds = make_dataset(DataConfig(vocab_size=16, order=2, branching=2),
    ...                   replicas=2, batch_size=3, seq_len=8)
    >>> ds.train_batch(0).shape, ds.train_batch(0).dtype, ds.eval_batch().shape
    ((2, 3, 9), dtype('int32'), (64, 9))
    >>> bool(np.array_equal(ds.train_batch(5), ds.train_batch(5)))
    True
    >>> 0 < ds.entropy_rate <= np.log(2) and ds.loss_floor > ds.entropy_rate
    True
  """
  if not isinstance(cfg, DataConfig):
    raise ValueError(f"make_dataset needs a DataConfig, got {type(cfg).__name__}.")
  for name, value in (("replicas", replicas), ("batch_size", batch_size), ("seq_len", seq_len)):
    if not _is_int(value) or value < 1:
      raise ValueError(f"make_dataset {name} must be an integer >= 1, got {value!r}.")
  if model_vocab_size is not None and (not _is_int(model_vocab_size) or model_vocab_size < 1):
    raise ValueError(f"make_dataset model_vocab_size must be None or an integer >= 1, got"
                     f" {model_vocab_size!r}.")
  replicas, batch_size, seq_len = int(replicas), int(batch_size), int(seq_len)
  if cfg.is_synthetic:
    if model_vocab_size is not None and model_vocab_size < cfg.vocab_size:
      raise ValueError(
          f"model vocab_size ({model_vocab_size}) is smaller than DataConfig.vocab_size"
          f" ({cfg.vocab_size}); token ids would fall outside the vocabulary.")
    return SyntheticDataset(cfg, replicas=replicas, batch_size=batch_size, seq_len=seq_len)
  return FileDataset(cfg, replicas=replicas, batch_size=batch_size, seq_len=seq_len,
                     model_vocab_size=model_vocab_size)
