"""Training data: a seeded synthetic language with an exact loss floor, or a local file.

Two kinds of data, both sharded over the :math:`M` DiLoCo replicas and both pure numpy
(the trainer converts batches to JAX arrays):

* **Synthetic** (``DataConfig.source="synthetic"``): a random sparse :math:`k`-th order
  Markov source over a vocabulary of :math:`V` tokens (:class:`MarkovSource`). Its
  stationary distribution is solved to machine precision, so the *entropy rate* and the
  Bayes-optimal cross-entropy of the eval set (the **loss floor** no model can beat)
  are exact numbers, not estimates.
* **Local files** (``DataConfig.source="path/to/file"``): UTF-8 text read as bytes
  (vocabulary 256), a 1-D integer ``.npy`` array of token ids, or a directory of
  ``.npy`` or ArrayRecord shards, read on demand (:mod:`diloco_core.data.files`) and served
  in windows by a Grain pipeline (:mod:`diloco_core.data.grain_data`). Nothing is ever
  downloaded. The last 10% of the tokens are held out for evaluation.

Every batch is a pure function of ``(seed, replica, step)``: each replica's synthetic
sequences come from a counter-based generator ``np.random.default_rng([stream, seed,
replica, step])`` with distinct stream ids for the source tables, training and eval, and
file windows from a seeded, random-access Grain ``MapDataset``, so resuming at step
:math:`t` reproduces the exact batches and train and eval never share draws.

Sharding over replicas (``DataConfig.distribution``):

* ``"iid"``: every replica draws an independent stream of the same distribution (one
  Markov source; for file data, shuffled windows of the whole training split).
* ``"non-iid"``: the heterogeneous setting of the DiLoCo paper. Synthetic data has
  :math:`M` independently drawn sub-sources, one per replica; each of replica
  :math:`m`'s sequences comes from sub-source :math:`m` with probability
  :math:`s` = ``non_iid_share`` and otherwise from a sub-source drawn uniformly from
  all :math:`M` (so :math:`s = 0` is the i.i.d. version of the very same data and
  :math:`s = 1` fully disjoint shards). Every non-iid sequence starts with a *tag*
  token (token id :math:`m` for sub-source :math:`m`) that is only ever an input, so
  the floor stays exact; the eval set is the uniform mixture of the sub-sources. For
  file data, replica :math:`m` reads only the windows of its own contiguous :math:`1/M`
  of the training split.

This module holds the config (:class:`DataConfig`), the synthetic dataset with its replica
sharding (:class:`SyntheticDataset`) and :func:`make_dataset`; the Markov source lives in
:mod:`diloco_core.data.markov`, file data in :mod:`diloco_core.data.files` (token files read on
demand) and :mod:`diloco_core.data.grain_data` (the Grain pipeline), and the batch interface in
:mod:`diloco_core.data.dataset`. Their public names are re-exported here.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib

import numpy as np

from diloco_core.data.dataset import EVAL_STREAM, SOURCE_STREAM, TRAIN_STREAM, Dataset, check_step
from diloco_core.data.grain_data import EVAL_FRACTION, FileDataset
from diloco_core.data.markov import MarkovSource, Tables, de_bruijn
from diloco_core.spec.validity import check_choice, check_int, is_int, is_real

__all__ = [
    "DataConfig", "Dataset", "EVAL_FRACTION", "FileDataset", "MAX_STATES", "MAX_TABLE_ENTRIES",
    "MarkovSource", "SyntheticDataset", "de_bruijn", "make_dataset",
]

from diloco_core.spec import fields

_DISTRIBUTIONS = ("iid", "non-iid")
_BLOCK_TOKENS = 1 << 20  # train tokens sampled in one vectorized pass (4 MiB of int32)

MAX_STATES = 2**20  # largest number of contexts V**k of a synthetic source
MAX_TABLE_ENTRIES = 2**24  # largest V**k * branching (the transition tables' size)


def _field(default, **kw):
  """A data field (:mod:`diloco_core.spec.fields`): in the CLI's data group, must match on resume."""
  return fields.field(default, group="data", must_match=True, **kw)


@dataclasses.dataclass(frozen=True)
class DataConfig:
  """What data to train on and how to shard it over replicas.

  The synthetic-source fields (``vocab_size``, ``order``, ``branching``,
  ``concentration``) are ignored for file data but still validated.
  """

  source: str = _field("synthetic", flag="data", help="'synthetic', a local UTF-8 text file (byte tokens), an .npy of token ids, or a directory of .npy / .array_record shards")
  distribution: str = _field("iid", flag="distribution", help="iid or non-iid replica shards")
  vocab_size: int = _field(64, flag="data-vocab", help="synthetic: vocabulary size V (text files: 256; .npy: the model's)")
  order: int = _field(2, flag="data-order", help="synthetic: Markov order k")
  branching: int = _field(4, flag="data-branching", help="synthetic: allowed next tokens per context")
  concentration: float = _field(0.5, help="Dirichlet concentration of next-token probabilities; inf = uniform")
  non_iid_share: float = _field(0.9, help="non-iid: share of a replica's sequences from its own sub-source")
  eval_sequences: int = _field(64, help="sequences in the fixed held-out eval set")
  seed: int = _field(0, flag="data-seed", help="seed of the synthetic source and of the sampling (independent of the model-init seed)")
  workers: int = fields.field(0, flag="data-workers", group="data", result=False,
                              help="file data: threads reading batches ahead (0: read each when asked); same batches")

  def __post_init__(self):
    if not isinstance(self.source, (str, pathlib.PurePath)) or not str(self.source):
      raise ValueError(
          f"DataConfig.source must be 'synthetic' or a path to a text file, an .npy file or a shard"
          f" directory, got {self.source!r}.")
    check_choice("DataConfig.distribution", self.distribution, _DISTRIBUTIONS)
    for name, low in (("vocab_size", 2), ("order", 1), ("branching", 1), ("eval_sequences", 1),
                      ("seed", 0), ("workers", 0)):
      check_int(f"DataConfig.{name}", getattr(self, name), low=low)
    if self.branching > self.vocab_size:
      raise ValueError(
          f"DataConfig.branching must be in [1, vocab_size={self.vocab_size}], got {self.branching!r}.")
    c = self.concentration
    uniform = isinstance(c, (float, np.floating)) and c == math.inf
    if not uniform and not (is_real(c) and c > 0):
      raise ValueError(f"DataConfig.concentration must be > 0 (or inf for uniform), got {c!r}.")
    s = self.non_iid_share
    if not is_real(s) or not 0.0 <= s <= 1.0:
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
    self.local_replicas = tuple(range(replicas))  # draws every row (nothing is read)
    self.vocab_size = cfg.vocab_size
    self.tagged = cfg.distribution == "non-iid"
    if self.tagged and replicas > cfg.vocab_size:
      raise ValueError(
          f"non-iid synthetic data tags each sequence with its sub-source's token id, so it"
          f" needs replicas ({replicas}) <= DataConfig.vocab_size ({cfg.vocab_size}).")
    num_sources = replicas if self.tagged else 1
    self.sources = [
        MarkovSource.random(vocab_size=cfg.vocab_size, order=cfg.order, branching=cfg.branching,
                            concentration=cfg.concentration, seed=[SOURCE_STREAM, cfg.seed, m, 0])
        for m in range(num_sources)
    ]
    self._tables = Tables(self.sources)
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
    self._block_start, self._block = None, None  # the block of train batches last drawn
    rng = np.random.default_rng([EVAL_STREAM, cfg.seed, 0, 0])
    self._eval = self._draw(self._eval_which, rng.random(n), rng.random((n, self._steps)))

  def _draw(self, which, u_start, u_next) -> np.ndarray:
    body = self._tables.sample(which, u_start, u_next)[:, :self._body]
    if not self.tagged:
      return body
    return np.concatenate([which.astype(np.int32)[:, None], body], axis=1)

  def train_batch(self, step: int) -> np.ndarray:
    """Training sequences of every replica at ``step``.

    Each (replica, step) has its own random stream, and the sampler treats every sequence
    on its own, so the batch of a step is the same whichever steps are drawn with it: the
    steps of one aligned block of :attr:`block_steps` are sampled in one vectorized pass
    (the per-token loop of the sampler runs once per block, not once per step) and the
    block is kept until a step outside it is asked for.

    Args:
      step: the global training (inner) step, >= 0.

    Returns:
      int32 array [replicas, batch_size, seq_len + 1].
    """
    step = check_step(step)
    start = step - step % self.block_steps
    if self._block_start != start:
      self._block = self._draw_steps(range(start, start + self.block_steps))
      self._block_start = start
    return self._block[step - start].copy()

  @property
  def block_steps(self) -> int:
    """Steps sampled together: up to 16, at most about 2**20 tokens per block."""
    per_step = self.replicas * self.batch_size * (self.seq_len + 1)
    return max(1, min(16, _BLOCK_TOKENS // per_step))

  def _draw_steps(self, steps: range) -> np.ndarray:
    """Batches [len(steps), replicas, batch_size, seq_len + 1] of the given steps."""
    cfg, b = self.config, self.batch_size
    which, u_start, u_next = [], [], []
    for step in steps:
      for r in range(self.replicas):
        rng = np.random.default_rng([TRAIN_STREAM, cfg.seed, r, step])
        if self.tagged:
          own = rng.random(b) < cfg.non_iid_share
          which.append(np.where(own, r, rng.integers(0, self.replicas, size=b)))
        else:
          which.append(np.zeros(b, dtype=np.int64))
        u_start.append(rng.random(b))
        u_next.append(rng.random((b, self._steps)))
    x = self._draw(np.concatenate(which), np.concatenate(u_start), np.concatenate(u_next))
    return x.reshape(len(steps), self.replicas, b, self.seq_len + 1)

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


def make_dataset(cfg: DataConfig, *, replicas: int, batch_size: int, seq_len: int,
                 model_vocab_size: int | None = None, local_replicas=None) -> Dataset:
  """Builds the dataset described by ``cfg`` for ``replicas`` x ``batch_size`` sequences.

  Args:
    cfg: the data config.
    replicas: M, number of DiLoCo replicas (data shards).
    batch_size: sequences per replica per step.
    seq_len: T, scored positions per sequence (each sequence has T + 1 tokens).
    model_vocab_size: the model's vocabulary; token ids must be below it (for .npy it
      is also the dataset's vocabulary).
    local_replicas: the replicas this process trains (None: all); file data reads only
      their shards (see :class:`~diloco_core.data.grain_data.FileDataset`). Synthetic data
      draws every replica's rows (it reads nothing).

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
    check_int(f"make_dataset {name}", value)
  if model_vocab_size is not None and (not is_int(model_vocab_size) or model_vocab_size < 1):
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
                     model_vocab_size=model_vocab_size, local_replicas=local_replicas)
