"""The fragment map of Streaming DiLoCo, and views of one fragment selected by a traced index.

Fragment 0 holds every leaf that is not a stacked layer (embeddings, final norm, head).
The L stacked layers are dealt to fragments 1..P-1: ``strided`` puts layer i in fragment
``1 + i % (P-1)``; ``sequential`` gives fragment ``1 + k`` the contiguous layers
``k·L/(P-1) .. (k+1)·L/(P-1) - 1``. With P = 1 the only fragment is the whole model.

Selecting a layer fragment never branches on p: the layer axis is reshaped to
``(L/(P-1), P-1)`` (strided) or ``(P-1, L/(P-1))`` (sequential) and the fragment is one
:func:`jax.lax.dynamic_index_in_dim` with the traced index. The jitted step therefore
holds two fragment branches (fragment 0, a layer fragment) whatever P is, and compile
time does not grow with P.

Leaves are handled as flat lists, each with a *kind*: ``OTHER`` (fragment 0), ``LAYER``
(sliced on its layer axis) or ``SHARED`` (non-parameter optimizer state such as a step
count or a schedule's step).

**Per-fragment outer state.** Each fragment owns its slice of the outer optimizer's state:
the params-shaped leaves are sliced like the params, and when P > 1 every non-parameter
leaf carries a leading axis P (:func:`per_fragment_state`), entry p being fragment p's own
copy. A stateful outer optimizer (Adam's count, a schedule) therefore behaves on each
fragment as if that fragment were the whole model, the rule of the Streaming DiLoCo paper
(one outer optimizer per fragment) and of torchft. With P = 1 nothing is stacked.

Examples:
  Adam's step count becomes one count per fragment; its moments keep the params' shapes:

  >>> import jax.numpy as jnp, optax
  >>> params = {"emb": jnp.zeros(3), "layers": jnp.zeros((2, 4))}
  >>> state = per_fragment_state(optax.adam(0.1), params, fragments=3)
  >>> state[0].count.shape, state[0].mu["layers"].shape
  ((3,), (2, 4))
"""

from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import optax

from diloco_core.spec.fragment_layers import deal_layers
from diloco_core.spec.validity import FRAGMENT_PATTERNS, check_choice, check_fragments_divide_layers

OTHER, LAYER, SHARED = 0, 1, 2


class Fragments:
  """The static partition of a params pytree into P fragments.

  Args:
    is_layer: one bool per flat leaf of the params (``jax.tree.leaves`` order): True for
      stacked-layer leaves (leading axis L).
    shapes: the leaves' shapes.
    fragments: P.
    pattern: ``"strided"`` or ``"sequential"``.
    paths: optional leaf names for :meth:`fragment_map`.

  Examples:
    >>> f = Fragments([False, True], [(3,), (6, 2)], fragments=4, pattern="strided")
    >>> [row["layers"] for row in f.fragment_map()]
    [[], [0, 3], [1, 4], [2, 5]]
    >>> f.sizes()
    [3, 4, 4, 4]
  """

  def __init__(self, is_layer: Sequence[bool], shapes: Sequence[tuple[int, ...]], fragments: int,
               pattern: str = "strided", paths: Sequence[str] | None = None):
    self.is_layer = [bool(x) for x in is_layer]
    self.shapes = [tuple(s) for s in shapes]
    self.num_fragments = fragments
    self.pattern = pattern
    self.paths = list(paths) if paths is not None else [f"leaf{i}" for i in range(len(shapes))]
    layer_dims = {s[0] for s, m in zip(self.shapes, self.is_layer) if m and len(s) > 0}
    if any(m and len(s) == 0 for s, m in zip(self.shapes, self.is_layer)):
      raise ValueError("layer leaves must have a leading layer axis; a scalar leaf was marked.")
    if len(layer_dims) > 1:
      raise ValueError(f"all layer leaves must share the leading layer axis length, got {sorted(layer_dims)}.")
    self.num_layers = layer_dims.pop() if layer_dims else 0
    if fragments > 1:
      if self.num_layers == 0:
        raise ValueError(
            f"fragments (P={fragments}) > 1 needs stacked-layer leaves; mark them with layer_mask.")
      check_fragments_divide_layers(fragments, self.num_layers)
    check_choice("fragment_pattern", pattern, FRAGMENT_PATTERNS)

  # ---- host-side description -------------------------------------------------------------
  def layers_of(self, p: int) -> list[int]:
    """The layer indices of fragment p (empty for fragment 0 when P > 1; :mod:`~diloco_core.spec.fragment_layers`)."""
    return deal_layers(self.num_layers, self.num_fragments, self.pattern)[p]

  def sizes(self) -> list[int]:
    """Elements in each fragment, p = 0..P-1."""
    out = []
    for p in range(self.num_fragments):
      n = 0
      for shape, layer in zip(self.shapes, self.is_layer):
        size = 1
        for d in shape:
          size *= d
        if self.num_fragments == 1:
          n += size
        elif layer and p > 0:
          n += size // self.num_layers * len(self.layers_of(p))
        elif not layer and p == 0:
          n += size
      out.append(n)
    return out

  def leaf_shapes(self, p: int) -> list[tuple[int, ...]]:
    """Shapes of fragment p's members (one tensor per member leaf, as sent on the wire)."""
    out = []
    for shape, layer in zip(self.shapes, self.is_layer):
      if self.num_fragments == 1 or (p == 0 and not layer):
        out.append(shape)
      elif p > 0 and layer:
        out.append((len(self.layers_of(p)),) + shape[1:])
    return out

  def fragment_map(self) -> list[dict[str, Any]]:
    """One row per fragment: its layers, its leaves and its size in elements."""
    rows = []
    for p, size in enumerate(self.sizes()):
      if self.num_fragments == 1:
        leaves = list(self.paths)
      else:
        leaves = [n for n, m in zip(self.paths, self.is_layer) if m == (p > 0)]
      rows.append({"fragment": p, "layers": self.layers_of(p), "leaves": leaves, "elements": size})
    return rows

  # ---- traced selection ------------------------------------------------------------------
  def _split_axis(self, x: jax.Array, axis: int) -> tuple[jax.Array, int]:
    """Reshapes the layer axis so that the fragment index is one axis; returns (x, index axis)."""
    P, L = self.num_fragments, self.num_layers
    n = L // (P - 1)
    if self.pattern == "strided":
      shape = x.shape[:axis] + (n, P - 1) + x.shape[axis + 1:]
      return x.reshape(shape), axis + 1
    shape = x.shape[:axis] + (P - 1, n) + x.shape[axis + 1:]
    return x.reshape(shape), axis

  def _member(self, kind: int, branch: str) -> bool:
    if branch == "all" or kind == SHARED:
      return True
    return (kind == LAYER) == (branch == "layer")

  def take(self, leaves: Sequence[Any], kinds: Sequence[int], branch: str, k=None,
           axis: int = 0) -> list[Any]:
    """The members of one fragment, layer leaves sliced to the fragment's layers.

    Args:
      leaves: flat leaves.
      kinds: their kinds (OTHER / LAYER / SHARED; a SHARED leaf has a leading axis P at
        ``axis`` when P > 1, see :func:`per_fragment_state`).
      branch: ``"all"`` (P = 1), ``"other"`` (fragment 0) or ``"layer"`` (fragment k + 1).
      k: traced layer-fragment index (``"layer"`` only).
      axis: position of the layer axis (0 for the global params, 1 for replica-stacked).

    Returns:
      The member arrays, in leaf order.
    """
    out = []
    for x, kind in zip(leaves, kinds):
      if not self._member(kind, branch):
        continue
      if branch == "layer" and kind == LAYER:
        y, ax = self._split_axis(x, axis)
        x = jax.lax.dynamic_index_in_dim(y, k, axis=ax, keepdims=False)
      elif kind == SHARED and branch != "all":  # this fragment's own copy (leading axis P)
        x = jax.lax.dynamic_index_in_dim(x, self._own(branch, k), axis=axis, keepdims=False)
      out.append(x)
    return out

  @staticmethod
  def _own(branch: str, k):
    """The index of the fragment on the per-fragment (leading P) axis of a SHARED leaf."""
    return 0 if branch == "other" else k + 1

  def put(self, leaves: Sequence[Any], kinds: Sequence[int], branch: str, values: Sequence[Any],
          k=None, axis: int = 0) -> list[Any]:
    """Writes ``values`` (as returned by :meth:`take`) back into ``leaves``."""
    it = iter(values)
    out = []
    for x, kind in zip(leaves, kinds):
      if not self._member(kind, branch):
        out.append(x)
        continue
      v = next(it)
      if branch == "layer" and kind == LAYER:
        y, ax = self._split_axis(x, axis)
        y = jax.lax.dynamic_update_index_in_dim(y, v.astype(y.dtype), k, axis=ax)
        v = y.reshape(x.shape)
      elif kind == SHARED and branch != "all":
        v = jax.lax.dynamic_update_index_in_dim(x, v.astype(x.dtype), self._own(branch, k), axis)
      out.append(v)
    return out

  def switch(self, p, fn):
    """Calls ``fn(branch, k)`` for traced fragment p with at most two compiled branches.

    Returns ``fn("all", None)`` when P = 1, else ``lax.cond(p == 0, fragment 0, layer p-1)``.
    ``fn`` must return the same pytree structure in both branches.
    """
    if self.num_fragments == 1:
      return fn("all", None)
    return jax.lax.cond(p == 0, lambda: fn("other", None), lambda: fn("layer", p - 1))


def shared_leaves(optimizer: optax.GradientTransformation, params) -> list[bool]:
  """For each flat leaf of ``optimizer.init(params)``: whether it is non-parameter state.

  Non-parameter leaves (a step count, a schedule's step, injected hyperparameters) are
  those that optax's :func:`optax.tree_utils.tree_map_params` does not map as params.
  Nothing is computed: the state is traced abstractly.
  """
  abstract = jax.eval_shape(optimizer.init, params)
  marks = optax.tree_utils.tree_map_params(optimizer, lambda _: False, abstract,
                                           transform_non_params=lambda _: True)
  return [bool(m) for m in jax.tree.leaves(marks)]


def per_fragment_state(optimizer: optax.GradientTransformation, params, fragments: int):
  """The outer optimizer's initial state with one copy of each non-parameter leaf per fragment.

  .. math::
     s_\\text{shared} \\mapsto [s_\\text{shared}]_{p = 0}^{P-1} \\quad (P > 1)

  Params-shaped leaves are unchanged (each fragment updates its slice of them); with
  P = 1 the state is exactly ``optimizer.init(params)``.

  Args:
    optimizer: the outer optimizer.
    params: the global params θ_g.
    fragments: P.

  Returns:
    The state pytree, every non-parameter leaf stacked on a new leading axis of size P.
  """
  state = optimizer.init(params)
  if fragments == 1:
    return state
  leaves, treedef = jax.tree.flatten(state)
  stacked = [jnp.broadcast_to(x, (fragments, *jnp.shape(x))) if shared else x
             for x, shared in zip(leaves, shared_leaves(optimizer, params))]
  return jax.tree.unflatten(treedef, stacked)


def leaf_paths(tree) -> list[str]:
  """Slash-joined key paths of the leaves of ``tree`` (for fragment maps and errors)."""
  out = []
  for path, _ in jax.tree_util.tree_flatten_with_path(tree)[0]:
    out.append("/".join(str(getattr(k, "key", getattr(k, "idx", getattr(k, "name", k)))) for k in path))
  return out
