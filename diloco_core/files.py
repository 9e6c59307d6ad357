"""Training data from a local file: UTF-8 text read as bytes, or an ``.npy`` of token ids.

Nothing is ever downloaded. Text is tokenized as bytes (vocabulary 256); an ``.npy`` file
holds a 1-D integer array of token ids. The last 10% of the tokens (at least one sequence)
are held out for evaluation; training crops are drawn per replica from the rest
(:class:`FileDataset`).
"""

from __future__ import annotations

import math
import pathlib

import numpy as np

from diloco_core.dataset import _TRAIN_STREAM, Dataset, check_step

EVAL_FRACTION = 0.1  # share of a file's tokens held out for evaluation
_HINT = "use 'synthetic' or a path to a UTF-8 text file or an .npy file of token ids"


def _load_tokens(source: str, model_vocab_size: int | None) -> tuple[np.ndarray, str, int]:
  """Reads a text or .npy file into int32 token ids; returns (tokens, kind, vocab_size)."""
  path = pathlib.Path(source)
  if not path.exists():
    raise FileNotFoundError(f"DataConfig.source: no such file {str(path)!r} ({_HINT}).")
  if not path.is_file():
    raise ValueError(f"DataConfig.source: {str(path)!r} is not a regular file ({_HINT}).")
  if path.suffix.lower() == ".npy":
    ids, vocab = _load_npy(path, model_vocab_size)
    return ids.astype(np.int32), "npy", int(vocab)
  ids = _load_text(path, model_vocab_size)
  return ids.astype(np.int32), "text", 256


def _load_npy(path: pathlib.Path, model_vocab_size: int | None) -> tuple[np.ndarray, int]:
  """A 1-D integer .npy of token ids and its vocabulary (the model's, or the largest id + 1)."""
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
  return ids, vocab


def _load_text(path: pathlib.Path, model_vocab_size: int | None) -> np.ndarray:
  """The bytes of a UTF-8 text file as token ids (vocabulary 256)."""
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
  high = int(ids.max())
  if model_vocab_size is not None and high >= model_vocab_size:
    raise ValueError(
        f"DataConfig.source: {str(path)!r} has byte token {high} outside the model vocabulary"
        f" [0, {model_vocab_size}); byte-level text needs vocab_size 256.")
  return ids


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
    step = check_step(step)
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
