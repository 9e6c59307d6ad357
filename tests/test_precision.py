"""Mixed precision, fused attention, remat and backend-proof rounding (issue: the trainer on accelerators)."""

import ast
import dataclasses
import json
import math
import os
import pathlib
import subprocess
import sys
import textwrap

import jax
import jax.extend.core
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest
from flax import nnx

from diloco_core import DiLoCo, DiLoCoConfig, ModelConfig, get_preset, init_model, layer_mask, lm_loss
from diloco_core.wire import compression as C
from diloco_core.model.transformer import Transformer, split_params
from tiny_run import xla_flags

ROOT = pathlib.Path(__file__).resolve().parents[1]
BF16 = dataclasses.replace(get_preset("tiny"), compute_dtype="bfloat16")


def _tokens(cfg, shape=(3, 17), seed=0):
  return jnp.asarray(np.random.default_rng(seed).integers(0, cfg.vocab_size, shape), jnp.int32)


def _primitives(jaxpr):
  """Every equation of a closed jaxpr, sub-jaxprs (scan, checkpoint, pjit) included."""
  for eqn in jaxpr.eqns:
    yield eqn
    for sub in jax.extend.core.jaxprs_in_params(eqn.params):
      yield from _primitives(sub)


# ------------------------------------------------------------------ 1. mixed precision


def test_the_model_resolves_its_compute_dtype_and_refuses_others():
  assert ModelConfig().compute_dtype is None  # the backend's default (float32 on CPU)
  resolved = Transformer(get_preset("tiny"), rngs=nnx.Rngs(0)).cfg
  assert resolved.compute_dtype == "float32" and resolved.attention == "xla"  # suite: float32
  assert Transformer(BF16, rngs=nnx.Rngs(0)).cfg.compute_dtype == "bfloat16"
  with pytest.raises(ValueError, match=r"ModelConfig.compute_dtype must be one of \('float32', 'bfloat16'\)"):
    ModelConfig(compute_dtype="float16")


def test_bf16_forward_equals_the_model_run_on_hand_cast_params():
  """The only thing bf16 changes is the dtype the params are cast to at the top of the forward."""
  apply_fn, params = init_model(BF16, 0)
  graphdef, _ = split_params(Transformer(BF16, rngs=nnx.Rngs(0)))
  hand_cast = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params)
  tokens = _tokens(BF16)
  out = jax.jit(apply_fn)(params, tokens)
  ref = jax.jit(lambda p, t: nnx.merge(graphdef, p)(t))(hand_cast, tokens)
  assert out.dtype == jnp.float32 and ref.dtype == jnp.float32
  np.testing.assert_array_equal(np.asarray(out), np.asarray(ref))


def test_bf16_matmuls_take_bf16_and_norms_softmax_loss_run_in_float32():
  apply_fn, params = init_model(BF16, 0)
  tokens = _tokens(BF16)
  jaxpr = jax.make_jaxpr(lambda p: lm_loss(apply_fn, p, tokens))(params).jaxpr
  eqns = list(_primitives(jaxpr))
  dots = [e for e in eqns if e.primitive.name == "dot_general"]
  assert len(dots) >= 9  # q, k, v, scores, values, out, 3 MLP matrices (scanned once) + head
  assert all(v.aval.dtype == jnp.bfloat16 for e in dots for v in e.invars)
  exps = [e for e in eqns if e.primitive.name == "exp"]  # softmax and the loss's logsumexp
  assert exps and all(e.invars[0].aval.dtype == jnp.float32 for e in exps)
  rsqrts = [e for e in eqns if e.primitive.name == "rsqrt"]  # 2 per block + the final norm
  assert len(rsqrts) == 3 and all(e.invars[0].aval.dtype == jnp.float32 for e in rsqrts)


def test_bf16_loss_and_gradients_are_float32_and_close_to_float32_compute():
  tokens = _tokens(BF16)
  losses = {}
  for dtype in ("float32", "bfloat16"):
    apply_fn, params = init_model(dataclasses.replace(BF16, compute_dtype=dtype), 0)
    loss, grads = jax.jit(jax.value_and_grad(lambda p: lm_loss(apply_fn, p, tokens)))(params)
    assert loss.dtype == jnp.float32
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))
    losses[dtype] = float(loss)
  assert losses["bfloat16"] != losses["float32"]  # it did compute in bf16
  assert abs(losses["bfloat16"] - losses["float32"]) < 1e-2 * losses["float32"]


def test_diloco_state_with_bf16_compute_is_float32_everywhere():
  apply_fn, params = init_model(BF16, 0)
  config = DiLoCoConfig(algorithm="streaming", replicas=2, sync_every=2, fragments=2, overlap=1,
                        compression="bf16", error_feedback=True)
  algo = DiLoCo(lambda p, x: lm_loss(apply_fn, p, x), optax.adamw(1e-3), config,
                layer_mask=layer_mask(params))
  state = algo.init(params)
  batch = algo.place_batch(np.asarray(_tokens(BF16, (2, 2, 9))))
  for _ in range(3):  # through a send (t = 1) and its merge (t = 2)
    state, _ = algo.step(state, batch)
  for name in ("params", "opt_state", "global_params", "outer_state", "ef_residual", "participants"):
    leaves = [x for x in jax.tree.leaves(getattr(state, name)) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert leaves, name
    assert all(x.dtype == jnp.float32 for x in leaves), name


# ------------------------------------------------------------------ 2. attention, remat


def _explicit_attention_block_output(cfg, params, tokens):
  """The model before fused attention: explicit float32 T x T scores, a tril mask, softmax."""
  from diloco_core.model import transformer as M

  def old_block(cfg_, x, w):
    t = x.shape[-2]
    h = M._rms_norm(x, w["attn_norm"])
    q = jnp.einsum("btd,dhk->bthk", h, w["wq"])
    k = jnp.einsum("btd,dhk->bthk", h, w["wk"])
    v = jnp.einsum("btd,dhk->bthk", h, w["wv"])
    if cfg_.positions == "rope":
      q, k = M._rope(q, jnp.arange(t)), M._rope(k, jnp.arange(t))
    groups = cfg_.n_heads // cfg_.kv_heads
    k, v = jnp.repeat(k, groups, axis=2), jnp.repeat(v, groups, axis=2)
    logits = jnp.einsum("bqhk,bshk->bhqs", q, k).astype(jnp.float32) / math.sqrt(cfg_.head_dim)
    logits = jnp.where(jnp.tril(jnp.ones((t, t), dtype=bool)), logits, jnp.finfo(jnp.float32).min)
    attn = jnp.einsum("bhqs,bshk->bqhk", jax.nn.softmax(logits, axis=-1).astype(v.dtype), v)
    x = x + jnp.einsum("bthk,hkd->btd", attn, w["wo"])
    h = M._rms_norm(x, w["mlp_norm"])
    return x + (jax.nn.silu(h @ w["w_gate"]) * (h @ w["w_up"])) @ w["w_down"]

  apply_fn, _ = init_model(cfg, 0)
  original = M._block
  M._block = old_block
  try:
    return jax.jit(apply_fn)(params, tokens)
  finally:
    M._block = original


@pytest.mark.parametrize("changes", [{}, {"n_kv_heads": 1}, {"positions": "learned", "d_model": 24, "n_heads": 2}])
def test_fused_attention_matches_explicit_attention(changes):
  """Within float32 rounding (|diff| <= 1e-6 + 1e-6 |x|; on XLA:CPU it is in fact bit-identical)."""
  cfg = dataclasses.replace(get_preset("tiny"), compute_dtype="float32", **changes)
  apply_fn, params = init_model(cfg, 0)
  tokens = _tokens(cfg)
  new = jax.jit(apply_fn)(params, tokens)
  old = _explicit_attention_block_output(cfg, params, tokens)
  np.testing.assert_allclose(np.asarray(new), np.asarray(old), rtol=1e-6, atol=1e-6)


def test_cudnn_attention_is_refused_where_it_cannot_run_before_compiling():
  """On CPU: not a GPU; on a GPU: float32 has no cuDNN flash kernel."""
  with pytest.raises(ValueError, match="ModelConfig.attention='cudnn' is not available: it "):
    init_model(dataclasses.replace(get_preset("tiny"), compute_dtype="float32", attention="cudnn"), 0)


#: How far a recomputed (remat) gradient may be from the stored one off a CPU, relative to the
#: gradient's largest entry. float32 compute: the same operations, fused and so summed in another
#: order, differ by a few float32 roundings of sums over d_model terms (tiny: 16), 2^-24 each
#: (on a TPU v5e: 3e-6 of the largest entry). bfloat16 compute: an accelerator's fusion may keep
#: an intermediate in float32 where the other program stores it as bfloat16, one rounding of 2^-9
#: (relative) more or less per stored activation; through a block's few such activations the
#: gradient moves by a few of them, 2^-6 in all, while a wrong recomputation moves it by O(1).
REMAT_RTOL = {"float32": 2.0 ** -16, "bfloat16": 2.0 ** -6}


@pytest.mark.parametrize("remat", ["block", "dots"])
@pytest.mark.parametrize("compute_dtype", ["float32", "bfloat16"])
def test_remat_gives_identical_gradients(compute_dtype, remat):
  """Bit-identical on XLA:CPU; on an accelerator within :data:`REMAT_RTOL` (fusion order)."""
  cfg = dataclasses.replace(get_preset("tiny"), n_layers=3, compute_dtype=compute_dtype)
  tokens = _tokens(cfg)
  out = {}
  for how in ("none", remat):
    apply_fn, params = init_model(dataclasses.replace(cfg, remat=how), 0)
    out[how] = jax.jit(jax.value_and_grad(lambda p: lm_loss(apply_fn, p, tokens)))(params)
  exact = jax.default_backend() == "cpu"
  if exact:
    assert float(out["none"][0]) == float(out[remat][0])
  else:
    np.testing.assert_allclose(float(out[remat][0]), float(out["none"][0]), rtol=REMAT_RTOL[compute_dtype])
  for a, b in zip(jax.tree.leaves(out["none"][1]), jax.tree.leaves(out[remat][1])):
    if exact:
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    else:
      np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0,
                                 atol=REMAT_RTOL[compute_dtype] * float(jnp.max(jnp.abs(a))))


def test_remat_checkpoints_the_scanned_block_and_bad_values_are_refused():
  cfg = dataclasses.replace(get_preset("tiny"), remat="block")
  apply_fn, params = init_model(cfg, 0)
  jaxpr = jax.make_jaxpr(lambda p: apply_fn(p, _tokens(cfg)))(params).jaxpr
  names = [e.primitive.name for e in _primitives(jaxpr)]
  assert "remat2" in names and "remat2" not in [  # jax.checkpoint, only with remat="block"
      e.primitive.name for e in _primitives(jax.make_jaxpr(lambda p: init_model(
          get_preset("tiny"), 0)[0](p, _tokens(cfg)))(params).jaxpr)]
  with pytest.raises(ValueError, match=r"ModelConfig.remat must be one of \('none', 'dots', 'block'\), got 'all'"):
    ModelConfig(remat="all")
  with pytest.raises(ValueError, match=r"ModelConfig.attention must be one of \('auto', 'xla', 'cudnn', 'flash'\)"):
    ModelConfig(attention="pallas")
  with pytest.raises(ValueError, match=r"ModelConfig.loss_chunk must be an integer >= 0 \(0: whole logits\), got -1"):
    ModelConfig(loss_chunk=-1)


# ------------------------------------------------------------------ 3. backend-proof rounding

_NARROW = ("bfloat16", "float16", "float8", "float4")


def _cast_pairs(source: str) -> list[int]:
  """Lines of ``x.astype(<narrow float>).astype(...)`` calls in Python source (docstrings ignored)."""
  lines = []
  for node in ast.walk(ast.parse(source)):
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "astype"
        and isinstance(node.func.value, ast.Call) and isinstance(node.func.value.func, ast.Attribute)
        and node.func.value.func.attr == "astype"
        and any(n in ast.unparse(node.func.value.args[0]) for n in _NARROW)):
      lines.append(node.lineno)
  return lines


def test_no_rounding_by_cast_pair_in_the_core():
  offenders = {path.name: _cast_pairs(path.read_text())
               for path in sorted((ROOT / "diloco_core").glob("*.py"))}
  assert {name: lines for name, lines in offenders.items() if lines} == {}
  assert _cast_pairs("y = x.astype(jnp.bfloat16).astype(jnp.float32)") == [1]  # the check works
  assert _cast_pairs("y = x.astype(jnp.float32).astype(jnp.int32)") == []


def test_bf16_quantize_is_reduce_precision_not_a_cast():
  names = [e.primitive.name for e in _primitives(jax.make_jaxpr(lambda x: C.quantize(x, "bf16"))(
      jnp.ones(4)).jaxpr)]
  assert "reduce_precision" in names
  assert "convert_element_type" not in names


_EXCESS_PRECISION_SCRIPT = textwrap.dedent("""
    import json, jax, jax.numpy as jnp, numpy as np
    from diloco_core.wire import compression as C
    cases = {
        "bf16": [1 + 2.0**-8, 1 + 3 * 2.0**-8, 1 + 2.0**-8 + 2.0**-20, -(1 + 2.0**-8), 2.0**-130,
                 3.4e38, 1.0 / 3.0],
        "fp8": [448.0, 0.5, 0.53125, 0.5625, -0.546875, 3.0],
        "fp4": [0.25, -0.875, 1.5, 3.0],
        "e3m0": [1.0, 0.75, 0.74, 2.0**-7, 0.3],
    }
    # Inside a larger jitted function, where the compiler may fuse a cast pair away.
    f = jax.jit(lambda x, name: C.quantize(x + 0.0, name) * 2.0, static_argnums=1)
    out = {name: C.quantize(jnp.array(v, jnp.float32), name).tolist() for name, v in cases.items()}
    out["bf16_fused"] = f(jnp.array([1 + 2.0**-8], jnp.float32), "bf16").tolist()
    out["random"] = np.asarray(C.quantize(jnp.asarray(np.random.default_rng(0).standard_normal(4096),
                                                      jnp.float32), "bf16")).tolist()
    print(json.dumps(out))
""")


def test_quantize_is_exact_when_xla_may_use_excess_precision():
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
             XLA_FLAGS=xla_flags(8, "--xla_allow_excess_precision=true"))
  proc = subprocess.run([sys.executable, "-c", _EXCESS_PRECISION_SCRIPT], env=env, cwd=ROOT,
                        capture_output=True, text=True, timeout=300, check=True)
  out = json.loads(proc.stdout.strip().splitlines()[-1])
  # bf16: 8 significant bits, ties to even; 1 + 3*2^-8 ties up to the even 1 + 2^-6;
  # above bf16's largest finite value (3.3895e38) a float32 rounds to infinity.
  assert out["bf16"][:4] == [1.0, 1.015625, 1.0078125, -1.0]
  assert out["bf16"][4] == 0.0 or out["bf16"][4] == 2.0**-130  # subnormal: flushed on XLA:CPU
  assert out["bf16"][5] == math.inf and out["bf16"][6] == 0.333984375
  assert out["bf16_fused"] == [2.0]  # (1 + 2^-8) rounds to 1 inside a fused program too
  x = np.asarray(np.random.default_rng(0).standard_normal(4096), np.float32)
  np.testing.assert_array_equal(np.asarray(out["random"], np.float32),
                                x.astype(ml_dtypes.bfloat16).astype(np.float32))
  # fp8: absmax 448 -> scale 1; the grid around 0.5 has spacing 2^-4 (ties to even).
  assert out["fp8"] == [448.0, 0.5, 0.5, 0.5625, -0.5625, 3.0]
  assert out["fp4"] == [0.25, -1.0, 1.5, 3.0]  # scale 1/2: -1.75 is a tie, goes to -2 * 0.5
  assert out["e3m0"] == [1.0, 1.0, 0.5, 0.0, 0.25]  # scale 1 (absmax 1)


# ------------------------------------------------------------------ 4. the Pallas flash kernel (TPU)
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_flash_attention_matches_xla_attention(kv_heads):
  """On a TPU the kernel runs; elsewhere Pallas interprets the same kernel (its TPU interpret
  mode, with 128-position blocks to keep it quick): ``tests/flash_interpret.py`` holds the check
  and its bounds. At the default matmul precision: ``make test-tpu`` sets "highest" for the
  float32 tests, and the inputs here are bfloat16 (one pass of the matrix unit whatever the
  precision).

  Off a TPU the interpretation runs in a process of its own: in a worker of the suite it once
  stalled for good (a plain XLA op waiting after the interpreted kernel's callbacks, with the
  worker's other tests' state around it; never when run alone), and a process of its own holds
  nothing else."""
  from flash_interpret import check_flash_against_xla
  if jax.default_backend() == "tpu":
    with jax.default_matmul_precision("default"):
      check_flash_against_xla(kv_heads)
    return
  r = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "flash_interpret.py"), str(kv_heads)],
                     env=dict(os.environ, XLA_FLAGS=xla_flags(1), JAX_PLATFORMS="cpu"), capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0, r.stderr[-3000:]
  assert r.stdout.strip() == f"flash matches XLA (kv_heads={kv_heads})", r.stdout


def test_flash_attention_is_refused_off_a_tpu_before_compiling():
  if jax.default_backend() == "tpu":
    pytest.skip("on a TPU flash attention runs (test_flash_attention_matches_xla_attention)")
  with pytest.raises(ValueError, match="ModelConfig.attention='flash' \\(the Pallas TPU kernel\\) runs on a TPU only"):
    init_model(dataclasses.replace(get_preset("tiny"), attention="flash"), 0)


def test_flash_attention_refuses_a_sequence_its_tiles_do_not_divide():
  from diloco_core.model.transformer import _flash_attention
  x = jnp.zeros((1, 1000, 2, 128), jnp.bfloat16)
  with pytest.raises(ValueError, match="attention 'flash' needs a sequence length that is at most 128 or a multiple"
                                       " of 128 \\(the kernel's tiles\\), got 1000"):
    _flash_attention(x, x, x)
