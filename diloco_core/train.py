"""Train one run: ``train(config)`` in Python, ``python -m diloco_core.train`` on the command line.

``python -m diloco_core.train --algorithm diloco --replicas 4 --sync-every 50 --out runs/x``
trains the built-in transformer on the built-in data (or a local file) and writes
``metrics.jsonl`` (one row per logged step) and ``summary.json`` to ``--out``.

This module gathers the trainer's entry points; they live in
:mod:`~diloco_core.run.config` (:class:`TrainConfig`), :mod:`~diloco_core.run.loop`
(:func:`train`, :class:`TrainResult`), :mod:`~diloco_core.run.programs` (the inner optimizer
and the program cache), :mod:`~diloco_core.run.drops` (simulated replica drops) and
:mod:`~diloco_core.run.cli` (the command line).
"""

from __future__ import annotations

import sys

from diloco_core.run.cli import main
from diloco_core.run.flags import build_parser, config_from_args
from diloco_core.run.drops import participation
from diloco_core.run.loop import TrainResult, train
from diloco_core.algorithm.optimizers import inner_optimizer_factory
from diloco_core.run.programs import clear_program_cache, make_algorithm
from diloco_core.run.programs import program_key
from diloco_core.run.config import TrainConfig, parse_drop_schedule

__all__ = ["TrainConfig", "TrainResult", "build_parser", "clear_program_cache", "config_from_args",
           "inner_optimizer_factory", "main", "make_algorithm", "parse_drop_schedule",
           "participation", "program_key", "train"]

if __name__ == "__main__":
  sys.exit(main())
