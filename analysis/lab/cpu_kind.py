"""The kind of CPU a run was computed on: the fingerprint that tells when two CPUs give the same bits.

XLA's CPU backend compiles for the instruction sets of the host (or fewer, under
``--xla_cpu_max_isa``), and kernels compiled for other sets round differently: a CPU run is
bit-reproducible on one kind of CPU, not across kinds. :func:`cpu_fingerprint` names the kind
(the model and the instruction sets XLA may use), :func:`max_isa` reads the cap. The stored
experiments record it (:mod:`analysis.lab.stored`) and their re-check uses it
(:mod:`analysis.lab.recheck`).
"""

from __future__ import annotations

import os
import pathlib
import platform
import re

from diloco_core.spec.validity import check_choice

#: The CPU flags that change what XLA's CPU backend compiles (its instruction sets), each with
#: the lowest ``--xla_cpu_max_isa`` level that lets XLA use it (the ladder of XLA's
#: ``cpu_features``: SSE4_2 < AVX < AVX2 < AVX512 < AVX512_VNNI < AVX512_BF16 < AMX).
ISA_LEVELS = ("SSE4_2", "AVX", "AVX2", "AVX512", "AVX512_VNNI", "AVX512_BF16", "AMX", "AMX_FP16")
ISA_FLAGS = {"sse4_2": "SSE4_2", "avx": "AVX", "avx2": "AVX2", "fma": "AVX2", "f16c": "AVX2",
             "avx_vnni": "AVX512_VNNI", "avx512f": "AVX512", "avx512dq": "AVX512",
             "avx512bw": "AVX512", "avx512vl": "AVX512", "avx512_vnni": "AVX512_VNNI",
             "avx512_bf16": "AVX512_BF16", "avx512_fp16": "AMX_FP16", "amx_tile": "AMX",
             "amx_bf16": "AMX", "amx_int8": "AMX"}


def max_isa(xla_flags: str | None = None) -> str | None:
  """The instruction-set cap XLA is told to compile for (``--xla_cpu_max_isa``), or None.

  Args:
    xla_flags: the flags to read (default: ``$XLA_FLAGS``).

  Examples:
    >>> max_isa("--xla_force_host_platform_device_count=8 --xla_cpu_max_isa=avx2")
    'AVX2'
    >>> max_isa("") is None
    True
  """
  flags = os.environ.get("XLA_FLAGS", "") if xla_flags is None else xla_flags
  found = re.findall(r"--xla_cpu_max_isa=(\S+)", flags)
  return found[-1].upper() if found else None


def _host_flags() -> set[str] | None:
  try:
    info = pathlib.Path("/proc/cpuinfo").read_text()
  except OSError:
    return None
  line = next((l for l in info.splitlines() if l.startswith("flags")), "")
  return set(line.split(":", 1)[-1].split())


def cap_in_effect(xla_flags: str | None = None) -> str | None:
  """The ``--xla_cpu_max_isa`` cap (:func:`max_isa`) if it hides an instruction set this CPU has
  (an emulation of an older CPU), else None: on a real AVX2 machine ``AVX2`` changes nothing.

  Examples:
    >>> cap_in_effect("") is None
    True
  """
  cap = max_isa(xla_flags)
  flags = _host_flags()
  if cap is None or flags is None:
    return cap
  check_choice("--xla_cpu_max_isa", cap, ISA_LEVELS)
  top = ISA_LEVELS.index(cap)
  return cap if any(ISA_LEVELS.index(ISA_FLAGS[f]) > top for f in flags if f in ISA_FLAGS) else None


def cpu_fingerprint(xla_flags: str | None = None) -> str:
  """The CPU's model name and the instruction sets XLA compiles for (Linux: /proc/cpuinfo).

  Two machines with the same fingerprint give the same bits for a CPU run; others may not.
  Under ``--xla_cpu_max_isa`` (:func:`max_isa`) the sets above the cap are left out: XLA
  compiles as for a CPU without them, so an AVX-512 machine told ``AVX2`` has the
  fingerprint of an AVX2 machine of the same model, but not its bits (an emulation,
  :func:`cap_in_effect`: the re-check tells them apart by the cap, :func:`analysis.lab.recheck.same_kind`).

  Args:
    xla_flags: the XLA flags in effect (default: ``$XLA_FLAGS``).
  """
  try:
    info = pathlib.Path("/proc/cpuinfo").read_text()
  except OSError:
    return f"{platform.machine()} {platform.processor()}".strip()
  fields = dict(line.split(":", 1) for line in info.splitlines() if ":" in line)
  fields = {k.strip(): v.strip() for k, v in fields.items()}
  flags = set(fields.get("flags", "").split())
  cap = max_isa(xla_flags)
  if cap is not None:
    check_choice("--xla_cpu_max_isa", cap, ISA_LEVELS)
    top = ISA_LEVELS.index(cap)
    flags = {f for f in flags if f not in ISA_FLAGS or ISA_LEVELS.index(ISA_FLAGS[f]) <= top}
  return f"{fields.get('model name', platform.machine())}; " + " ".join(f for f in ISA_FLAGS if f in flags)
