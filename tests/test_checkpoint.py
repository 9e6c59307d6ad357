"""Checkpoints, exact resume after SIGKILL, bootstrap, export, non-finite stops and replica drops."""

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from diloco_core import DataConfig, DataParallel, DiLoCo, DiLoCoConfig, load_params
from diloco_core.store import checkpoint as ckpt
from diloco_core.store import tree_io
from diloco_core.spec.fields import must_match_fields
from diloco_core.train import TrainConfig, build_parser, config_from_args, main, participation, train
from tiny_run import tiny

BASE = ["--model", "tiny", "--batch-size", "2", "--seq-len", "8", "--data-vocab", "16", "--data-order", "1",
        "--warmup-steps", "1", "--log-every", "2", "--eval-every", "6", "--no-progress"]
# The streaming case has a fragment in flight at every checkpoint: Δh = 2, so a fragment is
# sent at every even step and merged one step later (τ = 1); it also carries error-feedback
# residuals, bf16 wire compression and seeded replica drops (who took part is in flight too).
ALGOS = {
    "dp": ["--algorithm", "dp"],
    "diloco": ["--algorithm", "diloco", "--sync-every", "4"],
    "streaming": ["--algorithm", "streaming", "--replicas", "3", "--fragments", "2", "--sync-every", "4",
                  "--overlap", "1", "--compression", "bf16", "--error-feedback", "--drop-prob", "0.3"],
}
STEPS = 32


@pytest.fixture(scope="module", autouse=True)
def compilation_cache(tmp_path_factory):
  """Runs of one config compile once (a persistent cache shared by the xdist workers).

  The killed Streaming subprocess does not use it: its rows come from a fresh compilation
  and the reference's from another, so that comparison also covers recompiling after a
  restart, as a real resume does.
  """
  from jax.experimental.compilation_cache import compilation_cache as cc
  old = jax.config.jax_compilation_cache_dir, jax.config.jax_persistent_cache_min_compile_time_secs
  path = str(tmp_path_factory.getbasetemp().parent / "jax-compilation-cache")
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
  cc.reset_cache()
  cc.set_cache_dir(path)
  yield path
  jax.config.update("jax_compilation_cache_dir", old[0])
  jax.config.update("jax_persistent_cache_min_compile_time_secs", old[1])
  cc.reset_cache()


def config(algo, **changes):
  """The TrainConfig of ``BASE + ALGOS[algo]`` for STEPS steps (same compiled programs)."""
  cfg = config_from_args(build_parser().parse_args(BASE + ALGOS[algo] + ["--steps", str(STEPS)]))
  return dataclasses.replace(cfg, **changes)


def rows(path):
  out = [json.loads(line) for line in open(path)]
  for r in out:
    r.pop("wall_time_s")
  return out


def same_summary(a, b):
  keys = ["final_eval_loss", "loss_floor", "total_bytes_per_replica", "peak_bytes_per_step", "tokens", "params"]
  return {k: a[k] for k in keys} == {k: b[k] for k in keys}


# ---- exact resume after SIGKILL ----------------------------------------------------------------
@pytest.mark.cpu_only("the killed run trains in a child process, and a second process cannot take the"
                      " accelerator the suite holds; test_resume_with_a_npy_file_through_grain_is_bit_exact"
                      " resumes in this process")
@pytest.mark.parametrize("algo", list(ALGOS))
def test_resume_after_sigkill_is_bit_exact(algo, tmp_path, compilation_cache):
  argv = BASE + ALGOS[algo] + ["--steps", str(STEPS)]
  ref, run = tmp_path / "ref", tmp_path / "run"
  assert main(argv + ["--out", str(ref)]) == 0  # never interrupted
  env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT"))}
  if algo != "streaming":
    env.update(JAX_COMPILATION_CACHE_DIR=compilation_cache, JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  killed = subprocess.Popen(
      [sys.executable, "-m", "diloco_core.train", *argv, "--out", str(run), "--checkpoint-every", "2",
       "--keep-checkpoints", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
  try:
    deadline = time.time() + 120
    while not ckpt.finalized_steps(str(run)):
      assert killed.poll() is None, killed.stderr.read()
      assert time.time() < deadline, "no checkpoint appeared"
      time.sleep(0.005)
    killed.send_signal(signal.SIGKILL)  # wherever it is: between steps, or in the middle of a save
  finally:
    killed.kill()
    killed.wait()
  assert killed.returncode == -signal.SIGKILL and not (run / "summary.json").exists()
  at_kill = ckpt.finalized_steps(str(run))[-1]
  assert 2 <= at_kill < STEPS

  assert main(argv + ["--out", str(run), "--resume", "--checkpoint-every", "20"]) == 0  # a compatible change
  assert rows(run / "metrics.jsonl") == rows(ref / "metrics.jsonl")
  a, b = json.load(open(ref / "summary.json")), json.load(open(run / "summary.json"))
  assert same_summary(a, b) and b["resumed_from"].endswith(f"checkpoints/{b['resumed_from'].split('/')[-1]}")
  pa, pb = load_params(str(ref / "final_params")), load_params(str(run / "final_params"))
  for x, y in zip(jax.tree.leaves(pa), jax.tree.leaves(pb)):
    np.testing.assert_array_equal(x, y)
  if algo == "streaming":  # drops happened, and are recorded
    assert any(len(p[1]) < 3 for r in rows(ref / "metrics.jsonl") for p in r["participants"])


def test_restore_gives_the_same_pytree_bit_for_bit(tmp_path):
  cfg = config("streaming", checkpoint_every=STEPS, out=str(tmp_path))
  result = train(cfg)
  from diloco_core.model.transformer import init_model, lm_loss
  from diloco_core.train import make_algorithm
  apply_fn, params = init_model(cfg.model_config(vocab_size=16), cfg.seed)
  algo = make_algorithm(cfg, lambda p, t: lm_loss(apply_fn, p, t), params)
  fresh = algo.init(params)
  restored = ckpt.restore_latest(str(tmp_path), fresh, dataclasses.asdict(cfg), must_match_fields(TrainConfig))
  assert restored.step == STEPS and jax.tree.structure(restored.state) == jax.tree.structure(result.state)
  for x, y in zip(jax.tree.leaves(restored.state), jax.tree.leaves(result.state)):
    assert x.dtype == y.dtype and x.sharding == y.sharding
    np.testing.assert_array_equal(x, y)
  assert restored.state.ef_residual is not None and restored.state.participants.shape == (3, 2)
  meta = restored.meta
  assert meta["data_position"] == [STEPS] * 3 and meta["seeds"]["data"] == 0 and meta["config"]["steps"] == STEPS
  assert [r["step"] for r in meta["metrics"]["rows"]] == list(range(0, STEPS + 1, 2))


def test_interrupted_save_and_damaged_checkpoint_are_skipped(tmp_path, capsys):
  """A crash mid-save leaves <step>.orbax-checkpoint-tmp-*; a damaged newest checkpoint is set aside."""
  argv = BASE + ALGOS["diloco"] + ["--steps", str(STEPS)]
  ref, run = tmp_path / "ref", tmp_path / "run"
  assert main(argv + ["--out", str(ref)]) == 0
  assert main(argv + ["--out", str(run), "--checkpoint-every", "10", "--keep-checkpoints", "5"]) == 0
  d = run / "checkpoints"
  assert ckpt.finalized_steps(str(run)) == [10, 20, 30, 32]
  os.remove(run / "summary.json")
  for step in (30, 32):  # pretend the run died after step 25: drop the later checkpoints
    shutil.rmtree(d / str(step))
  (d / "30.orbax-checkpoint-tmp-1234" / "state").mkdir(parents=True)  # the save that was cut off
  for f in (d / "20" / "state").rglob("*"):  # and the newest complete one is damaged on disk
    if f.is_file() and f.parent.name == "d":
      f.write_bytes(f.read_bytes()[: len(f.read_bytes()) // 2])
  capsys.readouterr()
  assert main(argv + ["--out", str(run), "--resume"]) == 0
  err = capsys.readouterr().err
  assert "interrupted save" in err and "is damaged" in err
  assert not (d / "30.orbax-checkpoint-tmp-1234").exists() and (d / "20.damaged").exists()
  assert rows(run / "metrics.jsonl") == rows(ref / "metrics.jsonl")  # resumed from step 10, still exact
  assert json.load(open(run / "summary.json"))["resumed_from"].endswith("checkpoints/10")


def test_keep_last_k_and_resume_extends_a_finished_run(tmp_path):
  out = str(tmp_path)
  train(config("diloco", checkpoint_every=4, keep_checkpoints=2, out=out))
  assert ckpt.finalized_steps(out) == [28, 32]
  # more steps and another eval interval are compatible changes
  longer = train(config("diloco", steps=36, checkpoint_every=4, keep_checkpoints=2, eval_every=4, out=out, resume=True))
  assert [r["step"] for r in rows(tmp_path / "metrics.jsonl")][-4:] == [30, 32, 34, 36]
  assert longer.summary["resumed_from"].endswith("checkpoints/32") and ckpt.finalized_steps(out) == [32, 36]


def test_resume_with_a_npy_file_through_grain_is_bit_exact(tmp_path):
  """File data (Grain windows) resumes exactly from the data position; read-ahead workers change nothing."""
  path = tmp_path / "ids.npy"
  np.save(path, (np.arange(3000) * 7) % 16)
  argv = BASE + ALGOS["diloco"] + ["--data", str(path), "--distribution", "non-iid", "--vocab-size", "16"]
  ref, run = tmp_path / "ref", tmp_path / "run"
  assert main(argv + ["--steps", "12", "--out", str(ref)]) == 0
  assert main(argv + ["--steps", "12", "--checkpoint-every", "6", "--out", str(run)]) == 0
  for name in ("summary.json", "final_params", "checkpoints/12"):  # as if it died after step 6
    shutil.rmtree(run / name) if (run / name).is_dir() else os.remove(run / name)
  assert main(argv + ["--steps", "12", "--resume", "--data-workers", "2", "--out", str(run)]) == 0
  assert rows(run / "metrics.jsonl") == rows(ref / "metrics.jsonl")
  summary = json.load(open(run / "summary.json"))
  assert summary["data"]["kind"] == "npy" and summary["resumed_from"].endswith("checkpoints/6")
  for x, y in zip(jax.tree.leaves(load_params(str(ref / "final_params"))),
                  jax.tree.leaves(load_params(str(run / "final_params")))):
    np.testing.assert_array_equal(x, y)


# ---- bootstrap and export ------------------------------------------------------------------------
def test_export_and_bootstrap_a_diloco_run_from_a_dp_run(tmp_path):
  dp = train(config("dp", out=str(tmp_path / "dp")))
  path = str(tmp_path / "dp" / "final_params")
  loaded = load_params(path)  # the documented one-liner
  for x, y in zip(jax.tree.leaves(loaded), jax.tree.leaves(dp.params)):
    np.testing.assert_array_equal(x, y)
  assert dp.summary["final_params"] == path
  boot = train(config("streaming", init_from=path))
  # the step-0 evaluation is of the loaded params (the global copy the replicas start from)
  assert boot.metrics["eval_loss"].iloc[0] == dp.metrics["eval_loss"].dropna().iloc[-1]
  assert np.isfinite(boot.summary["final_eval_loss"])
  # what the trainer does with them: broadcast to every replica, fresh (zero) outer momentum
  algo = DiLoCo(quad, optax.sgd(0.1), DiLoCoConfig(replicas=3))
  state = algo.init(loaded)
  for x, y in zip(jax.tree.leaves(state.params), jax.tree.leaves(loaded)):
    np.testing.assert_array_equal(x, np.broadcast_to(y, x.shape))
  assert not any(np.any(np.asarray(v)) for v in jax.tree.leaves(state.outer_state))


# ---- non-finite --------------------------------------------------------------------------------
def test_non_finite_loss_stops_naming_step_and_replica_and_keeps_the_last_checkpoint(tmp_path, capsys):
  out = tmp_path / "nan"
  assert main(BASE + ALGOS["diloco"] + ["--steps", "12", "--inner-lr", "1e30", "--checkpoint-every", "2",
                                        "--out", str(out)]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("error: ") and "lower --inner-lr" in err and "\n" not in err
  bad_step = int(err.split("step ")[1].split()[0].rstrip(","))
  steps = ckpt.finalized_steps(str(out))
  assert steps and max(steps) < bad_step and f"the newest finite checkpoint is {out}/checkpoints/{max(steps)};" in err
  assert not (out / "summary.json").exists() and not (out / "final_params").exists()


def test_non_finite_params_name_the_step_and_replica():
  from diloco_core.run.cli import to_flags
  from diloco_core.run.loop import check_finite
  algo = DiLoCo(quad, optax.sgd(0.5), DiLoCoConfig(replicas=3, sync_every=2))
  state = algo.init(jnp.zeros(2))
  ok = np.zeros((2, 3))
  check_finite(algo, ok, 4, state, None)
  bad = state.replace(params=state.params.at[1, 0].set(jnp.inf))

  def message(*args, algorithm=algo):  # the library names the option by field; the CLI by flag
    with pytest.raises(FloatingPointError) as e:
      check_finite(algorithm, *args)
    return to_flags(str(e.value))

  assert message(ok, 4, bad, "ck/2") == (
      "non-finite params after step 4 on replica(s) [1]; lower --inner-lr and start over with --overwrite"
      " (the newest finite checkpoint is ck/2; --resume continues from it with the same --inner-lr).")
  assert str(pytest.raises(FloatingPointError, check_finite, algo, ok, 4, bad, None).value).endswith(
      "lower `inner_lr` and start over with `overwrite` (no checkpoint was written).")  # no resume offered
  assert message(ok, 6, state.replace(global_params=jnp.array([0.0, jnp.nan])), None).startswith(
      "non-finite global params after step 6; lower --outer-lr and start over")
  assert message(np.array([[0, 0, np.nan], [0, 0, 0]]), 4, state, None).startswith(
      "training loss at step 3 is nan on replica(s) [2]; lower --inner-lr")
  dp = DataParallel(quad, optax.sgd(0.5), DiLoCoConfig(algorithm="dp", replicas=3))
  dp_state = dp.init(jnp.zeros(2))
  check_finite(dp, ok, 4, dp_state, None)
  assert message(ok, 4, dp_state.replace(params=jnp.array([jnp.nan, 0.0])), None, algorithm=dp) == (
      "non-finite params after step 4; lower --inner-lr and start over with --overwrite (no checkpoint"
      " was written).")


# ---- replica drops -------------------------------------------------------------------------------
def quad(w, x):
  return 0.5 * jnp.sum((w - x) ** 2)


def test_drop_by_hand_renormalised_mean_and_healing():
  """M = 3, inner SGD lr 0.5 (w <- (w + x_m) / 2), x = (2, 4, 8), H = 1, η = 1, μ = 0, α = 0.5.

  Step 1, replica 1 absent: replicas 1, 2, 4; Δ over {0, 2} = mean(-1, -4) = -2.5; θ_g = 2.5;
  present replicas blend: 0.5·1 + 0.5·2.5 = 1.75 and 0.5·4 + 0.5·2.5 = 3.25; the absent one
  is replaced by θ_g = 2.5. Step 2, nobody present: replicas step to 1.875, 3.25, 5.625;
  θ_g, the momentum and the replicas are otherwise left alone.
  """
  cfg = DiLoCoConfig(replicas=3, sync_every=1, outer_lr=1.0, outer_momentum=0.0, alpha=0.5)
  algo = DiLoCo(quad, optax.sgd(0.5), cfg)
  state = algo.init(jnp.zeros(()))
  x = jnp.array([2.0, 4.0, 8.0])
  state, _ = algo.step(state, x, jnp.array([1.0, 0.0, 1.0]))
  np.testing.assert_allclose(state.global_params, 2.5, rtol=1e-6)
  np.testing.assert_allclose(state.params, [1.75, 2.5, 3.25], rtol=1e-6)
  assert state.participants.tolist() == [[1.0], [0.0], [1.0]]
  state, _ = algo.step(state, x, jnp.zeros(3))
  np.testing.assert_allclose(state.global_params, 2.5, rtol=1e-6)
  np.testing.assert_allclose(state.params, [1.875, 3.25, 5.625], rtol=1e-6)


def test_drop_with_momentum_and_overlap_heals_at_the_merge():
  """τ = 1: replica 0 misses the sync after step 1 and is replaced by θ_g one step later.

  loss 0.5 (w - x_m)^2, SGD lr 0.5, x = (4, 0), M = 2, H = 2, η = 0.5, μ = 0.9, w = 0.
  Step 1: replicas 2, 0. Step 2: replicas 3, 0; sync with replica 1 only: Δ = 0 - 0 = 0,
  v = 0, θ_g = 0. Step 3: replicas 3.5, 0, then the merge: replica 0 (absent) <- θ_g = 0,
  replica 1 (present, α = 0) <- 0.
  Step 4: replicas 2, 0; sync with both: Δ = mean(0 - 2, 0 - 0) = -1, v = -1,
  θ_g = 0 - 0.5 (-1 + 0.9 (-1)) = 0.95.
  """
  cfg = DiLoCoConfig(algorithm="streaming", replicas=2, sync_every=2, overlap=1, outer_lr=0.5, outer_momentum=0.9)
  algo = DiLoCo(quad, optax.sgd(0.5), cfg)
  state = algo.init(jnp.zeros(()))
  x = jnp.array([4.0, 0.0])
  masks = [[1, 1], [0, 1], [1, 1], [1, 1]]
  seen = []
  for m in masks:
    state, _ = algo.step(state, x, jnp.array(m, jnp.float32))
    seen.append((np.asarray(state.params).tolist(), float(state.global_params)))
  assert seen[1] == ([3.0, 0.0], 0.0) and seen[2] == ([0.0, 0.0], 0.0)
  np.testing.assert_allclose(seen[3][1], 0.95, rtol=1e-6)
  np.testing.assert_allclose(state.outer_state[0].trace, -1.0, rtol=1e-6)


@pytest.mark.parametrize("kw", [dict(), dict(algorithm="streaming", fragments=2, overlap=3, alpha=0.3,
                                           compression="fp8", error_feedback=True)])
def test_all_present_mask_is_bit_identical_to_no_mask(kw):
  rng = np.random.default_rng(0)
  params = {"emb": jnp.array([0.5, -1.0]), "layers": jnp.array([[1.0], [-2.0], [0.25], [3.0]])}
  loss = lambda p, t: 0.5 * sum(jnp.sum((a - b) ** 2) for a, b in zip(jax.tree.leaves(p), jax.tree.leaves(t)))
  targets = [jax.tree.map(lambda x: jnp.asarray(rng.normal(size=(3, *x.shape)), jnp.float32), params)
             for _ in range(13)]
  cfg = DiLoCoConfig(replicas=3, sync_every=4, **kw)
  out = []
  for mask in (None, np.ones(3, np.float32)):
    algo = DiLoCo(loss, optax.adam(0.05), cfg, layer_mask={"emb": False, "layers": True})
    state = algo.init(params)
    for tg in targets:
      state, _ = algo.step(state, tg, mask)
    out.append(jax.tree.leaves(state))
  for a, b in zip(*out):
    np.testing.assert_array_equal(a, b)


def test_trainer_drop_schedule_records_participants_and_changes_only_later_rows():
  plain = train(config("diloco"))
  dropped = train(config("diloco", drop_schedule=((28, 1), (32, 0))))
  m = dropped.metrics
  assert m["participants"].tolist()[-3:] == [[[28, [0]]], [], [[32, [1]]]]
  assert m["participants"].tolist()[2] == [[4, [0, 1]]]
  cols = ["train_loss", "eval_loss"]
  a, b = plain.metrics[cols].to_numpy(float), m[cols].to_numpy(float)
  k = 28 // 2  # the row of step 28
  np.testing.assert_array_equal(a[:k], b[:k])  # identical up to the drop (the mask path is exact)
  assert a[k, 0] == b[k, 0] and a[k + 1, 1] != b[k + 1, 1]  # same loss at step 28, eval at 30 differs
  assert a[-1, 1] != b[-1, 1]
  # Bytes: a dropped replica sends nothing, so each of the two syncs with one of M = 2 replicas
  # missing counts half a fragment per replica; the peak is still one whole fragment.
  per_sync = plain.summary["peak_bytes_per_step"]
  cfg = config("diloco")
  assert plain.summary["total_bytes_per_replica"] == per_sync * (cfg.steps // cfg.algo.sync_every)
  assert dropped.summary["total_bytes_per_replica"] == plain.summary["total_bytes_per_replica"] - per_sync
  assert dropped.summary["peak_bytes_per_step"] == per_sync
  assert m["bytes_sent"].sum() == dropped.summary["total_bytes_per_replica"]
  prob = tiny(replicas=4, drop_prob=0.5, seed=3)
  assert participation(prob, 4).tolist() == participation(prob, 4).tolist()  # seeded: pure in (seed, step)
  assert participation(prob, 3).tolist() == [1.0] * 4  # no sync after step 3


def test_asyncio_logs_of_failed_orbax_reads_are_dropped_and_others_kept():
  import logging
  import sys as _sys
  from diloco_core.store import checkpoint as ck

  def record_of(filename):
    try:
      exec(compile("raise ValueError('NOT_FOUND: array')", filename, "exec"))
    except ValueError:
      info = _sys.exc_info()
    return logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "Task exception was never retrieved",
                             None, info)

  tree_io.quiet_orbax_failures()
  filters = [f for f in logging.getLogger("asyncio").filters if isinstance(f, tree_io.OrbaxReadFailures)]
  assert len(filters) == 1
  tree_io.quiet_orbax_failures()  # installed once
  assert len([f for f in logging.getLogger("asyncio").filters if isinstance(f, tree_io.OrbaxReadFailures)]) == 1
  assert not filters[0].filter(record_of("/site-packages/orbax/checkpoint/_src/serialization.py"))
  assert filters[0].filter(record_of("/home/user/my_code.py"))
  assert filters[0].filter(logging.LogRecord("asyncio", logging.ERROR, __file__, 1, "no exception", None, None))
