"""Public names that load on first use: a package's re-exports without importing their modules.

``diloco_core`` and ``analysis`` re-export names from modules that pull in JAX. With
:func:`lazy_exports` (PEP 562's module ``__getattr__``) a name's module is imported when the
name is first used, so ``import diloco_core.spec.validity`` or ``import analysis`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Callable


def lazy_exports(package: str, table: dict[str, str], namespace: dict,
                 modules: dict[str, str] | None = None) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
  """The ``__getattr__`` and ``__dir__`` of a package whose names load on first use.

  Args:
    package: the package's name (for the error message).
    table: each public name -> the module that defines it.
    namespace: the package's ``globals()``; a loaded name is cached there.
    modules: names that stand for whole modules (a short name -> the module's path).

  Returns:
    ``(__getattr__, __dir__)`` to assign in the package's ``__init__``. A name not in
    ``table`` is looked up as a submodule of ``package``.

  Examples:
    >>> ns = {}
    >>> getattr_, dir_ = lazy_exports("pkg", {"sqrt": "math"}, ns)
    >>> getattr_("sqrt")(9.0), "sqrt" in ns, dir_()
    (3.0, True, ['sqrt'])
    >>> getattr_("cbrt")
    Traceback (most recent call last):
    ...
    AttributeError: module 'pkg' has no attribute 'cbrt'
    >>> import diloco_core
    >>> diloco_core.spec.wire_formats.SCALE_BITS  # a submodule loads on first use too
    32
  """
  def __getattr__(name: str):
    module = table.get(name)
    if module is not None:
      value = getattr(importlib.import_module(module), name)
    elif modules and name in modules:
      value = importlib.import_module(modules[name])
    else:  # a submodule, as after an eager import of the package (``diloco_core.algorithm.fragments``)
      try:
        value = importlib.import_module(f"{package}.{name}")
      except ModuleNotFoundError as e:
        if not f"{package}.{name}".startswith(e.name or "?"):  # a missing import inside it
          raise
        raise AttributeError(f"module {package!r} has no attribute {name!r}") from None
    namespace[name] = value
    return value

  def __dir__() -> list[str]:
    return sorted(set(namespace) | set(table) | set(modules or ()))

  return __getattr__, __dir__
