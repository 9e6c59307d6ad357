"""A slow link on one machine: a network namespace whose loopback is shaped (``launch --link-mbit``).

:class:`ShapedLink` makes a network namespace whose loopback carries at most R Mbit/s
(``tc qdisc ... tbf``: both directions share the rate) and gives the command prefix that runs
a process inside it; the launcher starts every trainer there. Linux, root and iproute2 only.
The namespace is removed on exit, also on failure; one left by a launcher killed with SIGKILL
is removed by the next one (:func:`remove_stale_links`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

#: The token bucket of a shaped link: burst and queue limit (``tc ... tbf``).
TBF_BURST, TBF_LATENCY = "64kbit", "4000ms"
#: A shaped link's network namespace is this prefix and the launcher's pid.
LINK_PREFIX = "diloco-link-"


class ShapedLink:
  """A network namespace whose loopback carries at most ``mbit`` Mbit/s (a context manager).

  ``prefix`` is the command prefix that runs a program inside it. Needs Linux, root and
  iproute2 (``ip``, ``tc``); otherwise entering it raises a one-line ValueError.
  """

  def __init__(self, mbit: float):
    self.mbit = mbit
    self.name = f"{LINK_PREFIX}{os.getpid()}"
    self.prefix: list[str] = []

  @staticmethod
  def unavailable() -> str | None:
    """None when a shaped link can be made here (it makes one and removes it), else the
    one-line reason entering one would raise."""
    try:
      with ShapedLink(1000.0):
        return None
    except ValueError as e:
      return str(e)

  def __enter__(self) -> "ShapedLink":
    missing = [t for t in ("ip", "tc") if shutil.which(t) is None]
    if not sys.platform.startswith("linux") or missing or os.geteuid() != 0:
      why = ("not Linux" if not sys.platform.startswith("linux") else
             f"{' and '.join(missing)} not found" if missing else "not root")
      raise ValueError(f"--link-mbit needs Linux, root and iproute2 (ip, tc) to shape a network"
                       f" namespace's loopback ({why}); run without --link-mbit, or as root.")
    remove_stale_links()
    rate = f"{self.mbit:g}mbit"
    steps = [["ip", "netns", "add", self.name],
             ["ip", "-n", self.name, "link", "set", "lo", "mtu", "1500"],
             ["ip", "-n", self.name, "link", "set", "lo", "up"],
             ["ip", "netns", "exec", self.name, "tc", "qdisc", "add", "dev", "lo", "root", "tbf",
              "rate", rate, "burst", TBF_BURST, "latency", TBF_LATENCY]]
    for cmd in steps:
      r = subprocess.run(cmd, capture_output=True, text=True)
      if r.returncode != 0:
        self.__exit__(None, None, None)
        raise ValueError(f"--link-mbit: `{' '.join(cmd)}` failed ({r.stderr.strip() or r.returncode});"
                         " the link cannot be shaped here.")
    self.prefix = ["ip", "netns", "exec", self.name]
    return self

  def __exit__(self, *exc) -> None:
    subprocess.run(["ip", "netns", "delete", self.name], capture_output=True)


def remove_stale_links() -> list[str]:
  """Deletes the shaped-link namespaces of launchers that are gone (one killed by SIGKILL could
  not remove its own); returns their names."""
  listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
  stale = [name for name in listed if name.startswith(LINK_PREFIX) and not _alive(name[len(LINK_PREFIX):])]
  for name in stale:
    subprocess.run(["ip", "netns", "delete", name], capture_output=True)
  return stale


def _alive(pid: str) -> bool:
  if not pid.isdigit():
    return True  # not a name this launcher made: leave it
  try:
    os.kill(int(pid), 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    pass
  return True
