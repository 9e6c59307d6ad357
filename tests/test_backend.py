"""diloco_core.devices.backend: per-backend defaults, attention kernel choice, determinism flag; device peaks."""

import dataclasses
import os
import pathlib
import subprocess
import sys

import pytest

from analysis.planning.hardware import HARDWARE, hardware_for_device_kind
from diloco_core import ModelConfig, get_preset
from diloco_core.devices import backend

ROOT = pathlib.Path(__file__).resolve().parents[1]
FLAG = "--xla_gpu_deterministic_ops=true"


def test_defaults_by_platform(monkeypatch):
  monkeypatch.delenv(backend.COMPUTE_DTYPE_ENV)  # the suite pins float32 (conftest.py)
  assert [backend.default_compute_dtype(p) for p in ("cpu", "gpu", "tpu")] == ["float32", "bfloat16", "bfloat16"]
  assert [backend.default_demo_steps(p) for p in ("cpu", "gpu", "tpu")] == [1500, 3000, 3000]
  resolved = backend.resolve_model_config(get_preset("small"), "cpu")
  assert (resolved.compute_dtype, resolved.attention) == ("float32", "xla")
  assert dataclasses.replace(resolved, compute_dtype=None, attention="auto") == get_preset("small")
  resolved = backend.resolve_model_config(get_preset("base"), "gpu")  # d_h = 32
  assert (resolved.compute_dtype, resolved.attention) == ("bfloat16", "cudnn")
  # The running backend follows the same table.
  assert backend.default_compute_dtype() == backend.default_compute_dtype(backend.platform())
  assert backend.default_demo_steps() == backend.default_demo_steps(backend.platform())


def test_compute_dtype_override_and_config_win_in_that_order(monkeypatch):
  monkeypatch.setenv(backend.COMPUTE_DTYPE_ENV, "bfloat16")
  assert backend.resolve_model_config(ModelConfig(), "cpu").compute_dtype == "bfloat16"
  assert backend.resolve_model_config(ModelConfig(compute_dtype="float32"), "gpu").compute_dtype == "float32"
  monkeypatch.setenv(backend.COMPUTE_DTYPE_ENV, "fp16")
  with pytest.raises(ValueError, match=r"DILOCO_COMPUTE_DTYPE must be one of \('float32', 'bfloat16'\), got 'fp16'"):
    backend.default_compute_dtype("cpu")


@pytest.mark.parametrize("platform, changes, expected", [
    ("gpu", {"compute_dtype": "bfloat16"}, "cudnn"),
    ("gpu", {}, "cudnn"),  # None resolves to bfloat16 on a GPU
    ("gpu", {"compute_dtype": "float32"}, "xla"),  # cuDNN flash has no float32 kernel
    ("gpu", {"compute_dtype": "bfloat16", "d_head": 12}, "xla"),  # not a multiple of 8
    ("gpu", {"compute_dtype": "bfloat16", "d_head": 256}, "xla"),  # above 128
    ("gpu", {"compute_dtype": "bfloat16", "attention": "xla"}, "xla"),
    ("tpu", {"compute_dtype": "bfloat16"}, "xla"),
    ("cpu", {"compute_dtype": "bfloat16"}, "xla"),
    ("gpu", {"compute_dtype": "bfloat16", "attention": "cudnn"}, "cudnn"),
])
def test_attention_auto_picks_cudnn_only_where_it_applies(platform, changes, expected, monkeypatch):
  cfg = dataclasses.replace(ModelConfig(d_model=256, n_heads=4), **changes)  # d_h = 64
  monkeypatch.delenv(backend.COMPUTE_DTYPE_ENV)
  assert backend.attention_implementation(cfg, platform) == expected


@pytest.mark.parametrize("platform, changes, reason", [
    ("cpu", {"compute_dtype": "bfloat16"}, "it runs on a GPU only"),
    ("tpu", {"compute_dtype": "bfloat16"}, "it runs on a GPU only"),
    ("gpu", {"compute_dtype": "float32"}, "it needs compute_dtype 'bfloat16'"),
    ("gpu", {"compute_dtype": "bfloat16", "d_head": 12},
     "it needs a head dimension that is a multiple of 8 and <= 128, got 12"),
])
def test_cudnn_where_it_cannot_run_is_a_one_line_error(platform, changes, reason):
  cfg = dataclasses.replace(ModelConfig(d_model=256, n_heads=4, attention="cudnn"), **changes)
  with pytest.raises(ValueError, match=f"ModelConfig.attention='cudnn' is not available: {reason}"):
    backend.attention_implementation(cfg, platform)


def test_determinism_opt_outs_and_cpu_leave_xla_flags_alone(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  assert backend.configure_determinism() is False  # CPU kernels are deterministic anyway
  monkeypatch.setenv("JAX_PLATFORMS", "cuda")
  assert backend.configure_determinism(False) is False
  monkeypatch.setenv(backend.NONDETERMINISTIC_ENV, "1")
  assert backend.configure_determinism() is False
  assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=8"
  monkeypatch.setenv("XLA_FLAGS", FLAG)
  assert backend.configure_determinism(False) is True  # reports what XLA will do


def test_determinism_after_jax_started_warns_and_changes_nothing(monkeypatch):
  monkeypatch.setenv("XLA_FLAGS", "")
  monkeypatch.setenv("JAX_PLATFORMS", "cuda")
  monkeypatch.delenv(backend.NONDETERMINISTIC_ENV, raising=False)
  backend.platform()  # make sure this process's backend is up
  with pytest.warns(RuntimeWarning, match="ran after JAX started its backend"):
    assert backend.configure_determinism() is False
  assert os.environ["XLA_FLAGS"] == ""


def test_determinism_before_jax_starts_sets_the_flag_and_runs():
  code = ("import os; from diloco_core.devices import backend; print(backend.configure_determinism());"
          " print(os.environ['XLA_FLAGS']); import jax.numpy as jnp; print(float(jnp.ones(3).sum()))")
  env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", backend.NONDETERMINISTIC_ENV)}
  env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])), XLA_FLAGS="--xla_force_host_platform_device_count=2")
  out = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, capture_output=True,
                       text=True, timeout=300, check=True).stdout.split("\n")
  assert out[:3] == ["True", f"--xla_force_host_platform_device_count=2 {FLAG}", "3.0"]


@pytest.mark.parametrize("kind, key", [
    ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA B200", "b200"), ("TPU v4", "v4"), ("TPU v5 lite", "v5e"), ("TPU v5p", "v5p"),
    ("TPU v6 lite", "v6e"), ("TPU7x", "tpu7x"),
])
def test_device_kind_to_peak(kind, key):
  assert hardware_for_device_kind(kind) is HARDWARE[key]


def test_unknown_device_kind_has_no_peak():
  assert hardware_for_device_kind("cpu") is None
  assert hardware_for_device_kind("NVIDIA GeForce RTX 4090") is None
