"""diloco_core.devices.compile_cache: every process of a run writes JAX's persistent compilation
cache (the launched runs' check: tests/test_launch.py)."""

import jax
from jax._src import compilation_cache, compiler, distributed

from diloco_core.devices.compile_cache import cache_every_process


def test_every_process_writes_the_cache_under_jaxs_own_conditions(monkeypatch):
  """A process other than 0 writes its entry (JAX's own write skips it), unless the program has
  host callbacks or compiled faster than jax_persistent_cache_min_compile_time_secs; process 0
  keeps JAX's own write."""
  assert cache_every_process("/tmp/a-local-folder") and cache_every_process("/tmp/again")  # idempotent
  written = []
  monkeypatch.setattr(compilation_cache, "put_executable_and_time", lambda key, *args: written.append(key))
  before = jax.config.jax_persistent_cache_min_compile_time_secs
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)
  try:
    for pid in (1, 0):
      monkeypatch.setattr(distributed.global_state, "process_id", pid)
      compiler._cache_write(f"slow{pid}", 2.0, "m", None, None, [])
      compiler._cache_write(f"callback{pid}", 2.0, "m", None, None, ["a host callback"])
      compiler._cache_write(f"fast{pid}", 0.5, "m", None, None, [])
  finally:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", before)
  assert written == ["slow1", "slow0"]


def test_a_shared_filesystem_or_no_cache_keeps_jaxs_rule():
  assert not cache_every_process("gs://bucket/cache") and not cache_every_process("") and not cache_every_process(None)
