"""Bad input: one case per row of docs/troubleshooting.md.

Every case runs the CLI (``main``), which must return 2 with a single ``error: ...`` line on
stderr that names the problem, and must leave every file that already existed untouched.
"""

import hashlib
import json
import os
import signal
import shutil
import subprocess
import sys

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from diloco_core import DiLoCo, DiLoCoConfig, export_params, init_model, load_params
from diloco_core.store import checkpoint as ckpt
from diloco_core.run.divergence import Watch
from diloco_core.runtime.communication import InStep
from diloco_core.spec.model_config import get_preset
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


def quad(w, x):
  return 0.5 * jnp.sum((w - x) ** 2)


def snapshot(root):
  return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else None
          for p in root.rglob("*")}


def write(path, data):
  path.write_bytes(data)
  return str(path)


def npy(path, array):
  np.save(path, array)
  return str(path)


def shards(tmp, files):
  """A shard directory ``tmp/shards`` holding ``files`` (name -> array saved as .npy, or raw bytes)."""
  (tmp / "shards").mkdir()
  for name, content in files.items():
    write(tmp / "shards" / name, content) if isinstance(content, bytes) else np.save(tmp / "shards" / name, content)
  return str(tmp / "shards")


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


def all_damaged(tmp, finished):
  run = tmp / "run"
  shutil.copytree(finished, run)
  for step in ("2", "4"):
    truncate_all(run / "checkpoints" / step / "state")
  return str(run)


def damaged_params(tmp, finished):
  shutil.copytree(finished / "final_params", tmp / "params")
  truncate_all(tmp / "params")
  return str(tmp / "params")


def other_model_params(tmp, finished):
  _, params = init_model(get_preset("tiny").__class__(**{**get_preset("tiny").__dict__, "n_layers": 4,
                                                         "vocab_size": 16}), 0)
  return export_params(params, str(tmp / "other"))


def changed_params(tmp, finished):
  """The finished run's final_params whose array files were replaced by those of other params
  of the same model (what a flipped byte Orbax cannot see does): only the checksums can tell."""
  import dataclasses
  shutil.copytree(finished / "final_params", tmp / "params")
  _, other = init_model(dataclasses.replace(get_preset("tiny"), vocab_size=16), 1)
  export_params(other, str(tmp / "other"))
  for entry in (tmp / "other").iterdir():
    if entry.name != "params_manifest.json":
      target = tmp / "params" / entry.name
      shutil.rmtree(target) if target.is_dir() else target.unlink()
      shutil.move(str(entry), str(target))
  return str(tmp / "params")


# (id, argv builder (tmp_path, finished run) -> extra argv, expected part of the message)
CASES = [
    # ---- options ----
    ("steps-not-a-number", lambda t, f: ["--steps", "ten"], "argument --steps: invalid int value: 'ten'"),
    ("unknown-flag", lambda t, f: ["--stpes", "10"], "unrecognized arguments: --stpes"),
    ("replicas-zero", lambda t, f: ["--replicas", "0"], "--replicas (M) must be an integer >= 1"),
    ("h-not-multiple-of-p", lambda t, f: ["--algorithm", "streaming", "--fragments", "3", "--sync-every", "4"],
     "--sync-every (H=4) must be a multiple of fragments (P=3)"),
    ("overlap-too-large", lambda t, f: ["--overlap", "2"], "--overlap (τ) must be an integer with 0 <= τ < sync_every"),
    ("warmup-not-below-steps", lambda t, f: ["--warmup-steps", "4"], "--warmup-steps must be an integer in [0, --steps=4)"),
    ("experts-zero", lambda t, f: ["--experts", "0"], "--experts (E) must be an integer >= 1, got 0"),
    ("experts-per-token-above-experts", lambda t, f: ["--experts", "2", "--experts-per-token", "3"],
     "--experts-per-token (k=3) must be <= --experts (E=2)"),
    ("experts-below-the-presets-k", lambda t, f: ["--model", "moe-tiny", "--experts", "1"],
     "--experts-per-token (k=2, the moe-tiny preset's) must be <= --experts (E=1)"),
    ("mesh-too-large", lambda t, f: ["--mesh", "diloco=2,data=64"], "needs 128 devices"),
    # ---- data files ----
    ("data-missing", lambda t, f: ["--data", str(t / "none.txt")], "no such file"),
    ("data-directory-empty", lambda t, f: ["--data", str(t)], "is empty (use 'synthetic', a UTF-8 text file"),
    ("data-shards-mixed-dtypes", lambda t, f: ["--data", shards(t, {"a.npy": np.arange(50, dtype=np.int32),
                                                                     "b.npy": np.arange(50, dtype=np.int64)})],
     "mixes dtypes ['int32', 'int64']; save every .npy shard with one integer dtype"),
    ("data-shards-mixed-kinds", lambda t, f: ["--data", shards(t, {"a.npy": np.arange(50), "b.array_record": b""})],
     "mixes file kinds (.npy and .array_record)"),
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
    ("out-cannot-be-created", lambda t, f: ["--out", "/proc/x"], "--out '/proc/x' cannot be created ("),
    ("out-under-a-file", lambda t, f: ["--out", write(t / "file", b"x") + "/run"], "cannot be created (Not a directory)"),
    ("out-empty", lambda t, f: ["--out", ""], "--out must be a directory path, got ''"),
    # ---- sizes beyond the memory of the devices (checked before the model is built) ----
    ("replicas-beyond-memory", lambda t, f: ["--replicas", "1000000000000"], "lower --replicas, --batch-size"),
    ("batch-beyond-memory", lambda t, f: ["--batch-size", "100000000000"], "logits"),
    ("layers-beyond-memory", lambda t, f: ["--layers", "100000000"], "training state"),
    # ---- checkpoint options ----
    ("checkpoint-every-without-out", lambda t, f: ["--checkpoint-every", "2"], "--checkpoint-every needs --out"),
    ("checkpoint-every-off-log-rows", lambda t, f: ["--checkpoint-every", "3", "--out", str(t / "o")],
     "--checkpoint-every (3) must be a multiple of --log-every (2)"),
    ("checkpoint-every-negative", lambda t, f: ["--checkpoint-every", "-1"], "--checkpoint-every must be an integer >= 0"),
    ("keep-zero-checkpoints", lambda t, f: ["--keep-checkpoints", "0"], "--keep-checkpoints must be an integer >= 1"),
    ("resume-without-out", lambda t, f: ["--resume"], "resume needs --out"),
    ("resume-without-checkpoint", lambda t, f: ["--resume", "--out", str(t)], "--resume: no checkpoint in"),
    ("resume-other-replicas", lambda t, f: ["--resume", "--out", unfinished(t, f), "--replicas", "4"],
     "written with replicas=2 but this run has replicas=4 (--replicas)"),
    ("resume-other-algorithm", lambda t, f: ["--resume", "--out", unfinished(t, f), "--algorithm", "streaming",
                                             "--fragments", "2"],
     "written with algorithm='diloco' but this run has algorithm='streaming'"),
    ("resume-other-model-shape", lambda t, f: ["--resume", "--out", unfinished(t, f), "--layers", "4"],
     "written with n_layers=2 but this run has n_layers=4 (--layers)"),  # effective values
    ("resume-fewer-steps", lambda t, f: ["--resume", "--out", str(shutil.copytree(f, t / "run")), "--steps", "3"],
     "steps (3) is below the checkpoint's step 4"),
    ("resume-damaged-checkpoint", lambda t, f: ["--resume", "--out", damaged_run(t, f)],
     "--resume: no readable checkpoint in"),
    ("resume-all-damaged-names-each", lambda t, f: ["--resume", "--out", all_damaged(t, f)],
     "; step 2: "),
    ("resume-stopped-before-first-checkpoint", lambda t, f: ["--resume", "--out", str(t)] if write(
        t / "metrics.jsonl", b"{}\n") else [], "start over: drop --resume and pass --overwrite"),
    # ---- params checkpoints (--init-from) ----
    ("init-from-missing", lambda t, f: ["--init-from", str(t / "nope")], "does not exist"),
    ("init-from-a-file", lambda t, f: ["--init-from", write(t / "p.bin", b"x")], "is a file, not a checkpoint directory"),
    ("init-from-not-a-checkpoint", lambda t, f: ["--init-from", str(t)], "is not a params checkpoint"),
    ("init-from-training-checkpoint", lambda t, f: ["--init-from", str(f / "checkpoints" / "4")],
     "is a training checkpoint (or run) directory"),
    ("init-from-another-model", lambda t, f: ["--init-from", other_model_params(t, f)], "but this model needs"),
    ("init-from-damaged", lambda t, f: ["--init-from", damaged_params(t, f)], "cannot be read"),
    ("init-from-changed-contents", lambda t, f: ["--init-from", changed_params(t, f)],
     "is damaged: ['blocks']['attn_norm'] does not match its checksum in params_manifest.json"),
    # ---- options that would change nothing are refused, not ignored ----
    ("dp-with-outer-overlap", lambda t, f: ["--algorithm", "dp", "--outer-overlap", "eager"],
     "--outer-overlap 'eager' has no effect with algorithm 'dp' (no outer step"),
    ("error-feedback-without-compression", lambda t, f: ["--error-feedback"],
     "--error-feedback resends the compression residual, and compression='none' leaves none"),
    ("compression-block-without-compression", lambda t, f: ["--compression", "none", "--compression-block", "8"],
     "--compression-block 8 sets the quantization scale's block, and compression='none' quantizes nothing"),
    ("outer-beta2-without-adam", lambda t, f: ["--outer-beta2", "0.9"],
     "--outer-beta2 0.9 is Adam's second-moment decay, and outer_optimizer='nesterov' has none"),
    ("muon-momentum-without-muon", lambda t, f: ["--muon-momentum", "0.9"],
     "--muon-momentum 0.9 is Muon's momentum, and inner_optimizer='adamw' has none"),
    ("fragment-order-with-one-fragment", lambda t, f: ["--fragment-order", "embeddings-last"],
     "--fragment-order 'embeddings-last' orders fragments, and fragments (P=1) has one"),
    ("unknown-inner-optimizer", lambda t, f: ["--inner-optimizer", "lion"],
     "--inner-optimizer must be one of ('adamw', 'muon'), got 'lion'"),
    ("unknown-outer-optimizer", lambda t, f: ["--outer-optimizer", "adamw"],
     "--outer-optimizer must be one of ('nesterov', 'sgd', 'adam'), got 'adamw'"),
    ("topk-zero", lambda t, f: ["--topk", "0"], "--topk must be an integer in [1, topk_chunk=4096]"),
    ("topk-above-chunk", lambda t, f: ["--topk", "65", "--topk-chunk", "64"],
     "--topk must be an integer in [1, topk_chunk=64] (entries kept per chunk), got 65"),
    ("reduction-unknown", lambda t, f: ["--reduction", "ring"],
     "--reduction must be one of ('all-gather', 'reduce-scatter'), got 'ring'."),
    ("reduce-scatter-with-topk", lambda t, f: ["--compression", "e3m0", "--topk", "3", "--topk-chunk", "8",
                                               "--reduction", "reduce-scatter"],
     "--reduction reduce-scatter re-quantizes the mean of dense payloads, and topk (k=3) sends sparse ones"),
    ("drops-with-reduce-scatter", lambda t, f: ["--communication", "background", "--reduction", "reduce-scatter",
                                                "--drop-prob", "0.1"],
     "--communication background simulates replica drops with --reduction all-gather only"),
    ("topk-with-compression-block", lambda t, f: ["--topk", "4", "--compression", "fp4", "--compression-block", "8"],
     "--compression-block 8 cannot be combined with --topk: top-k values take one scale per chunk"),
    ("topk-chunk-without-topk", lambda t, f: ["--topk-chunk", "64"],
     "--topk-chunk 64 sets the top-k chunk, and topk is None (dense)"),
    ("error-feedback-decay-without-error-feedback", lambda t, f: ["--error-feedback-decay", "0.9"],
     "--error-feedback-decay 0.9 decays the error-feedback residual: pass --error-feedback"),
    ("allow-data-change-without-resume", lambda t, f: ["--allow-data-change"],
     "--allow-data-change only applies to --resume (a new run reads the data as it is): drop --allow-data-change."),
    ("join-timeout-infinite", lambda t, f: ["--join-timeout", "inf"],
     "--join-timeout must be a finite number of seconds > 0, got inf."),
    ("data-workers-negative", lambda t, f: ["--data-workers", "-1"], "--data-workers must be an integer >= 0"),
    ("experts-beyond-memory", lambda t, f: ["--experts", "1000000000"], "--seq-len, --layers or --experts."),
    # ---- replica drops ----
    ("drop-schedule-malformed", lambda t, f: ["--drop-schedule", "2-1"], "must look like step:replica"),
    ("drop-schedule-bad-replica", lambda t, f: ["--drop-schedule", "2:5"], "replica 5 (at step 2) is not in [0, replicas=2)"),
    ("drop-schedule-no-sync", lambda t, f: ["--drop-schedule", "3:0"], "no sync after step 3"),
    ("drop-prob-out-of-range", lambda t, f: ["--drop-prob", "1.5"], "--drop-prob must be a number in [0, 1)"),
    ("drops-with-dp", lambda t, f: ["--algorithm", "dp", "--drop-prob", "0.1"], "algorithm 'dp' has none to miss"),
    # ---- elastic runs ----
    ("elastic-in-step", lambda t, f: ["--elastic"], "--elastic needs --communication background"),
    ("elastic-one-process", lambda t, f: ["--elastic", "--communication", "background", "--replicas", "1"],
     "--elastic needs several processes: start them with `python -m diloco_core.launch"),
    ("elastic-with-eval-replicas", lambda t, f: ["--elastic", "--communication", "background", "--eval-replicas"],
     "--elastic does not support --eval-replicas (a lost replica has no params to evaluate); drop --elastic or"
     " --eval-replicas."),
    ("min-replicas-without-elastic", lambda t, f: ["--min-replicas", "2"],
     "--min-replicas applies to --elastic runs only: add --elastic, or drop --min-replicas."),
    ("min-replicas-above-replicas", lambda t, f: ["--elastic", "--min-replicas", "3"],
     "--min-replicas must be an integer in [1, replicas=2], got 3."),
    ("heal-wait-without-elastic", lambda t, f: ["--heal-wait", "30"],
     "--heal-wait applies to --elastic runs only: add --elastic, or drop --heal-wait."),
    ("heal-wait-negative", lambda t, f: ["--elastic", "--heal-wait", "-1"], "--heal-wait must be"),
    ("rejoin-schedule-malformed", lambda t, f: ["--rejoin-schedule", "4:1"], "must look like step:replica:source"),
    ("rejoin-schedule-same-replica", lambda t, f: ["--rejoin-schedule", "4:1:1"],
     "--rejoin-schedule entries must be (step, replica, source) with step in [1, steps=4] and two different replicas"),
    ("rejoin-schedule-background", lambda t, f: ["--rejoin-schedule", "4:1:0", "--communication", "background"],
     "--rejoin-schedule replays an elastic run in the in-step runtime"),
    # ---- the replica-vs-global diagnostic ----
    ("eval-replicas-with-dp", lambda t, f: ["--algorithm", "dp", "--eval-replicas"], "algorithm 'dp' has one model"),
    ("eval-replicas-with-checkpoints", lambda t, f: ["--eval-replicas", "--checkpoint-every", "2", "--out", str(t / "o")],
     "drop --checkpoint-every / --resume or --eval-replicas"),
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
  assert capsys.readouterr().err.strip() == f"error: --out={str(tmp_path)!r} is not writable; choose another directory."
  def refuse(path, *args, **kwargs):  # a read-only file system refuses root too
    raise PermissionError(13, "Permission denied", path)

  monkeypatch.setattr(os, "makedirs", refuse)
  assert main(BASE + ["--out", str(tmp_path / "a" / "b")]) == 2
  assert capsys.readouterr().err.strip() == (
      f"error: --out {str(tmp_path / 'a' / 'b')!r} cannot be created (Permission denied); choose a"
      " directory in a writable place.")


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


# ---- runs that go wrong after they start (each message's advice is followed) ----------------------
def strict_json(line):
  def refuse(name):
    raise AssertionError(f"metrics.jsonl holds {name}: not strict JSON")
  return json.loads(line, parse_constant=refuse)


def test_outer_divergence_stops_before_checkpointing_and_names_outer_lr(tmp_path, capsys):
  out = tmp_path / "run"
  argv = BASE + ["--algorithm", "streaming", "--fragments", "2", "--sync-every", "4", "--steps", "8",
                 "--checkpoint-every", "2", "--out", str(out)]
  assert main(argv + ["--outer-lr", "1e6"]) == 2
  err = capsys.readouterr().err
  lines = [line for line in err.splitlines() if line.startswith("error: ")]
  assert len(lines) == 1 and "Traceback" not in err, err
  assert lines[0].startswith("error: global params after the outer step at step 2 hold ") and (
      "lower --outer-lr and start over with --overwrite (no checkpoint was written" in lines[0]), lines[0]
  assert ckpt.finalized_steps(str(out)) == []  # step 2 diverged: never checkpointed
  rows = [strict_json(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  assert all(r["step"] < 2 for r in rows)
  # The advice works: a lower --outer-lr with --overwrite finishes, every row finite.
  assert main(argv + ["--outer-lr", "0.7", "--overwrite"]) == 0
  rows = [strict_json(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in rows] == [2, 4, 6, 8] and all(np.isfinite(r["train_loss"]) for r in rows)


def test_divergence_watch_blames_the_outer_or_the_inner_step():
  """max |θ| limit 1e3 (init max 1); an outer blow-up (replicas fine before the outer step)
  names outer_lr, a blow-up already in the replicas names inner_lr, an eval NaN outer_lr."""
  algo = DiLoCo(quad, optax.sgd(0.5), DiLoCoConfig(replicas=2, sync_every=2))
  state = algo.init(jnp.ones(2))
  watch = Watch(InStep(algo), state, 1.0, "ck/2", outer=True)
  big = state.replace(global_params=jnp.array([1.0, 5e3]))
  ok = np.ones((2, 2))
  watch.after_step(3, state, False, True)  # replicas fine before the send at 4
  watch.after_step(4, big, True, False)
  with pytest.raises(FloatingPointError, match=r"^global params after the outer step at step 4 hold 5e\+03"
                     r" \(above 1e\+03: exploding\) values; lower `outer_lr`"):
    watch.check_row(4, ok, big)
  watch.after_step(3, state.replace(params=jnp.full((2, 2), 2e3)), False, True)
  watch.after_step(4, big, True, False)
  with pytest.raises(FloatingPointError, match=r"^replica params after step 3, before the outer step,"
                     r" hold 2e\+03 .*lower `inner_lr`.*newest finite checkpoint is ck/2"):
    watch.check_row(4, ok, big)
  with pytest.raises(FloatingPointError, match=r"^training loss at step 4 is 500 \(above 100: exploding\)"):
    watch.check_row(4, np.array([[1.0, 1.0], [1.0, 500.0]]), state)
  with pytest.raises(FloatingPointError, match=r"^eval loss \(global params after the outer steps\) at"
                     r" step 4 is nan; lower `outer_lr`"):
    watch.check_eval(4, float("nan"))


def test_overwrite_keeps_foreign_files_and_h_over_steps_warns(tmp_path, finished, capsys):
  run = tmp_path / "run"
  shutil.copytree(finished, run)
  (run / "checkpoints" / "README").write_text("notes")
  (run / "checkpoints" / "999").mkdir()
  (run / "checkpoints" / "999" / "x").write_text("mine")
  (run / "final_params" / "mine.txt").write_text("mine")  # beside the export's files: kept, named
  argv = BASE + ["--out", str(run), "--overwrite", "--sync-every", "8"]
  # Checkpoints cannot go next to a step-named directory Orbax would take for the newest one.
  assert main(argv + ["--checkpoint-every", "2"]) == 2
  assert capsys.readouterr().err == (f"error: {run}/checkpoints/999 in the checkpoint directory was not written"
                                     " by a run (no checkpoint marker); move it out of there or choose another --out.\n")
  assert main(argv) == 0
  err = capsys.readouterr().err
  assert (run / "checkpoints" / "README").read_text() == "notes" and (run / "checkpoints" / "999" / "x").exists()
  assert ckpt.finalized_steps(str(run)) == [] and not (run / "checkpoints" / "2").exists()
  warned = [line for line in err.splitlines() if line.startswith("warning: ")]
  assert any("--overwrite kept 3 file(s) no run wrote" in w and "README" in w and "999" in w
             and "final_params/mine.txt" in w for w in warned), err
  assert (run / "final_params" / "mine.txt").read_text() == "mine"
  assert set(load_params(str(run / "final_params"))) == set(load_params(str(finished / "final_params")))
  h = "sync_every (H=8) > steps (4): the global params are never updated (fragment(s) [0] never sent)"
  assert any(w.startswith(f"warning: --sync-every (H=8) > steps (4): the global params are never updated") and "lower --sync-every to at most 4" in w for w in warned), err
  summary = json.loads((run / "summary.json").read_text())
  assert len(summary["warnings"]) == 1 and summary["warnings"][0].startswith(h)


def test_damaged_evidence_is_kept_and_the_warning_is_clean(tmp_path, finished, capsys):
  run = tmp_path / "run"
  shutil.copytree(finished, run)
  for suffix in ("damaged", "damaged.1"):
    truncate_all(run / "checkpoints" / "4" / "state")
    assert main(BASE + ["--out", str(run), "--resume", "--checkpoint-every", "2"]) == 0
    err = capsys.readouterr().err
    assert (run / "checkpoints" / f"4.{suffix}").is_dir(), err
    warned = [line for line in err.splitlines() if "is damaged" in line]
    assert len(warned) == 1 and warned[0].endswith("and resumed from step 2."), err
    assert "pybind" not in err and " at 0x" not in err and "Traceback" not in err
  assert (run / "checkpoints" / "4.damaged").is_dir() and ckpt.finalized_steps(str(run)) == [2, 4]


@pytest.mark.parametrize("how", ["sigint", "sigterm", "sigterm-during-save"])
def test_interrupt_one_line_and_resume_works(how, tmp_path, monkeypatch, capsys):
  import diloco_core.run.loop as loop
  real, real_save = loop.participation, ckpt.CheckpointWriter.save

  def interrupt_at_3(cfg, t):
    if t == 3:
      if how == "sigint":
        raise KeyboardInterrupt
      os.kill(os.getpid(), signal.SIGTERM)
    return real(cfg, t)

  def save_interrupted(self, step, *args):
    os.kill(os.getpid(), signal.SIGTERM)  # mid-save: the save is finished, then the run stops
    return real_save(self, step, *args)

  if how == "sigterm-during-save":
    monkeypatch.setattr(ckpt.CheckpointWriter, "save", save_interrupted)
  else:
    monkeypatch.setattr(loop, "participation", interrupt_at_3)
  run = tmp_path / "run"
  assert main(BASE + ["--out", str(run), "--checkpoint-every", "2"]) == 130
  err = capsys.readouterr().err
  # SIGTERM under the CLI is a stop request: step 3 finishes, the loop stops before step 4; one
  # during the save of step 2 lets the save finish and stops before step 3.
  done = {"sigint": 2, "sigterm": 3, "sigterm-during-save": 2}[how]
  assert ckpt.finalized_steps(str(run)) == [2]
  assert err.strip().splitlines()[-1] == f"interrupted at step {done}; resume with --resume (from {run}/checkpoints/2).", err
  assert "Traceback" not in err
  monkeypatch.setattr(loop, "participation", real)
  monkeypatch.setattr(ckpt.CheckpointWriter, "save", real_save)
  assert main(BASE + ["--out", str(run), "--resume", "--checkpoint-every", "2"]) == 0


@pytest.mark.parametrize("how", ["file-in-place", "removed"])
def test_checkpoints_removed_during_a_run_one_line(how, tmp_path, monkeypatch, capsys):
  import diloco_core.run.loop as loop
  real = loop._checkpoint_meta

  def remove_then_meta(cfg, t, log, *args):  # `rm -rf OUT/checkpoints` (and a file in its place) mid-run
    if t == 4:
      shutil.rmtree(run / "checkpoints")
      if how == "file-in-place":
        write(run / "checkpoints", b"not a directory")
    return real(cfg, t, log, *args)

  monkeypatch.setattr(loop, "_checkpoint_meta", remove_then_meta)
  run = tmp_path / "run"
  assert main(BASE + ["--out", str(run), "--checkpoint-every", "2"]) == 2
  err = capsys.readouterr().err
  lines = [line for line in err.splitlines() if line.startswith("error: ")]
  assert len(lines) == 1 and lines[0].startswith(f"error: checkpoint {run}/checkpoints/4 could not be written ("), err
  assert " at 0x" not in err and "Traceback" not in err and "WARNING" not in err
  assert lines[0].endswith("then start over with --overwrite (no checkpoint is left)."), lines[0]
  if how == "removed":  # the advice works
    assert f"({run}/checkpoints was removed or replaced during the run)" in lines[0]
    monkeypatch.setattr(loop, "_checkpoint_meta", real)
    assert main(BASE + ["--out", str(run), "--checkpoint-every", "2", "--overwrite"]) == 0


@pytest.mark.parametrize("make", ["metrics-only", "all-damaged"])
def test_resume_advice_leads_to_a_working_command(make, tmp_path, finished, capsys):
  if make == "metrics-only":  # went non-finite before its first checkpoint
    run = tmp_path / "run"
    run.mkdir()
    write(run / "metrics.jsonl", b'{"step": 2}\n')
    run = str(run)
  else:
    run = all_damaged(tmp_path, finished)
  assert main(BASE + ["--out", run, "--resume"]) == 2
  err = capsys.readouterr().err.strip()
  assert err.endswith("start over: drop --resume and pass --overwrite."), err
  assert main(BASE + ["--out", run, "--overwrite"]) == 0


# ---- the Python API checks its inputs at the boundary, in its own words --------------------------
def test_api_step_inputs_are_checked_at_the_boundary():
  algo = DiLoCo(quad, optax.sgd(0.5), DiLoCoConfig(replicas=2, sync_every=2))
  state = algo.init(jnp.zeros(2))
  with pytest.raises(ValueError, match=r"^DiLoCo.step: every batch leaf needs a leading axis of replicas=2"
                     r" \(one batch per replica\), got shape \(3, 2\).$"):
    algo.step(state, jnp.zeros((3, 2)))
  with pytest.raises(ValueError, match=r"^DiLoCo.step: participation must have shape \(replicas,\) = \(2,\)"
                     r" \(1 present, 0 dropped\), got shape \(2, 1\).$"):
    algo.step(state, jnp.zeros((2, 2)), jnp.ones((2, 1)))
  with pytest.raises(ValueError, match=r"^layer_mask leaves must be Python bools .*got a ndarray.$"):
    DiLoCo(quad, optax.sgd(0.5), DiLoCoConfig(replicas=2), layer_mask=np.array([True, False])).init(jnp.zeros(2))
  for bad in ([np.nan, 1.0], [2.0, 1.0], [-1.0, 1.0]):  # values, not only the shape
    with pytest.raises(ValueError, match=r"^DiLoCo.step: participation must hold 1 \(present\) or 0"
                       r" \(dropped\) for each replica, got \["):
      algo.step(state, jnp.zeros((2, 2)), jnp.array(bad))
  new, _ = algo.step(state, jnp.zeros((2, 2)), jnp.ones(2))  # the right inputs still run
  with pytest.raises(ValueError, match=r"^DiLoCo.step: this state was donated to an earlier step \(its"
                     r" buffers are deleted\); pass the state that step returned.$"):
    algo.step(state, jnp.zeros((2, 2)))
  algo.step(new, jnp.zeros((2, 2)))


def test_out_dir_removed_by_another_processs_probe_during_the_check_is_not_an_error(tmp_path, monkeypatch):
  # Multi-process runs: process 0 may create and remove `out` (its probe) while process 1 checks it.
  from diloco_core.store import out_dir as rc
  out, real = tmp_path / "run", rc._can_write_in
  out.mkdir()

  def vanish(directory):
    os.rmdir(directory)
    monkeypatch.setattr(rc, "_can_write_in", real)
    return False

  monkeypatch.setattr(rc, "_can_write_in", vanish)
  rc.check_out_dir(str(out), overwrite=False)
  assert not out.exists()  # checked again as a new directory: probed, nothing left behind


def test_processes_checking_one_new_out_at_once_all_pass(tmp_path):
  # The launcher's processes check the same new `out` at the same moment: only the writer (process
  # 0) creates and removes it to probe it; the others must never see it half made (a CI build once
  # failed with "is a file" from process 1 while process 0's probe removed the directory).
  import threading
  from diloco_core.store import out_dir as rc
  errors = []
  for r in range(100):
    out = str(tmp_path / f"r{r}" / "run")
    start = threading.Barrier(4)

    def check(index):
      start.wait()
      try:
        rc.check_out_dir(out, overwrite=False, probe=index == 0)
      except (ValueError, OSError) as e:
        errors.append(f"{type(e).__name__}: {e}")

    threads = [threading.Thread(target=check, args=(i,)) for i in range(4)]
    for t in threads:
      t.start()
    for t in threads:
      t.join()
    assert not os.path.exists(out), r  # the probe leaves nothing behind
  assert errors == []


def test_a_process_that_does_not_write_never_creates_out(tmp_path):
  from diloco_core.store import out_dir as rc
  rc.check_out_dir(str(tmp_path / "a" / "run"), overwrite=False, probe=False)
  assert os.listdir(tmp_path) == []
  with pytest.raises(ValueError, match="is a file; give a directory path"):
    rc.check_out_dir(write(tmp_path / "f", b"x"), overwrite=False, probe=False)


# ---- data files that change, under a run and between a run and its resume --------------------
def test_data_changed_during_the_run_and_before_resume(tmp_path, monkeypatch, capsys):
  import diloco_core.run.loop as loop
  ids = np.random.default_rng(0).integers(0, 16, 4000)
  data = npy(tmp_path / "ids.npy", ids)
  run = tmp_path / "run"
  argv = BASE + ["--data", data, "--vocab-size", "16", "--out", str(run), "--checkpoint-every", "2"]
  real = loop.participation

  def shrink_at_3(cfg, t):
    if t == 3:
      os.truncate(data, 1000)  # a memory map would die of SIGBUS on the next read
    return real(cfg, t)

  monkeypatch.setattr(loop, "participation", shrink_at_3)
  assert main(argv) == 2
  err = capsys.readouterr().err
  lines = [line for line in err.splitlines() if line.startswith("error: ")]
  assert len(lines) == 1 and "Traceback" not in err, err
  assert "ids.npy' shrank to 1000 bytes while the run read it" in lines[0] or "changed size" in lines[0], lines[0]
  assert lines[0].endswith(f"restore it and continue with --resume (from {run}/checkpoints/2)."), lines[0]
  assert ckpt.finalized_steps(str(run)) == [2]  # the last checkpoint is intact
  monkeypatch.setattr(loop, "participation", real)
  np.save(data, (ids + 1) % 16)  # back at full size, with other contents
  before = snapshot(run)
  assert main(argv + ["--resume"]) == 2
  err = capsys.readouterr().err
  assert err == (f"error: --resume: the data changed since checkpoint {run}/checkpoints/2 was written ({data}:"
                 " ids.npy has other contents (SHA-256 of whole file)); restore it, or pass"
                 " --allow-data-change to continue on the new data.\n"), err
  assert snapshot(run) == before
  # The override works; --layers 2 and --experts 1 are the tiny preset's own values (the
  # checkpoint holds None for both): the same run, compared on effective values.
  assert main(argv + ["--resume", "--allow-data-change", "--layers", "2", "--experts", "1"]) == 0


def test_params_without_a_manifest_load_with_a_warning(tmp_path, finished):
  shutil.copytree(finished / "final_params", tmp_path / "old")
  os.remove(tmp_path / "old" / "params_manifest.json")  # an export of an earlier version
  with pytest.warns(UserWarning, match="has no params_manifest.json .* its contents cannot be checked"):
    params = load_params(str(tmp_path / "old"))
  assert set(params) == set(load_params(str(finished / "final_params")))


# ---- the comparison (make demo) --------------------------------------------------------------
COMPARE = ["--model", "tiny", "--batch-size", "2", "--seq-len", "8", "--replicas", "2", "--steps", "12",
           "--sync-every", "6", "--fragments", "3", "--overlap", "1", "--no-progress"]  # test_compare's


def test_compare_errors_and_interrupt_are_one_line(tmp_path, monkeypatch, capsys):
  import diloco_core.run.loop as loop
  from diloco_core.compare import compare_main
  assert compare_main(["--algorithm", "dp"]) == 2
  err = capsys.readouterr().err
  assert err.count("\n") == 1 and err.startswith("error: unrecognized arguments: --algorithm dp; the"
                                                 " comparison trains dp, diloco and streaming"), err
  (tmp_path / "cmp" / "dp").mkdir(parents=True)
  write(tmp_path / "cmp" / "dp" / "summary.json", b"{}")
  assert compare_main(COMPARE + ["--out", str(tmp_path / "cmp")]) == 2
  err = capsys.readouterr().err
  assert err == (f"error: --out={str(tmp_path / 'cmp' / 'dp')!r} already holds a run; pass --overwrite to"
                 " replace it, or choose another directory.\n"), err
  real = loop.participation

  def ctrl_c_at_2(cfg, t):
    if t == 2:
      raise KeyboardInterrupt
    return real(cfg, t)

  monkeypatch.setattr(loop, "participation", ctrl_c_at_2)
  assert compare_main(COMPARE + ["--out", str(tmp_path / "c2")]) == 130
  err = capsys.readouterr().err
  assert err == ("interrupted during the dp run at step 1; the comparison has no resume: run it again"
                 " with --overwrite.\n"), err


@pytest.mark.parametrize("signum,delay", [(signal.SIGINT, 1.3), (signal.SIGTERM, 4.5)])
def test_a_signal_at_any_phase_is_one_line_exit_130(signum, delay, tmp_path):
  """SIGINT during the imports, SIGTERM around the compilation: one line, exit 130, no signal death."""
  import time
  p = subprocess.Popen([sys.executable, "-m", "diloco_core.train", *BASE, "--steps", "100000",
                        "--out", str(tmp_path / "run")], stderr=subprocess.PIPE, text=True)
  time.sleep(delay)
  p.send_signal(signum)
  _, err = p.communicate(timeout=300)
  assert p.returncode == 130, (p.returncode, err)
  assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("interrupted "), err


@pytest.mark.parametrize("module, argv", [
    ("diloco_core.train", ["--num-proc", "3"]),  # would have been --num-processes, past the launcher's check
    ("diloco_core.train", ["--coord", "127.0.0.1:1"]),
    ("diloco_core.compare", ["--step", "5"]),
    ("diloco_core.launch", ["--proc", "2", "--", "--steps", "2"]),
])
def test_no_command_line_takes_an_abbreviated_flag(module, argv):
  import subprocess
  import sys
  r = subprocess.run([sys.executable, "-m", module, *argv], capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and "unrecognized arguments" in r.stderr, r.stderr
  assert len(r.stderr.strip().splitlines()) == 1, r.stderr
