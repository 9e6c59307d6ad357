"""The local launcher: N processes, stopped together, the worst exit code, a shaped link."""

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from diloco_core import launch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = os.path.dirname(os.path.abspath(__file__))
ENV = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join([ROOT, TESTS]))


def run_launcher(*args, timeout=240):
  return subprocess.run([sys.executable, "-m", "diloco_core.launch", *args], env=ENV,
                        capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("argv,message", [
    (["--processes", "0"], "--processes must be an integer >= 1, got 0."),
    (["--link-mbit", "0"], "--link-mbit must be a rate > 0 (Mbit/s), got 0."),
    (["--devices-per-process", "0"], "--devices-per-process must be an integer >= 1, got 0."),
    (["--", "--num-processes", "4"], "--num-processes is set by the launcher for each process"),
    (["--", "--coordinator=h:1"], "--coordinator is set by the launcher for each process"),
])
def test_bad_launcher_options_one_line(argv, message, capsys):
  assert launch.main(argv) == 2
  err = capsys.readouterr().err
  assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


def test_a_failing_process_stops_the_others_and_sets_the_exit_code():
  start = time.monotonic()
  r = run_launcher("--processes", "3", "--module", "launch_child", "--", "fail1")
  assert r.returncode == 3, r.stderr
  assert time.monotonic() - start < 60  # process 0 and 2 waited 600 s: they were stopped
  assert "[process 1] error: process 1 failed on purpose" in r.stderr
  assert "launch: process 1 of 3 exited with 3; the others were stopped." in r.stderr
  assert "child 0 stopped" in r.stdout  # process 0's output is shown (SIGTERM reached it)


def test_a_stop_request_stops_every_process_with_130():
  p = subprocess.Popen([sys.executable, "-m", "diloco_core.launch", "--processes", "2", "--module",
                        "launch_child", "--", "wait"], env=ENV, stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, text=True)
  assert p.stdout.readline().startswith("child 0 of 2")  # process 0's output, shown as it comes
  time.sleep(2)  # process 1 started too
  p.send_signal(signal.SIGINT)
  out, err = p.communicate(timeout=60)
  assert p.returncode == 130, err
  assert "child 0 stopped" in out  # the trainer gets SIGTERM: it stops at its next step
  assert "launch: stopped on request; every process ended (130, " in err


@pytest.mark.slow
def test_two_launched_processes_are_the_two_device_run(tmp_path):
  """M = 2, one replica per process: the same metrics as one process with two devices."""
  args = ["--model", "tiny", "--replicas", "2", "--sync-every", "4", "--steps", "8", "--batch-size", "2",
          "--seq-len", "8", "--eval-every", "4", "--log-every", "2", "--warmup-steps", "1",
          "--no-progress", "--mesh", "diloco=2,data=1"]
  env1 = dict(ENV, XLA_FLAGS="--xla_force_host_platform_device_count=2")
  one = subprocess.run([sys.executable, "-m", "diloco_core.train", *args, "--out", str(tmp_path / "one")],
                       env=env1, capture_output=True, text=True, timeout=300)
  assert one.returncode == 0, one.stderr[-2000:]
  two = run_launcher("--processes", "2", "--devices-per-process", "1", "--", *args,
                     "--out", str(tmp_path / "two"), timeout=300)
  assert two.returncode == 0, two.stderr[-2000:] + two.stdout[-2000:]
  assert "final eval loss" in two.stdout  # process 0's result line is shown
  a = [json.loads(l) for l in open(tmp_path / "one" / "metrics.jsonl")]
  b = [json.loads(l) for l in open(tmp_path / "two" / "metrics.jsonl")]
  assert len(a) == len(b) >= 4
  for x, y in zip(a, b):
    np.testing.assert_allclose(x["replica_loss"], y["replica_loss"], rtol=1e-6)


def _can_shape() -> str | None:
  if not sys.platform.startswith("linux") or os.geteuid() != 0:
    return "needs Linux and root"
  if shutil.which("ip") is None or shutil.which("tc") is None:
    return "needs iproute2 (ip, tc)"
  probe = subprocess.run(["ip", "netns", "add", "diloco-probe"], capture_output=True, text=True)
  subprocess.run(["ip", "netns", "delete", "diloco-probe"], capture_output=True)
  return None if probe.returncode == 0 else f"network namespaces unavailable ({probe.stderr.strip()})"


def test_a_shaped_link_runs_every_process_in_a_namespace_and_removes_it():
  why = _can_shape()
  if why is not None:
    pytest.skip(why)
  r = run_launcher("--processes", "2", "--link-mbit", "50", "--module", "launch_child", "--", "netns")
  assert r.returncode == 0, r.stderr
  name = f"diloco-link-"  # the launcher's pid follows
  assert name in r.stdout and "tbf" in r.stdout and "rate 50Mbit" in r.stdout, r.stdout
  left = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
  assert "diloco-link-" not in left


def test_shaping_without_root_says_what_is_needed(monkeypatch, capsys):
  monkeypatch.setattr(os, "geteuid", lambda: 1000)
  assert launch.main(["--link-mbit", "50", "--", "--steps", "1"]) == 2
  err = capsys.readouterr().err
  assert err == ("error: --link-mbit needs Linux, root and iproute2 (ip, tc) to shape a network"
                 " namespace's loopback (not root); run without --link-mbit, or as root.\n")
