"""The docs site: notebook pairs and Colab URLs (fast), and a warning-free build (slow).

The build helper here is shared with ``test_site_browser.py``: one build of ``_build/html``
per state of the sources (``docs/build.py`` stamps each build with their digest), serialized
by a file lock so that pytest-xdist workers never build at once.
"""

from __future__ import annotations

import ast
import fcntl
import importlib.util
import json
import pathlib
import re
import subprocess

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
HTML = ROOT / "_build" / "html"


def conf_constant(name: str) -> str:
  """A string constant of conf.py, read without executing conf.py."""
  tree = ast.parse((ROOT / "conf.py").read_text())
  for node in tree.body:
    if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
      return ast.literal_eval(node.value)
  raise KeyError(name)


def colab_url(name: str) -> str:
  repo = conf_constant("REPOSITORY_URL").removeprefix("https://github.com/")
  return (f"{conf_constant('COLAB_URL')}/github/{repo}/blob/"
          f"{conf_constant('REPOSITORY_BRANCH')}/notebooks/{name}.ipynb")


def notebook_names() -> list[str]:
  return sorted({p.stem for p in NOTEBOOKS.glob("*.md")} | {p.stem for p in NOTEBOOKS.glob("*.ipynb")})


def _site_build():
  """docs/build.py, the one place that builds the site and stamps it (loaded by path)."""
  spec = importlib.util.spec_from_file_location("site_build", ROOT / "docs" / "build.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


site_build = _site_build()


def build_site(fresh: bool = False) -> subprocess.CompletedProcess | None:
  """The site in _build/html, built at most once per state of the sources; returns the build.

  A build stamped with the digest of the sources as they are now (`make docs`, which CI
  runs first, or an earlier call here) is reused: its process is returned from its log.
  Otherwise ``fresh=True`` builds the site from scratch (every page executed, every warning
  seen) and ``fresh=False`` reuses whatever ``_build/html`` holds, building only when there
  is none. A file lock serializes pytest-xdist workers.
  """
  lock_path = ROOT / "_build" / ".build.lock"
  lock_path.parent.mkdir(exist_ok=True)
  with open(lock_path, "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      current = site_build.current_build()
      if current is not None:
        return current
      if not fresh and (HTML / "docs" / "index.html").exists():
        return None
      return site_build.build(timeout=5400)
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


# ---- notebooks: pairs, badges, structure (fast) -----------------------------------------------
def test_there_are_six_notebooks():
  assert len(notebook_names()) == 6


@pytest.mark.parametrize("name", notebook_names())
def test_notebook_has_both_twins_declared_as_a_pair(name):
  md, ipynb = NOTEBOOKS / f"{name}.md", NOTEBOOKS / f"{name}.ipynb"
  assert md.exists(), f"{md.name} is missing (jupytext --sync notebooks/{name}.ipynb)"
  assert ipynb.exists(), f"{ipynb.name} is missing (jupytext --sync notebooks/{name}.md)"
  assert re.search(r"^  formats: ipynb,md:myst$", md.read_text(), re.M)
  meta = json.loads(ipynb.read_text())["metadata"]
  assert meta["jupytext"]["formats"] == "ipynb,md:myst"


@pytest.mark.parametrize("name", notebook_names())
def test_twins_hold_the_same_cells(name):
  jupytext = pytest.importorskip("jupytext")
  md = jupytext.read(NOTEBOOKS / f"{name}.md")
  nb = jupytext.read(NOTEBOOKS / f"{name}.ipynb")
  cells = lambda n: [(c.cell_type, c.source.strip()) for c in n.cells]
  assert cells(md) == cells(nb), f"run: jupytext --sync notebooks/{name}.md"


@pytest.mark.parametrize("name", notebook_names())
def test_ipynb_outputs_are_stripped(name):
  nb = json.loads((NOTEBOOKS / f"{name}.ipynb").read_text())
  for cell in nb["cells"]:
    if cell["cell_type"] == "code":
      assert cell["outputs"] == [] and cell["execution_count"] is None


@pytest.mark.parametrize("name", notebook_names())
def test_colab_badge_points_at_this_notebook(name):
  url = colab_url(name)
  for path in (NOTEBOOKS / f"{name}.md", NOTEBOOKS / f"{name}.ipynb"):
    text = path.read_text()
    found = re.findall(r"https://colab\.research\.google\.com/github/[^)\s\"\\]+", text)
    assert found == [url], f"{path.name}: Colab links {found}, expected [{url}]"


@pytest.mark.parametrize("name", notebook_names())
def test_notebook_starts_with_title_badge_install_and_devices(name):
  jupytext = pytest.importorskip("jupytext")
  nb = jupytext.read(NOTEBOOKS / f"{name}.md")
  first = nb.cells[0]
  assert first.cell_type == "markdown" and first.source.startswith("# ")
  assert "colab-badge.svg" in first.source
  code = [c.source for c in nb.cells if c.cell_type == "code"]
  assert 'IN_COLAB = "google.colab" in sys.modules' in code[0] and "if IN_COLAB:" in code[0]
  assert f"git+{conf_constant('REPOSITORY_URL')}" in code[0], "install from the repository in conf.py"
  assert "jax.devices()" in code[1] and "SCALE" in code[1]
  body = "\n".join(code[2:])
  assert "glue(" in body, "figures are placed with glue"
  assert re.search(r"^from (analysis|diloco_core)", body, re.M)


def test_every_notebook_is_in_the_toctree():
  index = (ROOT / "docs" / "index.md").read_text()
  for name in notebook_names():
    assert f"../notebooks/{name}" in index


def test_conf_excludes_the_ipynb_twins_and_sets_execution():
  text = (ROOT / "conf.py").read_text()
  assert '"notebooks/*.ipynb"' in text
  assert 'nb_execution_mode = "force"' in text and "nb_execution_raise_on_error = True" in text
  assert '"myst_nb"' in text and '"myst_parser"' not in text


# ---- the build stamp (fast) ------------------------------------------------------------------
def test_source_digest_follows_contents_and_skips_build_outputs(tmp_path):
  (tmp_path / "docs").mkdir()
  (tmp_path / "docs" / "a.md").write_text("x")
  first = site_build.source_digest(tmp_path)
  for ignored in ("_build", ".cache", "runs"):
    (tmp_path / ignored).mkdir()
    (tmp_path / ignored / "out.txt").write_text("built")
  assert site_build.source_digest(tmp_path) == first  # outputs of a build are not sources
  (tmp_path / "docs" / "a.md").write_text("y")
  assert site_build.source_digest(tmp_path) != first
  (tmp_path / "docs" / "a.md").write_text("x")
  (tmp_path / "docs" / "b.md").write_text("")
  assert site_build.source_digest(tmp_path) != first  # a new (even empty) file counts


# ---- the build (slow) ------------------------------------------------------------------------
@pytest.mark.slow
def test_docs_build_has_no_warnings():
  proc = build_site(fresh=True)
  out = proc.stdout + proc.stderr
  warnings = [l for l in out.splitlines() if "WARNING" in l and "IPKernelApp" not in l]
  assert proc.returncode == 0 and not warnings, "\n".join(warnings[:40]) or out[-4000:]
  for name in notebook_names():
    page = HTML / "notebooks" / f"{name}.html"
    assert page.exists()
    assert colab_url(name) in page.read_text(), f"{name}: no Colab launch button to its .ipynb"
  for page in (HTML / "docs").glob("*.html"):
    assert "colab.research.google.com" not in page.read_text(), f"{page.name}: Colab button on a doc page"
