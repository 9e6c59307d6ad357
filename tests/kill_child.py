"""The trainer under ``python -m diloco_core.launch --module kill_child``, with one process
killed (SIGKILL, as ``kill -9`` or a lost host would) after a checkpoint.

Process ``KILL_RANK`` (environment; default 1) kills itself ``KILL_AFTER_S`` seconds (default
0.5) after ``<out>/checkpoints/<KILL_AT>`` is finalized (default step 4), first writing the
time to the file ``KILL_STAMP`` (if set); every other process runs the trainer unchanged.
"""

import os
import signal
import sys
import threading
import time


def _kill_later(out: str, step: str, after: float) -> None:
  from diloco_core.checkpoint import finalized_steps
  while int(step) not in finalized_steps(out):
    time.sleep(0.02)
  time.sleep(after)
  stamp = os.environ.get("KILL_STAMP")
  if stamp:
    with open(stamp, "w") as f:
      f.write(repr(time.time()))
  os.kill(os.getpid(), signal.SIGKILL)


def main():
  from diloco_core.cli import main as train_main
  argv = sys.argv[1:]
  if os.environ["JAX_PROCESS_ID"] == os.environ.get("KILL_RANK", "1"):
    out = argv[argv.index("--out") + 1]
    threading.Thread(target=_kill_later, daemon=True,
                     args=(out, os.environ.get("KILL_AT", "4"), float(os.environ.get("KILL_AFTER_S", "0.5")))).start()
  sys.exit(train_main(argv))


if __name__ == "__main__":
  main()
