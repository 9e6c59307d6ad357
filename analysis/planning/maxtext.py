"""The MaxText config overrides that run a planned schedule on MaxText's DiLoCo trainer.

The planner (:func:`~analysis.planning.plan.plan_run`) states its choice as this trainer's flags
(:meth:`~analysis.planning.plan.Plan.train_args`); a real multi-slice run of Qwen3-8B or
Qwen3-30B-A3B is MaxText's job (it shards the model over a slice's chips; this trainer
replicates it and trains the built-in presets). The two name the same schedule differently:

* ``--algorithm diloco``: ``enable_diloco=true`` (``streaming``: also ``enable_streaming_diloco=true``;
  ``dp``: ``enable_diloco=false`` and ``dcn_data_parallelism=M``);
* ``--replicas M``: ``dcn_diloco_parallelism=M`` (one replica per slice);
* ``--sync-every H``: ``diloco_sync_period=H`` (MaxText rounds H to a multiple of its fragment count);
* ``--fragments P``: ``num_diloco_fragments=P-1`` (MaxText adds the non-layer fragment itself);
* ``--overlap τ``: ``num_communication_overlapping_steps``; ``--alpha α``:
  ``communication_overlapping_alpha``;
* ``--outer-lr η``: ``diloco_outer_lr``; ``--outer-momentum μ``: ``diloco_outer_momentum``.

MaxText's fragment order is this trainer's ``--fragment-order embeddings-last`` (the semantics
page compares the two schedules). Wire formats, top-k payloads and eager outer updates have
no MaxText key: :func:`maxtext_overrides` refuses them in one line.

:func:`maxtext_command` writes a planned run as a whole MaxText command line: the schedule's
keys, the outer optimizer, the model, the batch and the mesh of the plan (the slice's chips
shard the model, FSDP, as the planner's memory column assumes; one DiLoCo replica per slice
over DCN). :data:`PUBLISHED` holds MaxText's own values for its three DiLoCo recipes, as the
documentation PR of its DiLoCo tutorial ("[DiLoCo] Add Docs for Streaming DiLoCo",
``docs/tutorials/diloco_pretraining.md``) summarizes them, and :func:`side_by_side` sets them
beside a plan's.

Examples:
  >>> maxtext_overrides(["--algorithm", "dp", "--replicas", "2"])
  ['enable_diloco=false', 'dcn_data_parallelism=2']
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import pandas as pd

#: Trainer flag -> MaxText key, for the flags whose value carries over as it is.
KEYS = {"--replicas": "dcn_diloco_parallelism", "--sync-every": "diloco_sync_period",
        "--overlap": "num_communication_overlapping_steps", "--alpha": "communication_overlapping_alpha",
        "--outer-lr": "diloco_outer_lr", "--outer-momentum": "diloco_outer_momentum"}
#: Flags that MaxText has no key for, and what becomes of them.
NO_KEY = {"--compression": "MaxText has no wire-format option",
          "--outer-overlap": "MaxText has no eager or delayed outer update",
          "--topk": "MaxText sends dense pseudo-gradients"}


def maxtext_overrides(train_args: Sequence[str], *, keep_wire: bool = False) -> list[str]:
  """MaxText's ``key=value`` overrides for a planned schedule (``Plan.train_args()``).

  Args:
    train_args: the trainer's flags, ``--flag value`` pairs.
    keep_wire: accept a ``--compression`` of ``bf16`` (the planner's 16-bit default) and leave it
      out (MaxText has no wire-format option); any other flag of :data:`NO_KEY` is refused.

  Returns:
    The overrides, in the order of the table above.

  Raises:
    ValueError: a flag MaxText has no key for (one line naming it and why).

  Examples:
    >>> maxtext_overrides(["--algorithm", "streaming", "--replicas", "2", "--sync-every", "10",
    ...                    "--fragments", "10", "--overlap", "1", "--compression", "bf16"], keep_wire=True)
    ['enable_diloco=true', 'enable_streaming_diloco=true', 'dcn_diloco_parallelism=2', 'diloco_sync_period=10', 'num_diloco_fragments=9', 'num_communication_overlapping_steps=1']
    >>> maxtext_overrides(["--algorithm", "diloco", "--topk", "8"])
    Traceback (most recent call last):
    ...
    ValueError: --topk has no MaxText key: MaxText sends dense pseudo-gradients.
  """
  args = dict(zip(train_args[::2], train_args[1::2]))
  for flag, why in NO_KEY.items():
    if flag in args and not (flag == "--compression" and keep_wire and args[flag] == "bf16"):
      raise ValueError(f"{flag} has no MaxText key: {why}.")
  algorithm = args.get("--algorithm", "diloco")
  if algorithm == "dp":
    return ["enable_diloco=false", f"dcn_data_parallelism={args.get('--replicas', 1)}"]
  out = ["enable_diloco=true", f"enable_streaming_diloco={'true' if algorithm == 'streaming' else 'false'}"]
  for flag in ("--replicas", "--sync-every"):
    if flag in args:
      out.append(f"{KEYS[flag]}={args[flag]}")
  if algorithm == "streaming":
    out.append(f"num_diloco_fragments={int(args.get('--fragments', 1)) - 1}")
  for flag in ("--overlap", "--alpha", "--outer-lr", "--outer-momentum"):
    if flag in args:
      out.append(f"{KEYS[flag]}={args[flag]}")
  return out


#: The planner's catalog names (:mod:`analysis.planning.models`) of the models MaxText's DiLoCo
#: tutorial trains, and MaxText's ``model_name`` for each.
MODEL_NAMES = {"qwen3-8b": "qwen3-8b", "qwen3-30b-a3b": "qwen3-30b-a3b"}
#: MaxText's training entry point and base config, run on every host of every slice (its
#: multi-slice launch, e.g. with xpk); the paths are those of a MaxText checkout with ``src/``.
LAUNCH = ("python3", "-m", "MaxText.train", "src/MaxText/configs/base.yml")
#: The tutorial's advice on the outer learning rate: 0.3 to 0.9, lower for a higher inner one.
OUTER_LR_RANGE = (0.3, 0.9)
#: What :func:`side_by_side` shows for a value the summary of MaxText's tutorial does not state.
NOT_STATED = "not stated"


@dataclasses.dataclass(frozen=True)
class Published:
  """One recipe of MaxText's DiLoCo tutorial, as its documentation PR states it (None: not stated)."""

  title: str
  model: str  # a key of MODEL_NAMES
  algorithm: str  # "diloco" or "streaming"
  hardware: str | None  # as written there
  slices: int | None  # M: one DiLoCo replica per slice
  chips_per_slice: int | None  # a v5p-128 slice: 128 TensorCores, 2 a chip
  sync_every: int | None  # H
  fragments: int | None  # P, the non-layer fragment included (H = P = L + 1: P = 37 for L = 36)
  dataset_type: str | None  # MaxText's data pipeline ("grain": Grain)


#: MaxText's three DiLoCo recipes. Outer learning rate: :data:`OUTER_LR_RANGE`; outer optimizer:
#: Nesterov momentum (its value is not stated); the tuning heuristic: :math:`H = P = L + 1`.
PUBLISHED = {
    1: Published("Vanilla DiLoCo multi-slice pre-training", "qwen3-8b", "diloco", "2x v5p-128", 2, 64,
                 None, None, None),
    2: Published("Streaming DiLoCo dense pre-training", "qwen3-8b", "streaming", "2x v5p-128", 2, 64,
                 37, 37, None),
    3: Published("Streaming DiLoCo MoE pre-training", "qwen3-30b-a3b", "streaming", None, None, None,
                 None, None, "grain"),
}


def maxtext_command(plan, label: str | None = None, *, outer_lr: float, outer_momentum: float,
                    extra: Sequence[str] = (),
                    run_name: str = "RUN", output: str = "gs://BUCKET/runs") -> list[str]:
  """The MaxText command line of a plan's row: :data:`LAUNCH` and every override it needs.

  Args:
    plan: a :class:`~analysis.planning.plan.Plan` of a model of :data:`MODEL_NAMES`.
    label: a row of ``plan.table`` (default: the plan's choice).
    outer_lr: η (``diloco_outer_lr``; the planner does not choose it: this trainer's
      ``--outer-lr`` default, for instance, ``DiLoCoConfig().outer_lr``).
    outer_momentum: Nesterov μ (``diloco_outer_momentum``).
    extra: more overrides (the data: ``dataset_type=grain`` ...), appended.
    run_name: MaxText's ``run_name``.
    output: MaxText's ``base_output_directory``.

  Returns:
    The argv: the launch, ``run_name`` and ``base_output_directory``, the model
    (``model_name``), the batch (``per_device_batch_size``: the plan's global batch over every
    chip, ``max_target_length``), the mesh (``ici_fsdp_parallelism``: the slice's chips), then
    :func:`maxtext_overrides` of the row's trainer options with η and μ (for DiLoCo and
    Streaming: ``dcn_diloco_parallelism`` = M, the schedule, the outer optimizer), then ``extra``.

  Raises:
    ValueError: the plan's model is not one MaxText's tutorial names, or the row has a flag
      MaxText has no key for.

  Examples:
    >>> from analysis.planning.plan import plan_run
    >>> p = plan_run("qwen3-8b", "v5p", slices=2, chips_per_slice=64, seq_len=4096,
    ...              global_batch_tokens=2**21, link_gbps=20)
    >>> print(" ".join(maxtext_command(p, outer_lr=0.7, outer_momentum=0.9)))  # doctest: +NORMALIZE_WHITESPACE
    python3 -m MaxText.train src/MaxText/configs/base.yml run_name=RUN
    base_output_directory=gs://BUCKET/runs model_name=qwen3-8b per_device_batch_size=4
    max_target_length=4096 ici_fsdp_parallelism=64 enable_diloco=true enable_streaming_diloco=true
    dcn_diloco_parallelism=2 diloco_sync_period=20 num_diloco_fragments=9
    num_communication_overlapping_steps=0 diloco_outer_lr=0.7 diloco_outer_momentum=0.9
  """
  if not isinstance(plan.model, str) or plan.model.lower() not in MODEL_NAMES:
    raise ValueError(f"MaxText's DiLoCo tutorial names the models {sorted(MODEL_NAMES)}; the plan's model is"
                     f" {plan.model!r}.")
  per_device = plan.global_batch_tokens / (plan.slices * plan.chips_per_slice * plan.seq_len)
  schedule = [*plan.train_args(label), "--outer-lr", f"{outer_lr:g}", "--outer-momentum", f"{outer_momentum:g}"]
  return [*LAUNCH, f"run_name={run_name}", f"base_output_directory={output}",
          f"model_name={MODEL_NAMES[plan.model.lower()]}", f"per_device_batch_size={per_device:g}",
          f"max_target_length={plan.seq_len}", f"ici_fsdp_parallelism={plan.chips_per_slice}",
          *maxtext_overrides(schedule, keep_wire=True), *extra]


def published_overrides(recipe: Published) -> dict[str, str]:
  """A published recipe in MaxText's keys (:data:`NOT_STATED` where the source gives no value).

  Examples:
    >>> r = published_overrides(PUBLISHED[2])
    >>> r["diloco_sync_period"], r["num_diloco_fragments"], r["diloco_outer_lr"]
    ('37', '36', '0.3 to 0.9')
  """
  def stated(value, show=str):
    return NOT_STATED if value is None else show(value)
  return {"hardware": stated(recipe.hardware), "model_name": MODEL_NAMES[recipe.model],
          "enable_diloco": "true", "enable_streaming_diloco": str(recipe.algorithm == "streaming").lower(),
          "dcn_diloco_parallelism": stated(recipe.slices),
          "diloco_sync_period": stated(recipe.sync_every),
          "num_diloco_fragments": stated(recipe.fragments, lambda p: str(p - 1)),
          "diloco_outer_lr": f"{OUTER_LR_RANGE[0]:g} to {OUTER_LR_RANGE[1]:g}",
          "dataset_type": stated(recipe.dataset_type)}


def side_by_side(command: Sequence[str], recipe: Published, hardware: str) -> pd.DataFrame:
  """MaxText's published values beside a planned command's overrides (:func:`maxtext_command`).

  Args:
    command: the planned MaxText argv.
    recipe: the published recipe.
    hardware: the plan's hardware, in words.

  Returns:
    One row per key of the command (and ``hardware``, ``dataset_type``), the columns ``MaxText
    (published)`` and ``planned``; a key the source gives no value for reads
    :data:`NOT_STATED`; a key the command does not set reads ``–``.

  Examples:
    >>> t = side_by_side(["python3", "diloco_sync_period=20"], PUBLISHED[2], "2 x 64 v5p chips")
    >>> t.loc["diloco_sync_period"].tolist(), t.loc["hardware"].tolist()
    (['37', '20'], ['2x v5p-128', '2 x 64 v5p chips'])
  """
  planned = {"hardware": hardware, **dict(a.split("=", 1) for a in command if "=" in a)}
  published = published_overrides(recipe)
  keys = ["hardware", *[k for k in planned if k != "hardware"], *[k for k in published if k not in planned]]
  return pd.DataFrame({"MaxText (published)": [published.get(k, NOT_STATED) for k in keys],
                       "planned": [planned.get(k, "–") for k in keys]}, index=keys)
