"""Builds the site once per state of the sources: ``python docs/build.py`` (what `make docs` runs).

The build is Sphinx with warnings as errors, nitpicky references and a fresh environment
(every page and notebook is executed again), into ``_build/html``. Its output goes to the
terminal and to ``_build/build.log``; ``_build/build.stamp`` records the digest of the
sources it was built from and its exit status. The site tests
(``tests/test_docs.py``, ``tests/test_site_browser.py``) reuse a build whose stamp matches
the sources as they are now, and build the site themselves otherwise: CI builds the docs
first and the test suite checks that very build instead of executing every notebook twice.
A build holds ``_build/.build.lock`` from start to stamp, and :func:`site` takes the same lock,
so a test that asks for the site while ``make docs`` is building waits for that build instead
of starting another.

The digest covers every file git tracks or would track (``git ls-files -co
--exclude-standard``; without git, every file outside the ignored folders), by path and
content, so any change to the code, pages or notebooks makes an older build stale.

The pages' kernels and the test suite (``conftest.py``) share one JAX persistent compilation
cache, :data:`JAX_CACHE` (unless the environment names one): runs of the same program on
several pages, in several processes of one page (each process writes its own programs:
``diloco_core.devices.compile_cache``) or in the suite after the build (CI builds the docs
first) compile it once. A cached executable is the one XLA compiled, so no number depends on
it; ``make clean`` empties the cache. Both also compile each program's CPU code in one piece
(:data:`ONE_PIECE_CODEGEN`, :func:`harness_env`).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import pathlib
import signal
import subprocess
import sys
import threading

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "_build"
HTML = OUT / "html"
LOG = OUT / "build.log"
STAMP = OUT / "build.stamp"
#: Where ``conf.py`` starts the experiments page's re-checks (beside the HTML).
RECHECKS = OUT / "recheck"
LOCK = OUT / ".build.lock"
#: JAX's persistent compilation cache of the repository: the docs build, its notebook kernels and
#: the test suite (``conftest.py``) read and write the same programs. (JAX's cache key includes
#: the folder's path, through XLA's autotuning folder inside it: two folders share nothing.)
JAX_CACHE = ROOT / ".cache" / "jax"
COMMAND = ["-m", "sphinx", "-W", "-E", "-n", "--keep-going", "-b", "html", ".", "_build/html"]
# Folders never part of the sources when git is not available (mirrors .gitignore).
_IGNORED = {".git", ".venv", "_build", ".cache", "runs", "build", ".pytest_cache", "__pycache__",
            ".ipynb_checkpoints"}


#: XLA's CPU code generation of a program in one piece, not split into parts compiled on several
#: threads: the build and the suite keep both cores busy with several processes, where the split
#: only adds work. The kernels are the same (the experiments page's re-check is exact under it
#: against runs stored without it), so no number depends on it.
ONE_PIECE_CODEGEN = "--xla_cpu_parallel_codegen_split_count=1"


def harness_env(env: dict[str, str]) -> dict[str, str]:
  """``env`` as the docs build and the test suite run: :func:`compilation_cache_env`, and
  :data:`ONE_PIECE_CODEGEN` added to ``XLA_FLAGS`` (the caller's other flags kept; a split
  count the caller set is left as it is).

  Example::

      >>> harness_env({"XLA_FLAGS": "--xla_cpu_max_isa=AVX2"})["XLA_FLAGS"]
      '--xla_cpu_max_isa=AVX2 --xla_cpu_parallel_codegen_split_count=1'
      >>> harness_env({"XLA_FLAGS": "--xla_cpu_parallel_codegen_split_count=4"})["XLA_FLAGS"]
      '--xla_cpu_parallel_codegen_split_count=4'
  """
  env = compilation_cache_env(env)
  flags = env.get("XLA_FLAGS", "")
  if "xla_cpu_parallel_codegen_split_count" not in flags:
    env["XLA_FLAGS"] = f"{flags} {ONE_PIECE_CODEGEN}".strip()
  return env


def compilation_cache_env(env: dict[str, str]) -> dict[str, str]:
  """``env`` with JAX's persistent compilation cache in :data:`JAX_CACHE`, every program written
  however fast it compiled, unless ``env`` names a cache of its own.

  Example::

      >>> compilation_cache_env({})["JAX_COMPILATION_CACHE_DIR"] == str(JAX_CACHE)
      True
      >>> compilation_cache_env({"JAX_COMPILATION_CACHE_DIR": "/tmp/c"})
      {'JAX_COMPILATION_CACHE_DIR': '/tmp/c'}
  """
  if "JAX_COMPILATION_CACHE_DIR" in env:
    return dict(env)
  return dict(env, JAX_COMPILATION_CACHE_DIR=str(JAX_CACHE), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")


def source_files(root: pathlib.Path = ROOT) -> list[str]:
  """The repository's files (relative paths, sorted) that a build reads or could read."""
  try:
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root,
                         capture_output=True, check=True).stdout.decode()
    names = [n for n in out.split("\0") if n]
  except (OSError, subprocess.CalledProcessError):
    names = []
    for dirpath, dirnames, filenames in os.walk(root):
      dirnames[:] = [d for d in dirnames if d not in _IGNORED and not d.endswith(".egg-info")]
      names += [os.path.relpath(os.path.join(dirpath, f), root) for f in filenames]
  return sorted(n for n in names if (root / n).is_file())


def source_digest(root: pathlib.Path = ROOT) -> str:
  """SHA-256 over the paths and contents of :func:`source_files`."""
  h = hashlib.sha256()
  for name in source_files(root):
    h.update(name.encode() + b"\0")
    h.update(hashlib.sha256((root / name).read_bytes()).digest())
  return h.hexdigest()


@contextlib.contextmanager
def exclusive():
  """Holds the build lock (``_build/.build.lock``): one build, or one decision to reuse a build,
  at a time, across processes (``make docs`` beside the suite's xdist workers)."""
  OUT.mkdir(exist_ok=True)
  with open(LOCK, "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    try:
      yield
    finally:
      fcntl.flock(lock, fcntl.LOCK_UN)


def build(echo: bool = False, timeout: float | None = None) -> subprocess.CompletedProcess:
  """Builds the site from scratch, holding the build lock; writes the log and the stamp.

  Args:
    echo: also copy Sphinx's output to this process's stdout as it comes.
    timeout: seconds before the build is killed (``subprocess.TimeoutExpired``).

  Returns:
    The finished process, its combined output in ``stdout``.
  """
  with exclusive():
    return _build(echo, timeout)


def site(fresh: bool = False, timeout: float | None = 5400) -> subprocess.CompletedProcess | None:
  """The site in ``_build/html``, built at most once per state of the sources.

  Waits for a build in progress (the lock), then reuses a build stamped with the digest of the
  sources as they are now (its process is returned from its log). Otherwise ``fresh=True``
  builds the site from scratch and ``fresh=False`` reuses whatever ``_build/html`` holds
  (returning None), building only when there is none.

  Args:
    fresh: build unless the stamp matches the sources.
    timeout: seconds before a build started here is killed.

  Returns:
    The build's process, or None when an unstamped ``_build/html`` was reused.
  """
  with exclusive():
    current = current_build()
    if current is not None:
      return current
    if not fresh and (HTML / "docs" / "index.html").exists():
      return None
    return _build(timeout=timeout)


def _build(echo: bool = False, timeout: float | None = None) -> subprocess.CompletedProcess:
  """:func:`build` without the lock (the caller holds it)."""
  STAMP.unlink(missing_ok=True)
  digest = source_digest()
  cmd = [sys.executable] + COMMAND
  env = harness_env(os.environ)  # inside the suite, conftest.py has set the same
  lines = []
  with subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                        text=True, start_new_session=True, env=env) as proc:
    expired = threading.Event()

    def kill():  # the whole group: Sphinx and the notebook kernels it started, and the re-checks
      expired.set()
      os.killpg(proc.pid, signal.SIGKILL)
      kill_rechecks()

    watchdog = threading.Timer(timeout, kill) if timeout else None
    if watchdog:
      watchdog.start()
    try:
      for line in proc.stdout:
        lines.append(line)
        if echo:
          sys.stdout.write(line)
          sys.stdout.flush()
      rc = proc.wait()
    except BaseException:
      os.killpg(proc.pid, signal.SIGKILL)
      kill_rechecks()
      raise
    finally:
      if watchdog:
        watchdog.cancel()
  out = "".join(lines)
  LOG.write_text(out)
  if expired.is_set():
    raise subprocess.TimeoutExpired(cmd, timeout, output=out)
  STAMP.write_text(json.dumps({"digest": digest, "returncode": rc}))
  return subprocess.CompletedProcess(cmd, rc, out, "")


def kill_rechecks() -> list[int]:
  """Kills the experiments page's re-checks (their own process groups, which a kill of Sphinx's
  group does not reach: ``analysis.lab.recheck_build``, started by ``conf.py`` in
  :data:`RECHECKS`); the groups it found."""
  if str(ROOT) not in sys.path:  # run as `python docs/build.py`: the repository importable
    sys.path.insert(0, str(ROOT))
  from analysis.lab import recheck_build  # pylint: disable=import-outside-toplevel
  return recheck_build.kill_started(str(RECHECKS))


def current_build() -> subprocess.CompletedProcess | None:
  """The last build as a finished process, if it was built from the sources as they are now."""
  try:
    stamp = json.loads(STAMP.read_text())
    log = LOG.read_text()
  except (OSError, ValueError):
    return None
  if stamp.get("digest") != source_digest() or not (HTML / "docs" / "index.html").exists():
    return None
  return subprocess.CompletedProcess([sys.executable] + COMMAND, stamp["returncode"], log, "")


if __name__ == "__main__":
  sys.exit(build(echo=True).returncode)
