"""A stand-in for the trainer under ``python -m diloco_core.launch --module launch_child``.

Its first argument says what to do: ``fail1`` (process 1 exits with 3, the others wait to be
stopped), ``netns`` (print the network namespace and the loopback's qdisc), ``wait`` (every
process waits to be stopped, printing a line when it is: how SIGTERM reaches the trainer).
"""

import os
import signal
import subprocess
import sys
import time


def main():
  mode, rank = sys.argv[1], int(os.environ["JAX_PROCESS_ID"])
  print(f"child {rank} of {os.environ['JAX_NUM_PROCESSES']} at {os.environ['JAX_COORDINATOR_ADDRESS']}", flush=True)
  if mode == "netns":
    for cmd in (["ip", "netns", "identify", str(os.getpid())], ["tc", "qdisc", "show", "dev", "lo"]):
      print(subprocess.run(cmd, capture_output=True, text=True).stdout.strip(), flush=True)
    sys.exit(0)
  if mode == "fail1" and rank == 1:
    time.sleep(0.5)
    print("error: process 1 failed on purpose", flush=True)
    sys.exit(3)
  signal.signal(signal.SIGTERM, lambda *_: (print(f"child {rank} stopped", flush=True), sys.exit(130)))
  time.sleep(600)


if __name__ == "__main__":
  main()
