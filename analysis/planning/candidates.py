"""The planner's candidates: valid (H, P, τ) for a model, and the bandwidth and memory each needs.

:func:`candidates` lists DP, DiLoCo and Streaming DiLoCo configurations valid under the
schedule rules of ``diloco_core.spec.validity``; :func:`candidate_bandwidth` prices one with the
closed forms of :mod:`analysis.planning.bandwidth` (the simulator's accounting: every payload is
reduced layer by layer during the backward pass of the step that sends it); and
:func:`candidate_table` tabulates bandwidth and memory per slice. :func:`analysis.planning.plan.plan_run`
and ``python -m analysis roofline`` both read this table.
"""

from __future__ import annotations


import pandas as pd

from analysis.planning.bandwidth import hidden_bandwidth
from analysis.planning.bandwidth import payload_bytes
from analysis.planning.bandwidth import required_bandwidth
from analysis.planning.bandwidth import streaming_required_bandwidth
from analysis.planning.hardware import HardwareSpec
from analysis.planning.hardware import check_hardware
from analysis.planning.memory import memory_per_replica
from analysis.planning.models import check_model
from analysis.planning.models import fragment_sizes
from analysis.planning.roofline import METHODS
from diloco_core.spec.model_config import ModelConfig
from diloco_core.spec.model_config import param_count
from diloco_core.spec.validity import allowed_fragments
from diloco_core.spec.validity import check_choice
from diloco_core.spec.validity import check_outer_overlap

GBIT = 1e9 / 8  # bytes/s in one Gbit/s
SYNC_EVERY_LADDER = (10, 20, 50, 100, 200, 500, 1000)  # H candidates, besides L + 1
OVERLAPS = (0, 1, 5)  # τ candidates for Streaming


def largest_fragments(sync_every: int, layers: int) -> int:
  """Largest P valid with H: :math:`H \\bmod P = 0` and :math:`P = 1` or :math:`(P-1) \\mid L`.

  Args:
    sync_every: H.
    layers: L.

  Returns:
    P (1 when no P > 1 is valid), among ``diloco_core.spec.validity.allowed_fragments``.

  Examples:
    >>> largest_fragments(37, 36), largest_fragments(100, 36), largest_fragments(10, 48)
    (37, 10, 5)
  """
  return max(p for p in allowed_fragments(layers) if sync_every % p == 0)


def label(method: str, sync_every: int = 1, fragments: int = 1, overlap: int = 0,
          outer_overlap: str = "none") -> str:
  """The row label of a candidate: "DP", "DiLoCo H=…" ("DiLoCo H=… eager" with eager
  updates) or "Streaming H=… P=… tau=…"."""
  if method == "dp":
    return "DP"
  if method == "diloco":
    return f"DiLoCo H={sync_every}" + ("" if outer_overlap == "none" else f" {outer_overlap}")
  return f"Streaming H={sync_every} P={fragments} tau={overlap}"


def candidates(layers: int, sync_every=None, overlaps=OVERLAPS, eager: bool = False) -> list[tuple]:
  """The planner's candidates ``(method, H, P, τ)``: DP, then per H DiLoCo and Streaming.

  Args:
    layers: L.
    sync_every: H candidates (sorted ints), None for :math:`L + 1` and the ladder.
    overlaps: τ candidates for Streaming (sorted ints); those >= H are left out.

    eager: also, per H, ``("diloco", H, 1, 0, "eager")`` (eager updates, τ = 0).

  Returns:
    A list of ``(method, H, P, tau)`` (and the eager 5-tuples), every one valid under
    ``diloco_core.spec.validity.check_schedule`` with ``num_layers=layers``.

  Examples:
    >>> candidates(2, sync_every=(6,), overlaps=(0, 6))
    [('dp', 1, 1, 0), ('diloco', 6, 1, 0), ('streaming', 6, 3, 0)]
    >>> candidates(2, sync_every=(6,), overlaps=(0,), eager=True)[1:3]
    [('diloco', 6, 1, 0), ('diloco', 6, 1, 0, 'eager')]
  """
  out = [("dp", 1, 1, 0)]
  for h in (sorted({layers + 1, *SYNC_EVERY_LADDER}) if sync_every is None else sync_every):
    out += [("diloco", h, 1, 0)] + ([("diloco", h, 1, 0, "eager")] if eager else [])
    p = largest_fragments(h, layers)
    if p > 1:
      out += [("streaming", h, p, t) for t in overlaps if t < h]
  return out


#: The two rules a candidate's bandwidth follows (:func:`criterion`): the waits of a sync period
#: leave the target share of the wall time to compute, or no step waits at all.
CRITERIA = ("utilization", "no wait")


def criterion(method: str, overlap: int = 0, outer_overlap: str = "none") -> str:
  """Which rule of :data:`CRITERIA` prices a candidate (:func:`candidate_bandwidth`).

  DP, DiLoCo and Streaming with :math:`\\tau = 0` are priced by the utilization they keep;
  Streaming with :math:`\\tau \\ge 1` and DiLoCo with an outer overlap by the bandwidth at
  which every transfer arrives before it is needed. The two differ, so a table mixing them
  in one column could show a :math:`\\tau = 1` row needing more than its :math:`\\tau = 0` row.

  Examples:
    >>> criterion("dp"), criterion("streaming", 0), criterion("streaming", 1), criterion("diloco", 0, "eager")
    ('utilization', 'utilization', 'no wait', 'no wait')
  """
  if method == "dp" or (overlap == 0 and outer_overlap == "none"):
    return CRITERIA[0]
  return CRITERIA[1]


def candidate_bandwidth(method, *, target, payload, step_time, layers, sync_every=1,
                        fragments=1, overlap=0, first_fragment=0.0, latency=0.0,
                        outer_overlap="none"):
  """Bytes/s a DP, DiLoCo or Streaming candidate needs (the rule of the module docstring).

  Args:
    method: "dp", "diloco" or "streaming".
    target: u, the utilization for the τ = 0 candidates.
    payload: V, bytes a replica sends to all-reduce the whole model.
    step_time: T, seconds per inner step.
    layers: L.
    sync_every, fragments, overlap: H, P, τ (fragment 0 holds the non-layer parameters,
      fragments 1..P-1 the layers, strided, as in the trainer).
    first_fragment: V_0, bytes of fragment 0 (Streaming only).
    latency: ε, seconds per chunk.
    outer_overlap: "eager" (or "delayed"): DiLoCo's sync may take until the next send,
      as τ = H - 1 (DiLoCo only).

  Returns:
    Bytes/s.

  Examples:
    >>> # DiLoCo, 2 GB every 100 steps of 0.1 s, 24 layers, 95%: 27.1 Gbit/s.
    >>> w = candidate_bandwidth("diloco", target=0.95, payload=2e9, step_time=0.1, layers=24,
    ...                         sync_every=100)
    >>> round(w / GBIT, 1)
    27.1
    >>> # Eager: the 1.6e10 bits may take the rest of the backward pass and H - 1 = 99
    >>> # more steps (hidden_bandwidth with τ = 99), a little over V / (H T) = 1.6 Gbit/s.
    >>> w = candidate_bandwidth("diloco", target=0.95, payload=2e9, step_time=0.1, layers=24,
    ...                         sync_every=100, outer_overlap="eager")
    >>> round(w / GBIT, 3)
    1.606
  """
  check_choice("method", method, METHODS)
  utilization = criterion(method, overlap, check_outer_overlap(outer_overlap, overlap)) == CRITERIA[0]
  if outer_overlap != "none":
    if method != "diloco":
      raise ValueError(f"outer_overlap={outer_overlap!r} is planned for 'diloco' only, got {method!r}.")
    overlap = sync_every - 1  # due when the next sync is sent
  if method == "dp":
    return required_bandwidth(target, payload, step_time, 1, latency, chunks=layers)
  if method == "diloco" or fragments == 1:  # one payload of the whole model
    if utilization:
      return required_bandwidth(target, payload, step_time, sync_every, latency,
                                   chunks=layers)
    return hidden_bandwidth(payload, step_time, overlap, sync_every, chunks=layers)
  p = fragments - 1  # layer fragments
  if utilization:
    return streaming_required_bandwidth(target, payload - first_fragment, step_time,
                                           sync_every, p, layers, 0, latency,
                                           first_payload=first_fragment)
  every = sync_every / fragments
  layer_part = hidden_bandwidth((payload - first_fragment) / p, step_time, overlap, every,
                                   chunks=layers // p)
  return max(float(layer_part),
             float(hidden_bandwidth(first_fragment, step_time, overlap, every, chunks=1)))


def candidate_table(model: ModelConfig, hardware: HardwareSpec, cands, *, slices: int,
                    chips_per_slice: int, step_time: float, target: float, bits: float,
                    latency: float = 0.0, dp_bits: float | None = None) -> pd.DataFrame:
  """Bandwidth per slice and memory of each candidate ``(method, H, P, τ)`` (see the module).

  Each candidate's bandwidth is :func:`candidate_bandwidth` (latency :math:`\\varepsilon`
  per transfer for τ = 0; not modelled for τ >= 1).

  Args:
    model: the resolved model (a ModelConfig).
    hardware: the resolved chip (a HardwareSpec).
    cands: ``(method, H, P, tau)`` tuples, e.g. :func:`candidates`.
    slices: M.
    chips_per_slice: n.
    step_time: T, seconds per inner step.
    target: u, the utilization planned for by the τ = 0 candidates.
    bits: bits per value on the wire (for a sparse wire, the average bits per parameter,
      e.g. :func:`diloco_core.spec.wire_formats.topk_bits_per_element`).
    latency: ε, seconds per transfer (τ = 0).
    dp_bits: bits per gradient value of the DP row, when it differs from ``bits`` (a
      sparse DiLoCo wire; DP's gradients stay dense); None: ``bits``.

  Returns:
    A DataFrame indexed by :func:`label`, with the columns of :class:`~analysis.planning.plan.Plan`'s table except
    ``fits link``; ``criterion`` names the rule of ``Gbit/s per slice`` (:func:`criterion`).
  """
  model, hw = check_model(model), check_hardware(hardware)
  dcn_gbps = hw.dcn_bandwidth * chips_per_slice / GBIT
  rows = {}
  for method, h, p, tau, *mode in cands:
    mode = mode[0] if mode else "none"
    b = dp_bits if method == "dp" and dp_bits is not None else bits
    payload = payload_bytes(param_count(model), b, slices)  # whole model, per replica
    sizes = fragment_sizes(model, p)
    largest = payload_bytes(max(sizes), b, slices)
    w = candidate_bandwidth(method, target=target, payload=payload, step_time=step_time,
                            layers=model.n_layers, sync_every=h, fragments=p, overlap=tau,
                            first_fragment=payload_bytes(sizes[0], b, slices) if p > 1 else 0.0,
                            latency=latency, outer_overlap=mode)
    mem = memory_per_replica(model, method=method, sync_every=h, fragments=p,
                             overlap=tau).total
    rows[label(method, h, p, tau, mode)] = {
        "method": method, "H": h, "P": p, "tau": tau, "outer overlap": mode,
        "Gbit/s per slice": w / GBIT, "criterion": criterion(method, tau, mode),
        "GB per sync": largest / 1e9, "memory GB/replica": mem / 1e9,
        "memory GB/chip": mem / chips_per_slice / 1e9, "fits DCN": w / GBIT <= dcn_gbps}
  return pd.DataFrame.from_dict(rows, orient="index").rename_axis("label")


def check_overlaps(taus, layers: int, sync_every) -> None:
  """Refuses overlaps that no Streaming candidate can use (τ >= H for every H considered).

  Examples:
    >>> check_overlaps((100000,), 2, (6, 12))
    Traceback (most recent call last):
    ...
    ValueError: overlaps (100000,) leave no Streaming candidate: τ must be below H, and the largest H considered for Streaming is 12; give overlaps in [0, 11].
  """
  hs = sorted({layers + 1, *SYNC_EVERY_LADDER}) if sync_every is None else sync_every
  streaming = [h for h in hs if largest_fragments(h, layers) > 1]
  if streaming and min(taus) >= max(streaming):
    raise ValueError(f"overlaps {tuple(taus)} leave no Streaming candidate: τ must be below H, and the"
                     f" largest H considered for Streaming is {max(streaming)}; give overlaps in"
                     f" [0, {max(streaming) - 1}].")
