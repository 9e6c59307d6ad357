"""The tiny training run the trainer and checkpoint tests share (a few seconds on CPU), and what the
tests that start processes share (their environment, three processes of one device, a trace)."""

import json
import os
import re

from diloco_core import DataConfig, DiLoCoConfig
from diloco_core.train import TrainConfig


def tiny(algo="diloco", **kw):
  algo_kw = {k: kw.pop(k) for k in list(kw) if k in DiLoCoConfig.__dataclass_fields__}
  algo_kw.setdefault("replicas", 2)
  if algo != "dp":
    algo_kw.setdefault("sync_every", 4)
  base = dict(model="tiny", data=DataConfig(vocab_size=16, order=1), batch_size=2, seq_len=8,
              steps=8, eval_every=4, log_every=2, warmup_steps=1, progress=False)
  base.update(kw)
  return TrainConfig(algo=DiLoCoConfig(algorithm=algo, **algo_kw), **base)


def metrics_rows(path):
  """The rows of a run's metrics.jsonl without their wall times (which no two runs share)."""
  rows = [json.loads(line) for line in open(path)]
  for r in rows:
    r.pop("wall_time_s")
  return rows


def xla_flags(devices: int, extra: str = "") -> str:
  """``$XLA_FLAGS`` for a subprocess with ``devices`` fake CPU devices (and ``extra`` flags),
  keeping the caller's other flags: a suite run under ``--xla_cpu_max_isa=AVX2`` (an emulated
  older CPU) runs its subprocesses under it too."""
  kept = re.sub(r"--xla_force_host_platform_device_count=\S+", "", os.environ.get("XLA_FLAGS", ""))
  return " ".join(f for f in (kept, extra, f"--xla_force_host_platform_device_count={devices}") if f.strip())


ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))
#: A subprocess's environment: CPU, and the repository and the tests (``kill_child``) importable.
ENV = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([ROOT, TESTS]))
#: ``diloco_core.launch``'s flags for three processes of one device each.
THREE = ["--processes", "3", "--devices-per-process", "1"]


def trace_rows(out, rank):
  """The rows of process ``rank``'s trace of the run in ``out`` (``<out>/trace/process-<rank>.jsonl``)."""
  return [json.loads(line) for line in open(os.path.join(out, "trace", f"process-{rank}.jsonl"))]
