"""The trainer's layers: which sub-package may import which, and the import graph read from the source.

``diloco_core`` is a house of sub-packages on floors (:data:`LAYERS`). A sub-package imports
only the sub-packages its entry of :data:`ALLOWED` names, an explicit list of the pairs in use,
each on a lower floor, plus the helpers every floor may use (:data:`HELPERS`, which import
nothing of the trainer); the entry points (:data:`ENTRY_POINTS`) may use every floor. A new
arrow between two packages is a decision: it is added to :data:`ALLOWED` (and to the package's
"May import:" line), never let in because some floor lies below. ``tests/test_layout.py``
checks every import against this rule (function-level and relative ones included, read with
``ast``), that every allowed pair goes down and is in use, and the contributing page draws the
house from it.

Examples:
  >>> layer_of("spec"), layer_of("store"), layer_of("launch")
  (0, 2, 6)
  >>> allowed("model")
  ('spec', 'devices')
  >>> "data" in allowed("runtime")  # on a lower floor, but not a pair in use
  False
  >>> package_of("diloco_core.run.loop"), package_of("diloco_core.train")
  ('run', None)
"""

from __future__ import annotations

import ast
import pathlib

#: The sub-packages of ``diloco_core`` by floor, lowest first.
LAYERS = (("spec",), ("devices",), ("wire", "model", "data", "store"), ("algorithm",), ("runtime",),
          ("run",), ("launch",))
#: The sub-packages each one may import (besides itself and :data:`HELPERS`), lowest floor first:
#: the pairs in use, each going down :data:`LAYERS` (checked by :func:`upward_pairs`).
ALLOWED: dict[str, tuple[str, ...]] = {
    "spec": (),
    "devices": ("spec",),
    "wire": ("spec",),
    "model": ("spec", "devices"),
    "data": ("spec",),
    "store": ("devices",),
    "algorithm": ("spec", "devices", "wire"),
    "runtime": ("spec", "devices", "wire", "algorithm"),
    "run": ("spec", "devices", "data", "model", "store", "algorithm", "runtime"),
    "launch": ("spec", "devices", "store", "runtime", "run"),
}
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
  """The sub-packages ``package`` may import: its entry of :data:`ALLOWED`."""
  layer_of(package)  # a one-line error for a name that is no sub-package
  return ALLOWED[package]


def upward_pairs(allow: dict[str, tuple[str, ...]] | None = None) -> list[str]:
  """The pairs of an allow-list (default :data:`ALLOWED`) that do not go to a lower floor.

  Examples:
    >>> upward_pairs()
    []
    >>> upward_pairs({"wire": ("model",), "spec": ("run",)})
    ['spec -> run', 'wire -> model']
  """
  allow = ALLOWED if allow is None else allow
  return sorted(f"{a} -> {b}" for a, deps in allow.items() for b in deps if layer_of(b) >= layer_of(a))


def resolve(module: str, node, is_package: bool = False) -> str | None:
  """The absolute module a ``from ... import`` names, relative ones (``from .x import y``) included.

  Args:
    module: the dotted name of the importing module.
    node: the ``from ... import`` (an ``ast.ImportFrom`` node).
    is_package: whether ``module`` is a package (an ``__init__.py``): its dots count from itself.

  Returns:
    The dotted name, or None for a relative import that climbs above the top package.

  Examples:
    >>> resolve("diloco_core.run.loop", ast.parse("from .config import TrainConfig").body[0])
    'diloco_core.run.config'
    >>> resolve("diloco_core.run", ast.parse("from . import loop").body[0], is_package=True)
    'diloco_core.run'
    >>> resolve("diloco_core.run.loop", ast.parse("from ..spec import fields").body[0])
    'diloco_core.spec'
  """
  if node.level == 0:
    return node.module
  parts = module.split(".")
  base = parts if is_package else parts[:-1]
  if node.level - 1 >= len(base):
    return None
  base = base[:len(base) - (node.level - 1)]
  return ".".join(base + ([node.module] if node.module else []))


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
        continue
      if not isinstance(node, ast.ImportFrom):
        continue
      target = resolve(name, node, is_package=path.name == "__init__.py")
      if target not in mods:
        continue
      for alias in node.names:
        sub = f"{target}.{alias.name}"
        if sub in mods:
          edges[name].add(sub)
        else:
          edges[name].add(target)
          if alias.name.startswith("_"):
            private.append((name, target, alias.name))
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


def unused_pairs(edges: dict[str, set[str]], allow: dict[str, tuple[str, ...]] | None = None) -> list[str]:
  """The pairs of an allow-list (default :data:`ALLOWED`) that no import uses: allowed by accident.

  Examples:
    >>> unused_pairs({"diloco_core.model.moe": {"diloco_core.spec.fields"}},
    ...              {"model": ("spec", "devices")})
    ['model -> devices']
  """
  allow = ALLOWED if allow is None else allow
  used = set(package_graph(edges))
  return sorted(f"{a} -> {b}" for a, deps in allow.items() for b in deps if (a, b) not in used)


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
