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

Examples:
  >>> maxtext_overrides(["--algorithm", "dp", "--replicas", "2"])
  ['enable_diloco=false', 'dcn_data_parallelism=2']
"""

from __future__ import annotations

from typing import Sequence

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
