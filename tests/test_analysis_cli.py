"""`python -m analysis`: end to end in a subprocess, help and errors in process."""

import subprocess
import sys

import pytest

from analysis import __main__ as cli
from analysis import plan as pl
from analysis import roofline as rl
from analysis import simulate as sim
from analysis.planning.hardware import get_hardware
from analysis.planning.models import get_model
from analysis.planning.models import model_stats


def _run(*args):
  return subprocess.run([sys.executable, "-m", "analysis", *args], capture_output=True,
                        text=True, timeout=120)


def test_roofline_command():
  r = _run("roofline", "--hardware", "v5p", "--model", "8B", "--global-batch-tokens",
           "4194304", "--slices", "4")
  assert r.returncode == 0, r.stderr
  assert "ICI 2,550, DCN 73,440" in r.stdout  # critical intensities of v5p
  assert "8,030,261,248 parameters" in r.stdout
  # The DP row: critical batch and largest M computed by the library for this model.
  v5p, llama = get_hardware("v5p"), get_model("8B")
  b = rl.dp_critical_batch_per_slice(v5p, model=llama, replicas=4)
  m = rl.max_slices(4194304, v5p, model=llama)
  assert f"{b:,.0f}" in r.stdout and f" {m} " in r.stdout
  assert "Streaming H=100 P=5 tau=1" in r.stdout
  # Bandwidth and memory come from the planner's candidate_table (one computation).
  step = pl.step_time(model_stats(llama), v5p, 4194304 / 4, 256, 1.0)
  planned = pl.candidate_table(llama, v5p, [("streaming", 100, 5, 1)], slices=4,
                               chips_per_slice=256, step_time=step, target=0.95, bits=16)
  row = next(l for l in r.stdout.splitlines() if l.startswith("Streaming H=100 P=5 tau=1"))
  assert f"{planned['Gbit/s per slice'].iloc[0]:,.4g}" in row
  assert f"{planned['memory GB/chip'].iloc[0]:,.2f}" in row


def test_roofline_command_refuses_what_the_trainer_refuses():
  r = _run("roofline", "--hardware", "v5p", "--model", "8B", "--global-batch-tokens",
           "4194304", "--slices", "4", "--sync-every", "10", "--fragments", "3")
  assert r.returncode == 2 and r.stdout == ""
  assert "--sync-every (H=10) must be a multiple of fragments (P=3)" in r.stderr


def test_plan_command():
  p = pl.plan_run("qwen3-8b", "v5p", slices=2, chips_per_slice=64, seq_len=4096,
                  global_batch_tokens=2097152, link_gbps=100)
  r = _run(*p.command()[3:])
  assert r.returncode == 0, r.stderr
  assert "8,190,726,144 parameters" in r.stdout and f"step time {p.step_time:.4g} s" in r.stdout
  assert f"compute-bound above {p.dp_critical_tokens:,.0f} tokens per slice" in r.stdout
  assert f"choice: {p.choice}\n" in r.stdout and f"reason: {p.reason}\n" in r.stdout
  dp = next(l for l in r.stdout.splitlines() if l.startswith("DP "))
  assert f"{p.table.loc['DP', 'Gbit/s per slice']:,.4g}" in dp


def test_simulate_command_prints_exact_and_grid_values():
  r = _run("simulate", "--model", "1B", "--method", "streaming", "--overlap", "1", "--bits",
           "4", "--target", "0.95", "--bandwidth", "1", "100")
  assert r.returncode == 0, r.stderr
  kw = dict(overlap=1, bits=4)
  exact = sim.bandwidth_for_utilization(0.95, "1B", "streaming", **kw)
  grid = sim.bandwidth_for_utilization(0.95, "1B", "streaming", rounding="grid", **kw)
  line = next(l for l in r.stdout.splitlines() if l.startswith("95%"))
  assert line.split()[1:] == [f"{exact:.4g}", f"{grid:.4g}"]
  u = {l.split()[0]: l.split()[1] for l in r.stdout.splitlines()[2:4]}
  assert u == {"1": f"{sim.utilization('1B', 'streaming', 1.0, **kw):.4f}", "100": "1.0000"}


def test_simulate_table_command():
  r = _run("simulate", "--table")
  assert r.returncode == 0, r.stderr
  rows = [l for l in r.stdout.splitlines() if "Streaming + overlap + 4-bit" in l]
  assert len(rows) == 3
  assert "computed in" in r.stdout


@pytest.mark.parametrize("args, message", [
    (("roofline", "--hardware", "v9", "--model", "8B", "--global-batch-tokens", "1",
      "--slices", "2"), "hardware must be one of"),
    (("simulate", "--target", "1.5"), "target must be strictly between 0 and 1"),
    (("plan", "--model", "qwen3-8b", "--hardware", "v5p", "--slices", "2", "--chips-per-slice",
      "64", "--seq-len", "4096", "--global-batch-tokens", "2097152", "--link-gbps", "100",
      "--mfu", "1.5"), "mfu must be a finite number in (0, 1], got 1.5."),
    (("plan", "--model", "qwen3-8b", "--hardware", "v5p", "--slices", "2", "--chips-per-slice",
      "64", "--seq-len", "4096", "--global-batch-tokens", "2097152", "--link-gbps", "100",
      "--sync-every", "0"), "--sync-every must be an integer >= 1, got 0."),
    (("plan", "--model", "qwen3-8b", "--hardware", "v5p", "--slices", "2.5"),
     "argument --slices: invalid int value: '2.5'"),
    (("plan", "--model", "qwen3-8b", "--hardware", "v5p", "--slices", "2", "--chips-per-slice",
      "64", "--seq-len", "4096", "--global-batch-tokens", "1", "--link-gbps", "100"),
     "--global-batch-tokens (1) must be at least seq_len (4096): a step trains on whole sequences."),
])
def test_errors_are_one_line_exit_2(args, message):
  r = _run(*args)
  assert r.returncode == 2
  assert r.stdout == ""
  assert len(r.stderr.strip().splitlines()) == 1 and message in r.stderr
  assert r.stderr.startswith("error: "), r.stderr  # as the trainer's errors
  assert "Traceback" not in r.stderr


def test_in_process_errors_and_help(capsys):
  assert cli.main(["simulate", "--model", "llama3-8b"]) == 2
  assert "--step-time is needed" in capsys.readouterr().err
  with pytest.raises(SystemExit) as e:
    cli.main(["simulate", "--bogus"])
  assert e.value.code == 2
  err = capsys.readouterr().err
  assert len(err.strip().splitlines()) == 1 and "unrecognized arguments: --bogus" in err
  for command, flags in [
      ("roofline", ["--hardware", "--model", "--global-batch-tokens", "--slices",
                    "--chips-per-slice", "--seq-len", "--bits", "--sync-every", "--fragments",
                    "--overlap", "--mfu", "--target", "--latency"]),
      ("plan", ["--model", "--hardware", "--slices", "--chips-per-slice", "--seq-len",
                "--global-batch-tokens", "--link-gbps", "--mfu", "--target", "--bits",
                "--sync-every", "--overlaps"]),
      ("simulate", ["--model", "--method", "--step-time", "--replicas", "--sync-every",
                    "--fragment-layers", "--fragment-pattern", "--bucket-layers", "--overlap",
                    "--bits", "--latency", "--target", "--bandwidth", "--table", "--rounding"])]:
    with pytest.raises(SystemExit) as e:
      cli.main([command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    for flag in flags:
      assert flag in out, (command, flag)


def test_catalog_commands(capsys):
  assert cli.main(["hardware"]) == 0
  assert "TPU7x (Ironwood)" in capsys.readouterr().out
  assert cli.main(["models"]) == 0
  assert "qwen3-30b-a3b" in capsys.readouterr().out
  assert cli.main(["simulate", "--model", "llama3-8b", "--step-time", "0.5", "--method", "dp",
                   "--target", "0.5"]) == 0
  assert "8.03e+09 parameters, 32 layers" in capsys.readouterr().out


def test_plan_refuses_overlaps_no_streaming_candidate_can_use(capsys):
  assert cli.main(["plan", "--model", "qwen3-8b", "--hardware", "v5p", "--slices", "2", "--chips-per-slice",
                   "64", "--seq-len", "4096", "--global-batch-tokens", "2097152", "--link-gbps", "100",
                   "--overlaps", "100000"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: --overlaps (100000,) leave no Streaming candidate: τ must"
                                                 " be below H, and the largest H considered for Streaming is 1000;"
                                                 " give overlaps in [0, 999]."), err


PLAN = ["plan", "--model", "qwen3-8b", "--hardware", "v5p", "--slices", "2", "--chips-per-slice", "64",
        "--seq-len", "4096", "--global-batch-tokens", "2097152", "--link-gbps", "100"]
ROOF = ["roofline", "--hardware", "v5p", "--model", "8B", "--global-batch-tokens", "4194304"]


@pytest.mark.parametrize("args, message", [
    (PLAN + ["--topk-chunk", "64"], "--topk-chunk sets the chunk of a top-k payload: pass --topk too"),
    (["simulate", "--rounding", "exact"], "--rounding applies to --table"),
    (["simulate", "--latency", "inf"], "--latency must be a finite number >= 0, got inf."),
    (ROOF + ["--slices", "4", "--latency", "inf"], "--latency must be a finite number >= 0, got inf."),
    (ROOF + ["--slices", str(10**21)], f"--slices {10**21}: each slice needs at least one sequence"),
    (PLAN[:1] + ["--mod"] + PLAN[2:], "the following arguments are required: --model"),  # no abbreviations
    (["experiments", "verify", "non_iid", "--sample", "1000000000"],
     "--sample must be an integer in [1, 6] (runs of non_iid trained again), got 1000000000."),
])
def test_more_bad_input_is_one_line_exit_2(args, message, capsys):
  try:
    code = cli.main(args)
  except SystemExit as e:  # argparse's own errors
    code = e.code
  err = capsys.readouterr().err
  assert code == 2 and len(err.strip().splitlines()) == 1 and message in err, err
  assert err.startswith("error: ")


def test_experiments_run_refuses_an_unwritable_results_folder_before_training(tmp_path, monkeypatch, capsys):
  from analysis.lab import stored, sweeps
  blocked = tmp_path / "results"
  blocked.write_text("a file where the folder should be")
  monkeypatch.setattr(stored, "RESULTS_DIR", blocked)
  monkeypatch.setattr(sweeps, "run_one", lambda *a, **k: pytest.fail("trained before checking"))
  assert cli.main(["experiments", "run", "non_iid"]) == 2
  err = capsys.readouterr().err
  assert err.strip() == (f"error: cannot write the stored file into {blocked} (it is a file); make it"
                         " writable (or, from Python, pass another out_dir).")
