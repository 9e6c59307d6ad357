"""The notebooks on this machine: each run as a script, timed, its live sweeps and glued figures kept.

Each notebook (``notebooks/NN_*.md``) runs in a process of its own, its code cells one after the
other in one namespace, as "Run all" would (matplotlib draws off screen; the sweep cache is an
empty folder, so every live sweep trains from nothing). For each it records the wall time, every
cell's time, the numbers and strings it glues for the site (figures and tables left out) and
every live sweep it trained (:data:`analysis.lab.live.TRAINED`): the plan and its estimate, the
time it took, and each run's settings and final eval loss. ``--store`` writes them with their
provenance to ``analysis/results/accelerator/<device>-notebooks.json`` (a notebook run again
replaces its entry; the others are kept), which the tutorial's Colab section shows through
:mod:`analysis.lab.notebooks_measured`; the build never needs the device.

    python benchmarks/notebooks.py --store               # all six (03 and 05 train two sweeps each)
    python benchmarks/notebooks.py --store 03 04         # some of them
"""

from __future__ import annotations

import argparse
import glob
import json
import numbers
import os
import re
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

#: A MyST code cell: its options (``:tags: ...`` lines) and its source.
CELL = re.compile(r"^```\{code-cell\}[^\n]*\n((?::[^\n]*\n)*)(.*?)^```\s*$", re.S | re.M)


def code_cells(text: str) -> list[str]:
  """The code cells of a MyST notebook, in order, their option lines dropped.

  Examples:
    >>> code_cells("# T\\n```{code-cell} ipython3\\n:tags: [remove-cell]\\nx = 1\\n```\\ntext\\n"
    ...            "```{code-cell} ipython3\\nprint(x)\\n```\\n")
    ['x = 1\\n', 'print(x)\\n']
  """
  return [m.group(2) for m in CELL.finditer(text)]


def notebook_paths(selected: list[str]) -> list[str]:
  """``notebooks/NN_*.md`` whose number or name starts with one of ``selected`` (all when empty)."""
  paths = sorted(glob.glob(os.path.join(ROOT, "notebooks", "[0-9][0-9]_*.md")))
  chosen = [p for p in paths if not selected or any(os.path.basename(p).startswith(s) for s in selected)]
  if selected and not chosen:
    names = [os.path.basename(p)[:-3] for p in paths]
    raise SystemExit(f"notebooks: none of {selected} names a notebook; choose among {names}")
  return chosen


def run_here(path: str, argv: list[str]) -> dict:
  """Runs one notebook in this process and returns what it measured (see the module docstring)
  with the provenance of the command ``argv`` and the device it ran on."""
  import matplotlib.pyplot as plt

  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from accelerator import provenance

  import analysis.plots
  from analysis.lab import live
  from analysis.lab.notebooks_measured import sweep_record

  glued, real_glue = {}, analysis.plots.glue

  def recording_glue(name, value, display=True):
    if isinstance(value, (numbers.Real, str)) and not isinstance(value, bool):
      glued[name] = value if isinstance(value, str) else float(value)
    real_glue(name, value, display=display)

  analysis.plots.glue = recording_glue  # the notebooks import it from analysis.plots
  namespace = {"__name__": "__main__"}
  with open(path) as f:
    cells = code_cells(f.read())
  cell_s, start = [], time.perf_counter()
  for i, source in enumerate(cells):
    t0 = time.perf_counter()
    exec(compile(source, f"{os.path.basename(path)}, cell {i + 1}", "exec"), namespace)  # noqa: S102
    plt.close("all")
    cell_s.append(time.perf_counter() - t0)
  from diloco_core.devices.backend import default_compute_dtype
  return {"provenance": provenance(argv, "benchmarks/notebooks.py"), "compute_dtype": str(default_compute_dtype()),
          "wall_s": time.perf_counter() - start, "cell_s": cell_s, "glued": glued,
          "sweeps": [sweep_record(t) for t in live.TRAINED]}


def run_one(path: str, argv: list[str]) -> dict:
  """Runs one notebook in a fresh process (an empty sweep cache, matplotlib off screen): only
  that process touches the device (a TPU admits one process at a time)."""
  with tempfile.TemporaryDirectory() as tmp:
    out = os.path.join(tmp, "result.json")
    env = {**os.environ, "MPLBACKEND": "Agg", "DILOCO_SWEEPS_CACHE": os.path.join(tmp, "sweeps")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [env.get("PYTHONPATH"), ROOT]))
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", path, out, json.dumps(argv)], env=env, cwd=ROOT)
    if proc.returncode:
      raise SystemExit(f"notebooks: {os.path.basename(path)} failed (exit {proc.returncode}); see its output above")
    with open(out) as f:
      result = json.load(f)
  return {**result, "process_s": time.perf_counter() - t0}


def main(argv=None):
  argv = sys.argv[1:] if argv is None else argv
  if argv[:1] == ["--child"]:  # one notebook in this process
    with open(argv[2], "w") as f:
      json.dump(run_here(argv[1], json.loads(argv[3])), f)
    return
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("notebooks", nargs="*", help="notebook numbers or names, e.g. 03 04 (default: all)")
  p.add_argument("--store", action="store_true", help="write analysis/results/accelerator/<device>-notebooks.json")
  args = p.parse_args(argv)
  paths = notebook_paths(args.notebooks)
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from accelerator import store_path, write_json  # no JAX in this process: the children hold the device

  from analysis.lab.notebooks_measured import NOTEBOOKS_SUFFIX, merged
  for path in paths:
    name = os.path.basename(path)[:-3]
    print(f"{name}: running", flush=True)
    r = run_one(path, argv)
    sweeps = "; ".join(f"{s['sweep']}: {s['trained']} runs in {s['took_s']:.0f} s (estimated {s['estimate_s']:.0f} s)"
                       for s in r["sweeps"])
    print(f"{name}: {r['wall_s']:.1f} s, {len(r['cell_s'])} cells{'; ' + sweeps if sweeps else ''}", flush=True)
    if args.store:
      path_out = store_path(r["provenance"]["device_kind"])[:-len(".json")] + NOTEBOOKS_SUFFIX + ".json"
      previous = None
      if os.path.exists(path_out):
        with open(path_out) as f:
          previous = json.load(f)
      write_json(path_out, merged(previous, {name: r}))
      print(f"wrote {os.path.relpath(path_out, ROOT)}", flush=True)


if __name__ == "__main__":
  main()
