"""Bad input: one case per row of docs/troubleshooting.md.

Every case runs the CLI (``main``), which must return 2 with a single ``error: ...`` line on
stderr that names the problem, and must leave every file that already existed untouched.
"""

import hashlib
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from diloco_core import export_params, init_model
from diloco_core.model_config import get_preset
from diloco_core.train import main

BASE = ["--model", "tiny", "--batch-size", "2", "--seq-len", "8", "--data-vocab", "16", "--data-order", "1",
        "--warmup-steps", "1", "--log-every", "2", "--eval-every", "4", "--steps", "4", "--sync-every", "2",
        "--no-progress"]


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
  """A finished run with checkpoints at steps 2 and 4 and its final_params."""
  out = tmp_path_factory.mktemp("finished") / "run"
  assert main(BASE + ["--out", str(out), "--checkpoint-every", "2"]) == 0
  return out


def snapshot(root):
  return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
          for p in root.rglob("*")}


def write(path, data):
  path.write_bytes(data)
  return str(path)


def npy(path, array):
  np.save(path, array)
  return str(path)


def unfinished(tmp, finished):
  """A copy of the finished run that died after step 2 (no summary, checkpoint 2 only)."""
  run = tmp / "run"
  shutil.copytree(finished, run)
  for name in ("summary.json", "final_params", "checkpoints/4"):
    shutil.rmtree(run / name) if (run / name).is_dir() else os.remove(run / name)
  return str(run)


def truncate_all(directory):
  for f in directory.rglob("*"):
    if f.is_file() and f.parent.name == "d":
      f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])


def damaged_run(tmp, finished):
  run = unfinished(tmp, finished)
  truncate_all(tmp / "run" / "checkpoints" / "2" / "state")
  return run


def damaged_params(tmp, finished):
  shutil.copytree(finished / "final_params", tmp / "params")
  truncate_all(tmp / "params")
  return str(tmp / "params")


def other_model_params(tmp, finished):
  _, params = init_model(get_preset("tiny").__class__(**{**get_preset("tiny").__dict__, "n_layers": 4,
                                                         "vocab_size": 16}), 0)
  return export_params(params, str(tmp / "other"))


# (id, argv builder (tmp_path, finished run) -> extra argv, expected part of the message)
CASES = [
    # ---- options ----
    ("steps-not-a-number", lambda t, f: ["--steps", "ten"], "argument --steps: invalid int value: 'ten'"),
    ("unknown-flag", lambda t, f: ["--stpes", "10"], "unrecognized arguments: --stpes"),
    ("replicas-zero", lambda t, f: ["--replicas", "0"], "replicas (M) must be an integer >= 1"),
    ("h-not-multiple-of-p", lambda t, f: ["--algorithm", "streaming", "--fragments", "3", "--sync-every", "4"],
     "sync_every (H=4) must be a multiple of fragments (P=3)"),
    ("overlap-too-large", lambda t, f: ["--overlap", "2"], "overlap (τ) must be an integer with 0 <= τ < sync_every"),
    ("warmup-not-below-steps", lambda t, f: ["--warmup-steps", "4"], "warmup_steps must be an integer in [0, steps=4)"),
    ("mesh-too-large", lambda t, f: ["--mesh", "diloco=2,data=64"], "needs 128 devices"),
    # ---- data files ----
    ("data-missing", lambda t, f: ["--data", str(t / "none.txt")], "no such file"),
    ("data-is-a-directory", lambda t, f: ["--data", str(t)], "is not a regular file"),
    ("data-empty", lambda t, f: ["--data", write(t / "empty.txt", b"")], "is empty (no tokens)"),
    ("data-not-utf8", lambda t, f: ["--data", write(t / "bin.txt", b"ab\xff\xfe" * 40)], "is not valid UTF-8 text"),
    ("data-npy-unreadable", lambda t, f: ["--data", write(t / "bad.npy", b"not numpy at all")], "cannot read"),
    ("data-npy-not-token-ids", lambda t, f: ["--data", npy(t / "f.npy", np.ones((40, 2)))],
     "must hold a 1-D integer array of token ids"),
    ("token-id-beyond-vocab", lambda t, f: ["--data", npy(t / "ids.npy", np.arange(100) % 40), "--vocab-size", "32"],
     "has token id 39 outside the model vocabulary [0, 32)"),
    ("negative-token-id", lambda t, f: ["--data", npy(t / "neg.npy", np.arange(100) - 1)], "has token id -1 < 0"),
    ("sequence-longer-than-data", lambda t, f: ["--data", write(t / "short.txt", b"hello world"), "--seq-len", "64"],
     "too short for seq_len 64"),
    # ---- output directory ----
    ("out-is-a-file", lambda t, f: ["--out", write(t / "file", b"x")], "is a file; give a directory path"),
    ("out-holds-a-finished-run", lambda t, f: ["--out", str(shutil.copytree(f, t / "run"))], "already holds a finished run"),
    ("out-holds-an-unfinished-run", lambda t, f: ["--out", unfinished(t, f)],
     "holds checkpoints of an unfinished run; pass --resume"),
    ("out-holds-metrics-only", lambda t, f: ["--out", str(t)] if write(t / "metrics.jsonl", b"{}\n") else [],
     "holds metrics.jsonl of an unfinished run"),
    # ---- checkpoint options ----
    ("checkpoint-every-without-out", lambda t, f: ["--checkpoint-every", "2"], "checkpoint_every needs --out"),
    ("checkpoint-every-off-log-rows", lambda t, f: ["--checkpoint-every", "3", "--out", str(t / "o")],
     "checkpoint_every (3) must be a multiple of log_every (2)"),
    ("checkpoint-every-negative", lambda t, f: ["--checkpoint-every", "-1"], "checkpoint_every must be an integer >= 0"),
    ("keep-zero-checkpoints", lambda t, f: ["--keep-checkpoints", "0"], "keep_checkpoints must be an integer >= 1"),
    ("resume-without-out", lambda t, f: ["--resume"], "resume needs --out"),
    ("resume-without-checkpoint", lambda t, f: ["--resume", "--out", str(t)], "--resume: no checkpoint in"),
    ("resume-other-replicas", lambda t, f: ["--resume", "--out", unfinished(t, f), "--replicas", "4"],
     "written with replicas=2 but this run has replicas=4 (--replicas)"),
    ("resume-other-algorithm", lambda t, f: ["--resume", "--out", unfinished(t, f), "--algorithm", "streaming",
                                             "--fragments", "2"],
     "written with algorithm='diloco' but this run has algorithm='streaming'"),
    ("resume-other-model-shape", lambda t, f: ["--resume", "--out", unfinished(t, f), "--layers", "4"],
     "written with n_layers=None but this run has n_layers=4 (--layers)"),
    ("resume-fewer-steps", lambda t, f: ["--resume", "--out", str(shutil.copytree(f, t / "run")), "--steps", "3"],
     "steps (3) is below the checkpoint's step 4"),
    ("resume-damaged-checkpoint", lambda t, f: ["--resume", "--out", damaged_run(t, f)],
     "--resume: no readable checkpoint in"),
    # ---- params checkpoints (--init-from) ----
    ("init-from-missing", lambda t, f: ["--init-from", str(t / "nope")], "does not exist"),
    ("init-from-a-file", lambda t, f: ["--init-from", write(t / "p.bin", b"x")], "is a file, not a checkpoint directory"),
    ("init-from-not-a-checkpoint", lambda t, f: ["--init-from", str(t)], "is not a params checkpoint"),
    ("init-from-training-checkpoint", lambda t, f: ["--init-from", str(f / "checkpoints" / "4")],
     "is a training checkpoint (or run) directory"),
    ("init-from-another-model", lambda t, f: ["--init-from", other_model_params(t, f)], "but this model needs"),
    ("init-from-damaged", lambda t, f: ["--init-from", damaged_params(t, f)], "cannot be read"),
    # ---- replica drops ----
    ("drop-schedule-malformed", lambda t, f: ["--drop-schedule", "2-1"], "must look like step:replica"),
    ("drop-schedule-bad-replica", lambda t, f: ["--drop-schedule", "2:5"], "replica 5 (at step 2) is not in [0, replicas=2)"),
    ("drop-schedule-no-sync", lambda t, f: ["--drop-schedule", "3:0"], "no sync after step 3"),
    ("drop-prob-out-of-range", lambda t, f: ["--drop-prob", "1.5"], "drop_prob must be a number in [0, 1)"),
    ("drops-with-dp", lambda t, f: ["--algorithm", "dp", "--drop-prob", "0.1"], "algorithm 'dp' has none to miss"),
]


@pytest.mark.parametrize("case,extra,message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_one_line_exit_2_nothing_overwritten(case, extra, message, tmp_path, finished, capsys):
  argv = BASE + extra(tmp_path, finished)
  before, before_finished = snapshot(tmp_path), snapshot(finished)
  capsys.readouterr()
  assert main(argv) == 2, case
  err = capsys.readouterr().err
  assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
  assert snapshot(tmp_path) == before and snapshot(finished) == before_finished


def test_out_not_writable(tmp_path, monkeypatch, capsys):
  # Tests may run as root, which can write anywhere: pretend the directory is read-only.
  monkeypatch.setattr(os, "access", lambda path, mode: False)
  assert main(BASE + ["--out", str(tmp_path)]) == 2
  assert capsys.readouterr().err.strip() == f"error: out={str(tmp_path)!r} is not writable; choose another directory."
  assert main(BASE + ["--out", str(tmp_path / "a" / "b")]) == 2
  assert "cannot be created" in capsys.readouterr().err


def test_at_least_twenty_cases_and_all_in_the_docs():
  assert len(CASES) + 1 >= 20
  page = open(os.path.join(os.path.dirname(__file__), "..", "docs", "troubleshooting.md")).read()
  missing = [c[0] for c in CASES if f"`{c[0]}`" not in page]
  assert not missing, f"cases not listed in docs/troubleshooting.md: {missing}"


@pytest.mark.parametrize("argv,message", [
    (["--data", "/no/such/file.npy"], "no such file"),
    (["--resume", "--out", "{run}", "--replicas", "4"], "replicas=2 but this run has replicas=4"),
    (["--resume", "--out", "{damaged}"], "--resume: no readable checkpoint in"),  # Orbax read errors too
])
def test_cli_subprocess_no_traceback(argv, message, tmp_path, finished):
  if "{run}" in argv:
    argv[argv.index("{run}")] = unfinished(tmp_path, finished)
  if "{damaged}" in argv:
    argv[argv.index("{damaged}")] = damaged_run(tmp_path, finished)
  r = subprocess.run([sys.executable, "-m", "diloco_core.train", *BASE, *argv], capture_output=True, text=True)
  assert r.returncode == 2 and "Traceback" not in r.stderr
  lines = [line for line in r.stderr.splitlines() if line.startswith("error: ")]
  assert len(lines) == 1 and message in lines[0], r.stderr
