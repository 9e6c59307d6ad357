"""pyproject.toml declares every third-party package that diloco_core and analysis import.

A fresh ``pip install .`` must give an environment in which every module imports. The test
reads every module of the two packages with :mod:`ast` (imports inside functions count too:
they run when the function does), maps the imported top-level names to distribution names,
and checks each against ``[project].dependencies``, whose lower bounds must be the versions
pinned (and tested) in requirements.txt.
"""

from __future__ import annotations

import ast
import pathlib
import re
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("diloco_core", "analysis")

#: Import name -> distribution name, for every third-party package the code may import.
#: A new import that is missing here fails the test: add it here and to pyproject.toml.
DISTRIBUTIONS = {
    "jax": "jax",
    "jaxlib": "jaxlib",
    "flax": "flax",
    "optax": "optax",
    "drjax": "drjax",
    "orbax": "orbax-checkpoint",
    "grain": "grain",
    "ml_dtypes": "ml-dtypes",
    "numpy": "numpy",
    "scipy": "scipy",
    "pandas": "pandas",
    "matplotlib": "matplotlib",
    "tqdm": "tqdm",
    "zmq": "pyzmq",
}
#: Imports that are tried, not required: the module works without them (``except ImportError``).
#: Import name -> the only modules allowed to try it.
OPTIONAL = {
    "myst_nb": {"analysis/plots/notebook.py"},  # the docs build's glue; shown in the cell without it
    "IPython": {"analysis/plots/notebook.py"},  # a notebook's display; print() without it
}


def _normalize(name: str) -> str:
  """PEP 503 name normalization: ``ml_dtypes`` and ``ML-Dtypes`` are the same project."""
  return re.sub(r"[-_.]+", "-", name).lower()


def imported_top_level(source: str) -> set[str]:
  """Top-level names of the absolute imports anywhere in ``source``.

  >>> sorted(imported_top_level("import os.path\\nfrom a.b import c\\nfrom . import d\\n"
  ...                           "def f():\\n  import numpy as np"))
  ['a', 'numpy', 'os']
  """
  names = set()
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Import):
      names.update(alias.name.split(".")[0] for alias in node.names)
    elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
      names.add(node.module.split(".")[0])
  return names


def third_party_imports() -> dict[str, set[str]]:
  """Each third-party top-level import of the two packages -> the modules that import it."""
  out: dict[str, set[str]] = {}
  for package in PACKAGES:
    for path in sorted((ROOT / package).rglob("*.py")):
      for name in imported_top_level(path.read_text(encoding="utf-8")):
        if name in sys.stdlib_module_names or name in PACKAGES or name == "__future__":
          continue
        out.setdefault(name, set()).add(str(path.relative_to(ROOT)))
  return out


def declared_dependencies() -> dict[str, str]:
  """``[project].dependencies`` of pyproject.toml as {normalized name: requirement}."""
  project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
  out = {}
  for requirement in project["dependencies"]:
    name = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement).group(0)
    out[_normalize(name)] = requirement
  return out


def pinned_versions() -> dict[str, str]:
  """``name==version`` lines of requirements.txt as {normalized name: version}."""
  out = {}
  for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
    m = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s#]+)\s*(#.*)?", line)
    if m:
      out[_normalize(m.group(1))] = m.group(2)
  return out


def test_the_scan_sees_the_known_imports():
  found = third_party_imports()
  # scipy (the Markov source's stationary distribution) and orbax (checkpoints) are the two
  # that a hand-kept list most easily forgets; the scan must see them where they are.
  assert "diloco_core/data/markov.py" in found["scipy"]
  assert "diloco_core/store/checkpoint.py" in found["orbax"]
  assert {"jax", "numpy", "optax", "drjax", "pandas", "matplotlib"} <= set(found)


def test_every_import_has_a_known_distribution():
  unknown = {name: sorted(where) for name, where in third_party_imports().items()
             if name not in DISTRIBUTIONS and not (name in OPTIONAL and where <= OPTIONAL[name])}
  assert not unknown, f"imports with no distribution in DISTRIBUTIONS (add them): {unknown}"


def test_optional_imports_are_tried():
  for name, modules in OPTIONAL.items():
    for module in modules:
      text = (ROOT / module).read_text()
      assert re.search(rf"try:\n\s+(from {name}\b|import {name}\b).*\n(\s+.*\n)*?\s+except ImportError", text), (
          f"{module} must import {name} inside try/except ImportError (it is optional)")


def test_every_imported_distribution_is_a_dependency():
  declared = declared_dependencies()
  missing = {DISTRIBUTIONS[name]: sorted(where) for name, where in third_party_imports().items()
             if name in DISTRIBUTIONS and _normalize(DISTRIBUTIONS[name]) not in declared}
  assert not missing, f"imported but not in pyproject.toml [project].dependencies: {missing}"


@pytest.mark.parametrize("name", sorted(declared_dependencies()))
def test_lower_bounds_are_the_tested_pins(name):
  requirement = declared_dependencies()[name]
  pins = pinned_versions()
  assert name in pins, f"{requirement} has no tested pin in requirements.txt"
  assert requirement == f"{requirement.split('>=')[0]}>={pins[name]}", (
      f"pyproject.toml has {requirement!r}; requirements.txt pins {name}=={pins[name]}")


def _imports(path):
  import ast
  tree = ast.parse(open(path).read())
  names = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.Import):
      names |= {a.name for a in node.names}
    elif isinstance(node, ast.ImportFrom) and node.module:
      names.add(node.module)
      names |= {f"{node.module}.{a.name}" for a in node.names}
  return names


def test_the_trainer_imports_nothing_from_analysis_and_its_command_lines_stay_apart():
  import glob
  import os
  root = os.path.join(os.path.dirname(__file__), "..", "diloco_core")
  paths = glob.glob(os.path.join(root, "**", "*.py"), recursive=True)
  assert len(paths) > 60, paths  # every module of every sub-package
  for path in paths:
    bad = [n for n in _imports(path) if n == "analysis" or n.startswith("analysis.")]
    assert not bad, f"{os.path.relpath(path, root)} imports {bad}"
  cli, job = _imports(os.path.join(root, "run", "cli.py")), _imports(os.path.join(root, "run", "main_job.py"))
  assert not {n for n in cli if n.startswith(("diloco_core.compare", "diloco_core.run.main_job"))}, cli
  assert not {n for n in job if n.startswith(("diloco_core.run.cli", "diloco_core.compare"))}, job
