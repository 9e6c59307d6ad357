"""The main job on this machine's accelerator, stored with its provenance.

Trains the main job (``python -m diloco_core.compare``: DP, DiLoCo and Streaming DiLoCo on the
built-in data) at the backend's defaults (3000 steps and bfloat16 compute on a GPU or TPU,
:mod:`diloco_core.devices.backend`) and, with ``--store``, writes its table, the data's entropy
floor, the settings and every run's summary with the provenance the accelerator benchmark
writes (device kind, JAX, jaxlib and libtpu versions, git commit, date, the command) to
``analysis/results/accelerator/<device>-main-job.json``. The quickstart shows the stored
table beside the one its own cells train on CPU; the build never needs the accelerator.

    python benchmarks/main_job.py --store        # about a minute on a TPU v5e
    python benchmarks/main_job.py --steps 60     # a short smoke run, nothing stored
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from diloco_core.devices.backend import configure_determinism  # noqa: E402

configure_determinism()  # before JAX starts its backend

import jax  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from accelerator import provenance, store_path, write_json  # noqa: E402  (the benchmarks' one writer)

from analysis.lab.accelerator import MAIN_JOB_SUFFIX  # noqa: E402
from diloco_core.devices.backend import default_demo_steps, resolve_model_config  # noqa: E402
from diloco_core.run import main_job  # noqa: E402


def main_job_path(device_kind: str) -> str:
  """``analysis/results/accelerator/<device>-main-job.json``.

  Examples:
    >>> os.path.basename(main_job_path("TPU v5 lite"))
    'tpu-v5-lite-main-job.json'
  """
  return store_path(device_kind)[:-len(".json")] + MAIN_JOB_SUFFIX + ".json"


def run(steps: int | None) -> dict:
  """Trains the three runs at the main job's defaults (``steps`` None: the backend's) and
  returns the table's rows, the floor, the settings and each run's summary."""
  steps = default_demo_steps() if steps is None else steps
  t0 = time.perf_counter()
  with tempfile.TemporaryDirectory() as out:
    configs = main_job.default_configs(steps=steps, out=out, progress=False)
    results = main_job.compare(configs)
    spread = {name: main_job.eval_spread(configs[name], r.summary["final_params"]) for name, r in results.items()}
  settings = {k.removeprefix("algo."): v for k, v in main_job.DEFAULTS.items()
              if k not in ("out", "overwrite", "progress", "steps", "nondeterministic")}
  dp = results["dp"]
  return {"settings": {**settings, "steps": steps, "compute_dtype": resolve_model_config(configs["dp"].model_config()).compute_dtype},
          "loss_floor": dp.summary["loss_floor"], "rows": main_job.summary_rows(results),
          "summaries": {name: r.summary for name, r in results.items()}, "eval_spread": spread,
          "wall_s": time.perf_counter() - t0}


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--steps", type=int, default=None, help="inner steps (default: the backend's main-job default)")
  p.add_argument("--store", action="store_true", help="write analysis/results/accelerator/<device>-main-job.json")
  args = p.parse_args(argv)
  if args.steps is not None and args.steps < 1:
    p.error(f"--steps must be a positive integer, got {args.steps}")
  result = {"provenance": provenance(argv, "benchmarks/main_job.py"), **run(args.steps)}
  for row in result["rows"]:
    print(f"{row['algorithm']:10s} final eval loss {row['final eval loss']:.4f}  gap to floor"
          f" {row['gap to floor']:+.4f}  loss vs DP {row.get('loss vs DP (%)', 0.0):+.2f}%"
          f"  wall {row['wall time (s)']:.1f} s", flush=True)
  if args.store:
    path = main_job_path(jax.devices()[0].device_kind)
    write_json(path, result)
    print(f"wrote {os.path.relpath(path, ROOT)}")


if __name__ == "__main__":
  main()
