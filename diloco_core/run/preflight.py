"""The pre-flight checks of a run: what the disk and the devices allow, before anything compiles.

:meth:`~diloco_core.run.config.TrainConfig.validate` checks the options alone (no file is read,
no device is asked); :func:`preflight` checks, once, after it and before the model is built:

* the processes and devices: ``communication="background"`` and ``elastic`` against the
  process count, and an elastic run's largest value against what the coordination service
  carries (:func:`~diloco_core.runtime.background_mesh.check_background_processes`,
  :func:`~diloco_core.runtime.elastic.check_elastic_processes`), the mesh against the devices
  (:func:`~diloco_core.devices.mesh.check_mesh`, :func:`~diloco_core.devices.mesh.check_process_mesh`);
* the memory: the state and the logits (on an accelerator, every replica's activations of a
  step, :func:`~diloco_core.spec.activations.step_activation_bytes`) against the devices'
  memory (:func:`~diloco_core.spec.footprint.check_fits`);
* the disk: the ``init_from`` params checkpoint (:func:`~diloco_core.store.params_io.check_params_dir`)
  and the output directory (:func:`~diloco_core.store.out_dir.check_out_dir`,
  :func:`~diloco_core.store.checkpoint.check_no_foreign_steps`).

Every refusal is a one-line ``ValueError`` naming the option in backticks, as ``validate``'s.
"""

from __future__ import annotations

import math

from diloco_core.devices.mesh import check_mesh, check_process_mesh, parse_mesh
from diloco_core.run.config import TrainConfig
from diloco_core.runtime.background_mesh import check_background_processes
from diloco_core.run.syncer_options import check_step_delay_processes
from diloco_core.runtime.elastic import check_elastic_processes
from diloco_core.devices.backend import platform, resolve_model_config
from diloco_core.spec.activations import step_activation_bytes
from diloco_core.spec.footprint import check_fits
from diloco_core.store.checkpoint import check_no_foreign_steps
from diloco_core.store.out_dir import check_out_dir, writes_files
from diloco_core.store.params_io import check_params_dir


def preflight(cfg: TrainConfig) -> None:
  """Raises a one-line ``ValueError`` when the processes, devices or disk cannot hold the run.

  Call it after ``cfg.validate()`` and before anything compiles (``train`` does both).

  Args:
    cfg: a run config whose options :meth:`~diloco_core.run.config.TrainConfig.validate` accepted.

  Returns:
    None.

  Examples:
    >>> preflight(TrainConfig(model="tiny"))
    >>> preflight(TrainConfig(model="tiny", init_from="/nonexistent/final_params"))
    Traceback (most recent call last):
    ...
    ValueError: init_from: params checkpoint '/nonexistent/final_params' does not exist; pass the final_params/ directory of a finished run.
  """
  check_processes(cfg)
  M, mesh = cfg.algo.replicas, parse_mesh(cfg.mesh)
  devices = 1 if mesh is None else math.prod(mesh.values())
  vocab = cfg.vocab_size or cfg.data.vocab_size  # the data's vocabulary is only known later
  model = cfg.model_config(vocab_size=vocab)
  activations = None
  if platform() != "cpu":  # an accelerator's memory is its own: count the step's activations too
    per_replica = step_activation_bytes(resolve_model_config(model), cfg.batch_size, cfg.seq_len)
    activations = M * per_replica.total
  check_fits(cfg.planned_param_count(), replicas=M, outer=cfg.algo.algorithm != "dp",
             outer_optimizer=cfg.algo.outer_optimizer, tokens=M * cfg.batch_size * cfg.seq_len,
             vocab=vocab, devices=devices, experts=model.num_experts, activations=activations,
             remat=model.remat)
  if cfg.init_from is not None and not cfg.resume:
    try:  # the files now; their shapes once the model is known (init_model)
      check_params_dir(cfg.init_from)
    except ValueError as e:
      raise ValueError(f"init_from: {e}") from None
  if cfg.out is not None:  # only the process that writes may create (and remove) `out` to probe it
    # elastic: the writer checked `out` at start; a replacement joins the run that is in it
    check_out_dir(cfg.out, cfg.overwrite or (cfg.elastic and not writes_files()), cfg.resume,
                  probe=writes_files())
    if cfg.checkpoint_every:
      check_no_foreign_steps(cfg.out)


def check_processes(cfg: TrainConfig, processes: int | None = None, num_devices: int | None = None) -> None:
  """Raises a one-line ``ValueError`` when the processes and their devices cannot hold the run:
  ``communication="background"`` and ``elastic`` against the process count, the mesh against
  the devices (every device, in-step over several processes).

  :func:`preflight` calls it with JAX's counts; the launcher (:mod:`diloco_core.launch`) with its
  own, before it starts any process.

  Args:
    cfg: a run config whose options :meth:`~diloco_core.run.config.TrainConfig.validate` accepted.
    processes: the process count (default: JAX's).
    num_devices: the devices of every process together (default: JAX's; with ``processes`` and
      without it, the mesh is checked against the devices only where they are known).

  Returns:
    None.

  Examples:
    >>> check_processes(TrainConfig(model="tiny"), processes=2, num_devices=2)
    Traceback (most recent call last):
    ...
    ValueError: an in-step run over 2 processes needs a `mesh` over all 2 devices of the processes (e.g. `mesh`='diloco=2,data=1'), or `communication` background.
    >>> check_processes(TrainConfig(model="tiny", mesh="diloco=2,data=1"), processes=2, num_devices=2)
  """
  if cfg.communication == "background":
    check_background_processes(cfg, processes)
    if cfg.syncer.step_delay:
      import jax  # pylint: disable=import-outside-toplevel
      check_step_delay_processes(cfg.syncer, jax.process_count() if processes is None else processes)
  check_elastic_processes(cfg, processes)
  mesh = parse_mesh(cfg.mesh)
  known = processes is None or num_devices is not None  # the launcher may not know a process's devices
  if mesh is not None and known:
    check_mesh(mesh, replicas=cfg.algo.replicas, batch_size=cfg.batch_size, num_devices=num_devices)
  if cfg.communication == "in-step" and (known or mesh is None):  # one SPMD program over every device
    check_process_mesh(mesh, replicas=cfg.algo.replicas, batch_size=cfg.batch_size, processes=processes,
                       num_devices=num_devices if num_devices is not None else processes)
