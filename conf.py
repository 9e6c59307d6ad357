"""Sphinx configuration of the diloco-suite site (the source directory is the repository root).

Build (what `make docs` and CI run)::

    sphinx-build -W -n --keep-going -b html . _build/html

Every page under ``docs/`` that shows a number and every notebook under ``notebooks/`` is
executed on every build (``nb_execution_mode = "force"``), so no number on the site is typed
in by hand. Notebook kernels inherit this process's environment, which is why the JAX
settings below are made here, before anything imports JAX.
"""

from __future__ import annotations

import os
import re
import socket
import sys

ROOT = os.path.dirname(os.path.abspath(__file__))

# ---- environment shared with the notebook kernels (must precede any JAX import) -----------
os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
# Kernels run with the page's directory as cwd: make the two packages importable there.
_pp = os.environ.get("PYTHONPATH", "")
if ROOT not in _pp.split(os.pathsep):
  os.environ["PYTHONPATH"] = os.pathsep.join([ROOT] + ([_pp] if _pp else []))
sys.path.insert(0, ROOT)
# One sweep cache for every page, whatever the kernel's cwd (analysis.lab.sweeps reads it).
os.environ.setdefault("DILOCO_SWEEPS_CACHE", os.path.join(ROOT, ".cache", "sweeps"))
os.environ.setdefault("TQDM_DISABLE", "1")  # progress bars would only clutter the pages

# ---- project -------------------------------------------------------------------------------
project = "diloco-suite"
author = "diloco-suite authors"
copyright = "2026, diloco-suite authors"


def _load_by_path(relative: str):
  import importlib.util
  spec = importlib.util.spec_from_file_location(relative.replace("/", "_")[:-3], os.path.join(ROOT, relative))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


# The repository's address is one project setting (pyproject.toml, [project.urls]): the site's
# repository and launch buttons read it here; notebooks/sync.py writes it into the notebooks.
_SYNC = _load_by_path("notebooks/sync.py")
REPOSITORY_URL = _SYNC.settings()["repository"]
REPOSITORY_BRANCH = _SYNC.settings()["branch"]
COLAB_URL = _SYNC.COLAB_URL

root_doc = "docs/index"
extensions = [
    "myst_nb",  # also provides myst_parser: do not list both
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.intersphinx",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
]
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
exclude_patterns = [
    ".venv", "_build", "**/_build", ".git", ".ci", ".cache", ".pytest_cache", "runs",
    "tests", "benchmarks", "diloco_core", "analysis", "README.md", "**/README.md", "CONTRIBUTING.md",
    # each notebook is rendered from its MyST twin (notebooks/*.md); the .ipynb twin is
    # what Colab opens, and rendering both would give two pages with one docname
    "notebooks/*.ipynb", "**/.ipynb_checkpoints", "**/__pycache__", "docs/_static/*.md",
]
templates_path = []
html_static_path = ["docs/_static"]
html_css_files = ["custom.css"]

# ---- MyST / MyST-NB ------------------------------------------------------------------------
myst_enable_extensions = ["dollarmath", "amsmath", "colon_fence", "deflist", "substitution"]
myst_dmath_double_inline = True  # $$...$$ inside a paragraph or list item is display math too
myst_heading_anchors = 3
nb_execution_mode = "force"
nb_execution_raise_on_error = True
nb_execution_show_tb = True
nb_execution_timeout = 900
nb_merge_streams = True
# stderr of the kernels (JAX/absl start-up chatter, tqdm's "IProgress not found") is not part of
# the pages; errors still fail the build through nb_execution_raise_on_error.
nb_output_stderr = "remove"
nb_execution_allow_errors = False

# ---- API reference -------------------------------------------------------------------------
autodoc_default_options = {"members": True, "undoc-members": False, "show-inheritance": False}
autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_typehints_format = "short"
autodoc_class_signature = "separated"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
napoleon_use_ivar = True  # "Attributes:" as fields: dataclass fields are not documented twice
add_module_names = False
# "[source]" links only where the documented module defines the object. Following imports would
# list namedtuple helpers (module "namedtuple_X") as source modules and give re-exported names
# back-links into the wrong module's page (Sphinx keeps one back-link module per source file).
viewcode_follow_imported_members = False

# intersphinx: the inventories are fetched at build time. Offline (no DNS), a failed fetch
# would be a warning and fail the -W build, so unreachable hosts are dropped up front.
_INTERSPHINX = {
    "python": "https://docs.python.org/3",
    "jax": "https://docs.jax.dev/en/latest",
    "flax": "https://flax.readthedocs.io/en/latest",
    "optax": "https://optax.readthedocs.io/en/latest",
    "numpy": "https://numpy.org/doc/stable",
}


def _reachable(url: str, timeout: float = 3.0) -> bool:
  host = url.split("://", 1)[1].split("/", 1)[0]
  try:
    socket.create_connection((host, 443), timeout=timeout).close()
    return True
  except OSError:
    return False


if os.environ.get("DOCS_OFFLINE") == "1":
  intersphinx_mapping = {}
else:
  intersphinx_mapping = {k: (v, None) for k, v in _INTERSPHINX.items() if _reachable(v)}
intersphinx_timeout = 10
# Names from other libraries that an inventory may not hold (or that are offline): leave
# them as plain text instead of failing the nitpicky build. Our own names must resolve.
nitpick_ignore_regex = [
    (r"py:.*", r"(jax|jnp|jaxlib|flax|nnx|optax|np|numpy|pd|pandas|matplotlib|drjax|tqdm|ml_dtypes|typing|collections|argparse|os|pathlib|concurrent|queue|threading|logging|fractions)(\..*)?"),
    (r"py:.*", r"(Any|Callable|Iterable|Iterator|Sequence|Mapping|Figure|Axes|DataFrame|Array|ArrayLike|PyTree|LossFn|optional|callable)"),
    (r"py:.*", r"(int|float|str|bool|dict|list|tuple|None|object|type)\b.*"),
    (r"py:.*", r"diloco_core\.fragments\.(OTHER|LAYER|SHARED)"),
    (r"py:.*", r"dataclasses\.Field"),
]

# ---- HTML ----------------------------------------------------------------------------------
html_theme = "sphinx_book_theme"
html_title = "DiLoCo suite"
html_theme_options = {
    "repository_url": REPOSITORY_URL,
    "repository_branch": REPOSITORY_BRANCH,
    "path_to_docs": "",
    "use_repository_button": True,
    "use_issues_button": True,
    "use_download_button": True,
    "use_source_button": False,
    "launch_buttons": {"colab_url": COLAB_URL, "notebook_interface": "jupyterlab"},
    "show_toc_level": 2,
    "navigation_with_keys": False,
}
html_last_updated_fmt = None
html_extra_path = ["docs/_extra"]  # index.html at the site root, redirecting to docs/index.html


# MathJax 3 is served with the site when the pinned ``django-static-mathjax`` wheel (a plain
# copy of MathJax 3.2.2, no Django needed) is installed; otherwise Sphinx's CDN default.
def _local_mathjax_dir() -> str | None:
  import importlib.util
  spec = importlib.util.find_spec("mathjax")
  for base in (spec.submodule_search_locations or []) if spec else []:
    es5 = os.path.join(base, "static", "mathjax", "es5")
    if os.path.isfile(os.path.join(es5, "tex-chtml.js")):
      return es5
  return None


_MATHJAX_ES5 = _local_mathjax_dir()
_MATHJAX_PARTS = ("tex-chtml.js", "input", "output", "a11y", "ui", "adaptors")
if _MATHJAX_ES5:
  mathjax_path = "mathjax/tex-chtml.js"  # relative to _static
suppress_warnings = ["mystnb.unknown_mime_type"]


def _drop_launch_buttons_outside_notebooks(app, pagename, templatename, context, doctree):
  """Executed doc pages are MyST notebooks too, but only notebooks/ has an .ipynb twin.

  Colab opens .ipynb only, so a launch button on docs/*.md would point at a file Colab
  cannot open; the theme adds one to every executed page, this handler takes it off again.
  """
  if pagename.startswith("notebooks/"):
    return
  buttons = context.get("header_buttons")
  if buttons:
    context["header_buttons"] = [b for b in buttons if b.get("label") != "launch-buttons"]


def _copy_mathjax(app, exception):
  if exception is not None or not _MATHJAX_ES5 or app.builder.format != "html":
    return
  import shutil
  dest = os.path.join(app.outdir, "_static", "mathjax")
  os.makedirs(dest, exist_ok=True)
  for part in _MATHJAX_PARTS:
    src = os.path.join(_MATHJAX_ES5, part)
    if os.path.isdir(src):
      shutil.copytree(src, os.path.join(dest, part), dirs_exist_ok=True)
    else:
      shutil.copy2(src, dest)


# pandas' styled tables print the index's names in a last header row of their own, under blank
# corner cells: a row that reads as empty. The names go into the top row's corner instead (rows
# named R under columns named C: "R ↓ C →"); a table of another shape keeps its row, and the
# site test (tests/test_site_browser.py) reports it.
_INDEX_HEAD = re.compile(
    r'(<thead>\s*<tr>\s*)((?:<th class="blank(?: level0)?"\s*>&nbsp;</th>\s*)+|<th class="index_name level0"\s*>[^<]*</th>\s*)'
    r'((?:(?!</thead>).)*?</tr>)\s*<tr>\s*((?:<th class="index_name level\d+"\s*>[^<]*</th>\s*)+)'
    r'(?:<th class="blank col\d+"\s*>&nbsp;</th>\s*)+</tr>(?=\s*</thead>)', re.S)
_CELL = re.compile(r'<th class="(?:blank|index_name)(?: level\d+)?"\s*>([^<]*)</th>')


def _merge_index_header(match: "re.Match") -> str:
  corner, rest, names = match.group(2), match.group(3), _CELL.findall(match.group(4))
  blanks = _CELL.findall(corner)
  if corner.lstrip().startswith('<th class="index_name') and len(names) == 1:  # named columns
    cells = [f"{names[0]} ↓ {blanks[0]} →"]
  elif all(b == "&nbsp;" for b in blanks) and len(blanks) == len(names):
    cells = names
  else:
    return match.group(0)
  return match.group(1) + "".join(f'<th class="index_name level0" >{c}</th>' for c in cells) + rest


def _merge_index_names(app, pagename, templatename, context, doctree):
  if "body" in context and "index_name" in context["body"]:
    context["body"] = _INDEX_HEAD.sub(_merge_index_header, context["body"])


def _keep_prose_summaries(app, what, name, obj, options, lines):
  """Napoleon reads an attribute's first line "Some words: more" as "type: description".

  Properties here are documented in prose ("Warmup steps: ..."); when the part before the
  colon reads like words (a capital letter and a space), the colon becomes a dash so that
  the line stays a sentence instead of becoming an unresolvable type.
  """
  if what in ("attribute", "property", "data") and lines:
    head, sep, tail = lines[0].partition(": ")
    if sep and " " in head and head[:1].isupper() and "`" not in head:
      lines[0] = f"{head} — {tail}"


def _resolve_reexport(app, env, node, contnode):
  """Resolves ``diloco_core.X`` (a re-export) to where X is defined and documented.

  The API pages document every object once, in its defining module; docstrings may refer
  to the shorter public path (``diloco_core.DiLoCoConfig``), which this maps over.
  """
  if node.get("refdomain") != "py":
    return None
  target = node.get("reftarget", "")
  if not target.startswith(("diloco_core.", "analysis.")):
    return None
  import importlib
  parts = target.split(".")
  obj = None
  for i in range(len(parts), 0, -1):
    try:
      obj = importlib.import_module(".".join(parts[:i]))
    except ImportError:
      continue
    try:
      for attr in parts[i:]:
        obj = getattr(obj, attr)
    except AttributeError:
      return None
    break
  module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
  if not module or not qualname or f"{module}.{qualname}" == target:
    return None
  canonical = f"{module}.{qualname}"
  new = node.deepcopy()
  new["reftarget"] = canonical
  return env.domains["py"].resolve_xref(env, node["refdoc"], app.builder, node["reftype"],
                                        canonical, new, contnode)


_RECHECKS: list = []  # the re-check processes this build started


def _start_rechecks(app, env, docnames):
  """The experiments page's re-checks, started as soon as the build knows it will execute the
  page, and the page read last, so that every other page builds while they run
  (analysis.lab.recheck_build)."""
  if "docs/experiments" not in docnames or nb_execution_mode == "off":
    return
  import shutil
  from analysis.lab import cpu_kind, recheck_build, stored
  folder = os.path.abspath(os.path.join(app.outdir, "..", "recheck"))
  shutil.rmtree(folder, ignore_errors=True)
  emulated = cpu_kind.cap_in_effect("--xla_cpu_max_isa=AVX2") is not None
  _RECHECKS.extend(recheck_build.start(stored.stored_names(), folder, emulated))
  os.environ[recheck_build.ENV] = folder  # the page's kernel inherits it
  docnames.remove("docs/experiments")  # read last (Sphinx lets this event reorder the list in place):
  docnames.append("docs/experiments")  # every other page builds before the page waits for them


def _stop_rechecks(app, exception):
  """A build that ended before the page collected its re-checks leaves none running."""
  from analysis.lab import recheck_build
  recheck_build.stop(_RECHECKS)


def setup(app):
  app.connect("env-before-read-docs", _start_rechecks)
  app.connect("build-finished", _stop_rechecks)
  app.connect("missing-reference", _resolve_reexport)
  app.connect("autodoc-process-docstring", _keep_prose_summaries, priority=400)
  app.connect("build-finished", _copy_mathjax)
  # after sphinx-book-theme's add_launch_buttons (priority 501)
  app.connect("html-page-context", _drop_launch_buttons_outside_notebooks, priority=502)
  app.connect("html-page-context", _merge_index_names)
  return {"parallel_read_safe": True, "parallel_write_safe": True}
