"""What a compiled program needs of a device's memory, and the first of several settings that fits.

XLA knows, once a program is compiled and before it runs, how many bytes its arguments,
outputs and temporaries take (``compiled.memory_analysis()``); :func:`compiled_bytes` reads
them. :func:`first_fit` walks candidate settings (a remat policy, a batch) in the caller's
order of preference: it skips those the memory model rules out
(:func:`diloco_core.spec.activations.step_activation_bytes`), compiles the others one at a
time and keeps the first whose compiled program fits, so a setting that cannot fit costs a
compilation at most and never an out-of-memory error at run time.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

#: The share of a device's ``bytes_limit`` a program may plan to use: XLA's own allocator needs
#: some room beside the program's buffers (fragmentation, the runtime's scratch).
HEADROOM = 0.97
#: A candidate is skipped without compiling when the memory model puts it this many times over
#: the limit: the model is an estimate (XLA may keep more, or fuse away what it counts), so
#: only a clear miss saves the compilation; the compiled count decides the rest.
MODEL_SLACK = 1.25


def device_memory(device=None) -> float | None:
  """The bytes a device lets programs use (``memory_stats()["bytes_limit"]``), None on a CPU."""
  import jax  # here: importing this module does not start JAX

  device = jax.local_devices()[0] if device is None else device
  stats = device.memory_stats() or {}
  return float(stats["bytes_limit"]) if "bytes_limit" in stats else None


def compiled_bytes(compiled) -> dict[str, float]:
  """The memory a compiled program takes while it runs, from XLA's ``memory_analysis()``.

  .. math::
     \\text{peak} = \\text{arguments} + \\text{outputs} - \\text{aliased} + \\text{temporaries}

  (a donated argument aliased to an output is counted once).

  Args:
    compiled: a ``jax.stages.Compiled``.

  Returns:
    ``{"arguments", "outputs", "aliased", "temporaries", "peak"}`` in bytes.

  Examples:
    >>> import jax, jax.numpy as jnp
    >>> c = jax.jit(lambda x: x * 2, donate_argnums=0).lower(jnp.zeros(1024, jnp.float32)).compile()
    >>> b = compiled_bytes(c)
    >>> b["arguments"], b["peak"] >= 4096
    (4096.0, True)
  """
  m = compiled.memory_analysis()
  get = lambda name: float(getattr(m, name, 0) or 0)
  out = {"arguments": get("argument_size_in_bytes"), "outputs": get("output_size_in_bytes"),
         "aliased": get("alias_size_in_bytes"), "temporaries": get("temp_size_in_bytes")}
  out["peak"] = out["arguments"] + out["outputs"] - out["aliased"] + out["temporaries"]
  return out


@dataclasses.dataclass
class Fit:
  """The outcome of :func:`first_fit`: the setting kept (None if none fits) and what was tried."""

  choice: Any
  compiled: Any
  estimate: float | None  # the memory model's bytes for the choice
  measured: dict[str, float] | None  # compiled_bytes of the choice
  tried: list[str]  # one line per candidate: why it was skipped or kept



def first_fit(candidates: Sequence[Any], *, estimate: Callable[[Any], float],
              compile_fn: Callable[[Any], Any], limit: float | None, describe: Callable[[Any], str] = str
              ) -> Fit:
  """The first candidate whose compiled program fits in ``limit`` bytes (``HEADROOM`` of it).

  A candidate whose ``estimate`` exceeds the limit by more than :data:`MODEL_SLACK` is
  skipped without compiling; the others are compiled in turn and their :func:`compiled_bytes`
  peak decides. With no limit (a CPU) the first candidate is kept.

  Args:
    candidates: settings in order of preference.
    estimate: the memory model's bytes for a setting.
    compile_fn: compiles the program of a setting (a ``jax.stages.Compiled``).
    limit: the device's bytes (:func:`device_memory`), or None.
    describe: how a setting is named in the lines of ``Fit.tried``.

  Returns:
    A :class:`Fit`; ``choice`` None when nothing fits.

  Examples:
    >>> class Fake:  # a compiled program that would take n bytes
    ...   def __init__(self, n): self.n = n
    ...   def memory_analysis(self): return type("M", (), {"temp_size_in_bytes": self.n})()
    >>> fit = first_fit([16, 4, 2], estimate=lambda b: b * 10.0, compile_fn=lambda b: Fake(b * 30),
    ...                 limit=100.0, describe=lambda b: f"batch {b}")
    >>> fit.choice, fit.tried
    (2, ['batch 16: model 160 B (not compiled)', 'batch 4: model 40 B, compiled 120 B', 'batch 2: model 20 B, compiled 60 B (kept)'])
  """
  tried = []
  size = lambda b: f"{b / 2**30:.2f} GiB" if b >= 2**26 else f"{b:.0f} B"
  for cand in candidates:
    est = float(estimate(cand))
    if limit is not None and est > MODEL_SLACK * HEADROOM * limit:
      tried.append(f"{describe(cand)}: model {size(est)} (not compiled)")
      continue
    compiled = compile_fn(cand)
    measured = compiled_bytes(compiled)
    if limit is None or measured["peak"] <= HEADROOM * limit:
      tried.append(f"{describe(cand)}: model {size(est)}, compiled {size(measured['peak'])} (kept)")
      return Fit(cand, compiled, est, measured, tried)
    tried.append(f"{describe(cand)}: model {size(est)}, compiled {size(measured['peak'])}")
    del compiled
  return Fit(None, None, None, None, tried)
