"""The batch interface shared by every dataset, and the random streams behind it.

Every batch is a pure function of ``(seed, replica, step)``: each replica's synthetic
sequences come from a counter-based generator ``np.random.default_rng([stream, seed, replica, step])``
whose first word is one of the stream ids below, so resuming at step :math:`t` reproduces
the exact batches and the source tables, training and eval never share draws. (File data
is shuffled by Grain with seeds drawn from the training stream: :mod:`diloco_core.data.grain_data`.)
"""

from __future__ import annotations

import numpy as np

from diloco_core.spec.validity import check_int

# Stream ids: the first word of every generator key, so the source tables, the
# training batches and the eval set are drawn from disjoint random streams.
TRAIN_STREAM = 0
EVAL_STREAM = 1
SOURCE_STREAM = 2


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
    local_replicas: the replicas whose rows ``train_batch`` fills: in a multi-process
      run, the ones on this process's devices (file data reads only their shards; the
      other rows are zeros, never read by the mesh); all of them in one process.
  """

  vocab_size: int
  replicas: int
  batch_size: int
  seq_len: int
  loss_floor: float | None = None
  entropy_rate: float | None = None
  local_replicas: tuple[int, ...]

  def train_batch(self, step: int) -> np.ndarray:
    """int32 [M, batch_size, seq_len + 1], a pure function of (seed, replica, step)."""
    raise NotImplementedError

  def eval_batch(self) -> np.ndarray:
    """int32 [eval_sequences, seq_len + 1], the same held-out set on every call."""
    raise NotImplementedError

  def describe(self) -> dict:
    """A JSON-able summary of the data."""
    raise NotImplementedError


def check_step(step) -> int:
  """``step`` as an ``int`` if it is an integer >= 0; else a one-line ValueError.

  Examples:
    >>> check_step(np.int64(3))
    3
    >>> check_step(-1)
    Traceback (most recent call last):
    ...
    ValueError: train_batch step must be an integer >= 0, got -1.
  """
  return check_int("train_batch step", step, low=0)
