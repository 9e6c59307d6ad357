"""Memory footprint: the bytes a run's state and largest activation need, checked up front.

One formula for the trainer's up-front check (:func:`check_fits`) and for
:func:`analysis.planning.memory.memory_per_replica` (:func:`replica_state_bytes`), so that a
``replicas``, ``batch_size`` or ``n_layers`` far beyond the devices is refused in one line
before the model is built, not by the allocator after compiling.

The same bytes size the largest payloads an elastic run sends over its data plane
(:func:`elastic_value_bytes`: a heal, a process's checkpoint rows, a sync payload); they cross
in chunks, so no size limit applies beyond memory.
"""

from __future__ import annotations

import os

from diloco_core.spec.validity import OUTER_OPTIMIZERS, check_choice

#: Model-sized copies of state each outer optimizer keeps (:mod:`diloco_core.algorithm.optimizers`):
#: ``optax.sgd`` with momentum (``nesterov``; ``sgd``, whose μ is always given, so μ = 0 too)
#: keeps one trace, ``optax.adam`` two (m and v; its step count is a scalar, not counted).
OUTER_STATE_COPIES = {"nesterov": 1, "sgd": 1, "adam": 2}


def replica_state_bytes(n: float, *, outer: bool, outer_optimizer: str = "nesterov", param_bytes=4,
                        grad_bytes=4, optimizer_bytes=8, outer_bytes=4) -> dict[str, float]:
  """Bytes one replica holds for a model of ``n`` parameters (activations excluded).

  .. math::
     N(b_\\theta + b_g + b_\\text{Adam}) + [\\text{outer}]\\, (1 + k_\\text{outer}) N b_\\text{outer}

  with :math:`k_\\text{outer}` the outer optimizer's model-sized state copies
  (:data:`OUTER_STATE_COPIES`: 1 for ``nesterov`` and ``sgd``, 2 for ``adam``).

  Args:
    n: parameter count N.
    outer: whether the replica also holds θ_g and the outer optimizer's state (DiLoCo, Streaming).
    outer_optimizer: ``nesterov``, ``sgd`` or ``adam`` (:data:`~diloco_core.spec.validity.OUTER_OPTIMIZERS`).
    param_bytes: bytes per local parameter.
    grad_bytes: bytes per gradient value.
    optimizer_bytes: bytes of inner optimizer state per parameter (8: AdamW's m and v in fp32).
    outer_bytes: bytes per value of θ_g and of each outer state copy.

  Returns:
    ``params``, ``grads``, ``optimizer``, ``outer_params``, ``outer_momentum`` (the outer
    optimizer's whole state) in bytes.

  Examples:
    >>> sum(replica_state_bytes(1e6, outer=True).values()) / 1e6  # 4 + 4 + 8 + 4 + 1 x 4
    24.0
    >>> replica_state_bytes(10**6, outer=True, outer_optimizer="adam")["outer_momentum"]  # 2 x 4 x 10^6
    8000000
    >>> replica_state_bytes(10**6, outer=False, outer_optimizer="adam")["outer_momentum"]  # DP: no outer step
    0.0
  """
  check_choice("outer_optimizer", outer_optimizer, OUTER_OPTIMIZERS)
  o = n * outer_bytes if outer else 0.0
  return dict(params=n * param_bytes, grads=n * grad_bytes, optimizer=n * optimizer_bytes,
              outer_params=o, outer_momentum=OUTER_STATE_COPIES[outer_optimizer] * o)


def device_bytes(devices: int) -> float:
  """The memory of ``devices`` devices (accelerators: ``devices`` times the ``bytes_limit`` of
  one of this process's devices; CPU: the host's physical memory, shared by all of them)."""
  import jax  # here, not at the top: the planning library imports this module without JAX

  # Only this process's devices report memory (multi-process runs): devices are taken as alike.
  stats = jax.local_devices()[0].memory_stats() or {}
  if "bytes_limit" in stats:
    return float(stats["bytes_limit"]) * devices
  return host_bytes()


def host_bytes() -> float:
  """The host's physical memory in bytes (what every process on this machine shares)."""
  return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def check_fits(n_params: int, *, replicas: int, outer: bool, tokens: int, vocab: int,
               devices: int = 1, available: float | None = None, experts: int = 1,
               outer_optimizer: str = "nesterov", activations: float | None = None,
               remat: str = "none") -> None:
  """Raises a one-line ``ValueError`` when the state and a step's activations cannot fit in memory.

  The estimate is a lower bound: every replica's :func:`replica_state_bytes` (the global
  copy and momentum counted once), plus either the float32 logits of one step (``tokens`` =
  M·b·T tokens × V) or, when ``activations`` is given, all replicas' activation bytes of a
  step (:func:`diloco_core.spec.activations.step_activation_bytes` times M: they are live
  at once), logits included. ``experts`` (E of a mixture of experts) only adds
  `num_experts` to the options the message tells to lower when E > 1; ``outer_optimizer``
  sizes the outer state; ``remat`` other than ``block`` adds it to those options.

  Examples:
    >>> check_fits(10**6, replicas=10**12, outer=True, tokens=10**12 * 32, vocab=32, available=64e9)
    Traceback (most recent call last):
    ...
    ValueError: the run needs at least 1.6e+10 GB (training state 1.6e+10 GB for `replicas`=1000000000000 copies of 1000000 params; logits 4.1e+06 GB for M·b·T=32000000000000 tokens) but the device(s) have 64 GB; lower `replicas`, `batch_size`, `seq_len` or `n_layers`.
    >>> check_fits(10**8, replicas=2, outer=True, tokens=2 * 8 * 1024, vocab=32768, available=16e9,
    ...            activations=13e9, remat="dots")
    Traceback (most recent call last):
    ...
    ValueError: the run needs at least 17 GB (training state 4 GB for `replicas`=2 copies of 100000000 params; activations 13 GB for M·b·T=16384 tokens with `remat` dots) but the device(s) have 16 GB; set `remat` to 'block' or lower `replicas`, `batch_size`, `seq_len` or `n_layers`.
  """
  per = replica_state_bytes(n_params, outer=outer, outer_optimizer=outer_optimizer)
  state = replicas * (per["params"] + per["grads"] + per["optimizer"]) + per["outer_params"] + per["outer_momentum"]
  step = 4.0 * tokens * vocab if activations is None else float(activations)
  what = (f"logits {gb(step)} for M·b·T={tokens} tokens" if activations is None else
          f"activations {gb(step)} for M·b·T={tokens} tokens with `remat` {remat}")
  available = device_bytes(devices) if available is None else available
  if state + step > available:
    remedy = "" if activations is None or remat == "block" else "set `remat` to 'block' or "
    raise ValueError(
        f"the run needs at least {gb(state + step)} (training state {gb(state)} for `replicas`={replicas}"
        f" copies of {n_params} params; {what}) but the device(s) have {gb(available)}; {remedy}lower"
        f" `replicas`, `batch_size`, `seq_len`"
        f"{', `n_layers` or `num_experts`' if experts > 1 else ' or `n_layers`'}.")


def gb(x: float) -> str:
  """Bytes as the refusals print them (two significant digits, decimal GB).

  Examples:
    >>> gb(1.234e9), gb(5e12)
    ('1.2 GB', '5e+03 GB')
  """
  return f"{x / 1e9:.2g} GB"


def elastic_value_bytes(n: float, *, replicas_per_process: int, outer_optimizer: str = "nesterov",
                        error_feedback: bool = False, checkpoints: bool = False) -> dict[str, float]:
  """Bytes of the largest payloads an elastic run sends over its data plane, for N params.

  Each crosses peer to peer in chunks (:mod:`diloco_core.runtime.data_plane`), from the
  bytes of :func:`replica_state_bytes` (float32 params, 8 bytes of AdamW moments per param,
  :data:`OUTER_STATE_COPIES`), m = ``replicas_per_process``:

  * ``heal``: the global params, the outer state and one replica's inner optimizer state,
    :math:`N (4 + 4 k_\\text{outer} + 8)`;
  * ``checkpoint`` (``checkpoint_every`` set, else 0): a process's rows of the replica fields,
    :math:`m N (4 + 8 + 4 [\\text{error feedback}])`;
  * ``sync``: a process's payload, at most its replicas' float32 pseudo-gradients of the whole
    model, :math:`4 m N` (a compressed format or a fragment sends less).

  Step counts and the participation rows (a few bytes per replica, whatever N) are left out.
  Muon's inner state is smaller than AdamW's: the bytes are then an upper bound.

  Args:
    n: parameter count N.
    replicas_per_process: m, the replicas of one process (M / processes).
    outer_optimizer: ``nesterov``, ``sgd`` or ``adam``.
    error_feedback: the replicas keep an error-feedback residual (float32, shaped like the params).
    checkpoints: the run writes checkpoints (``checkpoint_every``).

  Returns:
    ``{"heal", "checkpoint", "sync"}`` in bytes.

  Examples:
    >>> elastic_value_bytes(10**6, replicas_per_process=2, checkpoints=True)
    {'heal': 16000000, 'checkpoint': 24000000, 'sync': 8000000}
    >>> elastic_value_bytes(10**6, replicas_per_process=1, outer_optimizer="adam")["heal"]  # 4 + 2 x 4 + 8
    20000000
  """
  s = replica_state_bytes(n, outer=True, outer_optimizer=outer_optimizer)
  rows = s["params"] + s["optimizer"] + (s["params"] if error_feedback else 0)  # the residual: float32
  return {"heal": s["outer_params"] + s["outer_momentum"] + s["optimizer"],
          "checkpoint": replicas_per_process * rows if checkpoints else 0,
          "sync": replicas_per_process * s["params"]}
