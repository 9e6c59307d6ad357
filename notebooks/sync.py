"""Writes the repository's address where users meet it: ``python notebooks/sync.py``.

The address is one project setting, ``[project.urls] Repository`` in ``pyproject.toml``, with
the branch the notebooks open from in ``[tool.diloco-suite]``. The docs build reads it
(``conf.py``: the site's repository and launch buttons); this script writes it into

* every notebook's Colab badge and install cell (the MyST twin ``notebooks/NN_*.md``, then
  its ``.ipynb`` twin through jupytext; the cell also names the JAX version ``requirements.txt``
  pins, in the message it prints when a runtime's JAX is too old),
* the tutorial's clone command (``docs/tutorial.md``) and the README's install line.

``python notebooks/sync.py --check`` changes nothing and exits 1 naming what is out of date
(the test suite runs it). A fork changes the setting and runs the script once.
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
COLAB_URL = "https://colab.research.google.com"

BADGE = re.compile(r"\[!\[Open In Colab\]\([^)]*\)\]\([^)]*\)")
# The first code cell of a MyST notebook (the install cell).
FIRST_CELL = re.compile(r"```\{code-cell\} ipython3\n.*?\n```", re.S)
CLONE = re.compile(r"git clone \S+ && cd \S+")
README_INSTALL = re.compile(r'pip install "diloco-suite @ git\+[^"]*"')

INSTALL_CELL = '''```{{code-cell}} ipython3
# This notebook needs the diloco-suite package. On Colab it is installed from the repository,
# keeping the runtime's own JAX, jaxlib and libtpu (a TPU runtime's JAX must not be replaced).
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tempfile

REPOSITORY = "{repository}"
if importlib.util.find_spec("diloco_core") is None:
  if "google.colab" in sys.modules:
    keep = []  # the runtime's versions, as pip constraints
    for name in ("jax", "jaxlib", "libtpu"):
      try:
        keep.append(f"{{name}}=={{importlib.metadata.version(name)}}")
      except importlib.metadata.PackageNotFoundError:
        pass
    constraints = os.path.join(tempfile.gettempdir(), "runtime-jax.txt")
    with open(constraints, "w") as f:
      f.write("\\n".join(keep) + "\\n")
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-c", constraints,
                          f"diloco-suite @ git+{{REPOSITORY}}"], capture_output=True, text=True)
    if pip.returncode and "conflict" in pip.stdout + pip.stderr:
      print(f"This runtime's {{' '.join(keep)}} cannot run diloco-suite (it needs jax>={jax}, tested "
            "with {jax}): upgrade the runtime's JAX with its accelerator support (on a TPU: "
            "pip install -U 'jax[tpu]=={jax}'), restart the runtime and run this notebook again.")
    elif pip.returncode:
      print(f"Could not install diloco-suite from {{REPOSITORY}} (no network, or a private fork?): "
            "set REPOSITORY to a repository this runtime can reach, or upload a wheel built "
            "with `pip wheel .` in a clone and `pip install` it, then run this notebook again.")
  else:
    print("diloco-suite is not installed in this kernel: `pip install .` in a clone (or "
          f"`pip install 'diloco-suite @ git+{{REPOSITORY}}'`), then restart the kernel.")
```'''


def pinned_jax(root: pathlib.Path = ROOT) -> str:
  """The JAX version ``requirements.txt`` pins (the one the suite is tested with)."""
  found = re.search(r"^jax==(\S+)$", (root / "requirements.txt").read_text(), re.M)
  if not found:
    raise ValueError(f"{root / 'requirements.txt'}: no 'jax==VERSION' line")
  return found.group(1)


def install_cell(root: pathlib.Path = ROOT) -> str:
  """The notebooks' install cell, with the repository's address and the pinned JAX written in."""
  return INSTALL_CELL.format(repository=settings(root)["repository"], jax=pinned_jax(root))


def settings(root: pathlib.Path = ROOT) -> dict[str, str]:
  """The repository address and branch, read from ``pyproject.toml``."""
  project = tomllib.loads((root / "pyproject.toml").read_text())
  return {"repository": project["project"]["urls"]["Repository"],
          "branch": project["tool"]["diloco-suite"]["branch"]}


def colab_url(name: str, root: pathlib.Path = ROOT) -> str:
  """Where Colab opens notebook ``name`` (its ``.ipynb`` twin on the branch)."""
  s = settings(root)
  repo = s["repository"].removeprefix("https://github.com/")
  return f"{COLAB_URL}/github/{repo}/blob/{s['branch']}/notebooks/{name}.ipynb"


def notebook_text(text: str, name: str, root: pathlib.Path = ROOT) -> str:
  """A notebook's MyST text with its badge and install cell as the settings say."""
  badge = f"[![Open In Colab]({COLAB_URL}/assets/colab-badge.svg)]({colab_url(name, root)})"
  if not BADGE.search(text) or not FIRST_CELL.search(text):
    raise ValueError(f"{name}.md: no Colab badge or no first code cell to rewrite")
  text = BADGE.sub(lambda _: badge, text, count=1)
  cell = install_cell(root)
  return FIRST_CELL.sub(lambda _: cell, text, count=1)


def _cells(nb) -> list[tuple[str, str]]:
  return [(c.cell_type, c.source.strip()) for c in nb.cells]


def _write_ipynb(md_text: str, ipynb: pathlib.Path) -> None:
  import jupytext
  nb = jupytext.reads(md_text, fmt="md:myst")
  old = jupytext.read(ipynb).cells if ipynb.exists() else []
  for i, cell in enumerate(nb.cells):
    if i < len(old) and old[i].cell_type == cell.cell_type and "id" in old[i]:
      cell.id = old[i].id  # the same cell keeps its id: the diff shows only what changed
    if cell.cell_type == "code":
      cell.outputs, cell.execution_count = [], None
  jupytext.write(nb, ipynb)


def planned_texts(root: pathlib.Path = ROOT) -> dict[pathlib.Path, str]:
  """Every text file this script manages, as it should read."""
  s = settings(root)
  out = {}
  for md in sorted((root / "notebooks").glob("[0-9][0-9]_*.md")):
    out[md] = notebook_text(md.read_text(), md.stem, root)
  name = s["repository"].rstrip("/").rsplit("/", 1)[-1]
  tutorial = root / "docs" / "tutorial.md"
  out[tutorial] = CLONE.sub(f"git clone {s['repository']} && cd {name}", tutorial.read_text())
  readme = root / "README.md"
  out[readme] = README_INSTALL.sub(f'pip install "diloco-suite @ git+{s["repository"]}"',
                                   readme.read_text())
  return out


def sync(root: pathlib.Path = ROOT, check: bool = False) -> list[str]:
  """Rewrites what is out of date (nothing with ``check``); returns the files that were."""
  stale = []
  planned = planned_texts(root)
  for path, text in planned.items():
    if path.read_text() != text:
      stale.append(str(path.relative_to(root)))
      if not check:
        path.write_text(text)
  import jupytext
  for path, text in planned.items():
    if path.suffix == ".md" and path.parent.name == "notebooks":
      ipynb = path.with_suffix(".ipynb")
      if not ipynb.exists() or _cells(jupytext.reads(text, fmt="md:myst")) != _cells(jupytext.read(ipynb)):
        stale.append(str(ipynb.relative_to(root)))
        if not check:
          _write_ipynb(text, ipynb)
  return stale


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if out of date")
  args = parser.parse_args(argv)
  stale = sync(check=args.check)
  verb = "out of date" if args.check else "rewritten"
  for name in stale:
    print(f"{verb}: {name}")
  if args.check and stale:
    print("run: python notebooks/sync.py", file=sys.stderr)
    return 1
  return 0


if __name__ == "__main__":
  sys.exit(main())
