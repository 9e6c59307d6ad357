"""Every invalid option raises a clear one-line error before anything compiles."""

import pytest

from diloco_core import DiLoCoConfig, Fragments

BAD = [
    (dict(replicas=0), r"replicas \(M\) must be an integer >= 1, got 0"),
    (dict(replicas=-2), r"replicas \(M\)"),
    (dict(replicas=2.5), r"replicas \(M\)"),
    (dict(sync_every=0), r"sync_every \(H\) must be an integer >= 1"),
    (dict(sync_every=-1), r"sync_every \(H\)"),
    (dict(outer_lr=-0.1), r"outer_lr \(η\) must be a finite number >= 0"),
    (dict(outer_lr=float("nan")), r"outer_lr \(η\)"),
    (dict(outer_momentum=1.0), r"outer_momentum \(μ\) must be a finite number in \[0, 1\)"),
    (dict(outer_momentum=-0.1), r"outer_momentum \(μ\)"),
    (dict(algorithm="fedprox"), r"algorithm must be one of \('dp', 'diloco', 'streaming'\)"),
    (dict(algorithm="streaming", fragments=0), r"fragments \(P\) must be an integer >= 1"),
    (dict(algorithm="diloco", fragments=2), r"needs algorithm='streaming'"),
    (dict(algorithm="streaming", sync_every=10, fragments=3), r"sync_every \(H=10\) must be a multiple of fragments \(P=3\)"),
    (dict(algorithm="streaming", sync_every=6, fragments=3, overlap=-1), r"overlap \(τ\) must be an integer with 0 <= τ < sync_every"),
    (dict(algorithm="streaming", sync_every=6, fragments=3, overlap=6), r"overlap \(τ\)"),
    (dict(alpha=1.5), r"alpha \(α\) must be a finite number in \[0, 1\]"),
    (dict(alpha=-0.01), r"alpha \(α\)"),
    (dict(compression="int8"), r"compression must be one of \('none', 'bf16', 'fp8', 'fp4', 'e3m0'\)"),
    (dict(fragment_pattern="random"), r"fragment_pattern must be one of"),
    (dict(compression_block=0), r"compression_block must be None"),
    (dict(error_feedback="yes"), r"error_feedback must be True or False"),
]


@pytest.mark.parametrize("kwargs,message", BAD)
def test_invalid_options_raise_one_line(kwargs, message):
  with pytest.raises(ValueError, match=message) as e:
    DiLoCoConfig(**kwargs)
  assert "\n" not in str(e.value)


def test_fragments_must_divide_layers():
  cfg = DiLoCoConfig(algorithm="streaming", sync_every=12, fragments=4)
  with pytest.raises(ValueError, match=r"P - 1 must divide the number of layers \(L=4\); allowed P for this model: \[1, 2, 3, 5\]"):
    cfg.validate(num_layers=4)
  cfg.validate(num_layers=6)
  with pytest.raises(ValueError, match=r"P - 1 must divide the number of layers \(L=4\)"):
    Fragments([True], [(4, 2)], fragments=4)
  with pytest.raises(ValueError, match="needs stacked-layer leaves"):
    Fragments([False], [(4, 2)], fragments=2)


def test_valid_values_are_not_rounded():
  cfg = DiLoCoConfig(algorithm="streaming", sync_every=12, fragments=4, overlap=11, alpha=1.0)
  assert cfg.sync_interval == 3 and cfg.overlap == 11
