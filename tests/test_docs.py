"""The docs site: notebook pairs and Colab URLs (fast), and a warning-free build (slow).

The build helper here is shared with ``test_site_browser.py``: one build of ``_build/html``
per session, serialized by a file lock so that pytest-xdist workers never build at once.
"""

from __future__ import annotations

import ast
import fcntl
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
HTML = ROOT / "_build" / "html"
BUILD_CMD = [sys.executable, "-m", "sphinx", "-W", "-n", "--keep-going", "-b", "html", ".", "_build/html"]


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


def build_site(fresh: bool = False) -> subprocess.CompletedProcess | None:
  """Builds the site into _build/html (once per lock holder); returns the process or None.

  ``fresh=True`` rebuilds from a new environment (-E), so every page is read and executed
  again and every warning is seen; otherwise an existing build is reused as it is.
  """
  lock_path = ROOT / "_build" / ".build.lock"
  lock_path.parent.mkdir(exist_ok=True)
  with open(lock_path, "w") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      if not fresh and (HTML / "docs" / "index.html").exists():
        return None
      cmd = BUILD_CMD[:4] + ["-E"] + BUILD_CMD[4:] if fresh else BUILD_CMD
      proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=2400)
      (ROOT / "_build" / "build.log").write_text(proc.stdout + proc.stderr)
      return proc
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
