"""Stored experiments: the file format, the hash, staleness, the re-check, and every stored file."""

from __future__ import annotations

import json

import pytest

from analysis import experiments, stored
from analysis.sweeps import grid
from diloco_core.data import DataConfig
from diloco_core.train import TrainConfig

_TINY = TrainConfig(model="tiny", steps=8, batch_size=2, seq_len=8, eval_every=4, log_every=4,
                    warmup_steps=1, data=DataConfig(vocab_size=16), progress=False)


@pytest.fixture(scope="module")
def toy_trained(tmp_path_factory):
  """The two-run experiment 'toy' trained and stored once for the module (shared runs), by two
  worker processes."""
  root = tmp_path_factory.mktemp("toy")
  with pytest.MonkeyPatch.context() as mp:
    mp.setitem(experiments.SWEEPS, "toy", _toy)
    path = stored.run_experiment("toy", cache=root / "cache", progress=False, out_dir=root / "stored",
                                 workers=2)  # the two runs trained by two spawned processes
  return path


def _toy(scale):
  return grid(_TINY, sync_every=[2, 4])


@pytest.fixture
def toy(toy_trained, monkeypatch, tmp_path):
  """A registered experiment 'toy' with a fresh copy of its stored file (each test may edit it)."""
  monkeypatch.setitem(experiments.SWEEPS, "toy", _toy)
  monkeypatch.setattr(stored, "RESULTS_DIR", tmp_path / "results")
  (tmp_path / "results").mkdir()
  path = tmp_path / "results" / "toy.json"
  path.write_text(toy_trained.read_text())
  return path


def test_stored_file_holds_runs_provenance_and_a_matching_hash(toy):
  doc = json.loads(toy.read_text())
  assert doc["name"] == "toy" and doc["format"] == stored.FORMAT and len(doc["runs"]) == 2
  prov = doc["provenance"]
  for k in ("code", "jax", "jaxlib", "numpy", "python", "platform", "device_kind", "date",
            "wall_time_s", "command"):
    assert prov[k] not in (None, ""), k
  assert prov["command"] == "python -m analysis experiments run toy --scale cpu"
  assert doc["sha256"] == stored.content_hash(doc)
  e = stored.load("toy")
  assert e.frame["sync_every"].tolist() == [2, 4]
  assert e.frame["final_eval_loss"].notna().all()
  assert set(e.curves["step"]) == {0, 4, 8}
  assert "toy" in e.provenance_line() and prov["code"] in e.provenance_line()


def test_an_edited_number_is_refused(toy):
  doc = json.loads(toy.read_text())
  doc["runs"][0]["row"]["final_eval_loss"] += 1e-9
  toy.write_text(json.dumps(doc))
  with pytest.raises(stored.StoredResultError, match="do not match its sha256"):
    stored.load("toy")


def test_a_changed_experiment_is_stale(toy, monkeypatch):
  monkeypatch.setitem(experiments.SWEEPS, "toy", lambda scale: grid(_TINY, sync_every=[2, 8]))  # changed
  with pytest.raises(stored.StoredResultError, match=r"stale: 1 of its 2 configs differ.*experiments run toy"):
    stored.load("toy")


def test_missing_and_wrong_scale(toy, monkeypatch):
  with pytest.raises(stored.StoredResultError, match="stored at scale 'cpu', asked for 'accelerator'"):
    stored.load("toy", scale="accelerator")
  toy.unlink()
  with pytest.raises(stored.StoredResultError, match="no stored file"):
    stored.load("toy")


def test_verify_retrains_the_sample_and_catches_a_changed_trainer(toy, monkeypatch):
  # The file was trained by two spawned workers (`run --workers 2`); trained again here, in one
  # process, every run gives its numbers (the curve passes through the cache's JSON lines).
  assert stored.load("toy").provenance["workers"] == 2
  report = stored.verify("toy", k=2)
  assert sorted(report["index"]) == [0, 1]
  assert report["ok"].all() and (report["max_rel_diff"] < 1e-9).all()  # CPU: the same losses
  # A trainer whose numbers changed: the run now trains with another inner LR.
  real = stored.run_one
  monkeypatch.setattr(stored, "run_one", lambda cfg, cache=None: real(
      cfg.__class__(**{**cfg.__dict__, "inner_lr": cfg.inner_lr * 1.01}), cache=cache))
  with pytest.raises(stored.StoredResultError, match=r"run [01] .* differs in .* allowed 1e-06"):
    stored.verify("toy", k=1)


def test_on_another_cpu_verify_checks_the_counts_and_the_final_loss_within_the_cross_cpu_bound(toy, monkeypatch):
  assert stored.load("toy").provenance["cpu"] == stored.cpu_fingerprint()
  monkeypatch.setattr(stored, "cpu_fingerprint", lambda: "another CPU; avx2")
  real = stored.run_one
  # other rounding (a 1% larger inner LR stands for it): not exact, but the same counts and a close loss
  monkeypatch.setattr(stored, "run_one", lambda cfg, cache=None: real(
      cfg.__class__(**{**cfg.__dict__, "inner_lr": cfg.inner_lr * 1.01}), cache=cache))
  report = stored.verify("toy", k=1)
  assert report["check"].tolist() == ["another CPU"] and report["ok"].all()
  assert 0 < report["max_rel_diff"].iloc[0] <= stored.CROSS_CPU_RTOL
  # a changed count (another sequence length: other tokens) fails on any CPU
  monkeypatch.setattr(stored, "run_one", lambda cfg, cache=None: real(
      cfg.__class__(**{**cfg.__dict__, "seq_len": cfg.seq_len // 2}), cache=cache))
  with pytest.raises(stored.StoredResultError, match="on another CPU than the stored one"):
    stored.verify("toy", k=1)


def test_verify_all_refuses_a_bad_worker_count_before_training():
  # workers > 1 (spawned processes) is what the docs build runs on every stored experiment
  with pytest.raises(ValueError, match="workers must be an integer >= 1, got 0"):
    stored.verify_all(["toy"], workers=0)


def test_sample_indices_are_fixed_and_spread():
  costs = [float(c) for c in range(144, 0, -1)]  # run i costs 144 - i: the last is the cheapest
  assert stored.sample_indices(costs, 1) == [143]
  assert stored.sample_indices(costs, 2) == [143, 0]
  assert stored.sample_indices(costs, 3) == [143, 71, 0]  # the 72nd cheapest is run 71
  assert stored.sample_indices([1.0, 1.0, 0.5], 5) == [2, 0, 1]  # ties: the lower index first


@pytest.mark.parametrize("name", sorted(experiments.SWEEPS))
def test_every_experiment_is_stored_up_to_date_and_unedited(name):
  """Every named experiment has a stored file whose hash matches and whose configs are the
  registry's: changing an experiment without running it again fails here."""
  e = stored.load(name)
  assert len(e.runs) == len(experiments.named_sweep(name))
  assert e.provenance["runs"] == len(e.runs)


# ---- python -m analysis experiments ------------------------------------------------------------
def test_experiments_cli_lists_runs_stores_and_verifies(toy, capsys):
  from analysis import __main__ as cli
  assert cli.main(["experiments", "list"]) == 0
  out = capsys.readouterr().out
  assert any(line.startswith("toy") and "2 runs" in line and "stored" in line for line in out.splitlines())
  assert cli.main(["experiments", "verify", "toy", "--sample", "1"]) == 0
  assert "toy: 1 runs trained again, largest relative difference" in capsys.readouterr().out


@pytest.mark.parametrize("argv,message", [
    (["experiments", "run", "nope"], "experiment must be one of"),
    (["experiments", "run"], "name at least one experiment"),
    (["experiments", "verify", "claims", "--scale", "gpu"], "scale must be one of"),
    (["experiments", "run", "claims", "--workers", "0"], "--workers must be an integer >= 1, got 0"),
])
def test_experiments_cli_bad_input_is_one_line_before_any_training(argv, message, capsys):
  from analysis import __main__ as cli
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and message in err[0], err
