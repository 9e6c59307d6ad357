"""The trainer under ``python -m diloco_core.launch --module save_kill_child``: process 1 is killed
(SIGKILL) shortly after it starts writing the checkpoint of step 40, while process 0 is in the
same Orbax save (its cross-process barrier then fails). Every other process runs the trainer
unchanged."""

import os
import signal
import sys
import threading
import time

KILL_SAVE_STEP, KILL_DELAY_S = 40, 0.05


def main():
  from diloco_core.store import checkpoint
  from diloco_core.run.cli import main as train_main
  if os.environ["JAX_PROCESS_ID"] == "1":
    save = checkpoint.CheckpointWriter.save

    def save_then_die(self, step, *args, **kwargs):
      if step == KILL_SAVE_STEP:
        threading.Thread(target=lambda: (time.sleep(KILL_DELAY_S), os.kill(os.getpid(), signal.SIGKILL)),
                         daemon=True).start()
      return save(self, step, *args, **kwargs)

    checkpoint.CheckpointWriter.save = save_then_die
  sys.exit(train_main(sys.argv[1:]))


if __name__ == "__main__":
  main()
