"""The stored accelerator results: read back, every derived figure recomputed, an edit refused."""

import gzip
import json

import pytest

from analysis.lab import accelerator as A
from analysis.lab.stored import content_hash


def test_every_stored_device_loads_and_its_ratios_are_its_timings():
  assert "tpu-v5-lite" in A.stored_devices()
  for device in A.stored_devices():
    r = A.load(device)
    m = r.methods()
    plain = m.loc["plain", "ms_per_step"]
    for run, row in m.dropna(subset=["ms_per_step"]).iterrows():
      assert row["step_over_M_plain"] == pytest.approx(row["ms_per_step"] / (row["replicas"] * plain), rel=1e-12)


def test_an_edited_timing_is_refused_even_with_a_fresh_hash(tmp_path, monkeypatch):
  doc = json.loads((A.ACCELERATOR_DIR / "tpu-v5-lite.json").read_text())
  doc["levers"][0]["ms_per_step"] *= 0.5  # twice as fast, the MFU left as it was
  body = {k: v for k, v in doc.items() if k != "sha256"}
  doc["sha256"] = content_hash(body)
  with pytest.raises(A.AcceleratorResultError, match="lever 'before: .*: stored tokens_per_s .* is not what its"):
    A.check(doc, "edited")
  del doc["sha256"]
  with pytest.raises(A.AcceleratorResultError, match="its sha256 does not match"):
    A.check(doc, "unhashed")
  monkeypatch.setattr(A, "ACCELERATOR_DIR", tmp_path)
  with pytest.raises(A.AcceleratorResultError, match="no stored accelerator result 'tpu-v5-lite'"):
    A.load("tpu-v5-lite")


def test_trace_breakdown_counts_top_level_ops_per_step(tmp_path):
  ev = [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:TPU:0"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 1, "args": {"name": "XLA Modules"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 2, "args": {"name": "XLA Ops"}}]
  for step in range(2):  # each step: a 6 us module holding a 4 us loop (with a 3 us op inside) and a 2 us fusion
    t = 10 * step
    ev += [{"ph": "X", "pid": 1, "tid": 1, "ts": t, "dur": 6, "name": "jit_step"},
           {"ph": "X", "pid": 1, "tid": 2, "ts": t, "dur": 4, "name": "while", "args": {"hlo_category": "while"}},
           {"ph": "X", "pid": 1, "tid": 2, "ts": t + 1, "dur": 3, "name": "dot", "args": {"hlo_category": "convolution fusion"}},
           {"ph": "X", "pid": 1, "tid": 2, "ts": t + 4, "dur": 2, "name": "adam", "args": {"hlo_category": "loop fusion"}}]
  path = tmp_path / "t.json.gz"
  with gzip.open(path, "wt") as f:
    json.dump({"traceEvents": ev}, f)
  out = A.trace_breakdown(path)
  assert out.to_dict() == {"while": 0.004, "loop fusion": 0.002, "total": 0.006}


def test_a_trace_without_device_tracks_is_one_line(tmp_path):
  path = tmp_path / "cpu.json.gz"
  with gzip.open(path, "wt") as f:
    json.dump({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/host:CPU"}}]}, f)
  with pytest.raises(A.AcceleratorResultError, match="no device 'XLA Modules' track"):
    A.trace_breakdown(path)


def test_the_roofline_benchmark_writes_what_the_reader_checks(tmp_path):
  """``benchmarks/roofline.py --quick`` on this CPU: every point's FLOPs and bytes are the
  calculator's, its rates its time's; the stored TPU roofline loads; an edited point is refused."""
  import subprocess
  import sys
  from analysis.lab import roofline_measured as R
  from analysis.planning.op_cost import matmul_cost
  out = tmp_path / "roofline.json"
  subprocess.run([sys.executable, str(A.ACCELERATOR_DIR.parents[2] / "benchmarks" / "roofline.py"), "--quick",
                  "--json", str(out)], check=True, capture_output=True, text=True, env={**__import__("os").environ,
                                                                                      "JAX_PLATFORMS": "cpu"})
  doc = json.loads(out.read_text())
  R.check_roofline(doc, "quick run")
  matmuls = [p for p in doc["points"] if p["kind"] == "matmul"]
  assert [p["m"] for p in matmuls] == [2**i for i in range(9)]  # m from 1 to k = 256
  assert (matmuls[0]["flops"], matmuls[0]["bytes"]) == matmul_cost(1, 256, 256)
  assert [p["kind"] for p in doc["points"]][-1] == "elementwise"
  prov, points = R.load_roofline("tpu-v5-lite")
  assert prov["device_kind"] == "TPU v5 lite" and points["intensity"].max() >= 2000
  doc["points"][0]["seconds"] *= 0.5  # twice as fast, the rates left as they were
  body = {k: v for k, v in doc.items() if k != "sha256"}
  with pytest.raises(A.AcceleratorResultError, match=r"point 0 \(matmul\): stored flops_per_s .* is not its recomputed"):
    R.check_roofline({**body, "sha256": content_hash(body)})
  with pytest.raises(A.AcceleratorResultError, match="no stored roofline 'h100'"):
    R.load_roofline("h100")


def test_the_catalogs_achievable_hbm_bandwidth_is_the_stored_measurement():
  """The v5e's ``hbm_bandwidth_achievable`` is the stored roofline's elementwise ceiling (to the
  four digits the catalog writes), and the catalog names that file as its source."""
  from analysis.lab.roofline_measured import load_roofline
  from analysis.planning.hardware import HARDWARE, hardware_for_device_kind
  provenance, points = load_roofline("tpu-v5-lite")
  hw = hardware_for_device_kind(provenance["device_kind"])
  measured = points.loc[points["kind"] == "elementwise", "bytes_per_s"].max()
  assert f"{hw.hbm_bandwidth_achievable:.4g}" == f"{measured:.4g}"
  assert "tpu-v5-lite-roofline.json" in hw.hbm_achievable_source
  assert hw.hbm_for("spec") == hw.hbm_bandwidth > hw.hbm_for("achievable")
  measured_elsewhere = [k for k, h in HARDWARE.items() if h.hbm_bandwidth_achievable is not None]
  assert measured_elsewhere == ["v5e"], "a new measured figure needs its stored measurement checked here"


@pytest.mark.parametrize("change,message", [
    (dict(hbm_bandwidth_achievable=0.0), "HardwareSpec.hbm_bandwidth_achievable must be a positive number, got 0.0."),
    (dict(hbm_achievable_source=""), "HardwareSpec.hbm_achievable_source must say where"),
])
def test_an_achievable_figure_needs_a_positive_value_and_a_source(change, message):
  import dataclasses

  from analysis.planning.hardware import HARDWARE
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
    dataclasses.replace(HARDWARE["v5e"], **change)
  with pytest.raises(ValueError, match=r"which must be one of \('spec', 'achievable'\), got 'peak'"):
    HARDWARE["v5e"].hbm_for("peak")
