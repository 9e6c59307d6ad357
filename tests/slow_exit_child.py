"""The trainer under ``python -m diloco_core.launch --module slow_exit_child``: slow steps, and one
process slow to leave.

Every process sleeps ``STEP_S`` seconds (environment; default 0.15) in each step, so that a
stop request lands in the middle of the run. Process ``SLOW_RANK`` (default 1) waits
``SLOW_EXIT_S`` seconds (default 3) at exit before JAX's own clean-up disconnects it from the
coordination service, as a process still closing its files would: a process 0 that left first
would have taken the service (which it hosts) with it, and that disconnect would abort. In an
elastic run, where a process leaves without that clean-up, process ``SLOW_RANK`` waits
``SLOW_LEAVE_S`` seconds (default 0) between saying it leaves and exiting, as a loaded machine
can hold it there (``diloco_core.devices.processes.LEFT_GRACE_S``). Every process prints what is
left of its data plane as it leaves (``plane_leftovers``).
"""

import atexit
import os
import sys
import time


def main():
  import jax  # noqa: F401  (JAX's clean-up is registered at its import: the handler below runs first)
  from diloco_core.runtime import background
  from diloco_core.run.cli import main as train_main
  step, pause = background.Background.step, float(os.environ.get("STEP_S", "0.15"))

  def slow_step(self, *args, **kwargs):
    time.sleep(pause)
    return step(self, *args, **kwargs)

  background.Background.step = slow_step
  from plane_leftovers import report_at_leave
  report_at_leave()  # prints what is left of the data plane as it leaves
  if os.environ["JAX_PROCESS_ID"] == os.environ.get("SLOW_RANK", "1"):
    atexit.register(time.sleep, float(os.environ.get("SLOW_EXIT_S", "3")))
    from diloco_core.devices import processes
    leave, slow = processes.exit_without_peers, float(os.environ.get("SLOW_LEAVE_S", "0"))

    def slow_leave(code):
      time.sleep(slow)
      leave(code)

    processes.exit_without_peers = slow_leave
  sys.exit(train_main(sys.argv[1:]))


if __name__ == "__main__":
  main()
