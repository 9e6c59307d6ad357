"""How the ``python -m analysis`` commands name options in their errors: as the flags typed.

The library's checks name an option by its argument (``link_gbps must be ...``) or, the
trainer's, in backticks (`` `topk` ``); the command line shows ``--link-gbps`` and ``--topk``.
"""

from __future__ import annotations

import argparse
import re


def as_flags(message: str, options: set[str]) -> str:
  """A library message with option names as the flags typed: the trainer's checks name options
  in backticks (`` `topk` `` -> ``--topk``); the planning checks start with the argument's
  name (``link_gbps must be ...`` -> ``--link-gbps must be ...``), rewritten when that flag exists.

  Examples:
    >>> as_flags("link_gbps must be a finite number > 0, got 0.0.", {"--link-gbps"})
    '--link-gbps must be a finite number > 0, got 0.0.'
    >>> as_flags("`topk` needs `compression`; grid must be positive", {"--grid-x"})
    '--topk needs --compression; grid must be positive'
  """
  message = re.sub(r"`([a-z_]+)`", lambda m: "--" + m.group(1).replace("_", "-"), message)
  flag = lambda m: ("--" + m.group(1).replace("_", "-")) if "--" + m.group(1).replace("_", "-") in options else m.group(1)
  return re.sub(r"^([a-z][a-z_]*)(?=[\s:=(])", flag, message)


def option_strings(parser: argparse.ArgumentParser) -> set[str]:
  """Every flag of ``parser`` and of its sub-commands."""
  found = set()
  for action in parser._actions:
    found.update(action.option_strings)
    choices = getattr(action, "choices", None)
    for sub in choices.values() if isinstance(choices, dict) else ():
      if isinstance(sub, argparse.ArgumentParser):
        found |= option_strings(sub)
  return found
