"""The trainer under ``python -m diloco_core.launch --module late_child``, with one process late.

Process ``LATE_RANK`` (environment; default 1) sleeps ``LATE_S`` seconds (default 8) before
its first step, as a host that is slower to start would; every other process runs the trainer
unchanged. With ``communication="background"`` the others take their inner steps meanwhile
(no program of theirs waits for it) until they need its payload.
"""

import os
import sys
import time


def main():
  from diloco_core.runtime import background
  from diloco_core.run.cli import main as train_main
  if os.environ["JAX_PROCESS_ID"] == os.environ.get("LATE_RANK", "1"):
    step, late = background.Background.step, [float(os.environ.get("LATE_S", "8"))]

    def late_step(self, *args, **kwargs):
      if late:
        time.sleep(late.pop())
      return step(self, *args, **kwargs)

    background.Background.step = late_step
  sys.exit(train_main(sys.argv[1:]))


if __name__ == "__main__":
  main()
