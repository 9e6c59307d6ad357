"""The code's layout: layers of sub-packages, no import circle, no private name used across modules,
small modules.

Read with :mod:`ast` (imports inside functions count: they run when the function does).
"""

from __future__ import annotations

import ast
import pathlib
import re

from diloco_core import layers
from diloco_core.layers import HELPERS, LAYERS, PLANNING_MAY_IMPORT, allowed, package_of

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("diloco_core", "analysis")
#: The most lines a module may have (docstrings included).
MAX_LINES = 450
#: The most lines a function of the trainer may have (its docstring included): one you read at once.
MAX_FUNCTION_LINES = 80


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


def test_the_allow_list_goes_down_names_every_package_and_every_pair_is_in_use():
  """ALLOWED is the rule and the picture: no pair up or across, none allowed by accident."""
  assert set(layers.ALLOWED) == {p for names in LAYERS for p in names}
  assert layers.upward_pairs() == []
  assert layers.unused_pairs(import_graph()[0]) == [], "pairs no import uses: drop them from ALLOWED"


def test_relative_imports_are_checked_like_absolute_ones(tmp_path):
  """A ``from ..run import loop`` in a lower package is caught, as its absolute form would be."""
  pkg = tmp_path / "diloco_core"
  for sub, text in {"spec": "from ..run import loop\nfrom . import fields\n", "run": ""}.items():
    (pkg / sub).mkdir(parents=True)
    (pkg / sub / "__init__.py").write_text(text)
  (pkg / "__init__.py").write_text("")
  (pkg / "spec" / "fields.py").write_text("from .. import lazy\n")
  (pkg / "run" / "loop.py").write_text("")
  (pkg / "lazy.py").write_text("")
  edges, _ = layers.import_graph(("diloco_core",), tmp_path)
  assert edges["diloco_core.spec"] == {"diloco_core.run.loop", "diloco_core.spec.fields"}
  assert edges["diloco_core.spec.fields"] == {"diloco_core.lazy"}  # a helper: allowed
  assert layers.against_the_layers(edges) == ["diloco_core.spec -> diloco_core.run.loop"]


def test_the_contributing_page_lists_every_module_in_its_package_row():
  """The module map on docs/contributing.md names each module of each sub-package (the map stays true)."""
  rows = {}
  for line in (ROOT / "docs" / "contributing.md").read_text().splitlines():
    m = re.match(r"\| (?:\d|-) \| `(\w+)` \| (.*) \|$", line)
    if m:
      rows[m.group(1)] = m.group(2)
  assert set(rows) == {p for names in LAYERS for p in names}
  missing = [name for name in modules() if (package := package_of(name)) and name != f"diloco_core.{package}"
             and f"`{name.rsplit('.', 1)[1]}`" not in rows[package]]
  assert not missing, f"modules missing from the contributing page's table: {missing}"


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


def test_no_function_of_the_trainer_is_longer_than_a_screen():
  long = {f"{name}.{node.name}": node.end_lineno - node.lineno + 1
          for name, path in modules().items() if name.startswith("diloco_core")
          for node in ast.walk(ast.parse(path.read_text()))
          if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
          and node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES}
  assert not long, f"functions over {MAX_FUNCTION_LINES} lines (split them into named steps): {long}"


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


# ---- the algorithm/runtime contract -------------------------------------------------------------

def _tree(module: str) -> ast.Module:
  return ast.parse(modules()[module].read_text())


def _protocol_members() -> set[str]:
  from diloco_core.runtime.communication import Runtime
  return {n for n in vars(Runtime) if not n.startswith("_")} | set(Runtime.__annotations__)


#: The modules that drive a run's runtime: the lock-step loop and the tape's rounds.
DRIVERS = ("diloco_core.run.loop", "diloco_core.run.tape_run")


def test_the_loop_calls_only_the_runtime_protocol():
  """Every ``comm.<name>`` of the training loop (lock step and a tape's rounds) is a member of
  ``Runtime``, and nothing probes the runtime with ``getattr`` / ``hasattr``."""
  used, probes = set(), []
  for node in (n for module in DRIVERS for n in ast.walk(_tree(module))):
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "comm":
      used.add(node.attr)
    elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
          and node.args and isinstance(node.args[0], ast.Name) and node.args[0].id == "comm"):
      probes.append(ast.unparse(node))
  assert used, "the loop's runtime is no longer called `comm`: update this test"
  assert not used - _protocol_members(), f"the loop calls names Runtime does not list: {sorted(used - _protocol_members())}"
  assert not probes, probes


def test_every_runtime_implements_the_whole_protocol():
  """InStep, Background and TapeRuntime have every member of ``Runtime``, methods with its parameters."""
  import inspect

  from diloco_core.runtime.background import Background
  from diloco_core.runtime.communication import InStep, Runtime
  from diloco_core.runtime.tape_runtime import TapeRuntime
  for runtime in (InStep, Background, TapeRuntime):
    missing = sorted(n for n in _protocol_members() if not hasattr(runtime, n))
    assert not missing, f"{runtime.__name__} lacks {missing}"
    for name, spec in vars(Runtime).items():
      if callable(spec) and not name.startswith("_"):
        want = list(inspect.signature(spec).parameters)
        assert list(inspect.signature(getattr(runtime, name)).parameters) == want, (runtime.__name__, name)


def _classes() -> dict[tuple[str, str], tuple[ast.ClassDef, list[tuple[str, str]]]]:
  """``(module, class) -> (its node, its bases as (module, class))`` for every class of diloco_core
  (bases resolved through the module's own classes and its ``from M import X``)."""
  out, raw = {}, {}
  for module in (m for m in modules() if m.startswith("diloco_core")):
    tree = _tree(module)
    imported = {a.asname or a.name: (n.module, a.name) for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module for a in n.names}
    for node in ast.walk(tree):
      if isinstance(node, ast.ClassDef):
        raw[module, node.name] = (node, [imported.get(b.id, (module, b.id)) for b in node.bases if isinstance(b, ast.Name)])
  for key, (node, bases) in raw.items():
    out[key] = (node, [b for b in bases if b in raw])
  return out


def _ancestors(classes, key) -> set:
  seen = set()
  for base in classes[key][1]:
    seen |= {base} | _ancestors(classes, base)
  return seen


def _private(name: str) -> bool:
  return name.startswith("_") and not name.startswith("__")


def _defined(node: ast.ClassDef) -> set[str]:
  """The private names a class defines: methods, class attributes, ``self._x = ...``."""
  out = set()
  for n in ast.walk(node):
    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
      out.add(n.name)
    elif isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and isinstance(n.value, ast.Name) \
        and n.value.id == "self":
      out.add(n.attr)
  for stmt in node.body:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target] if isinstance(stmt, ast.AnnAssign) else []
    out |= {t.id for t in targets if isinstance(t, ast.Name)}
  return {n for n in out if _private(n)}


def _self_uses(node: ast.ClassDef) -> dict[str, bool]:
  """Private names used through ``self`` / ``cls`` -> whether the class assigns them."""
  out: dict[str, bool] = {}
  for n in ast.walk(node):
    if isinstance(n, ast.Attribute) and _private(n.attr) and isinstance(n.value, ast.Name) and n.value.id in ("self", "cls"):
      out[n.attr] = out.get(n.attr, False) or isinstance(n.ctx, ast.Store)
  return out


#: Reads of another object's private attribute (``x._name``, x not self / cls) that stay, each
#: for a reason: the API of another library, with no public spelling (key: module, expression).
FOREIGN_PRIVATE_READS = {
    ("diloco_core.compare", "p._actions"): "argparse: the actions of a parser (no public accessor)",
    ("diloco_core.run.flags", "p._action_groups"): "argparse: the argument groups (no public accessor)",
    ("diloco_core.data.files", "ids._mmap"): "numpy.memmap: its mmap, closed explicitly",
    ("diloco_core.algorithm.base", "self._step._cache_size"): "jax: a jitted function's compiled count",
    ("diloco_core.store.tree_io", "hook._diloco_quiet"): "a marker this module sets on its own hook function",
    ("diloco_core.devices.compile_cache", "compiler._cache_write"):
        "jax: the persistent cache's write, wrapped so that every process writes (no public hook)",
    ("diloco_core.devices.compile_cache", "compiler._should_raise_persistent_cache_error"):
        "jax: whether a failed cache write raises, as JAX's own write decides it",
}
#: Public API of other libraries that happens to start with an underscore.
UNDERSCORE_APIS = {"_replace", "_asdict", "_fields", "_make", "_exit"}


def test_no_class_reads_another_objects_private_names():
  """``x._name`` only for x = self / cls, another instance of the same class, or a listed exception."""
  classes = _classes()
  found = set()
  for module in (m for m in modules() if m.startswith("diloco_core")):
    own_of = {}  # an expression's line -> the private names its enclosing class defines
    for (mod, _), (node, _) in classes.items():
      if mod == module:
        defined = _defined(node)
        for n in ast.walk(node):
          if hasattr(n, "lineno"):
            own_of.setdefault(n.lineno, set()).update(defined)
    for n in ast.walk(_tree(module)):
      if isinstance(n, ast.Attribute) and _private(n.attr) and n.attr not in UNDERSCORE_APIS and not (
          isinstance(n.value, ast.Name) and n.value.id in ("self", "cls")) and n.attr not in own_of.get(n.lineno, ()):
        found.add((module, ast.unparse(n)))
  unexplained = found - set(FOREIGN_PRIVATE_READS)
  assert not unexplained, f"private names of another object read: {sorted(unexplained)}"
  assert not set(FOREIGN_PRIVATE_READS) - found, "an exception no longer needed: drop it"


def test_a_class_uses_only_its_own_private_names_and_its_bases():
  """A mixin or base class never reads a private name that a class mixing it in defines (the
  ElasticRuntime of old read five of Background's); no two classes of one hierarchy assign the
  same private attribute."""
  classes = _classes()
  bad = []
  for key, (node, _) in classes.items():
    mine = _defined(node)
    line = _ancestors(classes, key)
    theirs = set().union(*(_defined(classes[a][0]) for a in line))
    for name, assigned in _self_uses(node).items():
      if name not in mine | theirs:
        bad.append(f"{key[1]} uses {name}, defined by none of its bases")
      elif assigned and name in theirs:
        bad.append(f"{key[1]} assigns {name}, a private attribute of a base")
  assert not bad, bad


def _documented_contract() -> set[str]:
  """The names of the ``Runtimes read the algorithm ...`` list of the Phases docstring."""
  import re

  from diloco_core.algorithm.phases import Phases
  doc = Phases.__doc__
  block = doc[doc.index("Runtimes read the algorithm"):].split("\n\n")[1]
  return set(re.findall(r"``([A-Za-z_]\w*)``", block))


#: Modules where ``algo`` names the run's :class:`~diloco_core.DiLoCoConfig` (``TrainConfig.algo``),
#: not the algorithm: their reads must be the config's attributes.
ALGO_IS_A_CONFIG = ("diloco_core.run.config", "diloco_core.runtime.quorum")
CONTRACT_DEBT: dict = {}  # the tape player drives the phases too (inner_steps, payloads, merge, round_outer_step)


def test_the_runtimes_read_the_algorithm_through_its_documented_contract_only():
  """Every name a module outside ``algorithm/`` reads off the algorithm (``algo.X``,
  ``self.algo.X``, ``run.algo.X``) is in the Phases docstring's list (a ``DiLoCoConfig``
  attribute read off a config named ``algo`` is not the algorithm), except
  :data:`CONTRACT_DEBT`, and every name there exists on a prepared DiLoCo."""
  import jax.numpy as jnp
  import optax

  from diloco_core import DiLoCo, DiLoCoConfig
  documented = _documented_contract()
  read, config_reads = {}, {}
  for module in (m for m in modules() if m.startswith("diloco_core") and not m.startswith("diloco_core.algorithm")):
    for n in ast.walk(_tree(module)):
      if isinstance(n, ast.Attribute) and (
          (isinstance(n.value, ast.Name) and n.value.id == "algo")
          or (isinstance(n.value, ast.Attribute) and n.value.attr == "algo" and isinstance(n.value.value, ast.Name)
              and n.value.value.id in ("self", "run"))):
        (config_reads if module in ALGO_IS_A_CONFIG else read).setdefault(n.attr, set()).add(module)
  assert read, "the runtimes no longer name the algorithm `algo`: update this test"
  assert set().union(*config_reads.values()) == set(ALGO_IS_A_CONFIG)
  not_config = sorted(name for name in config_reads if not hasattr(DiLoCoConfig, name))
  assert not not_config, f"{sorted(ALGO_IS_A_CONFIG)} read {not_config} off `algo`, which is no DiLoCoConfig attribute"
  undocumented = {name: sorted(where) for name, where in read.items() if name not in documented}
  assert undocumented == CONTRACT_DEBT, f"names read outside the Phases contract: {undocumented}"
  algo = DiLoCo(lambda w, x: jnp.sum((w - x) ** 2), optax.sgd(0.1), DiLoCoConfig(replicas=2))
  algo.prepare(jnp.zeros(3))
  assert not [n for n in documented if not hasattr(algo, n)], "the contract lists names DiLoCo lacks"
  assert not [n for n in documented if _private(n)]


def _loaded_after(code: str) -> set[str]:
  """The top-level packages loaded by a fresh interpreter after ``code``."""
  import json
  import subprocess
  import sys
  probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
  out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_the_configs_and_the_launchers_help_load_no_jax():
  """The flag tables, the configs and ``python -m diloco_core.launch --help`` answer without JAX."""
  loaded = _loaded_after("import diloco_core.algorithm.config, diloco_core.run.config, diloco_core.run.flags")
  assert not loaded & {"jax", "jaxlib", "flax", "optax"}, sorted(loaded & {"jax", "jaxlib", "flax", "optax"})
  help_run = ("import contextlib, io, runpy, sys\nsys.argv = ['launch', '--help']\n"
              "with contextlib.redirect_stdout(io.StringIO()) as out:\n"
              "  try:\n    runpy.run_module('diloco_core.launch', run_name='__main__')\n"
              "  except SystemExit as e:\n    assert e.code == 0, e.code\n"
              "assert '--processes' in out.getvalue()")
  loaded = _loaded_after(help_run)
  assert "jax" not in loaded and "diloco_core" in loaded
