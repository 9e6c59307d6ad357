"""File data through Grain: exact windows, memory maps, shuffles, shards, workers, errors, CLI."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordWriter

from diloco_core.data.sources import DataConfig, make_dataset
from diloco_core.data.files import open_tokens
from diloco_core.data.grain_data import FileDataset
from diloco_core.train import main


def npy(path, array):
  np.save(path, array)
  return str(path)


def records(path, chunks, dtype="<i4"):
  writer = ArrayRecordWriter(str(path), "group_size:1")
  for c in chunks:
    writer.write(c if isinstance(c, bytes) else np.asarray(c, dtype).tobytes())
  writer.close()
  return str(path)


def dataset(source, replicas=2, batch_size=3, seq_len=4, **kw):
  vocab = kw.pop("model_vocab_size", None)
  local = kw.pop("local_replicas", None)
  return make_dataset(DataConfig(source=str(source), **kw), replicas=replicas, batch_size=batch_size,
                      seq_len=seq_len, model_vocab_size=vocab, local_replicas=local)


def steps(ds, n):
  return np.stack([ds.train_batch(s) for s in range(n)])  # [steps, M, b, T + 1]


# ----------------------------------------------------------------------------- windows and maps


def test_windows_are_the_hand_computed_token_ranges(tmp_path):
  # 100 tokens: eval = ceil(10) = 10, train = 90; windows of T + 1 = 5 at stride 4: (90 - 1) // 4 = 22
  ds = dataset(npy(tmp_path / "ids.npy", np.arange(100, dtype=np.int64)))
  assert isinstance(ds, FileDataset) and (ds.train_tokens, ds.eval_tokens, ds.windows) == (90, 10, 22)
  x = steps(ds, 40)  # 40 steps x 2 replicas x 3 = 240 windows: 10 full epochs and a part
  assert x.shape == (40, 2, 3, 5) and x.dtype == np.int32
  starts = x[..., 0]
  np.testing.assert_array_equal(x, starts[..., None] + np.arange(5))  # window i = tokens [4i, 4i + 5)
  assert set(np.unique(starts)) == set(range(0, 88, 4))  # all 22 windows, none reaching the eval tail
  epoch = starts.reshape(-1)[:22 * 10].reshape(10, 22)  # iid: one stream, replicas interleaved
  assert all(sorted(e) == list(range(0, 88, 4)) for e in epoch)  # each epoch a permutation
  assert len({tuple(e) for e in epoch}) == 10  # a fresh shuffle every epoch
  e = ds.eval_batch()  # 64 evenly spaced windows of the tail [90, 100): first and last
  assert e.shape == (64, 5) and e[0, 0] == 90 and e[-1, -1] == 99
  np.testing.assert_array_equal(e, e[:, :1] + np.arange(5))


def test_files_are_read_on_demand_not_loaded_or_mapped(tmp_path):
  from diloco_core.data.files import FileSegment
  ids = npy(tmp_path / "ids.npy", np.arange(1000, dtype=np.int32))
  text = tmp_path / "t.txt"
  text.write_bytes(b"hello world " * 50)
  for source in (ids, text):
    store = dataset(source).store
    assert len(store.segments) == 1 and isinstance(store.segments[0], FileSegment)
    assert store.segments[0].path == str(source) and store.segments[0].file_bytes == os.path.getsize(source)
  assert store.read(6, 11).tolist() == list(b"world")


@pytest.mark.parametrize("how", ["shrink", "vanish"])
def test_a_file_that_shrinks_or_vanishes_while_read_is_one_error_not_sigbus(tmp_path, how):
  from diloco_core.data.files import DataChangedError
  path = npy(tmp_path / "ids.npy", np.arange(4000, dtype=np.int32))
  ds = dataset(path, workers=2)
  ds.train_batch(0)
  os.truncate(path, 1000) if how == "shrink" else os.remove(path)
  with pytest.raises(DataChangedError, match="shrank|changed size|vanished"):
    ds.store.check_unchanged()
  if how == "shrink":  # a read past the new end: the same error, never a signal
    with pytest.raises(DataChangedError, match=r"shrank to 1000 bytes while the run read it"):
      for step in range(200):
        ds.train_batch(step)


def test_text_is_bytes(tmp_path):
  data = ("héllo wörld, ünïcode ✓\n" * 40).encode()
  (tmp_path / "c.txt").write_bytes(data)
  ds = dataset(tmp_path / "c.txt", seq_len=16, model_vocab_size=256)
  assert ds.kind == "text" and ds.vocab_size == 256 and ds.loss_floor is None
  n_eval = math.ceil(0.1 * len(data))
  assert (ds.eval_tokens, ds.train_tokens) == (n_eval, len(data) - n_eval)
  for s in range(3):
    for row in ds.train_batch(s).reshape(-1, 17):
      start = int(np.flatnonzero([bytes(row.astype(np.uint8)) == data[i:i + 17] for i in range(0, 700, 16)])[0])
      assert start * 16 + 17 <= ds.train_tokens
  for row in ds.eval_batch():
    assert bytes(row.astype(np.uint8)) in data[ds.train_tokens:]
  doc = ds.describe()
  json.dumps(doc, allow_nan=False)
  assert doc["kind"] == "text" and doc["tokens_available"] == len(data)


# ----------------------------------------------------------------------------- determinism


def test_seeded_shuffle_reproducible_pure_in_step_and_seeds_differ(tmp_path):
  path = npy(tmp_path / "ids.npy", np.arange(2000))
  a, b = dataset(path, seed=3), dataset(path, seed=3)
  forward = steps(a, 12)
  backward = np.stack([b.train_batch(s) for s in reversed(range(12))])[::-1]  # call order irrelevant
  np.testing.assert_array_equal(forward, backward)
  np.testing.assert_array_equal(a.train_batch(5), forward[5])
  assert not np.array_equal(steps(dataset(path, seed=4), 12), forward)
  np.testing.assert_array_equal(dataset(path, seed=4).eval_batch(), a.eval_batch())  # eval: no seed


def test_workers_read_ahead_the_same_batches(tmp_path):
  path = npy(tmp_path / "ids.npy", np.arange(3000))
  plain = dataset(path, distribution="non-iid")
  ahead = dataset(path, distribution="non-iid", workers=3)
  order = [0, 1, 2, 3, 7, 8, 9, 2, 3, 30, 31]  # in order, a jump forward, one back (a resume)
  for s in order:
    np.testing.assert_array_equal(ahead.train_batch(s), plain.train_batch(s))
  assert ahead.describe()["workers"] == 3


# ----------------------------------------------------------------------------- replica shards


def test_non_iid_shards_are_disjoint_contiguous_thirds(tmp_path):
  # 1000 tokens: train 900, windows (900 - 1) // 15 = 59 of 16 tokens; thirds [0, 19), [19, 39), [39, 59)
  path = npy(tmp_path / "ids.npy", np.arange(1000))
  nd = dataset(path, replicas=3, batch_size=8, seq_len=15, distribution="non-iid")
  assert nd.describe()["shard_windows"] == [19, 20, 20]
  x = steps(nd, 30)  # 30 x 8 = 240 windows per replica: every window of its shard
  bounds = [(0, 19), (19, 39), (39, 59)]
  for r, (lo, hi) in enumerate(bounds):
    assert set(np.unique(x[:, r, :, 0]) // 15) == set(range(lo, hi))
  iid = steps(dataset(path, replicas=3, batch_size=8, seq_len=15), 30)
  seen = [set(np.unique(iid[:, r, :, 0]) // 15) for r in range(3)]
  assert set.union(*seen) == set(range(59))
  for r in range(3):  # iid: every replica samples the whole split
    assert all(seen[r] & set(range(lo, hi)) for lo, hi in bounds)
  assert len(np.unique(iid[:2, :, :, 0])) == 2 * 3 * 8  # 48 < 59: one epoch, no window twice


def test_local_replicas_read_only_their_rows(tmp_path):
  path = npy(tmp_path / "ids.npy", np.arange(2000) + 1)  # no zero token: zeros mean "not read"
  full = dataset(path, replicas=4, distribution="non-iid")
  mine = dataset(path, replicas=4, distribution="non-iid", local_replicas=[1, 3])
  assert mine.local_replicas == (1, 3) and set(mine.pipelines) == {1, 3}
  for s in (0, 9):
    x, y = full.train_batch(s), mine.train_batch(s)
    np.testing.assert_array_equal(y[[1, 3]], x[[1, 3]])
    assert not y[[0, 2]].any() and x[[0, 2]].all()
  with pytest.raises(ValueError, match=r"local_replicas must be distinct replica ids in \[0, 4\), got \[4\]"):
    dataset(path, replicas=4, local_replicas=[4])


# ----------------------------------------------------------------------------- shard directories


def test_shard_directories_equal_the_concatenated_file(tmp_path):
  ids = np.arange(777, dtype=np.int32) * 3 % 500
  one = npy(tmp_path / "all.npy", ids)
  (tmp_path / "npy").mkdir()
  (tmp_path / "ar").mkdir()
  (tmp_path / "bytes").mkdir()
  cuts = [0, 100, 101, 400, 777]
  for k, (a, b) in enumerate(zip(cuts, cuts[1:])):  # names sort in stream order
    npy(tmp_path / "npy" / f"part-{k}.npy", ids[a:b])
  records(tmp_path / "ar" / "a.array_record", [ids[:50], ids[50:50], ids[50:300]])  # an empty record too
  records(tmp_path / "ar" / "b.array_record", [ids[300:777]])
  ref = dataset(one, replicas=3, distribution="non-iid", model_vocab_size=512)
  for d in ("npy", "ar"):
    other = dataset(tmp_path / d, replicas=3, distribution="non-iid", model_vocab_size=512)
    assert other.kind == {"npy": "npy-shards", "ar": "array_record"}[d] and len(other.store) == 777
    np.testing.assert_array_equal(steps(other, 6), steps(ref, 6))
    np.testing.assert_array_equal(other.eval_batch(), ref.eval_batch())
  text = b"some bytes of text, " * 30
  (tmp_path / "t.txt").write_bytes(text)
  records(tmp_path / "bytes" / "x.bytes.array_record", [np.frombuffer(text[:99], np.uint8),
                                                         np.frombuffer(text[99:], np.uint8)], np.uint8)
  raw, txt = dataset(tmp_path / "bytes"), dataset(tmp_path / "t.txt")
  assert raw.vocab_size == 256 and raw.kind == "bytes-records"
  np.testing.assert_array_equal(steps(raw, 4), steps(txt, 4))


# ----------------------------------------------------------------------------- bad input


def write(tmp_path, name, content):
  path = tmp_path / name
  path.parent.mkdir(parents=True, exist_ok=True)
  if isinstance(content, np.ndarray):
    np.save(path, content, allow_pickle=True)
  elif isinstance(content, list):
    records(path, content)
  else:
    path.write_bytes(content)
  return str(path)


FILE_ERRORS = [  # (files to write, source, kwargs, error, message)
    ({"empty.txt": b""}, "empty.txt", {}, "is empty"),
    ({"bad.txt": b"ok \xff\xfe bad"}, "bad.txt", {}, "not valid UTF-8 text .byte 3"),
    ({"short.txt": b"x" * 30}, "short.txt", {}, "30 tokens, too short for seq_len 16: need at least 34"),
    ({"high.txt": "é".encode() * 40}, "high.txt", {"model_vocab_size": 128},
     "byte token 195 outside the model vocabulary"),
    ({"empty.npy": np.zeros(0, np.int32)}, "empty.npy", {}, "is empty"),
    ({"2d.npy": np.zeros((4, 50), np.int32)}, "2d.npy", {}, "1-D integer array.*shape \\(4, 50\\)"),
    ({"float.npy": np.zeros(100, np.float32)}, "float.npy", {}, "1-D integer array.*float32"),
    ({"neg.npy": np.array([3, -1] * 100)}, "neg.npy", {}, "token id -1 < 0"),
    ({"big.npy": np.arange(200)}, "big.npy", {"model_vocab_size": 64},
     "token id 199 outside the model vocabulary \\[0, 64\\)"),
    ({"obj.npy": np.array([1, "a"], dtype=object)}, "obj.npy", {}, "cannot read .* as .npy"),
    ({"shard.npy": np.arange(200)}, "shard.npy", {"replicas": 20},
     "non-iid shards .* hold 0 windows of seq_len \\+ 1 = 17 tokens for 20 replicas"),
    ({"d/.keep": b""}, "d", {}, "directory .* is empty"),
    ({"d/a.npy": np.arange(100), "d/b.array_record": [np.arange(10)]}, "d", {}, "mixes file kinds"),
    ({"d/a.npy": np.arange(100, dtype=np.int32), "d/b.npy": np.arange(100, dtype=np.int64)}, "d", {},
     "mixes dtypes \\['int32', 'int64'\\]"),
    ({"d/a.array_record": [np.arange(10)], "d/b.bytes.array_record": [np.arange(10)]}, "d", {},
     "mixes dtypes: int32 records"),
    ({"d/a.npy": np.arange(100), "d/notes.txt": b"hi"}, "d", {}, "holds 'notes.txt', not a shard"),
    ({"d/a.array_record": [np.arange(300), [-2, 1]]}, "d", {}, "token id -2 < 0"),
    ({"d/a.array_record": [np.arange(300)]}, "d", {"model_vocab_size": 256},
     "token id 299 outside the model vocabulary \\[0, 256\\)"),
    ({"d/a.array_record": [[]]}, "d", {}, "directory .* is empty \\(no tokens\\)"),
]


@pytest.mark.parametrize("files,source,kwargs,match", FILE_ERRORS)
def test_file_errors_name_the_option(tmp_path, files, source, kwargs, match):
  for name, content in files.items():
    write(tmp_path, name, content)
  replicas = kwargs.pop("replicas", 1)
  with pytest.raises(ValueError, match="^DataConfig.source: .*" + match) as e:
    dataset(tmp_path / source, replicas=replicas, batch_size=2, seq_len=16,
            distribution="non-iid" if replicas > 1 else "iid", **kwargs)
  assert "\n" not in str(e.value)


def test_missing_file_and_odd_bytes_in_records(tmp_path):
  with pytest.raises(FileNotFoundError, match="no such file .*use 'synthetic', a UTF-8 text file"):
    dataset(tmp_path / "nope.txt")
  with pytest.raises(FileNotFoundError, match="no such file 'synthtic'"):
    dataset("synthtic")
  (tmp_path / "d").mkdir()
  records(tmp_path / "d" / "a.array_record", [b"abcde"])
  with pytest.raises(ValueError, match="record 0 of .* has 5 bytes, not a whole number of int32 token ids"):
    open_tokens(tmp_path / "d")
  with pytest.raises(ValueError, match="DataConfig.workers must be an integer >= 0"):
    DataConfig(workers=-1)


def test_cli_error_line_and_exit_2(tmp_path, capsys):
  write(tmp_path, "d/a.npy", np.arange(100, dtype=np.int32))
  write(tmp_path, "d/b.npy", np.arange(100, dtype=np.int16))
  assert main(["--model", "tiny", "--no-progress", "--data", str(tmp_path / "d")]) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: --data: directory ") and "mixes dtypes" in err
  assert err.count("\n") == 1


# ----------------------------------------------------------------------------- the trainer


def test_cli_trains_on_a_text_file(tmp_path):
  corpus = tmp_path / "corpus.txt"
  corpus.write_text("the quick brown fox jumps over the lazy dog. " * 200, encoding="utf-8")
  out = tmp_path / "run"
  proc = subprocess.run(
      [sys.executable, "-m", "diloco_core.train", "--data", str(corpus), "--model", "tiny", "--replicas", "2",
       "--distribution", "non-iid", "--batch-size", "2", "--seq-len", "16", "--steps", "10", "--sync-every", "5",
       "--warmup-steps", "1", "--eval-every", "5", "--data-workers", "2", "--no-progress", "--out", str(out)],
      capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  summary = json.loads((out / "summary.json").read_text())
  assert summary["data"]["kind"] == "text" and summary["data"]["vocab_size"] == 256
  assert summary["data"]["shard_windows"] == [253, 253]  # 9000 bytes: train 8100, 8099 // 16 = 506 windows
  rows = [json.loads(line) for line in open(out / "metrics.jsonl")]
  assert rows[-1]["step"] == 10 and math.isfinite(summary["final_eval_loss"])
  assert summary["final_eval_loss"] < rows[0]["eval_loss"]  # it learns something in 10 steps
