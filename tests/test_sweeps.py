"""analysis.lab.sweeps (grids, the on-disk cache, tidy results) and analysis.plots."""

import dataclasses
import json

import matplotlib
import numpy as np
import pandas as pd
import pytest

from analysis import experiments, plots, sweep_cache, sweeps
from diloco_core.algorithm.config import DiLoCoConfig
from diloco_core.data.sources import DataConfig
from diloco_core.spec.schedule import schedule_table
from diloco_core.train import TrainConfig

# A run that compiles and trains in a few seconds.
# tiny_run.tiny()'s shape (8 steps): its programs are compiled by other tests already
TINY = TrainConfig(algo=DiLoCoConfig(replicas=2, sync_every=2), data=DataConfig(vocab_size=16),
                   model="tiny", steps=8, batch_size=2, seq_len=8, eval_every=4, log_every=2,
                   warmup_steps=1, progress=False)


# ---- grids ---------------------------------------------------------------------------------
def test_grid_is_the_product_in_order():
  cfgs = sweeps.grid(TINY, replicas=[2, 4], sync_every=[2, 4])
  assert [(c.algo.replicas, c.algo.sync_every) for c in cfgs] == [(2, 2), (2, 4), (4, 2), (4, 4)]


def test_grid_resolves_fields_of_the_three_configs():
  (cfg,) = sweeps.grid(TINY, {"data.seed": [3], "seed": [5], "distribution": ["non-iid"],
                              "outer_lr": [0.5], "steps": [6]})
  assert cfg.data.seed == 3 and cfg.seed == 5 and cfg.data.distribution == "non-iid"
  assert cfg.algo.outer_lr == 0.5 and cfg.steps == 6


def test_grid_switches_diloco_to_streaming_for_fragments():
  (cfg,) = sweeps.grid(TINY, fragments=[3], sync_every=[6])
  assert cfg.algo.algorithm == "streaming" and cfg.algo.fragments == 3


def test_grid_invalid_combinations_raise_or_are_skipped():
  with pytest.raises(ValueError, match="multiple of fragments"):
    sweeps.grid(TINY, sync_every=[4], fragments=[3])
  cfgs = sweeps.grid(TINY, sync_every=[4, 6], fragments=[3], skip_invalid=True)
  assert [c.algo.sync_every for c in cfgs] == [6]


def test_grid_unknown_axis_names_the_options():
  with pytest.raises(ValueError, match="unknown sweep axis 'H'"):
    sweeps.grid(TINY, H=[1])


# ---- cache keys ------------------------------------------------------------------------------
def test_config_key_ignores_only_fields_that_change_no_number():
  key = sweep_cache.config_key(TINY)
  assert key == sweep_cache.config_key(dataclasses.replace(TINY, out="x", progress=True, overwrite=True))
  for changed in (dataclasses.replace(TINY, steps=5), dataclasses.replace(TINY, seed=1),
                  sweeps.with_values(TINY, {"outer_lr": 0.6}),
                  sweeps.with_values(TINY, {"data.seed": 1}),
                  sweeps.with_values(TINY, {"compression": "fp8"})):
    assert sweep_cache.config_key(changed) != key


def test_flat_config_prefixes_data_fields():
  row = sweeps.flat_config(TINY)
  assert row["sync_every"] == 2 and row["model"] == "tiny" and row["data_vocab_size"] == 16
  assert "out" not in row and "algo" not in row


# ---- running and caching -----------------------------------------------------------------------
def test_run_sweep_caches_each_run_and_reruns_changed_configs(tmp_path):
  cfgs = sweeps.grid(TINY, sync_every=[2, 4])
  first = sweeps.run_sweep(cfgs, cache=tmp_path, progress=False, compilation_cache=False)
  assert not first["cached"].any()
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted(first["key"])
  again = sweeps.run_sweep(cfgs, cache=tmp_path, progress=False, compilation_cache=False)
  assert again["cached"].all()
  pd.testing.assert_series_equal(first["final_eval_loss"], again["final_eval_loss"])
  changed = sweeps.run_sweep(sweeps.grid(TINY, sync_every=[2, 4], outer_lr=[0.5]), cache=tmp_path,
                             progress=False, compilation_cache=False)
  assert not changed["cached"].any()
  # each cached run holds its full config, its summary and its metrics
  saved = json.loads((tmp_path / first["key"][0] / "config.json").read_text())
  assert saved["config"]["algo"]["sync_every"] == 2 and "code" in saved


def test_run_sweep_rows_are_tidy(tmp_path):
  df = sweeps.run_sweep(sweeps.grid(TINY, algorithm=["dp", "diloco"]), cache=tmp_path,
                        progress=False, compilation_cache=False)
  assert list(df["algorithm"]) == ["dp", "diloco"]
  for col in sweeps.SUMMARY_COLUMNS + ("key", "cached", "run_s", "replicas", "data_seed"):
    assert col in df.columns
  assert df.loc[0, "total_bytes_per_replica"] > df.loc[1, "total_bytes_per_replica"] > 0
  assert sweeps.varying_columns(df) == ["algorithm"]
  curves = sweeps.sweep_curves(df, cache=tmp_path)
  assert set(curves["algorithm"]) == {"dp", "diloco"}
  assert {"step", "eval_loss", "total_bytes_sent"} <= set(curves.columns)
  assert curves.groupby("algorithm")["step"].max().tolist() == [TINY.steps] * 2


def test_half_written_runs_are_not_read_back(tmp_path):
  key = sweep_cache.config_key(TINY)
  (tmp_path / f".{key}.partial").mkdir()  # what an interrupted _save leaves behind
  (tmp_path / key).mkdir()  # a folder without summary.json
  _, _, cached = sweeps.run_one(TINY, cache=tmp_path)
  assert not cached


def test_cache_dir_follows_the_environment(monkeypatch, tmp_path):
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=8")  # no ISA cap
  monkeypatch.setenv(sweep_cache.CACHE_ENV, str(tmp_path / "c"))
  assert sweep_cache.cache_dir() == tmp_path / "c"
  monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_max_isa=AVX2")  # another realization: kept apart
  assert sweep_cache.cache_dir() == tmp_path / "c-avx2"
  assert sweep_cache.cache_dir(tmp_path / "mine") == tmp_path / "mine"  # a folder named is used as is
  monkeypatch.delenv(sweep_cache.CACHE_ENV)
  assert str(sweep_cache.cache_dir()) == sweep_cache.DEFAULT_CACHE_DIR + "-avx2"
  monkeypatch.setenv("XLA_FLAGS", "")
  assert str(sweep_cache.cache_dir()) == sweep_cache.DEFAULT_CACHE_DIR


# ---- the docs sweeps -----------------------------------------------------------------------------
@pytest.mark.parametrize("scale", experiments.SCALES)
def test_named_sweeps_are_valid_and_distinct(scale):
  for name in experiments.SWEEPS:
    cfgs = experiments.named_sweep(name, scale)
    assert cfgs, name
    keys = [sweep_cache.config_key(c) for c in cfgs]
    assert len(set(keys)) == len(keys), f"{name} has duplicate runs"
    for c in cfgs:
      c.validate()


def test_cpu_experiments_are_in_the_papers_regime_and_the_build_retrains_few():
  """The stored experiments run many outer steps near convergence (docs/claims.md); the docs
  build trains only a fixed sample of them again (analysis.lab.stored), not every run."""
  from analysis import recheck
  base = experiments.base_config()
  assert base.steps // base.algo.sync_every >= 50
  for name, cfg in experiments.claims_arms().items():
    if cfg.algo.sync_every <= base.algo.sync_every:
      assert cfg.steps // cfg.algo.sync_every >= 50, name
  for c in experiments.methods_configs():
    if c.algo.algorithm != "dp":
      assert c.steps // c.algo.sync_every >= 50
  assert experiments.CLAIM_SEEDS >= 5
  retrained = sum(min(recheck.sample_size(n), len(experiments.named_sweep(n))) for n in experiments.SWEEPS)
  assert retrained <= 20  # 10-40 s each (the methods run: about 2 min)


def test_unknown_sweep_and_scale():
  with pytest.raises(ValueError, match="sweep must be one of"):
    experiments.named_sweep("nope")
  with pytest.raises(ValueError, match="scale must be one of"):
    experiments.base_config("gpu")


# ---- comparisons ------------------------------------------------------------------------------
def _fake(**cols):
  return pd.DataFrame(cols)


def test_compare_counts_paired_wins():
  df = _fake(H=[1, 1, 1, 2, 2, 2], seed=[0, 1, 2, 0, 1, 2],
             final_eval_loss=[2.0, 2.0, 2.0, 1.5, 2.5, 1.0])
  c = sweeps.compare(df, {"H": 1}, {"H": 2})
  assert c["better"] == "b" and c["wins_b"] == 2 and c["pairs"] == 3
  assert c["diff"] == pytest.approx(-0.333333, abs=1e-6)
  with pytest.raises(ValueError, match="no run matches"):
    sweeps.compare(df, {"H": 3}, {"H": 2})


def test_paired_noise_cancels_the_seed_and_takes_the_median_over_pairs():
  # seed 1 is worse by 1.0 everywhere (cancels); H = 4 deviates by 0.3 on seed 1; H = 8 diverged
  df = _fake(H=[1, 1, 2, 2, 4, 4, 8, 8], seed=[0, 1] * 4,
             final_eval_loss=[2.0, 3.0, 2.5, 3.5, 2.0, 3.3, 9.0, 5.0])
  # pair sds: (1,2) 0; (1,4) 0.3/√2; (2,4) 0.3/√2; (1,8), (2,8) 5/√2; (4,8) 5.3/√2 -> median 2.65/√2
  assert sweeps.paired_noise(df) == pytest.approx((0.3 / 2 ** 0.5 + 5 / 2 ** 0.5) / 2, abs=1e-12)
  assert sweeps.paired_noise(df[df["H"] != 8]) == pytest.approx(0.3 / 2 ** 0.5, abs=1e-12)
  one_seed = df[df["seed"] == 0]
  assert np.isnan(sweeps.paired_noise(one_seed))  # no pair shares two seeds


def test_best_and_summarize():
  df = _fake(lr=[1, 1, 1, 1], eta=[0.3, 0.3, 0.9, 0.9], seed=[0, 1, 0, 1],
             final_eval_loss=[1.0, 3.0, 1.5, 1.6])
  assert sweeps.best(df, "lr", "eta").loc[1, "eta"] == 0.9  # means 2.0 vs 1.55
  s = sweeps.summarize(df, "eta")
  assert s.loc[0.3, "n"] == 2 and s.loc[0.3, "mean"] == 2.0


# ---- plots --------------------------------------------------------------------------------------
def _runs():
  rows = []
  for m in (2, 4):
    for h in (4, 16):
      for seed in (0, 1):
        rows.append(dict(algorithm="diloco", replicas=m, sync_every=h, seed=seed,
                         compression="none", error_feedback=False,
                         final_eval_loss=1.0 + h / 100 + seed / 50 - m / 100,
                         total_bytes_per_replica=1e6 / h))
  return pd.DataFrame(rows)


def test_plot_functions_return_figures_with_data():
  df = _runs()
  curves = pd.DataFrame({"step": [0, 10, 20] * 2, "eval_loss": [3, 2, 1.5, 3, 2.5, 2],
                         "algorithm": ["dp"] * 3 + ["diloco"] * 3})
  figs = [plots.plot_curves(curves, floor=1.0),
          plots.plot_metric(df, x="sync_every", hue="replicas", logx=True, floor=0.9),
          plots.plot_metric(df, x="compression", categorical=True),
          plots.plot_tradeoff(df, hue="replicas", annotate="sync_every"),
          plots.plot_bars(df, x="sync_every", hue="replicas", floor=0.9),
          plots.plot_lines(df, x="sync_every", y="final_eval_loss", hue="replicas",
                           hlines={"ref": 1.0}),
          plots.plot_schedule(6, 3, 1, 12)]
  for fig in figs:
    assert isinstance(fig, matplotlib.figure.Figure)
    ax = fig.axes[0]
    assert ax.lines or ax.collections or ax.patches
  # two replica groups -> two lines (plus the floor) with means over the two seeds
  ax = figs[1].axes[0]
  assert ax.get_xlabel() == plots.label("sync_every")
  assert len(ax.get_legend().get_texts()) == 3


def test_plot_timeline_draws_each_kind():
  tl = pd.DataFrame({"kind": ["compute", "idle", "compute", "transfer"],
                     "start": [0.0, 1.0, 1.5, 0.8], "end": [1.0, 1.5, 2.5, 1.5]})
  fig = plots.plot_timeline(tl, start=0.0, end=2.5)
  labels = {t.get_text() for t in fig.axes[0].get_legend().get_texts()}
  assert labels == {"compute", "idle", "transfer"}


@pytest.mark.parametrize("h,p,tau", [(6, 3, 1), (12, 4, 2), (8, 1, 0), (10, 5, 7)])
def test_schedule_text_matches_schedule_table(h, p, tau):
  steps = 3 * h
  lines = plots.schedule_text(h, p, tau, steps).splitlines()
  send = next(l for l in lines if l.startswith("Streaming") and l.rstrip().split()[-2] == "send")
  merge = next(l for l in lines if l.startswith("Streaming") and "merge" in l)
  send_cells, merge_cells = send[-steps:], merge[-steps:]
  for row in schedule_table(h, p, tau, steps):
    t = row["step"] - 1
    assert send_cells[t] == ("." if row["send"] is None else str(row["send"]))
    assert merge_cells[t] == ("." if row["merge"] is None else str(row["merge"]))
  diloco = next(l for l in lines if l.startswith("DiLoCo"))[-steps:]
  assert [i + 1 for i, c in enumerate(diloco) if c == "S"] == list(range(h, steps + 1, h))
  assert np.all(np.array(list(lines[1][-steps:])) == "A")
