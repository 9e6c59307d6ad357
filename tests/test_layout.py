"""The code's layout: layers of sub-packages, no import circle, no private name used across modules,
small modules.

Read with :mod:`ast` (imports inside functions count: they run when the function does).
"""

from __future__ import annotations

import ast
import pathlib

from diloco_core import layers
from diloco_core.layers import HELPERS, LAYERS, PLANNING_MAY_IMPORT, allowed, package_of

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("diloco_core", "analysis")
#: The most lines a module may have (docstrings included).
MAX_LINES = 450


def modules() -> dict[str, pathlib.Path]:
  """Every module of the two packages, by dotted name (a package by its own name)."""
  return layers.modules(PACKAGES, ROOT)


def import_graph() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
  """Module -> the project modules it imports; and every ``from M import _private``."""
  return layers.import_graph(PACKAGES, ROOT)


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan), i.e. import circles.

  >>> circles({"a": {"b"}, "b": {"a"}, "c": {"a"}})
  [['a', 'b']]
  >>> circles({"a": {"b"}, "b": set()})
  []
  """
  index: dict[str, int] = {}
  low: dict[str, int] = {}
  stack: list[str] = []
  found = []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    for w in sorted(edges[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in stack:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(edges):
    if v not in index:
      visit(v)
  return found


def test_every_sub_package_has_a_layer_and_every_module_a_room():
  packages = {p.name for p in (ROOT / "diloco_core").iterdir() if (p / "__init__.py").exists()}
  assert packages == {p for names in LAYERS for p in names}
  top = {name for name in modules() if name.startswith("diloco_core") and package_of(name) is None}
  assert top == set(HELPERS) | set(layers.ENTRY_POINTS), f"modules outside the sub-packages: {sorted(top)}"


def test_imports_follow_the_layers():
  """Every import of the trainer (function-level ones included) goes down the layers, never up or across."""
  bad = layers.against_the_layers(import_graph()[0])
  assert not bad, "imports against the layers (see LAYERS):\n" + "\n".join(sorted(bad))


def test_the_planning_library_imports_only_the_spec():
  edges, _ = import_graph()
  bad = sorted(f"{m} -> {d}" for m, deps in edges.items() if m.startswith("analysis.planning")
               for d in deps if d.startswith("diloco_core") and d not in HELPERS and d != "diloco_core"
               and package_of(d) not in PLANNING_MAY_IMPORT)
  assert not bad, bad


def test_each_package_states_its_layer_rule():
  """The docstring's "May import:" line is the rule above, in words."""
  import importlib
  for names in LAYERS:
    for package in names:
      doc = importlib.import_module(f"diloco_core.{package}").__doc__
      lower = allowed(package)
      line = f"May import: {', '.join(lower)}." if lower else "May import: nothing of the trainer."
      assert line in doc, f"diloco_core.{package}'s docstring lacks {line!r}"


def test_no_import_circle():
  assert circles(import_graph()[0]) == []


def test_no_private_name_is_imported_across_modules():
  assert import_graph()[1] == []


def test_only_diloco_py_touches_the_private_parts_of_diloco():
  """The runtimes use DiLoCo's public phase contract, never its private names."""
  import diloco_core.algorithm.diloco as diloco_module
  private = {n for n in vars(diloco_module.DiLoCo) if n.startswith("_") and not n.startswith("__")}
  private |= {"_kinds", "_outer_kinds", "_treedef"}  # instance attributes set in DiLoCo
  users = {}
  for name, path in modules().items():
    if name == "diloco_core.algorithm.diloco":
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Attribute) and node.attr in private and not (
          isinstance(node.value, ast.Name) and node.value.id == "self"):
        users.setdefault(name, set()).add(node.attr)
  assert not users, f"private names of DiLoCo used outside diloco.py: {users}"


def test_modules_are_small():
  long = {name: n for name, path in modules().items()
          if (n := len(path.read_text().splitlines())) > MAX_LINES}
  assert not long, f"modules over {MAX_LINES} lines (split them by concept): {long}"


def test_the_planning_library_imports_nothing_of_the_lab():
  edges, _ = import_graph()
  bad = {m: sorted(e for e in deps if e.startswith("analysis.lab"))
         for m, deps in edges.items() if m.startswith("analysis.planning")}
  assert not any(bad.values()), bad


def test_every_module_keeps_its_short_name():
  """``from analysis import roofline, stored`` (the notebooks' and users' spelling) still works."""
  import analysis
  for name, path in modules().items():
    parts = name.split(".")
    if parts[0] == "analysis" and len(parts) == 3 and parts[1] in ("planning", "lab") and not parts[2].startswith("_"):
      assert getattr(analysis, parts[2]).__name__ == name


def test_public_paths_keep_working():
  """``from diloco_core import X`` for every public name, each sub-package's re-exports, and the
  ``python -m`` entry points (the launcher's default ``--module`` among them)."""
  import importlib
  import importlib.util

  import diloco_core
  from diloco_core.launch import supervisor
  for name in diloco_core.__all__:
    assert getattr(diloco_core, name) is not None, name
  for package in sum(LAYERS, ()):
    module = importlib.import_module(f"diloco_core.{package}")
    for name in module.__all__:
      assert getattr(module, name) is getattr(importlib.import_module(module._PUBLIC[name]), name)
  default_module = supervisor.build_parser().get_default("module")
  for entry in ("diloco_core.train", "diloco_core.compare", "diloco_core.launch.__main__",
                "diloco_core.coordination_service", default_module):
    assert importlib.util.find_spec(entry) is not None, entry
  assert default_module == "diloco_core.train"
