"""The trainer's flags: the parser built from the config fields, the flag names, the launch check.

The parser is built from the config fields' metadata (:mod:`diloco_core.spec.fields`: flag,
help, symbol, group, default), so every option of :class:`~diloco_core.TrainConfig`,
:class:`~diloco_core.DiLoCoConfig` and :class:`~diloco_core.DataConfig` that has a flag is
offered, with its default, and parsed back into the same field.

Library errors name options by their field in backticks (`` `out` ``, `` `inner_lr` ``,
`` `data.seed` ``); :func:`to_flags` rewrites those to the flags (``--out``, ``--inner-lr``,
``--data-seed``) before an error is printed. This module loads no JAX, so the launcher reads
the trainer's flags and refuses a bad command line (:func:`check_launch`) before anything
starts, and ``python -m diloco_core.launch --help`` answers at once; the trainer's command
itself is :mod:`diloco_core.run.cli`.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys

from diloco_core.spec.fields import flag_names, option_name, spec, walk
from diloco_core.devices.process_options import JOIN_TIMEOUT_S, check_process_options
from diloco_core.run.config import TrainConfig


#: The ``--help`` groups, in order (a field's metadata names its group).
GROUPS = {
    "algorithm": "algorithm (symbols as on the semantics page, docs/semantics.md)",
    "syncer": ("syncer rule (in-step, any of these plays a tape: P = 1, τ = 0, diloco_core.runtime.tape_player;"
               " background: --quorum with --elastic, --grace-s, --step-delay act on the real processes)"),
    "model": "model and inner optimizer",
    "data": "data",
    "run": "run",
    "checkpoints": "checkpoints and failures",
    "devices": "devices and processes",
}


#: The process options of multi-process runs: arguments of initialize_distributed, not config fields.
PROCESS_FLAGS = {"coordinator": "--coordinator", "num_processes": "--num-processes",
                 "process_id": "--process-id"}
#: Every flag of ``python -m diloco_core.train`` by the name errors give it (the launcher and the
#: ``python -m analysis`` messages read the trainer's flags here).
FLAGS = {**flag_names(TrainConfig), **PROCESS_FLAGS, "join_timeout": "--join-timeout"}


def to_flags(message: str, cls=TrainConfig) -> str:
  """Rewrites the backticked field names of a library message to the flags of ``cls``'s fields.

  Examples:
    >>> to_flags("resume needs `out`: the directory of the run to continue.")
    '--resume needs --out: the directory of the run to continue.'
    >>> to_flags("written with n_layers=None but this run has n_layers=4 (`n_layers`); lower `inner_lr`")
    'written with n_layers=None but this run has n_layers=4 (--layers); lower --inner-lr'
    >>> to_flags("`data.seed` and `progress` and `unknown`")
    '--data-seed and --no-progress and unknown'
    >>> to_flags("DataConfig.workers must be an integer >= 0; DataConfig.order too")
    '--data-workers must be an integer >= 0; --data-order too'
    >>> to_flags("outer_momentum (μ) must be a finite number in [0, 1), got 2.0.")  # a check's leading name
    '--outer-momentum (μ) must be a finite number in [0, 1), got 2.0.'
  """
  table = FLAGS if cls is TrainConfig else flag_names(cls)
  message = re.sub(r"`([A-Za-z_][\w.]*)`", lambda m: table.get(m.group(1), m.group(1)), message)
  # The checks of diloco_core.spec.validity start with the bare name: "replicas (M) must be ...".
  message = re.sub(r"^([A-Za-z_][\w.]*)(?=[\s:=])", lambda m: table.get(m.group(1), m.group(1)), message)
  # DataConfig's own checks name its fields as DataConfig.<name> (it is also used on its own).
  return re.sub(r"\bDataConfig\.(\w+)", lambda m: table.get("data." + m.group(1), m.group(0)), message)


class OneDefaultHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
  """``--help`` with each option's default said once: argparse's ``(default: X)``, unless the
  option's own help already says its default (``(default: every live replica)``).

  Examples:
    >>> p = argparse.ArgumentParser(formatter_class=OneDefaultHelpFormatter)
    >>> _ = p.add_argument("--k", default=None, help="K (default: every replica)")
    >>> _ = p.add_argument("--h", default=4, help="H")
    >>> " ".join(p.format_help().split()).count("(default:")
    2
  """

  def _get_help_string(self, action):
    text = action.help or ""
    return text if "(default:" in text else super()._get_help_string(action)


def _get(config, path: str):
  for name in path.split("."):
    config = getattr(config, name)
  return config


def _add_option(group, path: str, f: dataclasses.Field, default) -> None:
  s = spec(f)
  text = (f"{s.symbol}: {s.help}" if s.symbol else s.help).replace("%", "%%")
  if isinstance(default, bool):  # a switch: --resume sets True, --no-progress sets False
    if default:
      text += f" (without it: {option_name(path)}=%(default)s)"  # not "--no-progress (default: True)"
    group.add_argument("--" + s.flag, dest=path, action="store_false" if default else "store_true",
                       default=default, help=text)
    return
  typed = default if default is not None else f.default  # a None default keeps the field's type
  kind = s.parse or (type(typed) if typed not in (None, dataclasses.MISSING) else str)
  if kind not in (int, float, str):  # parsed after argparse, so its error is a one-line ValueError
    kind, default = str, None
  group.add_argument("--" + s.flag, dest=path, type=kind, default=default, help=text,
                     metavar=s.flag.upper().replace("-", "_"))


def add_options(parser: argparse.ArgumentParser, cls, defaults: dict, only=None) -> None:
  """Adds the flag of every field of ``cls`` (or of the paths in ``only``) to its ``--help`` group."""
  groups = {name: parser.add_argument_group(title) for name, title in GROUPS.items()}
  for path, f in walk(cls):
    if spec(f).flag and (only is None or path in only):
      _add_option(groups[spec(f).group or "run"], path, f, defaults[path])


def field_defaults(config) -> dict:
  """Every field path of ``config`` with its value (a parser's defaults)."""
  return {path: _get(config, path) for path, _ in walk(type(config))}


def build_parser(defaults: TrainConfig | None = None) -> argparse.ArgumentParser:
  """The parser of ``python -m diloco_core.train``.

  Args:
    defaults: the config whose values are the defaults, and whose class's fields are the
      options (default: ``TrainConfig()``).
  """
  defaults = TrainConfig() if defaults is None else defaults
  p = argparse.ArgumentParser(
      prog="python -m diloco_core.train",
      description="Train the built-in transformer with DP, DiLoCo or Streaming DiLoCo.",
      formatter_class=OneDefaultHelpFormatter,
      allow_abbrev=False)  # an abbreviated flag (--num-proc) must not reach around a check
  add_options(p, type(defaults), field_defaults(defaults))
  g = [a for a in p._action_groups if a.title == GROUPS["devices"]][0]
  g.add_argument("--coordinator", default=None, help="multi-process: host:port of process 0 (or JAX_COORDINATOR_ADDRESS)")
  g.add_argument("--num-processes", type=int, default=None, help="multi-process: number of processes (or JAX_NUM_PROCESSES)")
  g.add_argument("--process-id", type=int, default=None, help="multi-process: this process's id (or JAX_PROCESS_ID)")
  g.add_argument("--join-timeout", type=float, default=JOIN_TIMEOUT_S, metavar="SECONDS",
                 help="multi-process: seconds to wait for every process to join, then one error line and exit 2")
  return p


def config_from_args(args: argparse.Namespace, base: TrainConfig | None = None) -> TrainConfig:
  """The :class:`~diloco_core.run.config.TrainConfig` of parsed arguments: ``base`` (default: the defaults) with every
  option that the parser offers set from ``args``."""
  base = TrainConfig() if base is None else base
  values: dict[str, dict] = {"": {}, "algo": {}, "data": {}, "syncer": {}}
  for path, f in walk(type(base)):
    if not hasattr(args, path):
      continue
    value = getattr(args, path)
    parse = spec(f).parse
    if parse not in (None, int, float, str):
      value = _get(base, path) if value is None else parse(value)
    group, _, name = path.rpartition(".")
    values[group][name] = value
  nested = {g: dataclasses.replace(getattr(base, g), **values[g]) for g in ("algo", "data", "syncer")}
  return dataclasses.replace(base, **nested, **values[""])


def check_launch(argv: list[str], processes: int, devices_per_process: int | None = None) -> None:
  """The trainer's refusal of ``argv`` over ``processes`` processes, said before any starts.

  The launcher (:mod:`diloco_core.launch`) calls it: a flag the trainer does not know, a value
  its config refuses (:meth:`~diloco_core.run.config.TrainConfig.validate`) and what the process
  count cannot hold (:func:`~diloco_core.run.preflight.check_processes`) are one line, instead of
  the same line from every process after each one started. A command for one host of a
  multi-host run carries the process options: they are checked as the trainer checks them
  (:func:`~diloco_core.devices.process_options.check_process_options`), and ``--num-processes`` must
  be ``processes``.

  Args:
    argv: the trainer's flags.
    processes: how many processes will run them.
    devices_per_process: each process's devices, when the launcher sets them (else the mesh is
      checked against the devices by each process).

  Returns:
    None; raises a one-line ``ValueError`` in the flags' words.

  Examples:
    >>> check_launch(["--model", "tiny", "--coord", "h:1"], 2)
    Traceback (most recent call last):
    ...
    ValueError: unrecognized arguments: --coord h:1 (see python -m diloco_core.train --help).
    >>> check_launch(["--model", "tiny", "--replicas", "2", "--communication", "background"], 2)
    >>> check_launch(["--model", "tiny", "--communication", "background", "--coordinator", "host0:1234",
    ...               "--num-processes", "2", "--process-id", "2"], 2)
    Traceback (most recent call last):
    ...
    ValueError: --process-id must be in [0, --num-processes=2), got 2.
  """
  from diloco_core.run.preflight import check_processes
  if any(x in ("-h", "--help") for x in argv):  # the trainer prints its help
    return
  parser = build_parser()

  def refuse(message: str):
    raise ValueError(f"{message} (see python -m diloco_core.train --help).")

  parser.error = refuse
  try:
    args = parser.parse_args(argv)
    if check_process_options(args.coordinator, args.num_processes, args.process_id) and args.num_processes != processes:
      raise ValueError(f"`num_processes` ({args.num_processes}) is not the number of processes that run"
                       f" this command ({processes}).")
    cfg = config_from_args(args)
    cfg.validate()
    check_processes(cfg, processes, None if devices_per_process is None else processes * devices_per_process)
  except ValueError as e:
    raise ValueError(to_flags(" ".join(str(e).split()))) from None


def command_error(e: Exception) -> int:
  """Prints a library error as the command line's one ``error:`` line (field names as flags); 2."""
  print(f"error: {to_flags(' '.join(str(e).split()))}", file=sys.stderr)
  return 2


def one_line_errors(parser: argparse.ArgumentParser, note: str = "") -> argparse.ArgumentParser:
  """Makes ``parser`` report a malformed command line in one ``error:`` line, exit 2."""
  parser.error = lambda message: parser.exit(2, f"error: {message}{note} (see --help).\n")
  return parser
