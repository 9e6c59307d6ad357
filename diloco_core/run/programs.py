"""The trainer's algorithm objects, and the compiled programs kept for the next run in this process.

A sweep over H, τ, η, μ, α or the inner learning rate compiles once: those values are
traced inputs of the step (their fields say so in their metadata, :mod:`diloco_core.spec.fields`),
and ``PROGRAMS.get`` hands a later run the algorithm object of an earlier run with the
same :func:`program_key`, copied with the new values
(:meth:`~diloco_core.algorithm.base.AlgorithmBase.with_hyperparams`).
"""

from __future__ import annotations

import collections
import dataclasses
import json

import jax

from diloco_core.algorithm.base import reported_loss
from diloco_core.devices.backend import resolve_model_config
from diloco_core.algorithm.diloco import DiLoCo
from diloco_core.algorithm.dp import DataParallel
from diloco_core.spec.fields import program_fields, traced_values
from diloco_core.devices.mesh import make_mesh, parse_mesh
from diloco_core.model.transformer import layer_mask, muon_dimensions
from diloco_core.algorithm.optimizers import inner_optimizer_factory
from diloco_core.run.config import TrainConfig


def inner_hyperparams(cfg: TrainConfig) -> dict[str, float]:
  """The run's traced fields (``inner_lr``, ``weight_decay``, ``grad_clip``, ``muon_momentum``,
  ...): the inner optimizer's hyperparameters, fed to the step as float32 scalars."""
  return traced_values(cfg)


def program_key(cfg: TrainConfig, model_cfg) -> str:
  """What the compiled step of ``cfg`` depends on: the fields compiled into the program.

  Those are the fields marked ``program`` (the algorithm's structural fields, batch, sequence
  length, steps, mesh), the model's shape, and what the inner optimizer fixes (the warmup
  length, whether to clip); never a traced hyperparameter or a seed. The model config is
  resolved for this backend first (:func:`~diloco_core.devices.backend.resolve_model_config`), so an
  unresolved config and the resolved one the trainer builds give the same key.

  Examples:
    >>> from diloco_core.algorithm.config import DiLoCoConfig
    >>> a = TrainConfig(inner_lr=1e-3, algo=DiLoCoConfig(outer_lr=0.5))
    >>> b = TrainConfig(inner_lr=3e-3, algo=DiLoCoConfig(outer_lr=0.9), seed=7)
    >>> program_key(a, a.model_config()) == program_key(b, b.model_config())
    True
  """
  key = {name: getattr(cfg, name) for name in program_fields(type(cfg))}
  key["algo"] = {name: getattr(cfg.algo, name) for name in program_fields(type(cfg.algo))}
  key.update(model=dataclasses.asdict(resolve_model_config(model_cfg)), warmup=cfg.warmup, clip=bool(cfg.grad_clip))
  return json.dumps(key, sort_keys=True, default=str)


def make_algorithm(cfg: TrainConfig, loss_fn, params):
  """A new DataParallel or DiLoCo object for ``cfg.algo`` (``params`` gives the layer mask)."""
  hp = inner_hyperparams(cfg)
  opt = inner_optimizer_factory(cfg.steps, cfg.warmup, bool(cfg.grad_clip), cfg.inner_optimizer,
                                muon_dimensions=muon_dimensions)
  mesh = make_mesh(parse_mesh(cfg.mesh))
  if cfg.algo.algorithm == "dp":
    return DataParallel(loss_fn, opt, cfg.algo, mesh=mesh, hyperparams=hp)
  return DiLoCo(loss_fn, opt, cfg.algo, layer_mask=layer_mask(params), mesh=mesh, hyperparams=hp)


class ProgramCache:
  """Compiled programs kept for later runs: program key -> (algorithm, jitted eval loss).

  Args:
    size: how many programs to keep (least recently used ones are dropped).
  """

  def __init__(self, size: int):
    self.size = size
    self._programs: collections.OrderedDict[str, tuple] = collections.OrderedDict()

  def __len__(self) -> int:
    return len(self._programs)

  def __getitem__(self, key: str) -> tuple:
    return self._programs[key]

  def clear(self) -> None:
    self._programs.clear()

  def get(self, cfg: TrainConfig, loss_fn, params, model_cfg):
    """(algorithm, jitted eval loss) for ``cfg``: those of an earlier run of the same program
    (:func:`program_key`), with this run's hyperparameters, or new ones that are kept."""
    key = program_key(cfg, model_cfg)
    if key in self._programs:
      self._programs.move_to_end(key)
      algo, eval_fn = self._programs[key]
      outer = {k: getattr(cfg.algo, k) for k in algo.config_hyperparams}
      return algo.with_hyperparams(**outer, **inner_hyperparams(cfg)), eval_fn
    self._programs[key] = make_algorithm(cfg, loss_fn, params), jax.jit(reported_loss(loss_fn))
    while len(self._programs) > self.size:
      self._programs.popitem(last=False)
    return self._programs[key]


PROGRAM_CACHE_SIZE = 4
#: The programs :func:`diloco_core.train.train` keeps in this process.
PROGRAMS = ProgramCache(PROGRAM_CACHE_SIZE)


def clear_program_cache() -> None:
  """Forgets the compiled programs :func:`diloco_core.train.train` keeps for later runs."""
  PROGRAMS.clear()
