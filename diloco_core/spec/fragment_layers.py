"""Which stacked layers each Streaming fragment holds: the dealing rule, without JAX.

Fragment 0 holds every leaf that is not a stacked layer (embeddings, final norm, head). The
L stacked layers are dealt to fragments 1..P-1: ``strided`` puts layer i in fragment
``1 + i % (P-1)``; ``sequential`` gives fragment ``1 + k`` the contiguous layers
``k·L/(P-1) .. (k+1)·L/(P-1) - 1``. With P = 1 the only fragment is the whole model.

The trainer's fragment map (:class:`diloco_core.algorithm.fragments.Fragments`) and the simulator
(:func:`analysis.planning.simulate.fragment_layers_of`) both deal layers with :func:`deal_layers`.
"""

from __future__ import annotations

from diloco_core.spec.validity import FRAGMENT_PATTERNS, check_choice, check_fragments_divide_layers


def deal_layers(num_layers: int, fragments: int, pattern: str = "strided") -> list[list[int]]:
  """The layer indices of each fragment p = 0..P-1.

  Args:
    num_layers: L, the stacked layers.
    fragments: P (P - 1 must divide L when P > 1).
    pattern: ``"strided"`` or ``"sequential"``.

  Returns:
    P lists of layer indices; fragment 0's is empty when P > 1 (it holds the other leaves).

  Examples:
    >>> deal_layers(6, 4)
    [[], [0, 3], [1, 4], [2, 5]]
    >>> deal_layers(6, 4, "sequential")
    [[], [0, 1], [2, 3], [4, 5]]
    >>> deal_layers(3, 1)
    [[0, 1, 2]]
  """
  check_choice("fragment_pattern", pattern, FRAGMENT_PATTERNS)
  if fragments == 1:
    return [list(range(num_layers))]
  check_fragments_divide_layers(fragments, num_layers)
  per = num_layers // (fragments - 1)
  if pattern == "strided":
    layers = [list(range(k, num_layers, fragments - 1)) for k in range(fragments - 1)]
  else:
    layers = [list(range(k * per, (k + 1) * per)) for k in range(fragments - 1)]
  return [[]] + layers
