"""What the trainer does differently on a GPU or TPU: defaults, kernels and determinism.

The numbers of a run are a function of its config on every backend; what the backend
changes is the defaults and which kernels compute them:

==========================  ===================  ==========================================
setting                     CPU                  GPU / TPU
==========================  ===================  ==========================================
compute dtype (forward)     ``float32``          ``bfloat16`` (:func:`default_compute_dtype`)
attention ``"auto"``        XLA                  cuDNN on a GPU in bf16 with head dim a
                                                 multiple of 8 and <= 128, XLA otherwise
main job (compare) steps    1500                 3000 (:func:`default_demo_steps`)
deterministic XLA ops       (always)             ``--xla_gpu_deterministic_ops=true``
                                                 unless ``DILOCO_NONDETERMINISTIC=1``
==========================  ===================  ==========================================

Master params, inner-optimizer state, outer params and momentum, pseudo-gradients and
error-feedback residuals are float32 on every backend; only the forward (and backward)
pass of the model computes in the compute dtype.

:func:`configure_determinism` must run before JAX starts its backend (before the first
array is made or device listed): the command-line entry points, the notebooks and the
benchmarks call it first.
"""

from __future__ import annotations

import dataclasses
import os
import warnings

import jax
from jax._src import xla_bridge

from diloco_core.spec.model_config import COMPUTE_DTYPES, ModelConfig
from diloco_core.spec.validity import check_choice

#: Setting this environment variable to 1 keeps XLA's fast non-deterministic GPU kernels.
NONDETERMINISTIC_ENV = "DILOCO_NONDETERMINISTIC"
#: Names a compute dtype (``float32`` or ``bfloat16``) that overrides the backend's default (a
#: config that names one wins). The test suite sets float32, so its exact numbers hold on every backend.
COMPUTE_DTYPE_ENV = "DILOCO_COMPUTE_DTYPE"
DETERMINISTIC_FLAG = "--xla_gpu_deterministic_ops=true"
ACCELERATORS = ("gpu", "tpu")


def platform() -> str:
  """The platform JAX computes on: ``"cpu"``, ``"gpu"`` or ``"tpu"`` (starts the backend)."""
  return jax.default_backend()


def default_compute_dtype(platform_name: str | None = None) -> str:
  """The forward pass's dtype when the config leaves it None: bfloat16 on GPU/TPU, float32 on CPU.

  The environment variable ``DILOCO_COMPUTE_DTYPE`` (``float32`` or ``bfloat16``), when
  set, overrides the platform's default.

  Args:
    platform_name: ``"cpu"``, ``"gpu"`` or ``"tpu"``; default: JAX's default backend.

  Examples:
    >>> saved = os.environ.pop(COMPUTE_DTYPE_ENV, None)
    >>> default_compute_dtype("cpu"), default_compute_dtype("gpu"), default_compute_dtype("tpu")
    ('float32', 'bfloat16', 'bfloat16')
    >>> os.environ[COMPUTE_DTYPE_ENV] = "float32"  # the test suite's setting
    >>> default_compute_dtype("gpu")
    'float32'
    >>> _ = os.environ.pop(COMPUTE_DTYPE_ENV) if saved is None else os.environ.update(
    ...     {COMPUTE_DTYPE_ENV: saved})
  """
  override = os.environ.get(COMPUTE_DTYPE_ENV)
  if override:
    return check_choice(COMPUTE_DTYPE_ENV, override, COMPUTE_DTYPES)
  name = platform() if platform_name is None else platform_name
  return "bfloat16" if name in ACCELERATORS else "float32"


def default_demo_steps(platform_name: str | None = None) -> int:
  """Inner steps of the main job (``diloco_core.compare``): 3000 on GPU/TPU, 1500 on CPU.

  At H = 30, 1500 steps are 50 outer steps (enough for the outer loop to matter, as in the
  papers) and fit in a few minutes on 2 CPU cores with 32-token sequences; an accelerator
  runs 3000 steps (100 outer steps).

  Args:
    platform_name: ``"cpu"``, ``"gpu"`` or ``"tpu"``; default: JAX's default backend.

  Examples:
    >>> default_demo_steps("cpu"), default_demo_steps("gpu")
    (1500, 3000)
  """
  name = platform() if platform_name is None else platform_name
  return 3000 if name in ACCELERATORS else 1500


def attention_implementation(cfg: ModelConfig, platform_name: str | None = None) -> str:
  """The attention kernel the model uses: ``"xla"`` or ``"cudnn"`` (``jax.nn.dot_product_attention``), or ``"flash"``.

  ``"auto"`` is cuDNN's fused (flash) kernel on a GPU when the compute dtype is bfloat16
  and the head dimension is a multiple of 8 and at most 128, and XLA otherwise.

  Args:
    cfg: the model config (``attention``, ``compute_dtype``, head dimension).
    platform_name: ``"cpu"``, ``"gpu"`` or ``"tpu"``; default: JAX's default backend.

  Returns:
    ``"xla"``, ``"cudnn"`` or ``"flash"`` (asked for by name, on a TPU).

  Raises:
    ValueError: ``attention="cudnn"`` off a GPU, in float32, or with a head dimension cuDNN
      does not support; ``attention="flash"`` off a TPU.

  Examples:
    >>> cfg = ModelConfig(compute_dtype="bfloat16")
    >>> attention_implementation(cfg, "gpu"), attention_implementation(cfg, "cpu")
    ('cudnn', 'xla')
    >>> attention_implementation(ModelConfig(attention="flash"), "cpu")
    Traceback (most recent call last):
    ...
    ValueError: ModelConfig.attention='flash' (the Pallas TPU kernel) runs on a TPU only (this backend is 'cpu'); use 'xla' or 'auto'.
  """
  name = platform() if platform_name is None else platform_name
  if cfg.attention == "flash":
    if name != "tpu":
      raise ValueError(f"ModelConfig.attention='flash' (the Pallas TPU kernel) runs on a TPU only"
                       f" (this backend is {name!r}); use 'xla' or 'auto'.")
    return "flash"
  dtype = cfg.compute_dtype or default_compute_dtype(name)
  problem = None
  if name != "gpu":
    problem = f"it runs on a GPU only (this backend is {name!r})"
  elif dtype != "bfloat16":
    problem = f"it needs compute_dtype 'bfloat16', got {dtype!r}"
  elif cfg.head_dim % 8 or cfg.head_dim > 128:
    problem = f"it needs a head dimension that is a multiple of 8 and <= 128, got {cfg.head_dim}"
  if cfg.attention == "cudnn" and problem:
    raise ValueError(f"ModelConfig.attention='cudnn' is not available: {problem}; use 'xla' or 'auto'.")
  if cfg.attention == "xla" or problem:
    return "xla"
  return "cudnn"


def resolve_model_config(cfg: ModelConfig, platform_name: str | None = None) -> ModelConfig:
  """``cfg`` with the backend's defaults filled in: a concrete compute dtype and attention kernel.

  Runs print and record this resolved config, so that a run says what it computed with.

  Args:
    cfg: the model config (``compute_dtype`` None and ``attention="auto"`` get resolved).
    platform_name: ``"cpu"``, ``"gpu"`` or ``"tpu"``; default: JAX's default backend.

  Examples:
    >>> cfg = ModelConfig(compute_dtype="bfloat16")
    >>> [(c.compute_dtype, c.attention) for c in (resolve_model_config(cfg, "cpu"),
    ...                                           resolve_model_config(cfg, "gpu"))]
    [('bfloat16', 'xla'), ('bfloat16', 'cudnn')]
  """
  name = platform() if platform_name is None else platform_name
  cfg = dataclasses.replace(cfg, compute_dtype=cfg.compute_dtype or default_compute_dtype(name))
  return dataclasses.replace(cfg, attention=attention_implementation(cfg, name))


def jax_started() -> bool:
  """True once JAX has initialized a backend (after which XLA_FLAGS are no longer read)."""
  return xla_bridge.backends_are_initialized()


def configure_determinism(deterministic: bool | None = None) -> bool:
  """Asks XLA for deterministic GPU kernels before JAX starts; returns whether they are on.

  Appends ``--xla_gpu_deterministic_ops=true`` to ``XLA_FLAGS`` unless ``deterministic``
  is False, or it is None and the environment sets ``DILOCO_NONDETERMINISTIC=1``. With it,
  a resumed or reused run on a GPU is bit-identical to an uninterrupted one (without it,
  reductions with atomics may differ in the last bits). CPU and TPU kernels are
  deterministic anyway: the flag is not added when ``JAX_PLATFORMS`` names only ``cpu``.

  Args:
    deterministic: True or False to decide, None to follow the environment variable.

  Returns:
    Whether the deterministic flag is in ``XLA_FLAGS``.

  Warns:
    RuntimeWarning: JAX has already started its backend with different flags, so the
      request cannot take effect in this process.

  Examples:
    >>> import os
    >>> flags = os.environ.get("XLA_FLAGS", "")
    >>> configure_determinism(False)  # the opt-out
    False
  """
  if deterministic is None:
    deterministic = os.environ.get(NONDETERMINISTIC_ENV, "0") in ("", "0")
  flags = os.environ.get("XLA_FLAGS", "")
  present = "xla_gpu_deterministic_ops=true" in flags
  platforms = os.environ.get("JAX_PLATFORMS", "")
  if not deterministic or present or platforms.strip().lower() == "cpu":
    return present
  if jax_started():
    warnings.warn(
        "configure_determinism() ran after JAX started its backend: XLA_FLAGS is no longer"
        " read, so GPU kernels stay non-deterministic in this process; call it before the"
        " first JAX array or device query.", RuntimeWarning, stacklevel=2)
    return False
  os.environ["XLA_FLAGS"] = f"{flags} {DETERMINISTIC_FLAG}".strip()
  return True

