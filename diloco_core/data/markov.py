"""A seeded sparse k-th order Markov source whose entropy rate and loss floor are exact.

The synthetic language of the trainer (``DataConfig.source="synthetic"``): a random sparse
:math:`k`-th order Markov source over a vocabulary of :math:`V` tokens
(:class:`MarkovSource`). Its stationary distribution is solved to machine precision, so the
*entropy rate* and the Bayes-optimal cross-entropy of an eval set (the **loss floor** no
model can beat) are exact numbers, not estimates. Pure numpy and scipy; sharding over
replicas is :mod:`diloco_core.data.sources`'s job.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.sparse
import scipy.sparse.csgraph
import scipy.sparse.linalg

_SMOOTHING = 1e-3  # share of uniform mass mixed into every context's next-token law
_STATIONARY_TOL = 1e-12  # required L1 residual of the stationary distribution


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

  Attributes:
    cum: float64 [V**k, b], each context's cumulative next-token probabilities (last column
      exactly 1.0), what ``Tables`` samples from.
    cum_stationary: float64 [V**k], the cumulative stationary distribution (last entry exactly
      1.0), what a sequence's start context is drawn from.

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
    self.cum = cum / cum[:, -1:]  # last column exactly 1.0, so a draw u < 1 always lands
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
    self.cum_stationary = cum_pi / cum_pi[-1]
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
    return Tables([self]).sample(np.zeros(num, dtype=np.int64), u_start, u_next)[:, :length]


class Tables:
  """The next-token tables of one or more sources of equal (V, k, b), stacked for sampling."""

  def __init__(self, sources: list[MarkovSource]):
    first = sources[0]
    self.vocab_size, self.order = first.vocab_size, first.order
    self.states = self.vocab_size**self.order
    self.sources = sources
    self.next_tokens = np.concatenate([s.next_tokens for s in sources])
    self.cum = np.concatenate([s.cum for s in sources])

  def sample(self, which: np.ndarray, u_start: np.ndarray, u_next: np.ndarray) -> np.ndarray:
    """Sequences [N, k + L] of sources ``which`` [N] from uniforms [N] and [N, L]."""
    n, steps = u_next.shape
    v, k, s = self.vocab_size, self.order, self.states
    state = np.empty(n, dtype=np.int64)
    for m in np.unique(which):
      mask = which == m
      state[mask] = np.searchsorted(self.sources[m].cum_stationary, u_start[mask], side="right")
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
