"""The trainer's layers: which sub-package may import which, and the import graph read from the source.

``diloco_core`` is a house of sub-packages on floors. A sub-package imports only those of
lower floors (:data:`LAYERS`), plus the two helpers every floor may use (:data:`HELPERS`,
which import nothing of the trainer); the entry points (:data:`ENTRY_POINTS`) may use every
floor. ``tests/test_layout.py`` checks every import against this rule (function-level ones
included, read with ``ast``), and the contributing page draws the house from it.

Examples:
  >>> layer_of("spec"), layer_of("store"), layer_of("launch")
  (0, 2, 6)
  >>> allowed("model")
  ('spec', 'devices')
  >>> package_of("diloco_core.run.loop"), package_of("diloco_core.train")
  ('run', None)
"""

from __future__ import annotations

import ast
import pathlib

#: The sub-packages of ``diloco_core`` by floor, lowest first.
LAYERS = (("spec",), ("devices",), ("wire", "model", "data", "store"), ("algorithm",), ("runtime",),
          ("run",), ("launch",))
#: Top-level modules every floor may import (they import nothing of the trainer but each other).
HELPERS = ("diloco_core.lazy", "diloco_core.interrupts", "diloco_core.layers")
#: Top-level modules that start the trainer (``python -m ...``); they may import every floor.
ENTRY_POINTS = ("diloco_core", "diloco_core.train", "diloco_core.compare", "diloco_core.coordination_service")
#: The floors the planning library (``analysis.planning``) may import: no JAX at import.
PLANNING_MAY_IMPORT = ("spec",)

ROOT = pathlib.Path(__file__).resolve().parents[1]


def layer_of(package: str) -> int:
  """The floor of a sub-package (0 is the lowest); ValueError for a name that is none."""
  for i, names in enumerate(LAYERS):
    if package in names:
      return i
  raise ValueError(f"{package!r} is not a sub-package of diloco_core; one of {sum(LAYERS, ())}")


def allowed(package: str) -> tuple[str, ...]:
  """The sub-packages ``package`` may import: those of every lower floor."""
  return sum(LAYERS[:layer_of(package)], ())


def package_of(module: str) -> str | None:
  """The sub-package of a dotted ``diloco_core`` module name, or None for a top-level module."""
  parts = module.split(".")
  if parts[0] != "diloco_core" or len(parts) < 2 or not any(parts[1] in names for names in LAYERS):
    return None
  return parts[1]


def modules(packages: tuple[str, ...] = ("diloco_core",), root: pathlib.Path = ROOT) -> dict[str, pathlib.Path]:
  """Every module of the packages, by dotted name (a package by its own name).

  Examples:
    >>> mods = modules()
    >>> "diloco_core.run.loop" in mods and "diloco_core.spec" in mods
    True
  """
  out = {}
  for package in packages:
    for path in sorted((root / package).rglob("*.py")):
      parts = path.relative_to(root).with_suffix("").parts
      out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
  return out


def import_graph(packages: tuple[str, ...] = ("diloco_core",), root: pathlib.Path = ROOT,
                 ) -> tuple[dict[str, set[str]], list[tuple[str, str, str]]]:
  """Module -> the project modules it imports (at any depth of the file); and every
  ``from M import _private`` as ``(importer, M, name)``.

  Examples:
    >>> edges, private = import_graph()
    >>> "diloco_core.spec.validity" in edges["diloco_core.spec.model_config"]
    True
  """
  mods = modules(packages, root)
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


def against_the_layers(edges: dict[str, set[str]]) -> list[str]:
  """The imports of ``diloco_core`` that break the rule, as ``"importer -> imported"``.

  Examples:
    >>> against_the_layers({"diloco_core.spec.schedule": {"diloco_core.run.loop"},
    ...                     "diloco_core.run.loop": {"diloco_core.spec.schedule", "diloco_core.lazy"}})
    ['diloco_core.spec.schedule -> diloco_core.run.loop']
  """
  bad = []
  for module, deps in edges.items():
    if not module.startswith("diloco_core") or module in ENTRY_POINTS:
      continue
    mine = package_of(module)
    for dep in deps:
      theirs = package_of(dep)
      if module in HELPERS:
        ok = not dep.startswith("diloco_core") or dep in HELPERS
      elif theirs is None:
        ok = dep in HELPERS
      else:
        ok = theirs == mine or theirs in allowed(mine)
      if not ok:
        bad.append(f"{module} -> {dep}")
  return sorted(bad)


def package_graph(edges: dict[str, set[str]]) -> dict[tuple[str, str], int]:
  """The arrows between sub-packages: ``(importer, imported) -> number of module imports``.

  Examples:
    >>> package_graph({"diloco_core.run.loop": {"diloco_core.spec.schedule", "diloco_core.spec.fields"}})
    {('run', 'spec'): 2}
  """
  out: dict[tuple[str, str], int] = {}
  for module, deps in edges.items():
    for dep in deps:
      a, b = package_of(module), package_of(dep)
      if a and b and a != b:
        out[(a, b)] = out.get((a, b), 0) + 1
  return dict(sorted(out.items()))
