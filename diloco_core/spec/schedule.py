"""When each fragment is sent and merged ("One inner step" on the semantics page, docs/semantics.md).

Fragment p is sent after inner step t > 0 when ``t % H == ((p + 1) * Δh) % H`` with
Δh = H / P, and merged τ steps later. That is the order ``"embeddings-first"`` (fragment 0,
the embeddings, at t = Δh); ``"embeddings-last"`` is MaxText's: the fragment sent at t is
``(t / Δh) mod P``, one more than ours, so fragment 0 goes last in each period. At most one fragment is sent (and at most one
merged) per step, so the jitted step needs one traced fragment index, not P branches.
The functions here work on Python ints (host side) and on traced int32 scalars alike.
"""

from __future__ import annotations


from diloco_core.spec.validity import FRAGMENT_ORDERS, check_choice


def _fragment_due(t, sync_every: int, fragments: int, order: str):
  check_choice("fragment_order", order, FRAGMENT_ORDERS)
  dh = sync_every // fragments
  due = (t > 0) & (t % dh == 0)
  shift = 1 if order == "embeddings-first" else 0
  return due, (t // dh - shift) % fragments


def sent_fragment(t, sync_every: int, fragments: int, order: str = "embeddings-first"):
  """Returns ``(is_send, p)``: whether a fragment is sent after step t, and which.

  .. math::
     \\text{send}(t) \\iff t > 0 \\wedge \\Delta h \\mid t,\\qquad
     p = (t / \\Delta h - 1) \\bmod P

  which is the unique p with :math:`t \\bmod H = ((p+1)\\Delta h) \\bmod H`;
  ``order="embeddings-last"`` (MaxText's) gives :math:`p = (t / \\Delta h) \\bmod P`.

  Args:
    t: inner steps done (int or traced int32).
    sync_every: H.
    fragments: P (H % P == 0).
    order: ``"embeddings-first"`` (this page's) or ``"embeddings-last"`` (MaxText's).

  Returns:
    A pair (bool, int) — or traced scalars when ``t`` is traced. ``p`` is meaningless
    when ``is_send`` is false.

  Examples:
    >>> [sent_fragment(t, 6, 3) for t in (1, 2, 4, 6)][1:]
    [(True, 0), (True, 1), (True, 2)]
    >>> [sent_fragment(t, 6, 3, "embeddings-last")[1] for t in (2, 4, 6)]
    [1, 2, 0]
  """
  return _fragment_due(t, sync_every, fragments, order)


def merged_fragment(t, sync_every: int, fragments: int, overlap: int,
                    order: str = "embeddings-first"):
  """Returns ``(is_merge, p)``: the fragment sent at step t − τ is merged after step t.

  Args:
    t: inner steps done (int or traced int32).
    sync_every: H.
    fragments: P.
    overlap: τ, 0 <= τ < H.
    order: as in :func:`sent_fragment`.

  Returns:
    A pair (bool, int) like :func:`sent_fragment`.

  Examples:
    >>> merged_fragment(3, 6, 3, overlap=1)
    (True, 0)
  """
  return _fragment_due(t - overlap, sync_every, fragments, order)


def schedule_table(sync_every: int, fragments: int, overlap: int, steps: int,
                   order: str = "embeddings-first") -> list[dict]:
  """Which fragment is sent and merged at each of steps 1..steps (``None`` = none).

  Examples:
    >>> for row in schedule_table(6, 3, overlap=1, steps=4): print(row)
    {'step': 1, 'send': None, 'merge': None}
    {'step': 2, 'send': 0, 'merge': None}
    {'step': 3, 'send': None, 'merge': 0}
    {'step': 4, 'send': 1, 'merge': None}
  """
  rows = []
  for t in range(1, steps + 1):
    s, p = sent_fragment(t, sync_every, fragments, order)
    m, q = merged_fragment(t, sync_every, fragments, overlap, order)
    rows.append({"step": t, "send": int(p) if s else None, "merge": int(q) if m else None})
  return rows

