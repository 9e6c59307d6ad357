"""The trainer under ``python -m diloco_core.launch --module late_child``, with one process late.

Process ``LATE_RANK`` (environment; default 1) starts its first step only once every other
process has finished its inner step ``LATE_UNTIL`` (environment; default 5), as a host that is
slower to start would: the others mark that moment with a file in ``LATE_DIR``. With
``communication="background"`` the others take their inner steps meanwhile (no program of
theirs waits for it) until they need its payload. Were one of them to wait for the late
process, the late one would give up waiting after ``LATE_MAX_S`` seconds (default 120) and
the run would end with the order of events that the test refuses.

A file, not a fixed sleep: a loaded machine can take longer than any sleep to compile the
early process's programs, and the test would then measure the machine, not the runtime.
"""

import os
import sys
import time


def main():
  from diloco_core.runtime import background
  from diloco_core.run.cli import main as train_main
  rank, late_rank = os.environ["JAX_PROCESS_ID"], os.environ.get("LATE_RANK", "1")
  until, marks = int(os.environ.get("LATE_UNTIL", "5")), os.environ["LATE_DIR"]
  step = background.Background.step
  if rank == late_rank:
    waiting = [True]

    def late_step(self, *args, **kwargs):
      if waiting:
        waiting.pop()
        deadline = time.monotonic() + float(os.environ.get("LATE_MAX_S", "120"))
        while time.monotonic() < deadline and not any(f.startswith("done-") for f in os.listdir(marks)):
          time.sleep(0.05)
      return step(self, *args, **kwargs)

    background.Background.step = late_step
  else:
    def early_step(self, state, batch, t, *args, **kwargs):
      out = step(self, state, batch, t, *args, **kwargs)
      if t == until:  # the step's compute is recorded as ended: tell the late process
        open(os.path.join(marks, f"done-{rank}"), "w").close()
      return out

    background.Background.step = early_step
  sys.exit(train_main(sys.argv[1:]))


if __name__ == "__main__":
  main()
