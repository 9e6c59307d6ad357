"""What a run writes under ``out``, and its removal when a new run takes the folder (``overwrite``).

A run writes ``checkpoints/`` (:mod:`diloco_core.store.checkpoint`), ``final_params/``
(:mod:`diloco_core.store.params_io`), ``metrics.jsonl`` and ``summary.json``.
:func:`remove_run_files` removes the first two by their own markers and the summary, and
nothing it does not recognise.
"""

from __future__ import annotations

import os
import shutil

from diloco_core.store.checkpoint import FINAL_PARAMS, TMP_MARK, checkpoints_dir, is_run_checkpoint
from diloco_core.store.params_io import remove_exported


def remove_run_files(out: str) -> list[str]:
  """Removes what runs write under ``out`` (checkpoints, set-aside and unfinished ones,
  ``summary.json``; ``final_params`` by its manifest,
  :func:`diloco_core.store.params_io.remove_exported`) and nothing else; returns the paths left
  (foreign files).

  An entry of ``checkpoints/`` is the run's when it carries the checkpoint marker
  (:func:`~diloco_core.store.checkpoint.is_run_checkpoint`), or is an interrupted save (``*.orbax-checkpoint-tmp*``).
  """
  foreign = []
  d = checkpoints_dir(out)
  for name in sorted(os.listdir(d)) if os.path.isdir(d) else []:
    path = os.path.join(d, name)
    step = name.split(".", 1)[0]
    if step.isdigit() and (TMP_MARK in name or is_run_checkpoint(path)):
      shutil.rmtree(path, ignore_errors=True)
    else:
      foreign.append(path)
  foreign += remove_exported(os.path.join(os.path.abspath(out), FINAL_PARAMS))
  if os.path.isfile(os.path.join(out, "summary.json")):
    os.remove(os.path.join(out, "summary.json"))
  return foreign
