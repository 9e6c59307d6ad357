"""What each config field is, said once on the field: the metadata every field list is read from.

A config field (of :class:`~diloco_core.DiLoCoConfig`, the run config
:class:`~diloco_core.TrainConfig`, :class:`~diloco_core.DataConfig`) is declared with
:func:`field`, which records in ``dataclasses.Field.metadata``:

* ``traced``: ``"int32"`` or ``"float32"`` when the value is a traced input of the compiled
  step (a hyperparameter: runs differing only in it share one program), else None;
* ``program``: the value is compiled into the step (part of the program key);
* ``must_match``: a resumed run must have the checkpoint's value (it fixes the state's
  shapes or the trajectory);
* ``result``: the value can change a number of the run (False for ``out``, ``overwrite``,
  ``progress``: settings of where and how a run is shown, not of what it computes);
* ``flag``, ``help``, ``symbol``, ``group``: how the CLI (:mod:`diloco_core.run.cli`) offers it
  (``flag=None``: no command-line option).

Every list of fields (the traced hyperparameters, the program key, the resume check, the
fields of a cached sweep result, the CLI) is a query over this metadata, so adding a field
means declaring it once.

Examples:
  >>> import dataclasses
  >>> @dataclasses.dataclass(frozen=True)
  ... class Toy:
  ...   lr: float = field(0.1, flag="lr", help="learning rate", symbol="η", traced="float32")
  ...   width: int = field(8, flag="width", help="hidden size", program=True, must_match=True)
  ...   out: str | None = field(None, flag="out", help="output directory", result=False)
  >>> traced_fields(Toy), program_fields(Toy), must_match_fields(Toy), non_result_fields(Toy)
  ({'lr': 'float32'}, ('width',), ('width',), ('out',))
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, NamedTuple

_KEY = "diloco"
#: Nested configs whose fields errors name without the prefix (their names are unique in a run).
FLAT_GROUPS = ("algo", "syncer")
TRACED_DTYPES = ("int32", "float32")


class FieldSpec(NamedTuple):
  """The metadata of one config field (see the module docstring)."""

  flag: str | None = None  # command-line option without the leading dashes; None: none
  help: str = ""
  symbol: str | None = None  # the semantics page's symbol, e.g. "H"
  group: str | None = None  # CLI group title
  traced: str | None = None  # "int32" | "float32" | None
  must_match: bool = False
  program: bool = False
  result: bool = True
  parse: Callable[[str], Any] | None = None  # CLI: text -> value (default: the default's type)


def field(default: Any = dataclasses.MISSING, *, default_factory: Any = dataclasses.MISSING,
          flag: str | None = None, help: str = "", symbol: str | None = None,
          group: str | None = None, traced: str | None = None, must_match: bool = False,
          program: bool = False, result: bool = True, parse: Callable[[str], Any] | None = None):
  """A ``dataclasses.field`` carrying a :class:`FieldSpec` (its metadata).

  Args:
    default: the default value.
    default_factory: or a factory of it (nested configs).
    flag: the command-line option (``"sync-every"`` for ``--sync-every``); None: no option.
    help: one line for ``--help``.
    symbol: the symbol of the semantics page (docs/semantics.md), e.g. ``"H"``.
    group: the ``--help`` group.
    traced: ``"int32"`` / ``"float32"`` for a traced input of the step, else None.
    must_match: a resumed run must have the checkpoint's value.
    program: compiled into the step (part of the program key).
    result: can change a number of the run.
    parse: converts the command-line text (default: the type of ``default``).

  Returns:
    A ``dataclasses.Field``.
  """
  if traced not in (None, *TRACED_DTYPES):
    raise ValueError(f"traced must be None or one of {TRACED_DTYPES}, got {traced!r}.")
  if traced and program:
    raise ValueError("a field is either traced or compiled into the program, not both.")
  spec = FieldSpec(flag, help, symbol, group, traced, must_match, program, result, parse)
  return dataclasses.field(default=default, default_factory=default_factory,
                           metadata={_KEY: spec})


def spec(f: dataclasses.Field) -> FieldSpec:
  """The :class:`FieldSpec` of a dataclass field (an empty one if it was not declared here)."""
  return f.metadata.get(_KEY, FieldSpec())


def option_name(path: str) -> str:
  """How errors name a field: its own name for top-level, outer-loop (``algo.``) and syncer
  (``syncer.``) fields, else its dotted path.

  Args:
    path: the field's dotted path (:func:`walk`).

  Returns:
    The name the library's messages give it (in backticks).

  Examples:
    >>> option_name("algo.sync_every"), option_name("data.seed"), option_name("syncer.quorum")
    ('sync_every', 'data.seed', 'quorum')
  """
  for group in FLAT_GROUPS:
    if path.startswith(group + "."):
      return path[len(group) + 1:]
  return path


def flag_names(cls) -> dict[str, str]:
  """Option name (:func:`option_name`) -> command-line flag, for every field of ``cls`` that has one.

  The one place a flag is made from a field: the ``flag`` of its metadata, with ``--`` before it.

  Args:
    cls: a config class declared with :func:`field` (nested configs included).

  Returns:
    ``{"sync_every": "--sync-every", ...}``, in field order.

  Examples:
    >>> import dataclasses
    >>> @dataclasses.dataclass(frozen=True)
    ... class Toy:
    ...   n_layers: int = field(2, flag="layers", help="blocks")
    ...   seed: int = 0
    >>> flag_names(Toy)
    {'n_layers': '--layers'}
  """
  return {option_name(path): "--" + spec(f).flag for path, f in walk(cls) if spec(f).flag}


def nested_type(f: dataclasses.Field) -> type | None:
  """The config class of a nested config field (``algo``, ``data``), else None."""
  if f.default_factory is dataclasses.MISSING:
    return None
  value = f.default_factory()
  return type(value) if dataclasses.is_dataclass(value) else None


def walk(cls, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field]]:
  """``(dotted path, field)`` of every leaf field of ``cls``, nested configs included, in order.

  Examples:
    >>> from diloco_core.algorithm.config import DiLoCoConfig
    >>> [p for p, _ in walk(DiLoCoConfig)][:3]
    ['algorithm', 'replicas', 'sync_every']
  """
  for f in dataclasses.fields(cls):
    sub = nested_type(f)
    if sub is None:
      yield prefix + f.name, f
    else:
      yield from walk(sub, f"{prefix}{f.name}.")


def traced_fields(cls) -> dict[str, str]:
  """``{name: dtype}`` of the top-level fields of ``cls`` that are traced inputs of the step."""
  return {f.name: spec(f).traced for f in dataclasses.fields(cls) if spec(f).traced}


def traced_values(config) -> dict[str, int | float]:
  """The traced fields of ``config`` as Python ``int`` (int32) or ``float`` (float32) values."""
  cast = {"int32": int, "float32": float}
  return {k: cast[dtype](getattr(config, k)) for k, dtype in traced_fields(type(config)).items()}


def program_fields(cls) -> tuple[str, ...]:
  """The top-level fields of ``cls`` compiled into the step (part of the program key)."""
  return tuple(f.name for f in dataclasses.fields(cls) if spec(f).program)


def must_match_fields(cls) -> tuple[str, ...]:
  """Dotted paths of the fields a resumed run must share with its checkpoint."""
  return tuple(p for p, f in walk(cls) if spec(f).must_match)


def non_result_fields(cls) -> tuple[str, ...]:
  """Top-level fields of ``cls`` that change no number of a run (``out``, ``progress``, ...)."""
  return tuple(f.name for f in dataclasses.fields(cls) if not spec(f).result)


def result_fields(cls) -> tuple[str, ...]:
  """Top-level fields of ``cls`` that can change a number of a run (the complement)."""
  return tuple(f.name for f in dataclasses.fields(cls) if spec(f).result)
