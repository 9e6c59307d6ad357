r"""JAX's persistent compilation cache in a run of several processes: every process writes its own
programs' entries.

JAX writes cache entries from process 0 only, against write contention on a shared filesystem
(GCS). But a program's cache key names the devices it runs on, and in the runs of this project
every process compiles programs for its own devices (the background runtime's inner step,
send and settle, the model's initialization): their keys are the process's own, and nobody
else would write them. Left to JAX's rule, processes :math:`1, \dots, N-1` compile every
program afresh in every launch while process 0 loads its own from the cache (in a tiny
three-process run, compiling is most of a launch's time). A cached executable is the one XLA
compiled, so no number depends on it.

A program that spans the processes (the in-step runtime's mesh over processes) has one key on
all of them; they compile it together and then each writes the same bytes to the same file. No
process of that run reads it meanwhile (they have all just missed it); a run started at that
very moment that read a half-written file would warn and compile (JAX's read catches it).

:func:`cache_every_process` lifts the rule when the cache is a local folder (no ``scheme://``);
on a shared filesystem JAX's rule stays. :func:`diloco_core.devices.processes.initialize_distributed`
calls it once ``jax.distributed`` is up. It wraps JAX's private ``jax._src.compiler._cache_write``
(JAX is pinned in ``requirements.txt``); where that function is not there, it changes nothing
and says so in its answer.

Examples:
  >>> cache_every_process("")  # no persistent cache: nothing to write
  False
  >>> cache_every_process("gs://bucket/jax-cache")  # a shared filesystem: JAX's rule stays
  False
"""

from __future__ import annotations

import threading
import warnings

_LOCK = threading.Lock()
#: Whether :func:`cache_every_process` already wrapped JAX's cache write in this process.
_wrapped = False


def is_local_folder(cache_dir: str | None) -> bool:
  """Whether ``cache_dir`` names a folder on this machine's filesystem (not ``gs://...`` and alike).

  Examples:
    >>> is_local_folder("/tmp/jax-cache"), is_local_folder("gs://b/c"), is_local_folder(None)
    (True, False, False)
  """
  return bool(cache_dir) and "://" not in cache_dir


def cache_every_process(cache_dir: str | None) -> bool:
  """Lets every process write JAX's persistent compilation cache, when ``cache_dir`` is local.

  A process other than 0 then writes the entries it compiled, under the same conditions JAX
  applies to process 0 (no host callbacks, at least ``jax_persistent_cache_min_compile_time_secs``
  of compile time). Idempotent.

  Args:
    cache_dir: the persistent cache's folder (``jax.config.jax_compilation_cache_dir``).

  Returns:
    True when every process now writes the cache (also when an earlier call arranged it);
    False when ``cache_dir`` is empty or not a local folder, or when the installed JAX has no
    ``_cache_write`` to wrap.
  """
  global _wrapped  # pylint: disable=global-statement
  if not is_local_folder(cache_dir):
    return False
  from jax._src import compilation_cache, compiler, config, distributed  # pylint: disable=import-outside-toplevel
  with _LOCK:
    if _wrapped:
      return True
    write = getattr(compiler, "_cache_write", None)
    if write is None or not hasattr(compiler, "_should_raise_persistent_cache_error"):
      return False

    def cache_write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks):
      if (distributed.global_state.process_id in (None, 0) or host_callbacks
          or compile_time_secs < config.persistent_cache_min_compile_time_secs.value):
        return write(cache_key, compile_time_secs, module_name, backend, executable, host_callbacks)
      try:  # as JAX's own write: a failed write warns (or raises where JAX is told to)
        compilation_cache.put_executable_and_time(cache_key, module_name, executable, backend,
                                                  int(compile_time_secs))
      except Exception as ex:  # noqa: BLE001
        if compiler._should_raise_persistent_cache_error(ex):  # pylint: disable=protected-access
          raise
        warnings.warn(f"Error writing persistent compilation cache entry for '{module_name}':"
                      f" {type(ex).__name__}: {ex}")
      return None

    compiler._cache_write = cache_write  # pylint: disable=protected-access
    _wrapped = True
  return True
