"""File data through a Grain pipeline: windows read on demand, replica shards, seeded shuffle.

A local file or shard directory (:func:`~diloco_core.data.files.open_tokens`) is one stream
of :math:`N` token ids. The last :math:`N_e = \\max(\\lceil 0.1 N \\rceil, T + 1)` are
held out for evaluation; the first :math:`N_t = N - N_e` are cut into
:math:`W = \\lfloor (N_t - 1) / T \\rfloor` training windows of :math:`T + 1` tokens
with stride :math:`T`,

.. math::
   \\text{window}_i = \\text{tokens}[iT,\\ iT + T + 1), \\qquad 0 \\le i < W,

so consecutive windows share one token (the last target of one is the first input of the
next) and every training token after the first is a target exactly once per epoch.

Each replica reads a Grain ``MapDataset``: ``range(lo, hi).shuffle(seed).repeat()``,
then ``map`` (read the window from the file) and ``batch(batch_size)``. Epoch
:math:`e` of the shuffle is a fresh permutation (Grain seeds it with ``seed + e``), and a
batch may span two epochs. Sharding over the :math:`M` replicas (``DataConfig.distribution``):

* ``"iid"``: one stream over all :math:`W` windows; replica :math:`m` at step :math:`s`
  takes batch :math:`sM + m` of it, so every replica samples the whole split and the
  replicas never share a window within an epoch.
* ``"non-iid"``: replica :math:`m` owns the contiguous windows
  :math:`[\\lfloor mW/M \\rfloor, \\lfloor (m+1)W/M \\rfloor)`, its own contiguous
  :math:`1/M` of the training split, shuffled with its own seed; it takes batch
  :math:`s` of its stream at step :math:`s`.

A ``MapDataset`` is random access, so the batch of step :math:`s` is a pure function of
``(source, seed, s)``: resuming at step :math:`s` (the ``data_position`` in a
checkpoint) reproduces the exact batches, in any call order. Only the rows of
``local_replicas`` are read (a process reads only its replicas' shards; the others are
zeros, which the mesh never reads). With ``DataConfig.workers`` :math:`> 0`, batches of
the following steps are read ahead by that many threads (Grain's ``to_iter_dataset``
with ``ReadOptions(num_threads=...)``); they are the same batches.

The eval set is ``eval_sequences`` evenly spaced windows of the held-out tail
(overlapping when the tail is short), read once.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING

import numpy as np

from diloco_core.data.dataset import TRAIN_STREAM, Dataset, check_step
from diloco_core.data.files import TokenStore, open_tokens

if TYPE_CHECKING:  # imported where a pipeline is built: synthetic runs never load Grain
  import grain

EVAL_FRACTION = 0.1  # share of a file's tokens held out for evaluation


def _shuffle_seed(seed: int, replica: int) -> int:
  """A 32-bit Grain shuffle seed from the data seed and the stream (``replica``, -1: shared)."""
  return int(np.random.default_rng([TRAIN_STREAM, seed, replica + 1]).integers(2**32))


class FileDataset(Dataset):
  """Windows of a local token file (read on demand), shuffled and batched by Grain.

  See the module docstring for the windows, the eval split and the replica shards.

  Attributes:
    store: the :class:`~diloco_core.data.files.TokenStore` (files read with ``os.pread``).
    kind: the store's kind (``"text"``, ``"npy"``, ``"npy-shards"``, ...).
    train_tokens: :math:`N_t`, tokens before the held-out tail.
    eval_tokens: :math:`N_e`.
    windows: :math:`W`, training windows.
    local_replicas: the replicas whose rows :meth:`train_batch` fills.
    pipelines: replica -> (Grain ``MapDataset`` of batches, batch index at step 0, stride).

  Examples:
    >>> import tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "ids.npy")
    >>> np.save(path, np.arange(100))
    >>> from diloco_core.data.sources import DataConfig
    >>> ds = FileDataset(DataConfig(source=path), replicas=2, batch_size=3, seq_len=4,
    ...                  model_vocab_size=None)
    >>> ds.windows, ds.train_tokens, ds.eval_tokens  # (90 - 1) // 4 windows of 5 tokens
    (22, 90, 10)
    >>> x = ds.train_batch(7)
    >>> x.shape, x.dtype, bool(np.all(x[..., 0] % 4 == 0) and np.all(np.diff(x, axis=-1) == 1))
    ((2, 3, 5), dtype('int32'), True)
  """

  def __init__(self, cfg, *, replicas: int, batch_size: int, seq_len: int,
               model_vocab_size: int | None, local_replicas=None):
    self.config = cfg
    self.replicas, self.batch_size, self.seq_len = replicas, batch_size, seq_len
    self.local_replicas = _check_local(local_replicas, replicas)
    self.path = str(cfg.source)
    self.store: TokenStore = open_tokens(self.path, model_vocab_size)
    self.kind, self.vocab_size = self.store.kind, self.store.vocab_size
    n, w = len(self.store), seq_len + 1
    n_eval = max(math.ceil(EVAL_FRACTION * n), w)
    n_train = n - n_eval
    if n_train < w:
      raise ValueError(
          f"DataConfig.source: {self.path!r} has {n} tokens, too short for seq_len {seq_len}: need"
          f" at least {n_eval + w} ({w} to train on plus {n_eval} held out for eval).")
    self.train_tokens, self.eval_tokens = n_train, n_eval
    self.windows = (n_train - 1) // seq_len
    self._bounds = self._shard_bounds()
    self.pipelines = {r: self._pipeline(r) for r in self.local_replicas}
    starts = np.round(np.linspace(0, n_eval - w, cfg.eval_sequences)).astype(np.int64) + n_train
    self._eval = np.stack([self.store.read(int(a), int(a) + w) for a in starts])
    self._ahead = None  # (next step, iterator) when reading ahead

  def _shard_bounds(self) -> list[tuple[int, int]]:
    """Window range of each replica: all of them (iid) or a contiguous 1/M (non-iid)."""
    M, W = self.replicas, self.windows
    if self.config.distribution != "non-iid":
      return [(0, W)] * M
    bounds = [(m * W // M, (m + 1) * W // M) for m in range(M)]
    if min(hi - lo for lo, hi in bounds) < 1:
      raise ValueError(
          f"DataConfig.source: non-iid shards of {self.path!r} hold {W // M} windows of seq_len + 1"
          f" = {self.seq_len + 1} tokens for {M} replicas; use fewer replicas, a shorter seq_len,"
          " more data or distribution='iid'.")
    return bounds

  def _read_window(self, i: int) -> np.ndarray:
    return self.store.read(i * self.seq_len, i * self.seq_len + self.seq_len + 1)

  def _pipeline(self, replica: int) -> tuple[grain.MapDataset, int, int]:
    """(batches of ``replica``'s stream, its batch index at step 0, batches per step)."""
    import grain  # pylint: disable=import-outside-toplevel,redefined-outer-name
    shared = self.config.distribution != "non-iid"
    lo, hi = self._bounds[replica]
    ds = (grain.MapDataset.range(lo, hi)
          .shuffle(seed=_shuffle_seed(self.config.seed, -1 if shared else replica))
          .repeat()
          .map(self._read_window)
          .batch(self.batch_size, drop_remainder=True))
    return (ds, replica, self.replicas) if shared else (ds, 0, 1)

  def _batch_at(self, step: int) -> np.ndarray:
    out = np.zeros((self.replicas, self.batch_size, self.seq_len + 1), np.int32)
    for r, (ds, first, stride) in self.pipelines.items():
      out[r] = ds[first + stride * step]
    return out

  def train_batch(self, step: int) -> np.ndarray:
    """Training windows of every local replica at ``step`` (other replicas' rows are 0).

    Args:
      step: training step, >= 0.

    Returns:
      int32 array [replicas, batch_size, seq_len + 1], a pure function of (source,
      seed, step).
    """
    step = check_step(step)
    workers = self.config.workers
    if workers == 0:
      return self._batch_at(step)
    if self._ahead is None or self._ahead[0] != step:  # first call, or a jump: restart there
      import grain  # pylint: disable=import-outside-toplevel,redefined-outer-name
      steps = grain.MapDataset.range(step, sys.maxsize).map(self._batch_at)
      options = grain.ReadOptions(num_threads=workers, prefetch_buffer_size=2 * workers)
      self._ahead = [step, iter(steps.to_iter_dataset(options))]
    self._ahead[0] += 1
    return next(self._ahead[1])

  def eval_batch(self) -> np.ndarray:
    return self._eval.copy()

  def describe(self) -> dict:
    out = {
        "kind": self.kind,
        "path": self.path,
        "files": len(self.store.paths),
        "distribution": self.config.distribution,
        "vocab_size": self.vocab_size,
        "loss_floor": None,
        "entropy_rate": None,
        "tokens_available": len(self.store),
        "train_tokens": int(self.train_tokens),
        "eval_tokens": int(self.eval_tokens),
        "train_windows": self.windows,
        "eval_sequences": self.config.eval_sequences,
        "replicas": self.replicas,
        "batch_size": self.batch_size,
        "seq_len": self.seq_len,
        "tokens_per_step": self.replicas * self.batch_size * self.seq_len,
        "seed": self.config.seed,
        "workers": self.config.workers,
    }
    if self.config.distribution == "non-iid":
      out["shard_windows"] = [hi - lo for lo, hi in self._bounds]
    return out


def _check_local(local_replicas, replicas: int) -> tuple[int, ...]:
  """``local_replicas`` as a sorted tuple of distinct replica ids in ``[0, replicas)``; None: all."""
  if local_replicas is None:
    return tuple(range(replicas))
  ids = sorted({int(r) for r in local_replicas})
  if not ids or ids[0] < 0 or ids[-1] >= replicas or len(ids) != len(list(local_replicas)):
    raise ValueError(f"local_replicas must be distinct replica ids in [0, {replicas}), got"
                     f" {list(local_replicas)!r}.")
  return tuple(ids)
