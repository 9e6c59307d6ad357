"""The code's layout: no import circle, no private name used across modules, small modules.

Read with :mod:`ast` (imports inside functions count: they run when the function does).
"""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("diloco_core", "analysis")
#: The most lines a module may have (docstrings included).
MAX_LINES = 450


def modules() -> dict[str, pathlib.Path]:
  """Every module of the two packages, by dotted name (a package by its own name)."""
  out = {}
  for package in PACKAGES:
    for path in sorted((ROOT / package).rglob("*.py")):
      parts = path.relative_to(ROOT).with_suffix("").parts
      out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return out


def import_graph() -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
  """Module -> the project modules it imports; and every ``from M import _private``."""
  mods = modules()
  edges: dict[str, set[str]] = {m: set() for m in mods}
  private = []
  for name, path in mods.items():
    for node in ast.walk(ast.parse(path.read_text())):
      if isinstance(node, ast.Import):
        edges[name] |= {a.name for a in node.names if a.name in mods}
      elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in mods:
        for alias in node.names:
          sub = f"{node.module}.{alias.name}"
          if sub in mods:
            edges[name].add(sub)
          else:
            edges[name].add(node.module)
            if alias.name.startswith("_"):
              private.append((name, node.module, alias.name))
  return edges, private


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
