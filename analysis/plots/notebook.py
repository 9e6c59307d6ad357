"""Showing a notebook's results where it runs: glued in the docs build, displayed elsewhere.

The docs build (MyST-NB) executes every notebook and places values computed in its cells
anywhere on the page through a *glue* name (``{glue:figure}``, ``{glue}``). Users run the
same notebooks in Jupyter, Colab or a script, where the docs' packages are not installed:
:func:`glue` then shows the value in the cell instead, and the notebook runs unchanged.
"""

from __future__ import annotations

from typing import Any


def _myst_glue():
  try:
    from myst_nb import glue as myst_glue
  except ImportError:  # outside the docs build: myst-nb is only in the "docs" extra
    return None
  return myst_glue


def glue(name: str, value: Any, display: bool = True) -> None:
  """Glues ``value`` under ``name`` for the docs build, or shows it where there is no build.

  With MyST-NB importable this is ``myst_nb.glue`` (the value is stored in the cell's
  output under ``name``; the page places it). Without it, ``display=True`` shows the value
  as the cell's output (IPython's ``display``, or ``print`` outside IPython; a figure
  outside IPython is left to the caller) and ``display=False`` does nothing: such values
  only feed the page's prose.

  Args:
    name: the glue key the page refers to.
    value: a figure, a table, a number or a string.
    display: also show the value in the notebook.

  Examples:
    >>> import sys
    >>> sys.modules["myst_nb"] = None  # as in a plain install: myst-nb cannot be imported
    >>> glue("answer", 42)
    42
    >>> glue("answer", 42, display=False)
    >>> del sys.modules["myst_nb"]
  """
  myst_glue = _myst_glue()
  if myst_glue is not None:
    myst_glue(name, value, display=display)
    return
  if not display:
    return
  try:
    from IPython import get_ipython
    from IPython.display import display as show
  except ImportError:
    get_ipython = show = None
  if show is not None and get_ipython() is not None:
    show(value)
  elif not hasattr(value, "savefig"):
    print(value)
