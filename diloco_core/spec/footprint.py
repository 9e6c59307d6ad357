"""Memory footprint: the bytes a run's state and largest activation need, checked up front.

One formula for the trainer's up-front check (:func:`check_fits`) and for
:func:`analysis.planning.memory.memory_per_replica` (:func:`replica_state_bytes`), so that a
``replicas``, ``batch_size`` or ``n_layers`` far beyond the devices is refused in one line
before the model is built, not by the allocator after compiling.
"""

from __future__ import annotations

import os


def replica_state_bytes(n: float, *, outer: bool, param_bytes=4, grad_bytes=4, optimizer_bytes=8,
                        outer_bytes=4) -> dict[str, float]:
  """Bytes one replica holds for a model of ``n`` parameters (activations excluded).

  .. math::
     N(b_\\theta + b_g + b_\\text{Adam}) + [\\text{outer}]\\, 2 N b_\\text{outer}

  Args:
    n: parameter count N.
    outer: whether the replica also holds θ_g and the outer momentum (DiLoCo, Streaming).
    param_bytes, grad_bytes, optimizer_bytes, outer_bytes: bytes per value.

  Returns:
    ``params``, ``grads``, ``optimizer``, ``outer_params``, ``outer_momentum`` in bytes.

  Examples:
    >>> sum(replica_state_bytes(1e6, outer=True).values()) / 1e6  # 4 + 4 + 8 + 4 + 4
    24.0
  """
  o = n * outer_bytes if outer else 0.0
  return dict(params=n * param_bytes, grads=n * grad_bytes, optimizer=n * optimizer_bytes,
              outer_params=o, outer_momentum=o)


def device_bytes(devices: int) -> float:
  """The memory of ``devices`` devices (accelerators: ``devices`` times the ``bytes_limit`` of
  one of this process's devices; CPU: the host's physical memory, shared by all of them)."""
  import jax  # here, not at the top: the planning library imports this module without JAX

  # Only this process's devices report memory (multi-process runs): devices are taken as alike.
  stats = jax.local_devices()[0].memory_stats() or {}
  if "bytes_limit" in stats:
    return float(stats["bytes_limit"]) * devices
  return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def check_fits(n_params: int, *, replicas: int, outer: bool, tokens: int, vocab: int,
               devices: int = 1, available: float | None = None, experts: int = 1) -> None:
  """Raises a one-line ``ValueError`` when the state and logits cannot fit in memory.

  The estimate is a lower bound: every replica's :func:`replica_state_bytes` (the global
  copy and momentum counted once), plus the float32 logits of one step (``tokens`` = M·b·T
  tokens × V). ``experts`` (E of a mixture of experts) only adds `num_experts` to the options
  the message tells to lower when E > 1.

  Examples:
    >>> check_fits(10**6, replicas=10**12, outer=True, tokens=10**12 * 32, vocab=32, available=64e9)
    Traceback (most recent call last):
    ...
    ValueError: the run needs at least 1.6e+10 GB (training state 1.6e+10 GB for `replicas`=1000000000000 copies of 1000000 params; logits 4.1e+06 GB for M·b·T=32000000000000 tokens) but the device(s) have 64 GB; lower `replicas`, `batch_size`, `seq_len` or `n_layers`.
  """
  per = replica_state_bytes(n_params, outer=outer)
  state = replicas * (per["params"] + per["grads"] + per["optimizer"]) + per["outer_params"] + per["outer_momentum"]
  logits = 4.0 * tokens * vocab
  available = device_bytes(devices) if available is None else available
  if state + logits > available:
    gb = lambda x: f"{x / 1e9:.2g} GB"
    raise ValueError(
        f"the run needs at least {gb(state + logits)} (training state {gb(state)} for `replicas`={replicas}"
        f" copies of {n_params} params; logits {gb(logits)} for M·b·T={tokens} tokens) but the"
        f" device(s) have {gb(available)}; lower `replicas`, `batch_size`, `seq_len`"
        f"{', `n_layers` or `num_experts`' if experts > 1 else ' or `n_layers`'}.")
