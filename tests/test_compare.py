"""The main job (`python -m diloco_core.compare`): its defaults and its table."""

import pandas as pd
import pytest

from analysis import experiments
from diloco_core.run import main_job
from diloco_core.compare import compare_main


def test_defaults_are_the_papers_regime_and_the_stored_methods_runs():
  runs = main_job.default_configs(steps=1500, out=None)
  dl = runs["diloco"]
  assert dl.steps // dl.algo.sync_every >= 50 and dl.algo.sync_every >= 25  # >= 25x fewer bytes
  stored_runs = experiments.methods_configs()
  assert [c.algo for c in stored_runs] == [c.algo for c in runs.values()]
  assert all(c.data == main_job.DATA and c.seq_len == dl.seq_len for c in stored_runs)


def test_table_has_loss_and_bytes_relative_to_dp(tmp_path, capsys):
  out = tmp_path / "cmp"
  # (M = 2, 12 steps: programs other tests compile, tests/test_background.py's Streaming among them)
  assert compare_main(["--model", "tiny", "--replicas", "2", "--steps", "12", "--sync-every", "6",
                       "--fragments", "3", "--overlap", "1", "--batch-size", "2", "--seq-len", "8",
                       "--out", str(out), "--no-progress"]) == 0
  table = pd.read_csv(out / "comparison.csv").set_index("algorithm")
  assert table.loc["dp", "loss vs DP (%)"] == 0.0
  # DP all-reduces the float32 gradient every step, DiLoCo the params once per H = 6 steps,
  # Streaming its 3 fragments once each per H steps: the same total.
  assert table.loc["diloco", "bytes: DP / this"] == pytest.approx(6.0, rel=1e-12)
  assert table.loc["streaming", "bytes: DP / this"] == pytest.approx(6.0, rel=1e-12)
  assert "loss vs DP (%)" in capsys.readouterr().out
  assert (table["eval SE"] > 0).all()  # each run's eval loss over the held-out sequences (main_job.eval_spread)
