"""The docs site: notebook pairs and Colab URLs (fast), and a warning-free build (slow).

The build helper here is shared with ``test_site_browser.py``: one build of ``_build/html``
per state of the sources (``docs/build.py`` stamps each build with their digest), serialized
by the build's file lock so that pytest-xdist workers, and a ``make docs`` beside them, never
build at once.
"""

from __future__ import annotations

import importlib.util
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


def _by_path(name: str, relative: str):
  """A script of the repository loaded as a module (docs/build.py, notebooks/sync.py)."""
  spec = importlib.util.spec_from_file_location(name, ROOT / relative)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


sync = _by_path("notebook_sync", "notebooks/sync.py")  # the repository's address, written out


def colab_url(name: str) -> str:
  return sync.colab_url(name)


def notebook_names() -> list[str]:
  return sorted({p.stem for p in NOTEBOOKS.glob("*.md")} | {p.stem for p in NOTEBOOKS.glob("*.ipynb")})


site_build = _by_path("site_build", "docs/build.py")  # the one place that builds and stamps the site


def build_site(fresh: bool = False) -> subprocess.CompletedProcess | None:
  """The site in _build/html (``site`` of docs/build.py): waits for a build in progress
  (a ``make docs`` started beside the suite), reuses a build stamped with the sources as they
  are now, else builds it (``fresh``) or reuses an unstamped one."""
  return site_build.site(fresh=fresh)


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
  assert code[0] == sync.install_cell().split("\n", 1)[1].rsplit("\n", 1)[0]
  assert "jax.devices()" in code[1] and "SCALE" in code[1]
  body = "\n".join(code[2:])
  assert "glue(" in body, "figures are placed with glue"
  assert re.search(r"^from (analysis|diloco_core)", body, re.M)


def _run_install_cell(monkeypatch, tmp_path, installed: dict, pip_result: tuple[int, str]):
  """Runs the notebooks' install cell as Colab would: ``google.colab`` imported, diloco_core not
  installed, ``installed`` the runtime's package versions, and ``pip`` a stub that records its
  command and the constraints file it was given, and answers ``pip_result`` (code, stderr)."""
  import importlib.metadata
  import types
  monkeypatch.setitem(sys.modules, "google", types.ModuleType("google"))
  monkeypatch.setitem(sys.modules, "google.colab", types.ModuleType("google.colab"))
  find_spec = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "diloco_core" else find_spec(name, *a))

  def version(name):
    if name not in installed:
      raise importlib.metadata.PackageNotFoundError(name)
    return installed[name]
  monkeypatch.setattr(importlib.metadata, "version", version)
  monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
  calls = []

  def pip(argv, **kwargs):
    constraints = argv[argv.index("-c") + 1] if "-c" in argv else None
    calls.append((argv, pathlib.Path(constraints).read_text().split() if constraints else None))
    return subprocess.CompletedProcess(argv, pip_result[0], "", pip_result[1])
  monkeypatch.setattr(subprocess, "run", pip)
  source = sync.install_cell().split("\n", 1)[1].rsplit("\n", 1)[0]
  exec(compile(source, "install-cell", "exec"), {})
  return calls


def test_the_install_cell_keeps_a_tpu_runtimes_jax(monkeypatch, tmp_path, capsys):
  """On a Colab TPU runtime the cell installs the package with the runtime's jax, jaxlib and
  libtpu as pip constraints (pip may not replace them with a CPU jaxlib); on a runtime without
  libtpu only jax and jaxlib are kept; installed, it says nothing."""
  tpu = {"jax": "0.10.2", "jaxlib": "0.10.2", "libtpu": "0.0.42.1"}
  [(argv, kept)] = _run_install_cell(monkeypatch, tmp_path, tpu, (0, ""))
  assert argv[:4] == [sys.executable, "-m", "pip", "install"] and argv[-1].startswith("diloco-suite @ git+")
  assert kept == ["jax==0.10.2", "jaxlib==0.10.2", "libtpu==0.0.42.1"]
  assert capsys.readouterr().out == ""
  cpu = {"jax": "0.10.2", "jaxlib": "0.10.2"}
  [(_, kept)] = _run_install_cell(monkeypatch, tmp_path, cpu, (0, ""))
  assert kept == ["jax==0.10.2", "jaxlib==0.10.2"]


def test_the_install_cell_says_what_to_do_when_the_runtimes_jax_is_too_old(monkeypatch, tmp_path, capsys):
  """pip refuses (the runtime's JAX is older than the pin): one message naming the runtime's
  versions, the version the suite is tested with and the command that upgrades JAX for the TPU;
  any other failure: the message about the repository."""
  old = {"jax": "0.4.33", "jaxlib": "0.4.33", "libtpu": "0.0.2"}
  conflict = "ERROR: Cannot install diloco-suite because these package versions have conflicting dependencies."
  _run_install_cell(monkeypatch, tmp_path, old, (1, conflict))
  out = capsys.readouterr().out
  jax_pin = sync.pinned_jax()
  assert out.count("\n") == 1 and "jax==0.4.33 jaxlib==0.4.33 libtpu==0.0.2" in out
  assert f"tested with {jax_pin}" in out and f"pip install -U 'jax[tpu]=={jax_pin}'" in out
  _run_install_cell(monkeypatch, tmp_path, old, (1, "ERROR: could not resolve host github.com"))
  out = capsys.readouterr().out
  assert out.startswith("Could not install diloco-suite from") and out.count("\n") == 1


def test_the_repository_address_is_written_from_its_one_setting():
  assert sync.sync(check=True) == [], "run: python notebooks/sync.py"


def test_a_fork_changes_the_setting_and_the_script_writes_it_everywhere(tmp_path):
  pytest.importorskip("jupytext")
  for name in ("pyproject.toml", "requirements.txt", "README.md", "docs/tutorial.md", *[
      f"notebooks/{p.name}" for p in NOTEBOOKS.glob("[0-9][0-9]_*.*")]):
    (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_bytes((ROOT / name).read_bytes())
  toml = tmp_path / "pyproject.toml"
  old = sync.settings()["repository"]
  fork = "https://github.com/someone/diloco-fork"
  toml.write_text(toml.read_text().replace(f'Repository = "{old}"', f'Repository = "{fork}"'))
  stale = sync.sync(tmp_path, check=True)
  assert len(stale) == 2 + 2 * len(notebook_names()), stale  # README, tutorial, both twins of each
  sync.sync(tmp_path)
  assert sync.sync(tmp_path, check=True) == []
  for path in [tmp_path / "README.md", tmp_path / "docs" / "tutorial.md", *(tmp_path / "notebooks").glob("0*")]:
    text = path.read_text()
    assert fork.replace("https://github.com/", "") in text and old not in text, path.name
  assert "git clone https://github.com/someone/diloco-fork && cd diloco-fork" in (tmp_path / "docs" / "tutorial.md").read_text()


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


def test_the_docs_build_and_the_suite_share_one_compilation_cache():
  """The suite's cache is the docs build's (conftest.py reads docs/build.py): after CI's build
  the suite loads the programs the pages compiled. A cache the caller names is kept. Both
  compile CPU code in one piece (the same XLA flags, so the same cache keys)."""
  import doctest  # pylint: disable=import-outside-toplevel
  examples = doctest.testmod(site_build)
  assert examples.attempted >= 4 and examples.failed == 0
  assert site_build.ONE_PIECE_CODEGEN in os.environ["XLA_FLAGS"].split()
  env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT"))}
  show = "import os, conftest; print(os.environ['JAX_COMPILATION_CACHE_DIR'], os.environ.get('JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS', '-'))"
  out = subprocess.run([sys.executable, "-c", show], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
  assert out.stdout.split() == [str(site_build.JAX_CACHE), "0"]
  out = subprocess.run([sys.executable, "-c", show], cwd=ROOT, env=dict(env, JAX_COMPILATION_CACHE_DIR="/tmp/own"),
                       capture_output=True, text=True, check=True)
  assert out.stdout.split() == ["/tmp/own", "-"]


def test_a_request_for_the_site_waits_for_a_build_in_progress(tmp_path, monkeypatch):
  """A site test that asks for the site while `make docs` holds the build lock enters only after
  the build has let it go (then reuses its stamp) instead of starting a second build."""
  import threading
  monkeypatch.setattr(site_build, "OUT", tmp_path)
  monkeypatch.setattr(site_build, "LOCK", tmp_path / ".build.lock")
  order, held, release = [], threading.Event(), threading.Event()

  def building():
    with site_build.exclusive():
      held.set()
      release.wait(30)
      order.append("build stamped")

  def asking():
    with site_build.exclusive():
      order.append("site test enters")

  builder = threading.Thread(target=building)
  builder.start()
  assert held.wait(30)
  asker = threading.Thread(target=asking)
  asker.start()
  asker.join(0.5)
  assert asker.is_alive() and order == []  # it waits on the lock
  release.set()
  asker.join(30)
  builder.join(30)
  assert order == ["build stamped", "site test enters"]


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
