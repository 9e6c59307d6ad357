"""The accelerator benchmark's stored results, read back and re-checked for the performance page.

``benchmarks/accelerator.py --store`` (``make bench-accel``) writes one file per kind of device
to ``analysis/results/accelerator/<device>.json``: its provenance, the plain step's rows lever by
lever, and DP / DiLoCo / Streaming against M plain steps. The timings themselves cannot be
measured again without the device; what :func:`load` re-checks, with the project's own code, is
everything derived from them: the file's hash (:func:`analysis.lab.stored.content_hash`, so an
edited number is refused), the analytic FLOPs per token
(:func:`~diloco_core.spec.model_config.flops_per_token`) and the tokens/s, TFLOP/s, MFU and
step / (M × plain) of every row from its milliseconds. The page shows what
:meth:`AcceleratorResult.levers` and :meth:`AcceleratorResult.methods` return, never a number typed into it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import pandas as pd

from analysis.lab.stored import RESULTS_DIR, content_hash
from diloco_core.spec.model_config import ModelConfig, flops_per_token, param_count

#: Where the benchmark stores its files (``benchmarks/accelerator.py``'s ``STORE_DIR``).
ACCELERATOR_DIR = RESULTS_DIR / "accelerator"
#: Provenance every stored file must carry.
PROVENANCE = ("device_kind", "platform", "jax", "jaxlib", "git_commit", "date", "command")
#: The stem suffix of a stored measured roofline (``benchmarks/roofline.py``).
ROOFLINE_SUFFIX = "-roofline"
#: The stem suffix of a stored main job (``benchmarks/main_job.py``).
MAIN_JOB_SUFFIX = "-main-job"
#: The stem suffix of the stored notebooks (``benchmarks/notebooks.py``).
NOTEBOOKS_SUFFIX = "-notebooks"
#: Relative agreement required between a stored derived figure and its recomputation.
RTOL = 1e-9


class AcceleratorResultError(ValueError):
  """A stored accelerator result is missing, edited, or inconsistent with its own timings."""


def provenance_sentence(p: dict, filename: str, rerun: str) -> str:
  """A stored measurement's provenance ``p`` as one sentence: what, where, with which code, the
  file (``filename`` under ``analysis/results/accelerator/``) and the command ``rerun`` that
  measures it again (with the command line that stored it)."""
  libtpu = f", libtpu {p['libtpu']}" if p.get("libtpu") else ""
  here = "" if p["command"] == rerun else f" (here: `{p['command']}`)"
  return (f"Measured {p['date'][:10]} on one {p['device_kind']} ({p['platform']}) with JAX {p['jax']}{libtpu},"
          f" code at commit `{p['git_commit'][:7]}`; stored in `analysis/results/accelerator/{filename}`;"
          f" measure again with `{rerun}`{here}.")


@dataclasses.dataclass(frozen=True)
class AcceleratorResult:
  """One device's stored benchmark, checked (see :func:`load`)."""

  doc: dict
  path: pathlib.Path

  @property
  def provenance(self) -> dict:
    return self.doc["provenance"]

  def provenance_line(self) -> str:
    """One sentence for the page: what, where, with which code and how to measure it again."""
    return provenance_sentence(self.provenance, self.path.name, "make bench-accel")

  def levers(self) -> pd.DataFrame:
    """The plain step lever by lever: one row per lever (``skipped`` rows say why they did not run)."""
    rows = []
    for r in self.doc["levers"]:
      rows.append({"lever": r["lever"], "heads": r.get("n_heads"), "attention": r.get("attention"),
                   "remat": r.get("remat"), "loss_chunk": r.get("loss_chunk"), "batch": r.get("batch"),
                   "ms_per_step": r.get("ms_per_step"), "tflops": r.get("tflops"), "mfu": r.get("mfu"),
                   "memory_model_gib": _gib(r.get("memory_model_bytes")),
                   "compiled_gib": _gib((r.get("compiled_bytes") or {}).get("peak")),
                   "skipped": r.get("skipped")})
    return pd.DataFrame(rows)

  def methods(self) -> pd.DataFrame:
    """DP, DiLoCo and Streaming against M plain steps, one row per run."""
    rows = []
    for name, r in self.doc["methods"].items():
      rows.append({"run": name, "replicas": r.get("replicas"), "replica_loop": r.get("replica_loop"),
                   "ms_per_step": r.get("ms_per_step"), "tokens_per_s": r.get("tokens_per_s"),
                   "mfu": r.get("mfu"), "step_over_M_plain": r.get("step_over_M_plain"),
                   "skipped": r.get("skipped")})
    return pd.DataFrame(rows).set_index("run")


def _gib(x):
  return None if x is None else x / 2**30


def agrees(stored: float | None, computed: float | None) -> bool:
  if stored is None or computed is None:
    return stored is None and computed is None
  return math.isclose(stored, computed, rel_tol=RTOL)


def _check_row(where: str, r: dict, cfg: ModelConfig, seq: int, peak: float | None, replicas: int) -> None:
  """Raises unless tokens/s, TFLOP/s and MFU are what the row's milliseconds give."""
  seconds = r["ms_per_step"] / 1e3
  tokens_s = replicas * r["batch"] * seq / seconds
  tflops = flops_per_token(cfg, seq) * tokens_s / 1e12
  mfu = None if peak is None else tflops / peak
  for name, want in (("tokens_per_s", tokens_s), ("tflops", tflops), ("mfu", mfu)):
    if not agrees(r.get(name), want):
      raise AcceleratorResultError(f"{where}: stored {name} {r.get(name)!r} is not what its {r['ms_per_step']} ms"
                                   f" give ({want!r})")


def _model(fields: dict) -> ModelConfig:
  names = {f.name for f in dataclasses.fields(ModelConfig)}
  return ModelConfig(**{k: v for k, v in fields.items() if k in names})


def model_of_lever(doc: dict, row: dict) -> ModelConfig:
  """The model a lever row of a stored benchmark measured: the document's ``lever_model`` with
  the row's heads, attention, remat and loss chunk."""
  return _model({**(doc.get("lever_model") or {}),
                 **{k: row[k] for k in ("n_heads", "attention", "remat", "loss_chunk")}})


def check_stamp(doc: dict, name: str, rerun: str) -> None:
  """A stored document's content hash and provenance (a one-line error naming ``rerun``, the
  command that stores it again, if not)."""
  if doc.get("sha256") != content_hash(doc):
    raise AcceleratorResultError(f"{name}: its sha256 does not match its content (edited by hand?); run"
                                 f" `{rerun}` on the device to store it again.")
  missing = [k for k in PROVENANCE if not doc["provenance"].get(k)]
  if missing:
    raise AcceleratorResultError(f"{name}: provenance lacks {missing}")


def check(doc: dict, name: str = "stored result") -> None:
  """Every derived figure of a stored document recomputed from its timings (a one-line error if not).

  Examples:
    >>> doc = {"provenance": dict.fromkeys(PROVENANCE, "x"), "peak_tflops": None, "seq_len": 4,
    ...        "levers": [], "methods": {}}
    >>> check({**doc, "sha256": content_hash(doc)})
    >>> check({**doc, "sha256": "0" * 64})
    Traceback (most recent call last):
    ...
    analysis.lab.accelerator.AcceleratorResultError: stored result: its sha256 does not match its content (edited by hand?); run `make bench-accel` on the device to store it again.
  """
  check_stamp(doc, name, "make bench-accel")
  seq, peak = doc["seq_len"], doc["peak_tflops"]
  for r in doc["levers"]:
    if "skipped" not in r:
      cfg = model_of_lever(doc, r)
      if param_count(cfg) != r["params"]:
        raise AcceleratorResultError(f"{name}, lever {r['lever']!r}: lever_model gives {param_count(cfg)} params,"
                                     f" the row measured {r['params']}")
      _check_row(f"{name}, lever {r['lever']!r}", r, cfg, seq, peak, 1)
  plain = doc["methods"].get("plain", {}).get("ms_per_step")
  cfg = _model(doc["methods_model"]) if doc["methods"] else None
  for run, r in doc["methods"].items():
    if "skipped" in r:
      continue
    _check_row(f"{name}, {run}", {**r, "batch": doc["methods_model"]["batch_per_replica"]}, cfg, seq, peak,
               r["replicas"])
    if not agrees(r.get("step_over_M_plain"), None if plain is None else r["ms_per_step"] / (r["replicas"] * plain)):
      raise AcceleratorResultError(f"{name}, {run}: step_over_M_plain is not ms / (M x plain ms)")


def stored_devices() -> list[str]:
  """The devices with a stored benchmark (file stems, e.g. ``tpu-v5-lite``; the measured
  rooflines beside them, ``*-roofline.json``, are :mod:`analysis.lab.roofline_measured`'s, the
  main jobs, ``*-main-job.json``, :mod:`analysis.lab.main_job_measured`'s, the notebooks,
  ``*-notebooks.json``, :mod:`analysis.lab.notebooks_measured`'s)."""
  return sorted(p.stem for p in ACCELERATOR_DIR.glob("*.json")
                if not p.stem.endswith((ROOFLINE_SUFFIX, MAIN_JOB_SUFFIX, NOTEBOOKS_SUFFIX)))


def load(device: str) -> AcceleratorResult:
  """The stored benchmark of ``device`` (a file stem of :func:`stored_devices`), checked by :func:`check`.

  Examples:
    >>> r = load("tpu-v5-lite")
    >>> r.provenance["device_kind"], len(r.levers()) > 0
    ('TPU v5 lite', True)
  """
  path = ACCELERATOR_DIR / f"{device}.json"
  if not path.exists():
    raise AcceleratorResultError(f"no stored accelerator result {device!r} in {ACCELERATOR_DIR}; stored:"
                                 f" {stored_devices()}; run `make bench-accel` on that device.")
  doc = json.loads(path.read_text())
  check(doc, f"analysis/results/accelerator/{path.name}")
  return AcceleratorResult(doc, path)


#: Profiles the benchmark wrote (``--trace``), converted to Perfetto JSON, kept beside the results.
TRACE_DIR = ACCELERATOR_DIR / "traces"


def trace_breakdown(path: str | pathlib.Path) -> pd.Series:
  """Device time per step by kind of XLA operation, from a ``jax.profiler`` Perfetto trace.

  Reads the device's "XLA Ops" track, keeps the top-level operations (one that starts inside
  another, a loop's body, is counted in its parent) and sums their durations by XLA's
  ``hlo_category`` (``loop fusion``: elementwise work such as the optimizer update;
  ``convolution fusion``: matmuls and what XLA fused into them; ``while``: the scanned layers;
  ``conditional``: the sync branch), divided by the number of steps the trace holds (the
  executions on the "XLA Modules" track).

  Args:
    path: a ``perfetto_trace.json.gz``.

  Returns:
    Milliseconds per step by category, largest first, with ``"total"`` (the modules' time per
    step) last.
  """
  import gzip
  events = json.load(gzip.open(path))
  events = events["traceEvents"] if isinstance(events, dict) else events
  meta = lambda kind: {(e["pid"], e.get("tid")) if kind == "thread_name" else e["pid"]: e["args"]["name"]
                       for e in events if e.get("ph") == "M" and e.get("name") == kind}
  procs, threads = meta("process_name"), meta("thread_name")
  on_device = [e for e in events if e.get("ph") == "X" and "/device:" in procs.get(e["pid"], "")]
  track = lambda e: threads.get((e["pid"], e.get("tid")), "")
  modules = [e for e in on_device if track(e) == "XLA Modules"]
  ops = sorted((e for e in on_device if track(e) == "XLA Ops"), key=lambda e: (e["ts"], -e["dur"]))
  steps = len(modules)
  if not steps:
    raise AcceleratorResultError(f"{path}: no device 'XLA Modules' track (a trace of an accelerator run has one;"
                                 " a CPU run's does not)")
  sums, end = {}, -math.inf
  for e in ops:
    if e["ts"] >= end:  # top level
      kind = e.get("args", {}).get("hlo_category", "other")
      sums[kind] = sums.get(kind, 0.0) + e["dur"]
      end = e["ts"] + e["dur"]
  out = pd.Series(sums).sort_values(ascending=False) / steps / 1e3
  out["total"] = sum(e["dur"] for e in modules) / steps / 1e3
  return out


def methods_breakdown(plain: str | pathlib.Path, diloco2: str | pathlib.Path, min_ms: float = 0.1) -> pd.DataFrame:
  """The plain step's and DiLoCo M = 2's :func:`trace_breakdown` side by side, with two plain
  steps and DiLoCo's difference to them: where DiLoCo's extra device time goes.

  Args:
    plain: the plain step's Perfetto trace.
    diloco2: DiLoCo M = 2's.
    min_ms: rows whose every column is under this many milliseconds are left out.

  Returns:
    Milliseconds per step, one row per kind of operation (``"total"`` included), columns
    ``plain``, ``diloco2``, ``M x plain`` and ``diloco2 - M x plain``.
  """
  bd = pd.DataFrame({"plain": trace_breakdown(plain), "diloco2": trace_breakdown(diloco2)}).fillna(0.0)
  bd["M x plain"] = 2 * bd["plain"]
  bd["diloco2 - M x plain"] = bd["diloco2"] - bd["M x plain"]
  return bd.loc[bd.abs().max(axis=1) >= min_ms]
