"""The schedule of a simulated run and its event loop: what each step sends, and the link.

:func:`schedule` turns a method (DP, DiLoCo, Streaming DiLoCo) into the chunks each step
of a sync period sends: a payload is cut by layer (or by bucket of layers) and each
chunk is released when the sending step's backward pass finishes its layers, as in the
Streaming DiLoCo paper's simulation (arXiv 2501.18512, Figure 3). :func:`run_events`
serves the chunks on one FIFO link and delays a step until what it needs has arrived.
:mod:`analysis.planning.simulate` builds its public API on these two functions.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from diloco_core.spec.fragment_layers import deal_layers
from diloco_core.spec.validity import check_int
from diloco_core.spec.validity import check_outer_overlap
from diloco_core.spec.validity import check_overlap


def fragment_layers_of(layers: int, fragment_layers: int, pattern: str = "strided"
                       ) -> list[list[int]]:
  """The layers of each Streaming fragment, dealt as the trainer deals them.

  There is no embeddings fragment (the paper's setting): the P = L / ``fragment_layers``
  fragments are the trainer's layer fragments 1..P
  (:func:`diloco_core.spec.fragment_layers.deal_layers`).

  Examples:
    >>> fragment_layers_of(6, 2)
    [[0, 3], [1, 4], [2, 5]]
    >>> fragment_layers_of(6, 2, "sequential")
    [[0, 1], [2, 3], [4, 5]]
  """
  fl = check_int("fragment_layers", fragment_layers)
  if layers % fl:
    raise ValueError(f"fragment_layers ({fl}) must divide the number of layers ({layers}).")
  p = layers // fl
  return deal_layers(layers, p + 1, pattern)[1:]


@dataclasses.dataclass(frozen=True)
class _Send:
  """What a step sends: chunk release offsets (s into the step), sizes (bits), deadline."""

  offsets: np.ndarray  # increasing
  sizes: np.ndarray
  delay: int  # must arrive before step t + delay starts
  fragment: int  # -1 for DP and DiLoCo


def _send(layer_set, m, bits_per_layer, delay, fragment, bucket_layers, phi) -> _Send:
  """Chunks of a payload holding ``layer_set``: one per bucket, released at its end."""
  n, k = m.layers, bucket_layers
  per_bucket = np.zeros(n // k)
  for layer in layer_set:
    per_bucket[(n - 1 - layer) // k] += 1  # bucket j holds backward positions jk .. jk+k-1
  b = (1.0 - phi) * m.step_time / n
  ends = phi * m.step_time + b * k * np.arange(1, n // k + 1)
  keep = per_bucket > 0
  return _Send(ends[keep], per_bucket[keep] * bits_per_layer, delay, fragment)


def schedule(method, m, *, replicas, sync_every, fragment_layers, fragment_pattern,
              overlap, bits, bucket_layers, forward_fraction, outer_overlap="none"
              ) -> tuple[int, dict]:
  """(period, {step mod period: _Send}): what each step sends and when it is due.

  Args:
    method: "dp", "diloco" or "streaming".
    m: the model (``params``, ``layers``, ``step_time``), e.g. a
      :class:`analysis.planning.simulate.SimModel`.
    replicas: M; the other keyword arguments (``sync_every``, ``fragment_layers``,
      ``fragment_pattern``, ``overlap``, ``bits``, ``bucket_layers``,
      ``forward_fraction``, ``outer_overlap``) are those of
      :func:`analysis.planning.simulate.run_simulation`.

  Returns:
    The period in steps (1 for DP, H otherwise) and, for each step of the period that
    sends (step mod period, 1-based steps), its chunks and deadline.

  Examples:
    >>> m = type("M", (), dict(params=6e9, layers=6, step_time=0.3))
    >>> period, plan = schedule("streaming", m, replicas=2, sync_every=4, fragment_layers=3,
    ...                         fragment_pattern="strided", overlap=1, bits=1, bucket_layers=1,
    ...                         forward_fraction=1 / 3)
    >>> period, sorted(plan), plan[2].offsets.round(2).tolist(), plan[2].delay
    (4, [0, 2], [0.17, 0.23, 0.3], 2)
  """
  k = check_int("bucket_layers", bucket_layers)
  if m.layers % k:
    raise ValueError(f"bucket_layers ({k}) must divide the number of layers ({m.layers}).")
  per_layer = m.params / m.layers * bits * 2.0 * (replicas - 1) / replicas
  every = range(m.layers)
  if method == "dp":
    if check_outer_overlap(outer_overlap, 0) != "none":
      raise ValueError(f"outer_overlap={outer_overlap!r} applies to 'diloco' and 'streaming', not 'dp'.")
    return 1, {0: _send(every, m, per_layer, 1, -1, k, forward_fraction)}
  h = check_int("sync_every", sync_every)
  tau = check_overlap(overlap, h)
  # Whole-outer-step overlap: a sync is due at the next send of the same fragment, H steps on.
  delay = tau + 1 if check_outer_overlap(outer_overlap, tau) == "none" else h
  if method == "diloco":
    return h, {0: _send(every, m, per_layer, delay, -1, k, forward_fraction)}
  frags = fragment_layers_of(m.layers, fragment_layers, fragment_pattern)
  p = len(frags)
  if p > h:
    raise ValueError(f"fragments ({p} = layers / fragment_layers) must be <= sync_every ({h}).")
  return h, {((f + 1) * h // p) % h: _send(frags[f], m, per_layer, delay, f, k,
                                            forward_fraction) for f in range(p)}


def run_events(period, plan, t, w_bps, eps, n_steps, first, record=False):
  """Runs the schedule for every bandwidth of ``w_bps`` at once.

  Returns ({step: start times (len(w))}, records): only the steps that send or wait are
  visited; in between, each step starts when the previous one ends. The chunks of one
  step are served by the FIFO recursion f_j = max(f_{j-1}, r_j) + d_j, unrolled as
  :math:`f_j = C_j + \\max(f_0, \\max_{i \\le j}(r_i - C_{i-1}))` with C the cumulative
  service times.
  """
  w = np.asarray(w_bps, dtype=float)[None, :]
  sends = [s for s in range(1, n_steps + 1) if s % period in plan]
  dues = {s + plan[s % period].delay for s in sends}
  steps = sorted({1, first, n_steps} | set(sends) | {s for s in dues if s <= n_steps})
  starts, rec, due = {}, [], {}
  link_free = np.zeros(w.shape[1])
  prev_step, prev = 1, np.zeros(w.shape[1])
  for step in steps:
    s = prev + (step - prev_step) * t
    if step in due:
      s = np.maximum(s, due.pop(step))
    starts[step], prev_step, prev = s, step, s
    send = plan.get(step % period)
    if send is None:
      continue
    ready = s[None, :] + send.offsets[:, None]
    cum = np.cumsum(send.sizes)[:, None] / w
    lead = np.maximum.accumulate(ready - (cum - send.sizes[:, None] / w), axis=0)
    finish = cum + np.maximum(link_free[None, :], lead)
    link_free = finish[-1]
    need = step + send.delay
    due[need] = np.maximum(due.get(need, -np.inf), link_free + eps)
    if record:
      for j in range(len(send.sizes)):
        rec.append((step, send.fragment, float(ready[j, 0]),
                    float(finish[j, 0] - send.sizes[j] / w[0, 0]), float(finish[j, 0]),
                    float(finish[j, 0] + eps), float(send.sizes[j]), need))
  return starts, rec
