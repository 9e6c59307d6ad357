"""The training loop, its outputs, the CLI and its errors (tiny model, a few steps)."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from diloco_core import DataConfig, DiLoCoConfig
from diloco_core.train import TrainConfig, main, train
from tiny_run import tiny


@pytest.fixture(scope="module")
def diloco_run(tmp_path_factory):
  out = tmp_path_factory.mktemp("run")
  return out, train(tiny(out=str(out)))


def test_outputs_match_the_dataframe(diloco_run):
  out, result = diloco_run
  rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
  assert [r["step"] for r in rows] == [2, 4, 6, 8]
  assert [r["step"] for r in rows] == result.metrics["step"].tolist()[1:]
  assert all(len(r["replica_loss"]) == 2 for r in rows)
  assert rows[-1]["tokens"] == 8 * 2 * 2 * 8
  summary = json.load(open(out / "summary.json"))
  assert summary["final_eval_loss"] == pytest.approx(result.metrics["eval_loss"].dropna().iloc[-1])
  assert summary["gap_to_floor"] == pytest.approx(summary["final_eval_loss"] - summary["loss_floor"])
  # H = 4, P = 1: the whole model (float32) goes out at steps 4 and 8 only.
  assert [r["bytes_sent"] for r in rows] == [0, 4 * summary["params"], 0, 4 * summary["params"]]
  assert summary["total_bytes_per_replica"] == 8 * summary["params"]
  assert summary["peak_bytes_per_step"] == 4 * summary["params"]


def test_same_seed_same_metrics_different_seed_different(diloco_run):
  _, a = diloco_run
  b = train(tiny())
  c = train(tiny(seed=1))
  cols = ["train_loss", "eval_loss"]
  np.testing.assert_array_equal(a.metrics[cols].to_numpy(float), b.metrics[cols].to_numpy(float))
  assert not np.allclose(a.metrics["train_loss"].to_numpy(float)[1:], c.metrics["train_loss"].to_numpy(float)[1:])


def test_a_runs_first_steps_are_its_rows_bit_for_bit_and_nothing_is_written(diloco_run, tmp_path):
  """train(cfg, until=k): the rows of steps <= k of the whole run (its schedule unchanged, so
  not a shorter run), no summary, no final params and no summary.json; k outside 1..steps and
  a tape run are refused in one line."""
  _, whole = diloco_run
  part = train(tiny(out=str(tmp_path / "part")), until=4)
  assert part.summary is None and part.params is None and part.state is None
  assert [r["step"] for r in part.rows] == [0, 2, 4]
  cols = ["step", "train_loss", "eval_loss", "total_bytes_sent"]
  np.testing.assert_array_equal(part.metrics[cols].to_numpy(float), whole.metrics[cols].to_numpy(float)[:3])
  shorter = train(tiny(steps=4))  # a 4-step run decays its learning rate sooner: other losses
  assert shorter.metrics["train_loss"].to_numpy(float)[2] != part.metrics["train_loss"].to_numpy(float)[2]
  assert sorted(os.listdir(tmp_path / "part")) == ["metrics.jsonl"]
  for bad in (0, 9, 2.0, True):
    with pytest.raises(ValueError, match=r"^until must be a step of the run, an integer in 1\.\.8 \(steps\), got"):
      train(tiny(), until=bad)


def test_streaming_and_dp_train():
  s = train(tiny("streaming", fragments=3, sync_every=6, overlap=1, compression="fp4", error_feedback=True))
  d = train(tiny("dp"))
  assert np.isfinite(s.summary["final_eval_loss"]) and np.isfinite(d.summary["final_eval_loss"])
  assert d.summary["total_bytes_per_replica"] == 8 * 4 * d.summary["params"]
  assert s.summary["peak_bytes_per_step"] < s.summary["total_bytes_per_replica"] / 2


def test_training_approaches_the_floor():
  r = train(tiny(steps=32, eval_every=32, inner_lr=1e-2))  # test_checkpoint compiles this shape
  losses = r.metrics["eval_loss"].dropna().to_numpy()
  assert losses[-1] < losses[0] - 0.3


@pytest.mark.parametrize("argv,message", [
    (["--replicas", "0"], "replicas (M) must be an integer >= 1"),
    (["--sync-every", "0"], "--sync-every (H) must be an integer >= 1"),
    (["--outer-lr", "-1"], "--outer-lr (η) must be a finite number >= 0"),
    (["--outer-momentum", "1"], "--outer-momentum (μ) must be a finite number in [0, 1)"),
    (["--batch-size", "0"], "--batch-size must be an integer >= 1"),
    (["--seq-len", "0"], "--seq-len must be an integer >= 1"),
    (["--steps", "0"], "steps must be an integer >= 1"),
    (["--algorithm", "sgd"], "algorithm must be one of"),
    (["--algorithm", "streaming", "--fragments", "4", "--sync-every", "12"], "P - 1 must divide the number of layers"),
    (["--inner-lr", "0"], "--inner-lr must be a finite number > 0"),
    (["--model", "huge"], "model must be one of"),
    (["--data", "no_such_file.txt"], "no_such_file.txt"),
])
def test_cli_bad_input_one_line_exit_2(argv, message, capsys):
  assert main(["--model", "tiny", "--no-progress"] + argv) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and message in err and "\n" not in err


def test_cli_refuses_to_overwrite_a_finished_run(diloco_run, capsys):
  out, _ = diloco_run
  before = open(out / "summary.json").read()
  assert main(["--model", "tiny", "--steps", "2", "--out", str(out), "--no-progress"]) == 2
  assert "already holds a finished run" in capsys.readouterr().err
  assert open(out / "summary.json").read() == before


def test_cli_subprocess_help_and_run(tmp_path):
  env = dict(os.environ)
  h = subprocess.run([sys.executable, "-m", "diloco_core.train", "--help"], capture_output=True, text=True, env=env)
  assert h.returncode == 0 and "--sync-every" in h.stdout and "H: inner steps" in h.stdout
  # each option says its default once (its own words, or argparse's)
  options = re.split(r"\n  (?=-)", h.stdout)
  assert not [o for o in options if o.count("(default:") > 1], [o for o in options if o.count("(default:") > 1]
  assert "(default: every live replica)" in " ".join(h.stdout.split())
  # tiny()'s shape (vocabulary 16, 8 steps): a program the in-process tests compile already
  r = subprocess.run([sys.executable, "-m", "diloco_core.train", "--model", "tiny", "--steps", "8",
                      "--batch-size", "2", "--seq-len", "8", "--sync-every", "2", "--eval-every", "4",
                      "--warmup-steps", "1", "--data-vocab", "16", "--no-progress", "--out", str(tmp_path / "x")],
                     capture_output=True, text=True, env=env)
  assert r.returncode == 0, r.stderr
  assert "final eval loss" in r.stdout and (tmp_path / "x" / "summary.json").exists()
  bad = subprocess.run([sys.executable, "-m", "diloco_core.train", "--replicas", "-1"],
                       capture_output=True, text=True, env=env)
  assert bad.returncode == 2 and "Traceback" not in bad.stderr
