"""The measured roofline of a chip, read back: ``benchmarks/roofline.py``'s stored points.

Each point's FLOPs and bytes are recomputed from its shape by the calculator's own
:func:`~analysis.planning.op_cost.matmul_cost` / :func:`~analysis.planning.op_cost.elementwise_cost`,
and its intensity and achieved rates from its time, so the stored file cannot drift from the
calculator it is compared with; an edited file (its hash) is refused.
"""

from __future__ import annotations

import json

import pandas as pd

from analysis.lab.accelerator import (ACCELERATOR_DIR, PROVENANCE, ROOFLINE_SUFFIX, AcceleratorResultError, agrees,
                                      check_stamp, provenance_sentence)
from analysis.lab.stored import content_hash
from analysis.planning.op_cost import elementwise_cost, matmul_cost


def _cost(p: dict) -> tuple[float, float]:
  if p["kind"] == "matmul":
    return matmul_cost(p["m"], p["k"], p["n"])
  if p["kind"] == "elementwise":
    return elementwise_cost(p["size"])
  raise AcceleratorResultError(f"unknown point kind {p['kind']!r} (expected 'matmul' or 'elementwise')")


def check_roofline(doc: dict, name: str = "stored roofline") -> None:
  """The hash, the provenance, and every point's FLOPs, bytes and rates recomputed (one line if not).

  Examples:
    >>> point = {"kind": "elementwise", "size": 4, "flops": 4, "bytes": 16, "seconds": 2.0,
    ...          "intensity": 0.25, "flops_per_s": 2.0, "bytes_per_s": 8.0}
    >>> doc = {"provenance": dict.fromkeys(PROVENANCE, "x"), "points": [point]}
    >>> check_roofline({**doc, "sha256": content_hash(doc)})
    >>> bad = {**doc, "points": [{**point, "bytes": 8}]}
    >>> check_roofline({**bad, "sha256": content_hash(bad)})
    Traceback (most recent call last):
    ...
    analysis.lab.accelerator.AcceleratorResultError: stored roofline, point 0 (elementwise): stored bytes 8 is not the calculator's 16
  """
  check_stamp(doc, name, "python benchmarks/roofline.py --store")
  for i, p in enumerate(doc["points"]):
    flops, num_bytes = _cost(p)
    want = {"flops": flops, "bytes": num_bytes, "intensity": flops / num_bytes,
            "flops_per_s": flops / p["seconds"], "bytes_per_s": num_bytes / p["seconds"]}
    for field, value in want.items():
      if not agrees(p[field], value):
        source = "the calculator's" if field in ("flops", "bytes") else "its recomputed"
        raise AcceleratorResultError(f"{name}, point {i} ({p['kind']}): stored {field} {p[field]:g} is not"
                                     f" {source} {value:g}")


def load_roofline(device: str) -> tuple[dict, pd.DataFrame]:
  """The stored measured roofline of ``device`` (e.g. ``"tpu-v5-lite"``), checked.

  Returns:
    ``(provenance, points)``: one row per point (``kind``, shape, ``flops``, ``bytes``,
    ``seconds``, ``intensity``, ``flops_per_s``, ``bytes_per_s``).

  Examples:
    >>> prov, points = load_roofline("tpu-v5-lite")
    >>> prov["device_kind"], sorted(set(points["kind"]))
    ('TPU v5 lite', ['elementwise', 'matmul'])
  """
  path = ACCELERATOR_DIR / f"{device}{ROOFLINE_SUFFIX}.json"
  if not path.exists():
    stored = sorted(p.stem[:-len(ROOFLINE_SUFFIX)] for p in ACCELERATOR_DIR.glob(f"*{ROOFLINE_SUFFIX}.json"))
    raise AcceleratorResultError(f"no stored roofline {device!r} in {ACCELERATOR_DIR}; stored: {stored}; run"
                                 " `python benchmarks/roofline.py --store` on that device.")
  doc = json.loads(path.read_text())
  check_roofline(doc, f"analysis/results/accelerator/{path.name}")
  return doc["provenance"], pd.DataFrame(doc["points"])


def provenance_line(provenance: dict, device: str) -> str:
  """The stored roofline's provenance as one sentence for a page (see
  :func:`~analysis.lab.accelerator.provenance_sentence`)."""
  return provenance_sentence(provenance, f"{device}{ROOFLINE_SUFFIX}.json", "python benchmarks/roofline.py --store")
