"""Disk faults: a run that cannot fit is refused before its first step; a disk that fills up,
a removed ``--out`` or ``metrics.jsonl`` and a failed final export end the run in one line that
names the path and the way on; nothing complete that was written is lost."""

import os
import shutil
import subprocess
import sys

import orbax.checkpoint as ocp
import pytest

from diloco_core.store import checkpoint as ckpt
from diloco_core.store import disk_space
from diloco_core.run import metrics_log
from diloco_core.train import main

BASE = ["--model", "tiny", "--batch-size", "2", "--seq-len", "8", "--data-vocab", "16", "--data-order", "1",
        "--warmup-steps", "1", "--log-every", "2", "--eval-every", "4", "--steps", "8", "--sync-every", "2",
        "--no-progress"]
FULL = "RESOURCE_EXHAUSTED: Failed writing: \"x\": No space left on device [os_error_code='28']"


def du(root) -> int:
  return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def one_error_line(err: str) -> str:
  lines = [line for line in err.splitlines() if line.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in err, err
  return lines[0]


def test_the_estimate_bounds_what_a_run_writes(tmp_path, monkeypatch):
  """The bytes the check asks for are at least what the run has on disk at its end (its kept
  checkpoints, final params, metrics and summary) plus the one checkpoint being saved, and
  within 3x of it (the arrays are counted uncompressed)."""
  asked = []
  real = disk_space.check_space
  monkeypatch.setattr(disk_space, "check_space", lambda out, need, detail: (asked.append(need), real(out, need, detail)))
  out = tmp_path / "run"
  assert main(BASE + ["--out", str(out), "--checkpoint-every", "2", "--keep-checkpoints", "2"]) == 0
  kept = sorted(ckpt.finalized_steps(str(out)))
  assert kept == [6, 8]
  peak = du(out) + du(out / "checkpoints" / "8")  # the oldest kept one is deleted after the new save
  assert len(asked) == 1 and peak <= asked[0] <= 3 * peak, (asked, peak)


def test_a_run_that_cannot_fit_on_its_disk_is_refused_before_its_first_step(tmp_path, monkeypatch, capsys):
  monkeypatch.setattr(disk_space, "free_bytes", lambda path: 100_000)
  out = tmp_path / "run"
  assert main(BASE + ["--out", str(out), "--checkpoint-every", "2"]) == 2
  line = one_error_line(capsys.readouterr().err)
  assert line.startswith(f"error: the disk of --out {out} has 100 kB free, but this run writes about ")
  assert "4 checkpoint(s) of about" in line and "choose another --out (fewer --keep-checkpoints" in line
  assert not out.exists() or not any(out.iterdir())  # nothing trained, nothing written


def test_a_disk_that_fills_up_during_a_save_is_one_line(tmp_path, monkeypatch, capsys):
  """The save of step 6 finds the disk full: one line with the free space and the way on; the
  partial checkpoint is removed, the complete ones stay; the advice works."""
  real = ocp.CheckpointManager.save

  def save(self, step, *args, **kwargs):
    if step == 6:
      os.makedirs(os.path.join(str(self.directory), "6.orbax-checkpoint-tmp-1"))  # what Orbax had begun
      raise ValueError(f"{FULL} while writing checkpoint 6")
    return real(self, step, *args, **kwargs)

  monkeypatch.setattr(ocp.CheckpointManager, "save", save)
  out = tmp_path / "run"
  assert main(BASE + ["--out", str(out), "--checkpoint-every", "2"]) == 2
  line = one_error_line(capsys.readouterr().err)
  d = out / "checkpoints"
  assert line.startswith(f"error: checkpoint {d}/6 could not be written: no space left on the disk of {d} (")
  assert line.endswith(f"free space there, then continue with --resume (from {d}/4)."), line
  assert sorted(os.listdir(d)) == ["2", "4"]
  monkeypatch.setattr(ocp.CheckpointManager, "save", real)
  assert main(BASE + ["--out", str(out), "--checkpoint-every", "2", "--resume"]) == 0


def test_a_disk_that_fills_up_between_saves_is_one_line(tmp_path, monkeypatch, capsys):
  """The metrics row of step 4 finds the disk full: one line; the rows before it stay."""

  class Full:
    def __init__(self, f):
      self.f, self.rows = f, 0

    def write(self, line):
      self.rows += 1
      if self.rows == 2:
        raise OSError(28, "No space left on device")
      return self.f.write(line)

    def __getattr__(self, name):
      return getattr(self.f, name)

  monkeypatch.setattr(metrics_log, "open", lambda *a, **k: Full(open(*a, **k)), raising=False)
  out = tmp_path / "run"
  assert main(BASE + ["--out", str(out)]) == 2
  line = one_error_line(capsys.readouterr().err)
  assert line.startswith(f"error: {out}/metrics.jsonl could not be written: no space left on the disk of {out} (")
  assert line.endswith("the run stopped after step 3: fix that, then start over with --overwrite."), line
  assert [r.split(",")[0] for r in (out / "metrics.jsonl").read_text().splitlines()] == ['{"step": 2']


def test_out_removed_during_a_run_is_one_line(tmp_path, monkeypatch, capsys):
  """`rm -rf OUT` mid-run: the rows would go to a deleted file; the run stops in one line."""
  real, calls = metrics_log.MetricsLog.fetch_losses, []

  def fetch_then_remove(self):
    calls.append(1)
    if len(calls) == 2:
      shutil.rmtree(out)
    return real(self)

  monkeypatch.setattr(metrics_log.MetricsLog, "fetch_losses", fetch_then_remove)
  out = tmp_path / "run"
  assert main(BASE + ["--out", str(out)]) == 2
  assert one_error_line(capsys.readouterr().err) == (
      f"error: --out {out} was removed during the run; the run stopped after step 3: fix that, then start"
      " over with --overwrite.")


def test_a_final_export_that_finds_the_disk_full_keeps_the_result_in_the_last_checkpoint(tmp_path, monkeypatch, capsys):
  real = ocp.StandardCheckpointer.save

  def save(self, directory, *args, **kwargs):
    os.makedirs(f"{directory}.orbax-checkpoint-tmp-7")  # what Orbax had begun
    raise ValueError(FULL)

  monkeypatch.setattr(ocp.StandardCheckpointer, "save", save)
  out = tmp_path / "run"
  assert main(BASE + ["--out", str(out), "--checkpoint-every", "4"]) == 2
  line = one_error_line(capsys.readouterr().err)
  assert line.startswith(f"error: the params could not be written to {out}/final_params (no space left on the disk of {out} (")
  assert line.endswith(f"the run trained all 8 steps: its last checkpoint {out}/checkpoints/8 holds the result;"
                       " free space, then run again with --resume."), line
  assert sorted(os.listdir(out)) == ["checkpoints", "metrics.jsonl"]  # no half-written export left
  monkeypatch.setattr(ocp.StandardCheckpointer, "save", real)
  assert main(BASE + ["--out", str(out), "--checkpoint-every", "4", "--resume"]) == 0
  assert (out / "final_params").is_dir() and (out / "summary.json").is_file()


def _small_disk(path) -> str | None:
  """Mounts a 2 MB tmpfs at ``path``; None when it did, else why it cannot be done here."""
  if os.geteuid() != 0 or shutil.which("mount") is None:
    return "a small disk needs root and mount"
  path.mkdir()
  r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(path)], capture_output=True, text=True)
  return None if r.returncode == 0 else f"mount -t tmpfs failed here ({r.stderr.strip()})"


@pytest.mark.slow
def test_on_a_real_small_disk(tmp_path):
  """A 2 MB tmpfs: 8 replicas' checkpoints do not fit (refused before the first step); 2 do, and
  filling the disk during the run ends it in one line that says so, the complete checkpoints kept."""
  disk = tmp_path / "disk"
  why = _small_disk(disk)
  if why is not None:
    pytest.skip(why)
  p = None
  try:
    train = [sys.executable, "-m", "diloco_core.train", "--model", "tiny", "--batch-size", "2", "--seq-len", "16",
             "--no-progress", "--sync-every", "10", "--checkpoint-every", "10"]
    r = subprocess.run([*train, "--replicas", "8", "--steps", "40", "--out", str(disk / "r8")], capture_output=True, text=True)
    assert r.returncode == 2 and one_error_line(r.stderr).startswith(f"error: the disk of --out {disk}/r8 has ")
    assert not (disk / "r8" / "metrics.jsonl").exists()
    p = subprocess.Popen([*train, "--replicas", "2", "--steps", "2000", "--out", str(disk / "r2")],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    while not ckpt.finalized_steps(str(disk / "r2")):
      assert p.poll() is None, p.communicate()
    with open(disk / "filler", "wb", buffering=0) as f:  # fill the disk to the last block
      try:
        while True:
          f.write(b"\0" * 4096)
      except OSError as e:
        assert e.errno == 28, e
    _, err = p.communicate(timeout=120)
    assert p.returncode == 2 and "no space left on the disk of" in one_error_line(err)
    left = os.listdir(disk / "r2" / "checkpoints")
    assert left and all(name.isdigit() for name in left), left  # complete ones only
  finally:  # a trainer still running keeps the disk busy: stop it first
    if p is not None and p.poll() is None:
      p.kill()
      p.wait()
    if subprocess.run(["umount", str(disk)], capture_output=True).returncode != 0:
      subprocess.run(["umount", "-l", str(disk)], capture_output=True)
