"""Tests for diloco_core.wire.compression: value sets, rounding, scaling, error feedback, bits."""

import math

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from diloco_core.wire import compression as C

SCALED = ("fp8", "fp4", "e3m0")

_quantize_jit = jax.jit(C.quantize, static_argnames=("name", "block_size"))
_round_jit = jax.jit(C.round_to_format, static_argnames=("name",))


def q(x, name, block_size=None):
  """quantize, run on the input zero-padded to one of a few lengths (fewer compilations).

  Zero padding at the end never changes the absmax of a block (nor adds elements to a block
  of real data), so this is exactly quantize(x); shapes are tested separately.
  """
  x = np.asarray(x, np.float32)
  n = x.size
  padded = next(size for size in (64, 256, 1024, 4096, 2**20) if size >= n)
  flat = np.zeros(padded, np.float32)
  flat[:n] = x.reshape(-1)
  out = _quantize_jit(jnp.asarray(flat), name, block_size=block_size)
  return np.asarray(out)[:n].reshape(x.shape)


def r(y, name):
  return np.asarray(_round_jit(jnp.asarray(y, jnp.float32), name))


# ------------------------------------------------------------- 1. value sets, round trips


def test_fp4_values_exact():
  pos = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0]
  expected = sorted(set(pos + [-v for v in pos]))
  np.testing.assert_array_equal(C.representable_values("fp4"), np.array(expected, np.float32))


def test_e3m0_values_exact():
  pos = [0.0] + [2.0**e for e in range(-6, 1)]  # 0, 1/64, ..., 1/2, 1
  expected = sorted(set(pos + [-v for v in pos]))
  values = C.representable_values("e3m0")
  assert values.dtype == np.float32 and len(values) == 15
  np.testing.assert_array_equal(values, np.array(expected, np.float32))


def test_fp8_values():
  values = C.representable_values("fp8")
  assert values.dtype == np.float32 and len(values) == 253  # 256 codes - 2 NaN - one zero
  assert values[-1] == 448.0 == C.max_value("fp8")
  assert float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max) == 448.0
  assert values[-2] == 416.0 and values[0] == -448.0
  pos = values[values > 0]
  assert pos[0] == 2.0**-9 and pos[7] == 2.0**-6  # 7 subnormals, then the normals
  assert np.all(np.diff(values) > 0)


def test_max_values():
  assert [C.max_value(f) for f in SCALED] == [448.0, 6.0, 1.0]
  for f in SCALED:
    assert C.representable_values(f)[-1] == C.max_value(f)


@pytest.mark.parametrize("name", ["none", "bf16"])
def test_no_value_grid_for_unscaled_formats(name):
  with pytest.raises(ValueError, match="no scaled value grid"):
    C.representable_values(name)
  with pytest.raises(ValueError):
    C.max_value(name)


@pytest.mark.parametrize("name", SCALED)
def test_round_to_format_is_identity_on_grid(name):
  values = C.representable_values(name)
  np.testing.assert_array_equal(r(values, name), values)


@pytest.mark.parametrize("name", SCALED)
# 2^-110 exercises the tiny-block path (absmax < 2^-100) with normal floats only: XLA on CPU
# flushes float32 subnormals to zero, so subnormal inputs cannot round-trip there.
@pytest.mark.parametrize("scale", [1.0, 3.0, 0.375, 2.0**-20, 1.25 * 2.0**10, 2.0**-110, 2.0**100])
def test_round_trip_of_scaled_grid_is_identity(name, scale):
  values = C.representable_values(name)
  x = (values.astype(np.float64) * scale).astype(np.float32)
  assert np.all(x.astype(np.float64) == values.astype(np.float64) * scale)  # x is exact
  np.testing.assert_array_equal(q(x, name), x)
  if scale == 3.0:
    shuffled = np.random.default_rng(0).permutation(x).reshape(-1, 1)  # 2-D, any order
    np.testing.assert_array_equal(q(shuffled, name), shuffled)


def test_bf16_round_trip_of_bf16_values_is_identity():
  rng = np.random.default_rng(1)
  x = (rng.standard_normal(4096) * np.exp(rng.uniform(-30, 30, 4096))).astype(np.float32)
  x = x.astype(ml_dtypes.bfloat16).astype(np.float32)
  np.testing.assert_array_equal(q(x, "bf16"), x)


def test_bf16_rounds_to_nearest_even():
  one_ulp = 2.0**-7  # bf16 spacing in [1, 2)
  x = np.array([1 + one_ulp / 2, 1 + 1.5 * one_ulp, 1 + one_ulp / 2 + 2.0**-20, -(1 + one_ulp / 2)],
               np.float32)
  np.testing.assert_array_equal(q(x, "bf16"), [1.0, 1 + 2 * one_ulp, 1 + one_ulp, -1.0])
  rng = np.random.default_rng(2)
  y = rng.standard_normal(1000).astype(np.float32)
  np.testing.assert_array_equal(q(y, "bf16"), y.astype(ml_dtypes.bfloat16).astype(np.float32))


def test_none_is_identity():
  x = np.array([1e-30, -3.3, 7e20, np.nan, np.inf], np.float32)
  np.testing.assert_array_equal(q(x, "none"), x)


# ------------------------------------------------------------------- 2. rounding by hand

E3M0_CASES = [
    (0.0, 0.0),
    (1.0, 1.0),
    (0.75, 1.0),  # linear midpoint of 0.5 and 1: tie goes up
    (0.7499, 0.5),
    (0.7501, 1.0),
    (0.1875, 0.25),  # 1.5 * 2^-3: tie goes up
    (0.18, 0.125),
    (0.36, 0.25),  # above the log-domain midpoint 0.3536, below the linear one 0.375
    (0.02, 2.0**-6),  # below 1.5 * 2^-6 = 0.0234375
    (0.0234375, 2.0**-5),  # tie between 2^-6 and 2^-5 goes up
    (2.0**-7, 0.0),  # tie between 0 and 2^-6 goes to zero (even)
    (2.0**-7 * 1.001, 2.0**-6),
    (1e-30, 0.0),  # tiny values flush to zero
    (1.3, 1.0),  # above max saturates
    (1e30, 1.0),
    (-0.75, -1.0),
    (-0.1875, -0.25),
    (-0.36, -0.25),
    (-2.0**-7, 0.0),
    (-5.0, -1.0),
]

FP4_CASES = [
    (0.0, 0.0),
    (0.25, 0.0),  # tie between 0 and 0.5 goes to zero (even)
    (0.2501, 0.5),
    (0.75, 1.0),  # tie 0.5 / 1: even significand
    (1.25, 1.0),  # tie 1 / 1.5
    (1.75, 2.0),  # tie 1.5 / 2
    (2.5, 2.0),  # tie 2 / 3
    (3.5, 4.0),  # tie 3 / 4
    (5.0, 4.0),  # tie 4 / 6
    (5.001, 6.0),
    (4.999, 4.0),
    (6.0, 6.0),
    (7.0, 6.0),  # above max saturates
    (1e30, 6.0),
    (1e-30, 0.0),
    (-0.25, 0.0),
    (-0.75, -1.0),
    (-2.5, -2.0),
    (-5.0, -4.0),
    (-5.5, -6.0),
    (-100.0, -6.0),
]


@pytest.mark.parametrize("name,cases", [("e3m0", E3M0_CASES), ("fp4", FP4_CASES)])
def test_hand_computed_rounding(name, cases):
  y = np.array([c[0] for c in cases], np.float32)
  want = np.array([c[1] for c in cases], np.float32)
  np.testing.assert_array_equal(r(y, name), want)
  # The same through quantize: a block whose absmax is q_max has scale exactly 1.
  inside = y[np.abs(y) <= C.max_value(name)]
  inside_want = want[np.abs(y) <= C.max_value(name)]
  x = np.concatenate([[C.max_value(name)], inside]).astype(np.float32)
  np.testing.assert_array_equal(q(x, name)[1:], inside_want)


def test_negative_tiny_rounds_to_signed_zero():
  out = r(np.array([-1e-30, -0.25], np.float32), "fp4")
  assert np.all(out == 0) and np.all(np.signbit(out))


def _midpoints(values):
  return ((values[:-1].astype(np.float64) + values[1:]) / 2).astype(np.float32)


def _test_inputs(name, n=20000, seed=0):
  rng = np.random.default_rng(seed)
  fmax = C.max_value(name)
  values = C.representable_values(name)
  mags = np.exp(rng.uniform(np.log(1e-4), np.log(fmax * 1.2), n))
  y = (rng.choice([-1.0, 1.0], n) * mags).astype(np.float32)
  mids = _midpoints(values)
  near = np.concatenate([mids, np.nextafter(mids, np.inf), np.nextafter(mids, -np.inf)])
  return np.concatenate([y, values, near]).astype(np.float32)


@pytest.mark.parametrize("name,dtype", [("fp8", ml_dtypes.float8_e4m3fn),
                                        ("fp4", ml_dtypes.float4_e2m1fn)])
def test_rounding_matches_ml_dtypes_cast(name, dtype):
  y = _test_inputs(name)
  clipped = np.clip(y, -C.max_value(name), C.max_value(name))
  want = clipped.astype(dtype).astype(np.float32)
  np.testing.assert_array_equal(r(y, name), want)


def _e3m0_reference(y):
  """Nearest of the e3m0 grid in the linear domain; ties up, except the 0 / 2^-6 tie -> 0."""
  grid = C.representable_values("e3m0").astype(np.float64)
  pos = grid[grid >= 0]
  mag = np.minimum(np.abs(y.astype(np.float64)), 1.0)
  dist = np.abs(mag[:, None] - pos[None, :])
  best = dist.min(axis=1, keepdims=True)
  ties = dist == best
  pick = np.where(ties, pos[None, :], -1.0).max(axis=1)  # ties: the larger magnitude
  pick = np.where(ties[:, 0] & ties[:, 1], 0.0, pick)  # ... except the tie at 2^-7
  return (np.sign(y) * pick).astype(np.float32)


def test_e3m0_rounding_matches_reference():
  y = _test_inputs("e3m0", seed=3)
  np.testing.assert_array_equal(r(y, "e3m0"), _e3m0_reference(y))


def test_round_to_format_keeps_nan():
  for name in SCALED:
    out = r(np.array([np.nan, 1.0], np.float32), name)
    assert np.isnan(out[0]) and out[1] == 1.0


# ---------------------------------------------------------------------------- 3. scaling


@pytest.mark.parametrize("name", SCALED)
def test_per_block_exact_when_every_block_is_on_its_grid(name):
  rng = np.random.default_rng(4)
  values = C.representable_values(name)
  fmax = C.max_value(name)
  block, num_blocks = 8, 6
  scales = np.array([1.0, 0.5, 3.0, 2.0**-30, 0.0, 1.75 * 2.0**12], np.float32)
  rows = rng.choice(values, (num_blocks, block))
  rows[:, 3] = fmax * rng.choice([-1.0, 1.0], num_blocks)  # each block's absmax is q_max * s
  x = (rows * scales[:, None]).astype(np.float32).reshape(-1)
  np.testing.assert_array_equal(q(x, name, block_size=block), x)
  np.testing.assert_array_equal(q(x.reshape(4, 12), name, block_size=block), x.reshape(4, 12))
  # One scale for the whole tensor is not exact any more for the small blocks...
  if name != "e3m0":
    assert not np.array_equal(q(x, name), x)
  # ... but the whole tensor's max element is.
  i = np.argmax(np.abs(x))
  assert q(x, name)[i] == x[i]


@pytest.mark.parametrize("name", SCALED)
@pytest.mark.parametrize("block_size", [None, 1, 7, 1000])
def test_max_element_of_each_block_is_exact(name, block_size):
  rng = np.random.default_rng(5)
  n = 300
  x = (rng.standard_normal(n) * np.exp(rng.uniform(-8, 8, n))).astype(np.float32)
  out = q(x, name, block_size)
  bs = n if block_size is None else block_size
  for start in range(0, n, bs):
    xb, ob = x[start:start + bs], out[start:start + bs]
    i = np.argmax(np.abs(xb))
    assert ob[i] == xb[i]
    assert np.all(np.abs(ob) <= np.abs(xb[i]))
  if block_size == 1:
    np.testing.assert_array_equal(out, x)  # every element is its own block's max


@pytest.mark.parametrize("name", SCALED)
def test_error_is_within_half_a_grid_step(name):
  rng = np.random.default_rng(6)
  x = rng.standard_normal((40, 25)).astype(np.float32)
  values = C.representable_values(name)
  half_gap = np.max(np.diff(values)) / 2
  for block_size in (None, 16):
    out = q(x, name, block_size)
    flat = x.reshape(-1)
    bs = flat.size if block_size is None else block_size
    for start in range(0, flat.size, bs):
      xb = flat[start:start + bs]
      s = np.abs(xb).max() / C.max_value(name)
      err = np.abs(out.reshape(-1)[start:start + bs] - xb)
      assert np.all(err <= half_gap * s * (1 + 1e-6))


@pytest.mark.parametrize("name", SCALED)
def test_zeros_give_zeros(name):
  for block_size in (None, 4):
    out = q(np.zeros((3, 5), np.float32), name, block_size)
    assert out.shape == (3, 5) and np.all(out == 0) and not np.any(np.isnan(out))
  x = np.array([0, 0, 0, 0, 1.0, -0.5, 0, 0], np.float32)  # one all-zero block of 4
  np.testing.assert_array_equal(q(x, name, 4), x)


@pytest.mark.parametrize("name", SCALED)
def test_non_finite_poisons_its_block_only(name):
  for bad in (np.nan, np.inf, -np.inf):
    x = np.array([1.0, bad, 0.5, 0.0, 2.0, -1.0, 0.5, 1.0], np.float32)
    out = q(x, name, 4)
    assert np.all(np.isnan(out[:4]))
    np.testing.assert_array_equal(out[4:], q(x[4:], name))
    assert np.all(np.isnan(q(x, name)))  # per-tensor: the whole tensor


def test_bf16_keeps_non_finite():
  out = q(np.array([np.nan, np.inf, -np.inf, 1.0], np.float32), "bf16")
  assert np.isnan(out[0]) and out[1] == np.inf and out[2] == -np.inf and out[3] == 1.0


# ------------------------------------------------------------------- 4. error feedback


def _random_deltas(rng, rounds):
  return [{"w": jnp.asarray(rng.standard_normal((6, 10)).astype(np.float32) * 1e-2),
           "b": [jnp.asarray(rng.standard_normal(7).astype(np.float32))]}
          for _ in range(rounds)]


@pytest.mark.parametrize("name", C.FORMATS)
@pytest.mark.parametrize("block_size", [None, 16])
def test_error_feedback_closes(name, block_size):
  rng = np.random.default_rng(7)
  rounds = 12
  deltas = _random_deltas(rng, rounds)
  step = jax.jit(lambda d, e: C.error_feedback(d, e, name, block_size=block_size))
  residual = jax.tree.map(jnp.zeros_like, deltas[0])
  total_sent = jax.tree.map(jnp.zeros_like, deltas[0])
  for delta in deltas:
    sent, residual = step(delta, residual)
    total_sent = jax.tree.map(jnp.add, total_sent, sent)
    if name == "none":
      assert all(np.all(np.asarray(e) == 0) for e in jax.tree.leaves(residual))
      jax.tree.map(np.testing.assert_array_equal, sent, delta)
  total_delta = jax.tree.map(lambda *ds: sum(ds), *deltas)
  expected = jax.tree.map(jnp.subtract, total_delta, residual)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5),
               total_sent, expected)
  # The residual stays bounded by one round's quantization error, it does not accumulate.
  for leaf in jax.tree.leaves(residual):
    assert np.all(np.isfinite(leaf)) and np.abs(np.asarray(leaf)).max() < 5.0


def test_error_feedback_residual_none_means_zeros():
  delta = {"a": jnp.array([0.3125, 1.0]), "b": jnp.array([[0.1, -0.2]])}
  zeros = jax.tree.map(jnp.zeros_like, delta)
  for name in ("none", "fp4"):
    a = C.error_feedback(delta, None, name)
    b = C.error_feedback(delta, zeros, name)
    jax.tree.map(np.testing.assert_array_equal, a, b)


def test_error_feedback_recovers_what_plain_quantization_loses():
  # A constant delta below e3m0's flush-to-zero threshold is never sent without feedback.
  delta = jnp.array([1.0, 0.005])
  assert C.quantize(delta, "e3m0").tolist() == [1.0, 0.0]
  residual, total = None, np.zeros(2)
  for _ in range(64):
    sent, residual = C.error_feedback(delta, residual, "e3m0")
    total += np.asarray(sent)
  np.testing.assert_allclose(total, 64 * np.asarray(delta) - np.asarray(residual), rtol=1e-6)
  assert total[1] > 0.25


# ---------------------------------------------------------------------- 5. wire bits


def test_wire_bits_exact():
  assert C.wire_bits(1000, "fp4") == 1000 * 4 + 32
  assert C.wire_bits(1000, "fp4", block_size=32) == 1000 * 4 + math.ceil(1000 / 32) * 32 == 5024
  assert C.wire_bits(1000, "e3m0", block_size=1000) == 4032
  assert C.wire_bits(1000, "e3m0", block_size=5000) == 4032
  assert C.wire_bits(1000, "fp8", block_size=1) == 1000 * (8 + 32)
  assert C.wire_bits(1024, "fp8", block_size=128) == 1024 * 8 + 8 * 32
  assert C.wire_bits(1000, "none") == 32000
  assert C.wire_bits(1000, "none", block_size=32) == 32000
  assert C.wire_bits(1000, "bf16") == 16000
  assert C.wire_bits(1, "fp4") == 36
  for name in C.FORMATS:
    assert C.wire_bits(0, name) == 0 and C.wire_bits(0, name, block_size=8) == 0
  assert C.wire_bits(2**40, "fp4") == 2**42 + 32  # Python ints: no overflow


def test_bits_per_element():
  assert [C.bits_per_element(f) for f in C.FORMATS] == [32, 16, 8, 4, 4]


def test_wire_bits_tree():
  tree = {"w": jnp.zeros((10, 100)), "b": [jnp.zeros(7), jax.ShapeDtypeStruct((3, 3), jnp.float32)]}
  assert C.wire_bits_tree(tree, "fp8") == (1000 + 7 + 9) * 8 + 3 * 32
  assert C.wire_bits_tree(tree, "fp4", block_size=8) == (1016 * 4 + (125 + 1 + 2) * 32)
  assert C.wire_bits_tree(tree, "bf16") == 1016 * 16


def test_blocks_in_wire_bits_match_blocks_in_quantize():
  # Changing one element changes exactly the elements of its own block (block count agrees).
  rng = np.random.default_rng(8)
  x = rng.standard_normal(100).astype(np.float32)
  base = q(x, "fp4", 32)
  y = x.copy()
  y[97] = 50.0  # in the last, short block (elements 96..99)
  changed = np.nonzero(q(y, "fp4", 32) != base)[0]
  assert changed.min() >= 96 and C.wire_bits(100, "fp4", block_size=32) == 400 + 4 * 32


# ----------------------------------------------------------- 6. jit, pytrees, errors


@pytest.mark.parametrize("name", C.FORMATS)
def test_jit_matches_eager_and_keeps_shapes(name):
  rng = np.random.default_rng(9)
  for shape, block_size in [((), None), ((3, 5, 7), 4), ((3, 5, 7), None), ((2, 0), 4)]:
    x = jnp.asarray(rng.standard_normal(shape).astype(np.float32))
    eager = C.quantize(x, name, block_size=block_size)
    jitted = jax.jit(lambda t: C.quantize(t, name, block_size=block_size) * 1.0)(x)  # nested
    assert eager.shape == jitted.shape == shape
    assert eager.dtype == jitted.dtype == jnp.float32
    np.testing.assert_array_equal(eager, jitted)


def test_scalar_and_non_float32_inputs():
  for name in C.FORMATS:
    out = C.quantize(jnp.float32(-0.3), name)
    assert out.shape == () and out.dtype == jnp.float32
    if name != "bf16":
      assert float(out) == float(np.float32(-0.3))  # a scalar is its own block's max
  out = C.quantize(jnp.array([1.0, 0.25], jnp.bfloat16), "fp4")
  assert out.dtype == jnp.float32 and out.tolist() == [1.0, 0.25]


def test_quantize_tree():
  tree = {"a": jnp.array([3.0, 0.6]), "b": [jnp.zeros(2), jnp.array([[6.0, -1.25]])]}
  out = jax.jit(lambda t: C.quantize_tree(t, "fp4"))(tree)
  assert jax.tree.structure(out) == jax.tree.structure(tree)
  assert out["a"].tolist() == [3.0, 0.5]
  assert out["b"][0].tolist() == [0.0, 0.0]
  assert out["b"][1].tolist() == [[6.0, -1.0]]
  jax.tree.map(np.testing.assert_array_equal, C.quantize_tree(tree, "none"), tree)


@pytest.mark.parametrize("call", [
    lambda: C.validate_format("fp16"),
    lambda: C.validate_format(None),
    lambda: C.bits_per_element("FP8"),
    lambda: C.quantize(jnp.ones(3), "int8"),
    lambda: C.quantize_tree({"a": jnp.ones(3)}, ""),
    lambda: C.wire_bits(10, "e2m1"),
    lambda: C.error_feedback(jnp.ones(3), None, "fp2"),
])
def test_unknown_format_is_a_one_line_value_error(call):
  with pytest.raises(ValueError) as info:
    call()
  message = str(info.value)
  assert "\n" not in message and "compression" in message
  for name in C.FORMATS:
    assert repr(name) in message


@pytest.mark.parametrize("block_size", [0, -1, 2.5, True, "8"])
@pytest.mark.parametrize("call", [
    lambda bs: C.quantize(jnp.ones(3), "fp4", block_size=bs),
    lambda bs: C.quantize(jnp.ones(3), "none", block_size=bs),
    lambda bs: C.quantize_tree([jnp.ones(3)], "fp8", block_size=bs),
    lambda bs: C.wire_bits(10, "e3m0", block_size=bs),
    lambda bs: C.error_feedback(jnp.ones(3), None, "fp8", block_size=bs),
])
def test_bad_block_size_is_a_one_line_value_error(call, block_size):
  with pytest.raises(ValueError) as info:
    call(block_size)
  message = str(info.value)
  assert "\n" not in message and "block_size" in message


def test_bad_num_elements():
  for n in (-1, 2.0, True):
    with pytest.raises(ValueError, match="num_elements"):
      C.wire_bits(n, "fp4")
