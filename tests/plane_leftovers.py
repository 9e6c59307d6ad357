"""What of the elastic data plane is left in a process (tests): ZeroMQ's native threads and the
plane's receiving thread, and a hook that prints them as a trainer child leaves.

``report_at_leave()`` wraps ``diloco_core.run.cli.leave_elastic`` so that an elastic run's
process writes ``{"zmq_threads": n, "plane_threads": n}`` to ``$PLANE_LEFTOVERS/<process>.json``
(when that variable names a folder) right before it leaves, after the run (or a stop request)
closed its runtime: both must be 0.
"""

import json
import os
import threading


def leftovers() -> dict:
  """ZeroMQ's native threads (libzmq names them ``ZMQbg/...``) and the data plane's Python threads."""
  names = []
  for task in os.listdir("/proc/self/task"):
    try:
      with open(f"/proc/self/task/{task}/comm") as f:
        names.append(f.read().strip())
    except OSError:  # a thread that ended meanwhile
      pass
  return {"zmq_threads": sum(n.startswith("ZMQbg") for n in names),
          "plane_threads": sum(t.name == "diloco-plane" for t in threading.enumerate())}


def report_at_leave() -> None:
  from diloco_core.run import cli
  leave = cli.leave_elastic

  def report_then_leave(code):
    folder = os.environ.get("PLANE_LEFTOVERS")
    if folder:
      os.makedirs(folder, exist_ok=True)
      with open(os.path.join(folder, f"{os.environ['JAX_PROCESS_ID']}.json"), "w") as f:
        json.dump(leftovers(), f)
    leave(code)

  cli.leave_elastic = report_then_leave
