"""How the ``python -m analysis`` commands name options in their errors: as the flags typed.

The library's checks name an option by its argument (``link_gbps must be ...``) or, the
trainer's, in backticks (`` `topk` ``); the command line shows ``--link-gbps`` and ``--topk``.
No flag is made from a name here: a name becomes the flag its parser declared for it
(:func:`option_flags`, argparse's own record), else the trainer's flag of the field of that
name (the field metadata, :data:`diloco_core.run.flags.FLAGS`, read only when needed: it loads the
trainer's config modules).
"""

from __future__ import annotations

import argparse
import re


def as_flags(message: str, options: dict[str, str]) -> str:
  """A library message with option names as the flags typed.

  Backticked names (the trainer's checks: `` `topk` ``) become the command's flag of that
  argument, else the trainer's flag of that field, else the bare name; a leading argument name
  (the planning checks: ``link_gbps must be ...``) becomes the command's flag when it has one.

  Args:
    message: a one-line library message.
    options: the command's flags by argument name (:func:`option_flags`).

  Returns:
    The message, with the flags.

  Examples:
    >>> as_flags("link_gbps must be a finite number > 0, got 0.0.", {"link_gbps": "--link-gbps"})
    '--link-gbps must be a finite number > 0, got 0.0.'
    >>> as_flags("`topk_chunk` needs `topk`; grid must be positive", {"topk": "--topk", "topk_chunk": "--topk-chunk"})
    '--topk-chunk needs --topk; grid must be positive'
    >>> as_flags("lower `n_layers` or `nothing`", {})  # the trainer's flag, from its field metadata
    'lower --layers or nothing'
  """

  def backticked(m: re.Match) -> str:
    name = m.group(1)
    if name in options:
      return options[name]
    from diloco_core.run.flags import FLAGS  # the trainer's flags (its config modules): only when needed
    return FLAGS.get(name, name)

  message = re.sub(r"`([A-Za-z_][\w.]*)`", backticked, message)
  return re.sub(r"^([a-z][a-z_]*)(?=[\s:=(])", lambda m: options.get(m.group(1), m.group(1)), message)


def option_flags(parser: argparse.ArgumentParser) -> dict[str, str]:
  """Argument name (argparse's ``dest``) -> its long flag, for ``parser`` and its sub-commands.

  Args:
    parser: a command line.

  Returns:
    ``{"link_gbps": "--link-gbps", ...}``.

  Examples:
    >>> p = argparse.ArgumentParser()
    >>> _ = p.add_subparsers().add_parser("plan").add_argument("--link-gbps", type=float)
    >>> option_flags(p)["link_gbps"]
    '--link-gbps'
  """
  found = {}
  for action in parser._actions:
    long = [s for s in action.option_strings if s.startswith("--")]
    if long:
      found.setdefault(action.dest, long[0])
    choices = getattr(action, "choices", None)
    for sub in choices.values() if isinstance(choices, dict) else ():
      if isinstance(sub, argparse.ArgumentParser):
        for dest, flag in option_flags(sub).items():
          found.setdefault(dest, flag)
  return found
