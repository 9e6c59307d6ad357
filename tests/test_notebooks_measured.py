"""The notebooks measured on a TPU (benchmarks/notebooks.py, analysis.lab.notebooks_measured)."""

from __future__ import annotations

import copy
import json
import importlib.util
import pathlib

import jupytext
import pandas as pd
import pytest

from analysis.lab import notebooks_measured as nbm
from analysis.lab.accelerator import AcceleratorResultError
from analysis.lab.stored import content_hash

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _benchmark():
  spec = importlib.util.spec_from_file_location("notebooks_bench", ROOT / "benchmarks" / "notebooks.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


@pytest.mark.parametrize("path", sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.md")), ids=lambda p: p.stem)
def test_the_benchmark_runs_the_cells_jupytext_reads(path):
  """The benchmark's cell parser finds the code cells Jupyter runs, in order, source for source."""
  cells = [c.source.strip() for c in jupytext.read(path).cells if c.cell_type == "code"]
  assert [c.strip() for c in _benchmark().code_cells(path.read_text())] == cells


def test_the_stored_tpu_notebooks_hold_and_every_estimate_is_within_20_percent():
  doc = nbm.load_notebooks("tpu-v5-lite")
  sweeps = [s for r in doc["notebooks"].values() for s in r["sweeps"]]
  assert sweeps and all(abs(s["took_s"] / s["estimate_s"] - 1) <= 0.2 for s in sweeps)
  assert doc["provenance"]["device_kind"] == "TPU v5 lite"
  table = nbm.timing_table(doc)
  assert list(table["notebook"][table["notebook"] != ""]) == sorted(doc["notebooks"])
  assert list(table["live sweep"][table["live sweep"] != ""]) == [s["sweep"] for s in sweeps]
  heads = nbm.headline_table(doc, "TPU v5e")
  assert list(heads["where"]) == ["TPU v5e", "CPU (stored)"] * len(sweeps)
  assert set(nbm.not_measured(doc)) | set(doc["notebooks"]) == {p.stem for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.md")}


def _restamped(doc):
  doc = {k: v for k, v in doc.items() if k != "sha256"}
  return {**doc, "sha256": content_hash(doc)}


def test_an_edited_or_inconsistent_file_is_refused():
  doc = nbm.load_notebooks("tpu-v5-lite")
  edited = copy.deepcopy(doc)
  next(iter(edited["notebooks"].values()))["wall_s"] += 1.0
  with pytest.raises(AcceleratorResultError, match="sha256 does not match"):
    nbm.check_notebooks(edited)
  name = next(n for n, r in doc["notebooks"].items() if r["sweeps"])
  fewer = copy.deepcopy(doc)
  fewer["notebooks"][name]["sweeps"][0]["rows"].pop()
  with pytest.raises(AcceleratorResultError, match="runs stored"):
    nbm.check_notebooks(_restamped(fewer))
  slow = copy.deepcopy(doc)
  s = slow["notebooks"][name]["sweeps"][0]
  s["took_s"] = 1.3 * s["estimate_s"]
  with pytest.raises(AcceleratorResultError, match=r"\+30%, more than ±20%"):
    nbm.check_notebooks(_restamped(slow))


def test_headline_by_hand():
  """Best run named by what varies and applies to it; each method's best against DP's best."""
  rows = pd.DataFrame({"algorithm": ["dp", "diloco", "diloco", "streaming"], "sync_every": [50, 10, 30, 30],
                       "fragments": [1, 1, 1, 5], "final_eval_loss": [1.00, 1.03, 1.01, 0.99], "loss_floor": 0.9})
  h = nbm.headline(rows)
  assert h["best"] == "algorithm=streaming, sync_every=30, fragments=5" and h["best_loss"] == 0.99
  assert h["reference"] == "dp" and h["vs"] == pytest.approx({"diloco": 1.0, "streaming": -1.0})
  no_dp = nbm.headline(rows[rows["algorithm"] != "dp"])
  assert no_dp["reference"] == "diloco" and no_dp["vs"] == pytest.approx({"streaming": 100 * (0.99 / 1.01 - 1)})


def test_the_stored_cpu_sweep_holds_and_is_refused_when_edited(monkeypatch, tmp_path):
  doc = nbm.load_cpu_estimate()
  assert [r["algorithm"] for r in doc["sweep"]["rows"]] == [c.algo.algorithm for c in nbm.cpu_sweep()]
  assert doc["provenance"]["command"].startswith("python benchmarks/live_estimate.py")
  slow = copy.deepcopy(doc)
  slow["sweep"]["took_s"] = 0.7 * slow["sweep"]["estimate_s"]
  path = tmp_path / "live_estimate.json"
  monkeypatch.setattr(nbm, "CPU_ESTIMATE_PATH", path)
  path.write_text(json.dumps(_restamped(slow)))
  with pytest.raises(AcceleratorResultError, match=r"-30%, more than ±20%"):
    nbm.load_cpu_estimate()
  slow["sweep"]["took_s"] = doc["sweep"]["took_s"]  # the stored hash no longer matches
  path.write_text(json.dumps({**slow, "sha256": _restamped(slow)["sha256"][::-1]}))
  with pytest.raises(AcceleratorResultError, match="sha256 does not match"):
    nbm.load_cpu_estimate()
