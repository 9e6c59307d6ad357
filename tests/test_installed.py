"""The package as users get it: installed from a wheel, used from a folder outside the repository.

The wheel is the one ``pip install .`` would install, built from this checkout (without build
isolation: the pinned setuptools of requirements.txt, no download), unpacked into a folder
that is put first on ``PYTHONPATH``; every command runs in an empty folder elsewhere, so
that nothing of the repository (its files, its editable install) can stand in for what the
wheel ships. On it:

* the planning library imports without the training stack (no JAX, flax, optax, drjax,
  Orbax or Grain in ``sys.modules`` after ``import analysis``);
* the command lines of the README's "without a clone" block run;
* all six notebooks execute (nbclient and ipykernel, what a hosted notebook service has)
  with nothing importable that the package does not declare: every distribution outside the
  requirements of its ``[project].dependencies`` (and of the kernel) is made unimportable, the
  docs' own packages (myst-nb, Sphinx, jupytext) and what they bring (Jinja2) included.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap
import tomllib
import zipfile

import pytest
from packaging.requirements import Requirement

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
TRAINING_STACK = ("jax", "jaxlib", "flax", "optax", "drjax", "orbax", "grain")
DOCS_ONLY = ("myst_nb", "myst_parser", "sphinx", "jupytext")

#: What runs the notebooks besides the package: a kernel and a client (a hosted notebook service's).
KERNEL = ("ipykernel", "nbclient")


def _canonical(name: str) -> str:
  return re.sub(r"[-_.]+", "-", name).lower()


def declared_closure() -> set[str]:
  """The distributions a user's environment holds after installing the package and a kernel:
  ``[project].dependencies`` of pyproject.toml, :data:`KERNEL`, and what they require in turn
  (their markers evaluated here, with the extras each requirement names)."""
  project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
  todo = [Requirement(r) for r in [*project["dependencies"], *KERNEL]]
  seen = {_canonical(project["name"])}
  while todo:
    req = todo.pop()
    name = _canonical(req.name)
    if name in seen:
      continue
    seen.add(name)
    try:
      requires = importlib.metadata.requires(req.name) or []
    except importlib.metadata.PackageNotFoundError:
      continue
    for r in map(Requirement, requires):
      if r.marker is None or any(r.marker.evaluate({"extra": e}) for e in ("", *req.extras)):
        todo.append(r)
  return seen


def undeclared_modules() -> set[str]:
  """The top-level modules of this environment that only undeclared distributions provide."""
  allowed = declared_closure()
  return {module for module, dists in importlib.metadata.packages_distributions().items()
          if not any(_canonical(d) in allowed for d in dists)}


# Put first on PYTHONPATH: what the package does not declare cannot be imported, as in a user's
# environment that installed only the package and a kernel.
BLOCKER = textwrap.dedent("""
    import importlib.abc, sys

    class _NotInstalled(importlib.abc.MetaPathFinder):
      def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
          raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

    sys.meta_path.insert(0, _NotInstalled())
""")


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
  """``(site, workdir, env)``: the unpacked wheel, an empty folder, the environment to run in."""
  base = tmp_path_factory.mktemp("installed")
  wheels, site, blocker, work = (base / n for n in ("wheels", "site", "blocker", "work"))
  for d in (site, blocker, work):
    d.mkdir()
  source = base / "source"  # a copy: setuptools builds in the source tree (build/, *.egg-info)
  for name in ("pyproject.toml", "README.md"):
    source.mkdir(exist_ok=True)
    shutil.copy2(ROOT / name, source / name)
  for package in ("diloco_core", "analysis"):
    shutil.copytree(ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
  build = subprocess.run(
      [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
       str(wheels), str(source)], capture_output=True, text=True, timeout=600)
  assert build.returncode == 0, build.stderr[-3000:]
  (wheel,) = wheels.glob("diloco_suite-*.whl")
  zipfile.ZipFile(wheel).extractall(site)  # a pure-Python wheel installs by unpacking
  blocked = undeclared_modules()
  assert set(DOCS_ONLY) <= blocked, blocked
  (blocker / "sitecustomize.py").write_text(f"BLOCKED = {sorted(blocked)!r}\n" + BLOCKER)
  env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "XLA_FLAGS")}
  env.update(PYTHONPATH=os.pathsep.join([str(site), str(blocker)]), JAX_PLATFORMS="cpu",
             DILOCO_SWEEPS_CACHE=str(base / "sweeps"), TQDM_DISABLE="1", MPLBACKEND="Agg")
  return site, work, env


def test_the_notebooks_environment_holds_what_the_package_declares_and_no_more():
  """The blocker's list: the docs' packages are blocked, and so is what only they bring (Jinja2
  would be, were the package not to declare it: pandas' Styler, the notebooks' tables, needs it)."""
  closure, blocked = declared_closure(), undeclared_modules()
  assert {"jax", "pandas", "matplotlib", "jinja2", "ipykernel", "nbclient", "markupsafe"} <= closure
  assert {"sphinx", "myst_nb", "jupytext", "pytest", "xdist"} <= blocked
  assert not {"jax", "pandas", "jinja2", "IPython", "zmq", "nbformat"} & blocked


def run(args, installed, timeout=600, **kw) -> subprocess.CompletedProcess:
  site, work, env = installed
  return subprocess.run([sys.executable, *args], cwd=work, env=env, capture_output=True,
                        text=True, timeout=timeout, **kw)


def test_the_wheel_ships_the_stored_experiments_and_every_module(installed):
  site, _, _ = installed
  for package in ("diloco_core", "analysis", "analysis/planning", "analysis/lab", "analysis/plots"):
    here = {p.name for p in (ROOT / package).glob("*.py")}
    shipped = {p.name for p in (site / package).glob("*.py")}
    assert here == shipped, f"{package}: not shipped {sorted(here - shipped)}"
  here = {p.name for p in (ROOT / "analysis" / "results").glob("*.json")}
  assert here and here == {p.name for p in (site / "analysis" / "results").glob("*.json")}


def test_the_planning_library_imports_without_the_training_stack(installed):
  site, _, _ = installed
  code = textwrap.dedent(f"""
      import json, sys, time
      start = time.perf_counter()
      import analysis, analysis.plots
      from analysis import plan_run, run_simulation, paper_table, memory_per_replica
      seconds = time.perf_counter() - start
      plan = plan_run(model="llama3-8b", hardware="v5p", slices=2, chips_per_slice=64,
                      seq_len=4096, global_batch_tokens=2**21, link_gbps=100)
      print(json.dumps({{"file": analysis.__file__, "seconds": seconds,
                         "loaded": sorted({{m.split(".")[0] for m in sys.modules}} & set({TRAINING_STACK!r})),
                         "after_plan": sorted({{m.split(".")[0] for m in sys.modules}} & set({TRAINING_STACK!r}))}}))
  """)
  proc = run(["-c", code], installed)
  assert proc.returncode == 0, proc.stderr[-3000:]
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  assert out["file"].startswith(str(site)), out["file"]
  assert out["loaded"] == [] and out["after_plan"] == [], out
  # what the first name of the experiments machinery loads, on first use: the trainer's configs,
  # which import no JAX (JAX comes with the first run it trains)
  proc = run(["-c", "import sys, analysis; analysis.grid; print('diloco_core.algorithm.config' in sys.modules,"
                    " 'jax' in sys.modules)"], installed)
  assert proc.returncode == 0 and proc.stdout.strip() == "True False", proc.stderr[-2000:]


@pytest.mark.parametrize("args", [
    ["-m", "analysis", "plan", "--model", "llama3-8b", "--hardware", "v5p", "--slices", "2",
     "--chips-per-slice", "64", "--seq-len", "4096", "--global-batch-tokens", "2097152",
     "--link-gbps", "100"],
    ["-m", "analysis", "simulate", "--table"],
    # the tiny run the suite's other trainer commands share (its programs are compiled once)
    ["-m", "diloco_core.train", "--model", "tiny", "--steps", "8", "--batch-size", "2", "--seq-len", "8",
     "--warmup-steps", "1", "--data-vocab", "16", "--data-order", "1", "--no-progress"],
], ids=["plan", "simulate", "train"])
def test_the_commands_run_from_another_folder(installed, args):
  proc = run(args, installed)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
  assert proc.stdout.strip()


def test_every_notebook_runs_installed_without_the_docs_packages(installed):
  site, work, _ = installed
  assert len(NOTEBOOKS) == 6
  # First cell of each copy: it runs the installed package, and the docs' packages are absent.
  guard = textwrap.dedent(f"""
      import analysis, importlib
      assert analysis.__file__.startswith({str(site)!r}), analysis.__file__
      for name in {DOCS_ONLY!r}:
        try:
          importlib.import_module(name)
        except ModuleNotFoundError:
          continue
        raise AssertionError(f"{{name}} is importable")
  """)
  driver = textwrap.dedent("""
      import sys, time, nbformat
      from nbclient import NotebookClient
      guard, paths = sys.argv[1], sys.argv[2:]
      for path in paths:
        nb = nbformat.read(path, as_version=4)
        nb.cells.insert(0, nbformat.v4.new_code_cell(guard))
        start = time.perf_counter()
        NotebookClient(nb, timeout=900, kernel_name="python3",
                       resources={"metadata": {"path": "."}}).execute()
        print(f"{path}: {time.perf_counter() - start:.0f} s", flush=True)
  """)
  for nb in NOTEBOOKS:
    (work / nb.name).write_bytes(nb.read_bytes())
  proc = run(["-c", driver, guard, *[nb.name for nb in NOTEBOOKS]], installed, timeout=1800)
  assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]
  print(proc.stdout)
  assert proc.stdout.count(": ") == 6, proc.stdout
