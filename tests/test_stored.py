"""Stored experiments: the file format, the hash, staleness, the re-check, and every stored file."""

from __future__ import annotations

import json
import os
import re

import pytest

from analysis import cpu_kind, experiments, realizations, recheck, stored, storing
from analysis.lab.sweep_cache import cache_dir
from analysis.lab.sweeps import run_one
from analysis.lab.sweeps import grid
from diloco_core.data.sources import DataConfig
from diloco_core.train import TrainConfig

_TINY = TrainConfig(model="tiny", steps=8, batch_size=2, seq_len=8, eval_every=4, log_every=4,
                    warmup_steps=1, data=DataConfig(vocab_size=16), progress=False)


@pytest.fixture(scope="module")
def toy_trained(tmp_path_factory):
  """The experiment 'toy' (two configs x two seeds) trained and stored once for the module
  (shared runs), by two worker processes."""
  root = tmp_path_factory.mktemp("toy")
  with pytest.MonkeyPatch.context() as mp:
    mp.setitem(experiments.SWEEPS, "toy", _toy)
    path = storing.run_experiment("toy", cache=root / "cache", progress=False, out_dir=root / "stored",
                                 workers=2)  # the two runs trained by two spawned processes
  return path


def _toy(scale):
  return grid(_TINY, sync_every=[2, 4], seed=[0, 1])


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
  assert doc["name"] == "toy" and doc["format"] == stored.FORMAT and len(doc["runs"]) == 4
  prov = doc["provenance"]
  for k in ("code", "jax", "jaxlib", "numpy", "python", "platform", "device_kind", "date",
            "wall_time_s", "command"):
    assert prov[k] not in (None, ""), k
  assert prov["command"] == "python -m analysis experiments run toy --scale cpu"
  assert doc["sha256"] == stored.content_hash(doc)
  e = stored.load("toy")
  assert e.frame["sync_every"].tolist() == [2, 2, 4, 4] and e.frame["seed"].tolist() == [0, 1, 0, 1]
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
  monkeypatch.setitem(experiments.SWEEPS, "toy", lambda scale: grid(_TINY, sync_every=[2, 8], seed=[0, 1]))
  with pytest.raises(stored.StoredResultError, match=r"stale: 2 of its 4 configs differ.*experiments run toy"):
    stored.load("toy")


def test_missing_and_wrong_scale(toy, monkeypatch):
  with pytest.raises(stored.StoredResultError, match="stored at scale 'cpu', asked for 'accelerator'"):
    stored.load("toy", scale="accelerator")
  toy.unlink()
  with pytest.raises(stored.StoredResultError, match="no stored file"):
    stored.load("toy")


@pytest.mark.parametrize("content, why", [
    ("[1, 2, 3]", "toy.json holds a JSON list, not a stored experiment (an object)"),
    ("folder", "toy.json is a folder, not a file"),
    ("{not json", "not valid JSON"),
])
def test_a_file_that_is_not_a_stored_experiment_is_refused_in_one_line(toy, content, why):
  toy.unlink()
  if content == "folder":
    toy.mkdir()
  else:
    toy.write_text(content)
  with pytest.raises(stored.StoredResultError) as e:
    stored.load("toy")
  assert why in str(e.value) and "\n" not in str(e.value)
  assert str(e.value).endswith("run `python -m analysis experiments run toy` to train and store it again.")


def _perturbed(monkeypatch, summary=None, cfg_change=None, scale_metrics=None):
  """run_one of the re-check, with the trained run changed: its config (a changed trainer), its
  summary numbers (another rounding) or its logged losses after ``scale_metrics = (step, f)``."""
  real = run_one  # the trainer itself (not an earlier patch)

  def fake(cfg, cache=None, until=None):
    if cfg_change:
      cfg = cfg.__class__(**{**cfg.__dict__, **cfg_change(cfg)})
    s, m, c = real(cfg, cache=cache, until=until)
    s = None if s is None else {**s, **(summary(s) if summary else {})}
    if scale_metrics:
      step, f = scale_metrics
      m = m.copy()
      for col in ("train_loss", "eval_loss"):
        m.loc[m["step"] > step, col] *= f
    return s, m, c
  monkeypatch.setattr(recheck, "run_one", fake)


def test_verify_retrains_the_sample_and_catches_a_changed_trainer(toy, monkeypatch):
  # The file was trained by two spawned workers (`run --workers 2`); trained again here, in one
  # process, every run gives its numbers (the curve passes through the cache's JSON lines).
  assert stored.load("toy").provenance["workers"] == 2
  report = recheck.verify("toy", k=2)
  costs = [r["row"]["wall_time_s"] for r in stored.load("toy").runs]
  cheapest, dearest = min(range(4), key=costs.__getitem__), max(range(4), key=costs.__getitem__)
  assert sorted(report["index"]) == sorted([cheapest, dearest])  # by stored wall time
  assert report["ok"].all() and (report["max_rel_diff"] < 1e-9).all()  # CPU: the same losses
  assert (report["check"] == "exact").all() and (report["against"] == "toy.json").all()
  # A trainer whose numbers changed: the run now trains with another inner LR.
  _perturbed(monkeypatch, cfg_change=lambda c: {"inner_lr": c.inner_lr * 1.01})
  with pytest.raises(stored.StoredResultError, match=r"run \d .* differs from toy.json in .* allowed 1e-06"):
    recheck.verify("toy", k=1)


def test_a_prefix_only_experiment_is_trained_to_its_step_and_still_catches_a_changed_trainer(toy, monkeypatch):
  """An experiment of PREFIX_ONLY: its sampled run trained up to that step only (schedule of the
  whole run), its losses and byte counters there equal the stored ones; a 1% change of the inner
  LR is caught in those steps; `whole=True` trains it to the end."""
  monkeypatch.setitem(recheck.PREFIX_ONLY, "toy", 4)
  trained = []
  real = run_one
  monkeypatch.setattr(recheck, "run_one", lambda cfg, cache=None, until=None: trained.append(until) or real(
      cfg, cache=cache, until=until))
  report = recheck.verify("toy", k=1)
  assert trained == [4] and report["steps"].tolist() == [4] and report["ok"].all()
  assert report["check"].tolist() == ["exact"] and report["max_rel_diff"].iloc[0] < 1e-9
  assert recheck.summary_line(report).startswith(f"toy: run {report['index'].iloc[0]} trained again up to step 4 (PREFIX_ONLY)")
  assert recheck.verify("toy", k=1, whole=True)["steps"].tolist() == [8] and trained == [4, None]
  _perturbed(monkeypatch, cfg_change=lambda c: {"inner_lr": c.inner_lr * 1.01})
  with pytest.raises(stored.StoredResultError, match=r"differs from toy.json in (train|eval)_loss of the first 4 steps"):
    recheck.verify("toy", k=1)


def _another_cpu(monkeypatch):
  assert stored.load("toy").provenance["cpu"] == cpu_kind.cpu_fingerprint()
  monkeypatch.setattr(recheck, "cpu_fingerprint", lambda: "another CPU; sse4_2 avx avx2")


def test_on_another_cpu_the_counts_the_prefix_and_the_seed_spread_decide(toy, monkeypatch):
  _another_cpu(monkeypatch)
  e = stored.load("toy")
  _, sigma_e = realizations.seed_spread(e.runs)
  [i] = recheck.sample_indices([r["row"]["wall_time_s"] for r in e.runs], 1, realizations.stable_runs(e.runs))
  sigma = realizations.run_scales(e.runs)[i]  # max(sigma_E, the sampled configuration's own spread)
  assert sigma >= sigma_e > 0
  # Another rounding: the losses after the prefix and the final loss moved by one seed spread.
  moved = lambda s: {"final_eval_loss": s["final_eval_loss"] + sigma}
  _perturbed(monkeypatch, summary=moved, scale_metrics=(recheck.PREFIX_STEPS, 1.01))
  report = recheck.verify("toy", k=1)
  assert report["check"].tolist() == ["another CPU"] and report["ok"].all()
  assert report["spread_z"].iloc[0] == pytest.approx(1 / 2 ** 0.5)
  assert report["prefix_rel_diff"].iloc[0] < 1e-9  # the toy's 8 steps are all in the prefix: unchanged
  # The final loss beyond SPREAD_Z standard deviations of two realizations: not the same experiment.
  far = lambda s: {"final_eval_loss": s["final_eval_loss"] + 6 * sigma}
  _perturbed(monkeypatch, summary=far)
  with pytest.raises(stored.StoredResultError, match=r"on another CPU than toy.json's: its final eval loss moved by"
                                                     r" 4.24 standard deviations .* \(allowed 4 on another CPU\)"):
    recheck.verify("toy", k=1)


def test_on_another_cpu_a_changed_count_still_fails(toy, monkeypatch):
  _another_cpu(monkeypatch)
  _perturbed(monkeypatch, cfg_change=lambda c: {"seq_len": c.seq_len // 2})
  with pytest.raises(stored.StoredResultError, match="its total_bytes_per_replica differs|its tokens differ"):
    recheck.verify("toy", k=1)


def test_on_another_cpu_the_prefix_catches_a_one_percent_change_of_the_inner_lr(monkeypatch):
  """The power of check 1 on a stored experiment's own sampled run (h_m's, about 10 s): a trainer
  whose inner LR is 1% off moves the losses of the first PREFIX_STEPS steps past PREFIX_RTOL,
  on any CPU (its final loss alone, within the seed spread, would not tell)."""
  monkeypatch.setattr(recheck, "cpu_fingerprint", lambda: "another CPU; sse4_2 avx avx2")
  _perturbed(monkeypatch, cfg_change=lambda c: {"inner_lr": c.inner_lr * 1.01})
  with pytest.raises(stored.StoredResultError, match=r"another CPU than h_m.json's: its losses of the first 40 steps"
                                                     r" differ by .* \(relative; allowed 0.0001 on another CPU\)"):
    recheck.verify("h_m", k=1)


def test_a_realization_stored_on_this_kind_of_cpu_is_checked_exactly(toy, monkeypatch):
  """On the CPU of a second realization (NAME@R.json), under its instruction-set cap, the check
  is exact against that file; the same fingerprint without the cap (a real CPU of that kind,
  not an emulation) is another kind. (The cap is SSE4_2, which hides AVX on any machine that
  runs this suite, so it is an emulation on every one.)"""
  doc = json.loads(toy.read_text())
  doc["provenance"]["cpu"] = "the CPU of the main file; avx512f"
  doc["sha256"] = stored.content_hash(doc)
  toy.write_text(json.dumps(doc))
  flags = os.environ.get("XLA_FLAGS", "")
  monkeypatch.setenv("XLA_FLAGS", f"{flags} --xla_cpu_max_isa=SSE4_2".strip())  # read by the fingerprint only
  twin = json.loads(toy.read_text())
  twin["provenance"].update(cpu=cpu_kind.cpu_fingerprint(), max_isa="SSE4_2")
  twin["sha256"] = stored.content_hash(twin)
  (toy.parent / "toy@sse4_2.json").write_text(json.dumps(twin))
  assert stored.realizations("toy") == ["sse4_2"]
  assert recheck.same_cpu_file("toy").path.name == "toy@sse4_2.json"
  assert not recheck.same_kind({**twin["provenance"], "max_isa": None})
  report = recheck.verify("toy", k=1)
  assert report["against"].tolist() == ["toy@sse4_2.json"] and report["check"].tolist() == ["exact"]
  # so another rounding fails there, where the main file alone would have let it pass
  _perturbed(monkeypatch, summary=lambda s: {"final_eval_loss": s["final_eval_loss"] * (1 + 1e-4)})
  with pytest.raises(stored.StoredResultError, match="differs from toy@sse4_2.json in final_eval_loss"):
    recheck.verify("toy", k=1)


def test_unstable_configurations_are_never_sampled():
  runs = [{"config": {"h": h, "seed": s}, "row": {"final_eval_loss": v, "wall_time_s": t}}
          for h, s, v, t in [(1, 0, 1.0, 5.0), (1, 1, 1.01, 5.0), (2, 0, 1.0, 9.0), (2, 1, 1.01, 9.0),
                             (3, 0, 1.0, 1.0), (3, 1, 1.5, 1.0)]]  # h = 3: cheapest, seeds 50x apart
  per_run, sigma = realizations.seed_spread(runs)
  c = realizations.median_sd_ratio(2)
  assert sigma == pytest.approx(0.01 / 2 ** 0.5 / c) and per_run[4] == pytest.approx(0.5 / 2 ** 0.5 / c)
  costs = [r["row"]["wall_time_s"] for r in runs]
  assert recheck.sample_indices(costs, 1) == [4]
  assert recheck.sample_indices(costs, 1, eligible=realizations.stable_runs(runs)) == [0]


def test_the_seed_spread_estimates_sigma_alike_for_two_seeds_and_for_eight():
  """Groups of k seeds drawn from one normal law (sigma = 0.01): the experiment's spread is about
  sigma whether each configuration has 2 seeds or 8 (the plain median of two-seed standard
  deviations would be 0.674 sigma, judging two-seed experiments 1.48 times as strictly)."""
  import numpy as np
  rng = np.random.default_rng(0)
  for k in (2, 3, 8):
    runs = [{"config": {"h": h, "seed": s}, "row": {"final_eval_loss": 1.0 + 0.01 * rng.standard_normal()}}
            for h in range(4001) for s in range(k)]
    _, sigma_e = realizations.seed_spread(runs)
    assert sigma_e == pytest.approx(0.01, rel=0.03), k
  assert realizations.median_sd_ratio(2) == pytest.approx(0.6744897501960817)  # Phi^-1(3/4)


def test_a_noisier_configuration_is_judged_by_its_own_seed_spread():
  """Check 2's scale is max(sigma_E, sigma_c): a configuration twice as noisy as the median
  gets twice the allowance; a luckily tight one keeps the experiment's floor."""
  runs = [{"config": {"h": h, "seed": s}, "row": {"final_eval_loss": v}}
          for h, s, v in [(1, 0, 1.0), (1, 1, 1.01), (2, 0, 1.0), (2, 1, 1.02), (3, 0, 1.0), (3, 1, 1.0),
                          (4, 0, 1.0), (4, 1, 1.04)]]
  _, sigma_e = realizations.seed_spread(runs)
  c = realizations.median_sd_ratio(2)  # two seeds: the standard deviations over sqrt(2), over c
  assert sigma_e == pytest.approx(0.015 / 2 ** 0.5 / c)  # the median of 0.01, 0.02, 0, 0.04
  scales = realizations.run_scales(runs)
  assert scales[6] == pytest.approx(0.04 / 2 ** 0.5 / c) and scales[4] == pytest.approx(sigma_e)
  assert scales[0] == pytest.approx(sigma_e)


def test_the_cpu_fingerprint_follows_the_isa_cap(monkeypatch):
  assert cpu_kind.max_isa("--xla_cpu_max_isa=AVX2 --xla_cpu_max_isa=sse4_2") == "SSE4_2"  # the last one
  full = cpu_kind.cpu_fingerprint("")
  capped = cpu_kind.cpu_fingerprint("--xla_cpu_max_isa=AVX2")
  assert capped.split(";")[0] == full.split(";")[0]  # the same model
  assert not {"avx512f", "avx512_bf16", "avx_vnni"} & set(capped.split(";")[1].split())
  assert set(capped.split(";")[1].split()) <= set(full.split(";")[1].split())
  with pytest.raises(ValueError, match="--xla_cpu_max_isa must be one of"):
    cpu_kind.cpu_fingerprint("--xla_cpu_max_isa=AVX3")
  monkeypatch.delenv("DILOCO_SWEEPS_CACHE", raising=False)
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX2")
  assert str(cache_dir()) == ".cache/sweeps-avx2"  # runs of another realization kept apart
  assert str(cache_dir("/tmp/x")) == "/tmp/x"


def test_a_realization_is_stored_only_under_its_isa_cap(monkeypatch, tmp_path):
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
  with pytest.raises(ValueError, match=r"--xla_cpu_max_isa=AVX2 before JAX starts.*--isa AVX2"):
    storing.run_experiment("claims", realization="avx2", out_dir=tmp_path)
  assert not list(tmp_path.iterdir())


def test_verify_all_refuses_a_bad_worker_count_before_training():
  # workers > 1 (spawned processes) is what the docs build runs on every stored experiment
  with pytest.raises(ValueError, match="workers must be an integer >= 1, got 0"):
    recheck.verify_all(["toy"], workers=0)


def test_sample_indices_are_fixed_and_spread():
  costs = [float(c) for c in range(144, 0, -1)]  # run i costs 144 - i: the last is the cheapest
  assert recheck.sample_indices(costs, 1) == [143]
  assert recheck.sample_indices(costs, 2) == [143, 0]
  assert recheck.sample_indices(costs, 3) == [143, 71, 0]  # the 72nd cheapest is run 71
  assert recheck.sample_indices([1.0, 1.0, 0.5], 5) == [2, 0, 1]  # ties: the lower index first


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
  assert any(line.startswith("toy") and "4 runs" in line and "stored" in line for line in out.splitlines())
  assert cli.main(["experiments", "verify", "toy", "--sample", "1"]) == 0
  assert re.search(r"^toy: run \d trained again, exact against toy.json: largest relative difference \S+ \(allowed 1e-06\)",
                   capsys.readouterr().out, re.M)


@pytest.mark.parametrize("argv,message", [
    (["experiments", "run", "nope"], "experiment must be one of"),
    (["experiments", "run"], "name at least one experiment"),
    (["experiments", "verify", "claims", "--scale", "gpu"], "scale must be one of"),
    (["experiments", "run", "claims", "--workers", "0"], "--workers must be an integer >= 1, got 0"),
    (["experiments", "verify", "claims", "--isa", "AVX3"], "--isa must be one of"),
    (["experiments", "verify", "claims", "--sample", "0"], "--sample must be an integer in [1, 192] (runs of claims"),
])
def test_experiments_cli_bad_input_is_one_line_before_any_training(argv, message, capsys):
  from analysis import __main__ as cli
  assert cli.main(argv) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert len(err) == 1 and message in err[0], err
