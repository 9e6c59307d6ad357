"""The command line of ``python -m diloco_core.train``: parse, join the processes, train, one line.

Its flags, their parser and the rewriting of field names to flags in errors are
:mod:`diloco_core.run.flags` (no JAX), re-exported here. This module, :mod:`diloco_core.run.flags`
and :mod:`diloco_core.compare` are the only ones that speak in flags.
"""

from __future__ import annotations

import signal
import sys
import warnings

from diloco_core import interrupts
from diloco_core.devices.backend import configure_determinism
from diloco_core.runtime.elastic import HEARTBEAT_S as ELASTIC_HEARTBEAT_S
from diloco_core.runtime.membership import process_membership
from diloco_core.devices.processes import (SHUTDOWN_S, elastic_joined, exit_without_peers, initialize_distributed,
                                           leave_elastic, leave_together, lost_process)
from diloco_core.run.flags import (FLAGS, GROUPS, PROCESS_FLAGS, OneDefaultHelpFormatter,  # noqa: F401  (re-exported)
                                   add_options, build_parser, check_launch, command_error, config_from_args,
                                   field_defaults, one_line_errors, to_flags)


def _show_warning(message, category, *args, **kwargs) -> None:
  print(f"warning: {to_flags(' '.join(str(message).split()))}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
  """``python -m diloco_core.train``: one-line errors on stderr and exit code 2 for bad input;
  SIGINT / SIGTERM stop at the next safe point (:mod:`diloco_core.interrupts`), exit 130."""
  with interrupts.deferred():
    try:
      return _main(argv)
    except KeyboardInterrupt:  # before the loop started (imports, set-up), or a second signal
      print("interrupted before the first step; nothing to resume.", file=sys.stderr)
      if "jax" in sys.modules and elastic_joined():  # process 0 (the service's host) last
        leave_elastic(130)
      return 130


def _main(argv: list[str] | None) -> int:
  from diloco_core.run.loop import Interrupted, RunWarning, train
  parser = one_line_errors(build_parser())
  try:
    args = parser.parse_args(argv)
  except SystemExit as e:  # --help (0) or a malformed flag (2, one line above)
    return int(e.code or 0)
  interrupts.check()
  configure_determinism(False if args.nondeterministic else None)  # before JAX starts
  several = elastic = False
  try:
    elastic = bool(getattr(args, "elastic", False))
    several = initialize_distributed(args.coordinator, args.num_processes, args.process_id, args.join_timeout,
                                     describe=to_flags, elastic_heartbeat=ELASTIC_HEARTBEAT_S if elastic else None)
    if several:
      interrupts.forward(signal.SIGTERM)  # Ctrl-C too stops every process at one step (processes.stop_agreed)
    if several and elastic:  # the first agreement at once: a replacement then never holds the others up
      process_membership()
    with warnings.catch_warnings():
      warnings.simplefilter("always", RunWarning)
      warnings.showwarning = _show_warning
      result = train(config_from_args(args))  # train validates the config, once
  except ConnectionError as e:  # another process was lost: its shutdown barrier would never pass
    code = command_error(e)
    if several:
      exit_without_peers(code)
    return code
  except (ValueError, OSError, FloatingPointError) as e:
    lost = lost_process(e) if several else None  # a collective outside the loop (gloo: a ValueError)
    if lost is not None:
      exit_without_peers(command_error(ConnectionError(lost)))
    return leave_together(command_error(e), SHUTDOWN_S) if several else command_error(e)
  except Interrupted as e:
    print(to_flags(str(e)), file=sys.stderr)
    if several and elastic:  # process 0 (the service's host) last: no peer loses the service
      leave_elastic(130)
    return leave_together(130) if several else 130
  s = result.summary
  floor = "n/a" if s["loss_floor"] is None else f"{s['loss_floor']:.4f}"
  aux = "" if s["final_aux_loss"] is None else f" (+ aux {s['final_aux_loss']:.4f} in training)"
  print(f"{s['algorithm']} ({s['compute_dtype']}): final eval loss {s['final_eval_loss']:.4f}{aux} (floor {floor}), "
        f"{s['total_bytes_per_replica'] / 1e6:.2f} MB sent per replica, {s['wall_time_s']:.1f} s")
  if several and elastic:
    leave_elastic(0)
  return leave_together(0) if several else 0
