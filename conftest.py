"""Shared test setup, set before JAX initializes, and skips for runs on one accelerator.

- 8 fake CPU devices (``JAX_PLATFORMS=cpu`` unless the caller picks a platform).
- The model computes in float32 (``DILOCO_COMPUTE_DTYPE``) on every backend, so exact-number
  tests mean the same on a GPU; bfloat16 is tested on purpose (tests/test_precision.py).
- JAX's persistent compilation cache in ``.cache/jax`` (unless the caller names one), the
  one the docs build uses (``docs/build.py``'s ``JAX_CACHE``): the suite loads the programs
  the pages compiled (CI builds the docs first), and its many subprocess runs (CLI, launcher,
  kill and resume tests) and both xdist workers compile each program once (in a launched run,
  every process writes its own programs: ``diloco_core.devices.compile_cache``). A cached
  executable is the one XLA compiled, so no number depends on it; a test that must compile
  afresh removes the two variables from its subprocess's environment
  (tests/test_checkpoint.py). ``make clean`` removes the cache. XLA compiles each program's
  CPU code in one piece, as the docs build does (``docs/build.py``'s ``harness_env``: the same
  kernels, less work when both cores are busy).
- Every "bit for bit" a test asserts compares two computations on the machine that runs the
  suite, i.e. on one kind of CPU; across kinds of CPU (another model or instruction set,
  ``--xla_cpu_max_isa``) numbers round differently, and the docs' implementation page lists
  what is equal where. The suite passes under ``XLA_FLAGS=--xla_cpu_max_isa=AVX2`` too; tests
  that start subprocesses keep that flag (``tests/tiny_run.xla_flags``).
- ``@pytest.mark.needs_cpu_devices(n)``: the test needs n devices (a mesh of n, as the 8 fake
  CPU devices give). With fewer, e.g. ``JAX_PLATFORMS=cuda`` on one GPU, it is skipped and
  the reason says so. Doctests that need devices are listed in ``_DOCTESTS_NEEDING_DEVICES``.
"""

import importlib.util
import os

import pytest

os.environ.setdefault("JAX_PLATFORMS", "cpu")
_flags = os.environ.get("XLA_FLAGS", "")
if "xla_force_host_platform_device_count" not in _flags:
  os.environ["XLA_FLAGS"] = (_flags + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("DILOCO_COMPUTE_DTYPE", "float32")
_spec = importlib.util.spec_from_file_location(
    "docs_build", os.path.join(os.path.dirname(os.path.abspath(__file__)), "docs", "build.py"))
_docs_build = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_docs_build)
os.environ.update(_docs_build.harness_env(os.environ))

_DOCTESTS_NEEDING_DEVICES = {"diloco_core.devices.mesh.make_mesh": 8}

#: Test files whose tests share an expensive module fixture (launched multi-process runs, the
#: background pairs, the stored toy experiment): under ``pytest -n`` each file runs in one
#: worker, as a module fixture used in two workers is set up in both. (pytest-xdist's
#: ``--dist loadgroup`` with ``xdist_group`` marks would say this per test, but with pytest 9.2
#: it silently stops grouping: pytest-xdist issue 1386.)
ONE_WORKER_FILES = ("tests/test_launch.py", "tests/test_background.py", "tests/test_stored.py",
                    "tests/test_installed.py", "tests/test_membership.py", "tests/test_elastic.py",
                    "tests/test_quorum.py")
#: Files that launch several processes (3 at once, timing their heartbeats and joins): one unit
#: together, so that two of them never load the machine at the same time.
PROCESS_FILES = ("tests/test_launch.py", "tests/test_membership.py", "tests/test_elastic.py", "tests/test_quorum.py")


class _Scheduling:
  """pytest-xdist's scheduler hook, registered only when xdist is loaded (``-p no:xdist``, or a
  machine without it, runs the suite in one process: ``make test-tpu``)."""

  @staticmethod
  def pytest_xdist_make_scheduler(config, log):
    """``-n`` with the default ``--dist load``: every test its own unit of work, handed to the
    next free worker, except the files of :data:`ONE_WORKER_FILES`, each one unit."""
    if config.getoption("dist") != "load":
      return None
    from xdist.scheduler import LoadScopeScheduling  # pylint: disable=import-outside-toplevel

    class FilesTogether(LoadScopeScheduling):
      def _split_scope(self, nodeid: str) -> str:
        path = nodeid.split("::", 1)[0]
        if path in PROCESS_FILES:
          return "processes"
        return path if path in ONE_WORKER_FILES else nodeid

    return FilesTogether(config, log)


#: The accelerator lane (``make test-tpu``): the files whose tests say something about the
#: backend they run on (semantics and reference numbers, bf16 compute, remat and the fused
#: loss, Muon, the wire formats, in-process resume), run in one process on the device JAX finds.
ACCELERATOR_FILES = ("tests/test_diloco.py", "tests/test_model.py",
                     "tests/test_precision.py", "tests/test_optimizers.py", "tests/test_compression.py",
                     "tests/test_wire_packing.py", "tests/test_eager.py", "tests/test_hyperparams.py",
                     "tests/test_replica_loop.py", "tests/test_fit.py", "tests/test_checkpoint.py")


def pytest_addoption(parser):
  parser.addoption("--accelerator-lane", action="store_true",
                   help="collect only the files of conftest.ACCELERATOR_FILES (make test-tpu)")


def pytest_ignore_collect(collection_path, config):
  """Under ``--accelerator-lane``, test files outside :data:`ACCELERATOR_FILES` are not collected."""
  if not config.getoption("--accelerator-lane") or collection_path.suffix != ".py":
    return None
  rel = os.path.relpath(str(collection_path), os.path.dirname(os.path.abspath(__file__)))
  if rel.startswith("tests" + os.sep) and os.path.basename(rel).startswith("test_"):
    return rel.replace(os.sep, "/") not in ACCELERATOR_FILES
  return None


def pytest_configure(config):
  if config.pluginmanager.hasplugin("xdist"):
    config.pluginmanager.register(_Scheduling(), "diloco-scheduling")
  config.addinivalue_line(
      "markers", "needs_cpu_devices(n): needs n devices (8 fake CPU devices); skipped with the"
      " reason when fewer are available, e.g. JAX_PLATFORMS=cuda on one GPU")
  config.addinivalue_line(
      "markers", "cpu_only(why): holds on a CPU only; skipped on an accelerator with the reason")


#: Tests that check the built site: collected last, so that a ``make docs`` started beside the
#: suite has the most time to finish first (they wait for a build in progress:
#: ``docs/build.py``'s lock).
SITE_TESTS = ("tests/test_site_browser.py::", "tests/test_docs.py::test_docs_build_has_no_warnings")


def pytest_collection_modifyitems(config, items):
  items.sort(key=lambda item: item.nodeid.startswith(SITE_TESTS))  # stable: the rest keep their order
  needs, cpu_only = [], []
  for item in items:
    if item.get_closest_marker("cpu_only"):
      cpu_only.append(item)
    marker = item.get_closest_marker("needs_cpu_devices")
    n = marker.args[0] if marker else _DOCTESTS_NEEDING_DEVICES.get(item.name)
    if n:
      needs.append((item, n))
  if not needs and not cpu_only:
    return
  import jax  # pylint: disable=import-outside-toplevel
  count, platform = jax.device_count(), jax.default_backend()
  if platform != "cpu":
    for item in cpu_only:
      item.add_marker(pytest.mark.skip(reason=f"on {platform}: {item.get_closest_marker('cpu_only').args[0]}"))
  for item, n in needs:
    if count < n:
      item.add_marker(pytest.mark.skip(reason=(
          f"needs {n} devices, this run has {count} {platform} device(s); run it on CPU"
          " (JAX_PLATFORMS=cpu, 8 fake devices)")))
