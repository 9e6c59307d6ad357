"""The docs build's re-checks as processes (analysis.lab.recheck_build): reports collected, a failed
or unfinished re-check is one error naming it, and a stop leaves none of their processes running."""

import json
import os
import time

import pytest

from analysis.lab import recheck_build


def _ended(folder, kind, status, records=None, err=""):
  (folder / f"{kind}.err").write_text(err)
  if records is not None:
    (folder / f"{kind}.json").write_text(json.dumps(records))
  (folder / f"{kind}.rc").write_text(f"{status}\n")


def test_reports_are_collected_and_a_failure_names_its_re_check(tmp_path):
  row = {"experiment": "h_m", "index": 8, "check": "exact", "max_rel_diff": None, "ok": True}
  _ended(tmp_path, "native", 0, [row])
  assert recheck_build.started(str(tmp_path)) and not recheck_build.started(None)
  got = recheck_build.collect(str(tmp_path), emulated=False)
  assert list(got) == ["native"] and got["native"].to_dict("records")[0]["index"] == 8
  _ended(tmp_path, "avx2", 1, err="Traceback ...\nValueError: h_m: run 8 moved by 3e-05 (allowed 1e-06)")
  with pytest.raises(RuntimeError, match=r"(?s)^the avx2 re-check failed \(exit status 1\): .*run 8 moved by 3e-05"):
    recheck_build.collect(str(tmp_path), emulated=True)


def test_an_unfinished_re_check_times_out_in_one_line(tmp_path):
  (tmp_path / "native.err").write_text("")
  with pytest.raises(RuntimeError, match=r"^the native re-check in .* did not end within 0 s\.$"):
    recheck_build.collect(str(tmp_path), emulated=False, timeout=0.2, poll=0.05)


def test_the_wrapper_records_the_exit_status_and_stop_ends_the_whole_group(tmp_path, monkeypatch):
  """A command that fails leaves its status and error output; a stop kills the wrapper and the
  command it runs (its process group), so no re-check outlives an aborted build."""
  monkeypatch.setattr(recheck_build, "commands", lambda names, emulated: {
      "native": ["sh", "-c", "echo no such experiment >&2; exit 3"]})
  procs = recheck_build.start(["x"], str(tmp_path / "a"), emulated=False)
  procs[0].wait()
  with pytest.raises(RuntimeError, match=r"exit status 3\): no such experiment"):
    recheck_build.collect(str(tmp_path / "a"), emulated=False, timeout=10)
  marker = f"sleep {400 + os.getpid() % 100}.5"
  monkeypatch.setattr(recheck_build, "commands", lambda names, emulated: {"native": ["sh", "-c", marker]})
  procs = recheck_build.start(["x"], str(tmp_path / "b"), emulated=False)
  time.sleep(0.3)
  recheck_build.stop(procs)
  assert procs[0].poll() is not None
  deadline = time.monotonic() + 10  # SIGKILL is delivered at once, but a process takes a moment to end
  while running := [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).endswith(marker.split()[1])]:
    assert time.monotonic() < deadline, running
    time.sleep(0.05)


def test_a_re_check_is_killed_from_another_process_by_its_folder(tmp_path, monkeypatch):
  """The docs build's watchdog kills Sphinx's process group, which does not hold the re-checks
  (each has a group of its own): ``kill_started`` ends them by the group numbers ``start`` wrote
  in their folder, the folder docs/build.py names."""
  import importlib.util
  spec = importlib.util.spec_from_file_location("docs_build", os.path.join(os.path.dirname(__file__), "..", "docs", "build.py"))
  site_build = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(site_build)
  assert site_build.RECHECKS == site_build.HTML.parent / "recheck"  # conf.py: <outdir>/../recheck
  marker = f"sleep {500 + os.getpid() % 100}.5"
  monkeypatch.setattr(recheck_build, "commands", lambda names, emulated: {"native": ["sh", "-c", marker]})
  procs = recheck_build.start(["x"], str(tmp_path), emulated=False)
  time.sleep(0.3)
  assert recheck_build.kill_started(str(tmp_path)) == [procs[0].pid]
  procs[0].wait(10)
  deadline = time.monotonic() + 10
  while running := [p for p in os.listdir("/proc") if p.isdigit() and _cmdline(p).endswith(marker.split()[1])]:
    assert time.monotonic() < deadline, running
    time.sleep(0.05)


def _cmdline(pid: str) -> str:
  try:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
      return f.read().replace(b"\0", b" ").decode(errors="replace").strip()
  except OSError:
    return ""
