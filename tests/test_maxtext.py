"""analysis.planning.maxtext: a plan's whole MaxText command, and MaxText's published recipes beside it."""

import pytest

from analysis.planning import maxtext as mt
from analysis.planning.models import get_model
from analysis.planning.plan import plan_run

KW = dict(slices=2, chips_per_slice=64, seq_len=4096, global_batch_tokens=2 * 64 * 4 * 4096)
OUTER = dict(outer_lr=0.7, outer_momentum=0.9)


def keys(cmd):
  return dict(a.split("=", 1) for a in cmd if "=" in a)


def test_the_command_has_model_batch_mesh_schedule_and_outer_optimizer():
  p = plan_run("qwen3-8b", "v5p", link_gbps=25, **KW)
  cmd = mt.maxtext_command(p, "DiLoCo H=20", **OUTER)
  assert cmd[:4] == list(mt.LAUNCH)
  k = keys(cmd)
  # 2 slices x 64 chips x 4 sequences of 4096 tokens: 4 sequences per chip.
  assert (k["model_name"], k["per_device_batch_size"], k["max_target_length"]) == ("qwen3-8b", "4", "4096")
  assert (k["ici_fsdp_parallelism"], k["dcn_diloco_parallelism"]) == ("64", "2")
  assert (k["enable_diloco"], k["enable_streaming_diloco"], k["diloco_sync_period"]) == ("true", "false", "20")
  assert (k["diloco_outer_lr"], k["diloco_outer_momentum"]) == ("0.7", "0.9")
  assert "num_diloco_fragments" not in k
  streaming = keys(mt.maxtext_command(p, "Streaming H=37 P=37 tau=1", outer_lr=0.5, outer_momentum=0.9,
                                      extra=["dataset_type=grain"]))
  assert (streaming["num_diloco_fragments"], streaming["num_communication_overlapping_steps"]) == ("36", "1")
  assert (streaming["diloco_outer_lr"], streaming["dataset_type"]) == ("0.5", "grain")
  dp = keys(mt.maxtext_command(p, "DP", **OUTER))
  assert (dp["enable_diloco"], dp["dcn_data_parallelism"]) == ("false", "2") and "diloco_outer_lr" not in dp


def test_a_model_maxtexts_tutorial_does_not_name_is_one_line():
  p = plan_run("llama3-70b", "v5p", link_gbps=25, **KW)
  with pytest.raises(ValueError, match=r"^MaxText's DiLoCo tutorial names the models \['qwen3-30b-a3b', 'qwen3-8b'\]; "
                     r"the plan's model is 'llama3-70b'.$"):
    mt.maxtext_command(p, **OUTER)


def test_published_recipes_and_the_side_by_side_table():
  dense = mt.PUBLISHED[2]
  # "H = P = L + 1" for Qwen3-8B's 36 layers, on 2 v5p-128 slices (128 TensorCores, 64 chips).
  assert dense.sync_every == dense.fragments == get_model("qwen3-8b").n_layers + 1
  assert (dense.slices, dense.chips_per_slice) == (2, 64)
  assert mt.PUBLISHED[3].model == "qwen3-30b-a3b" and mt.PUBLISHED[3].sync_every is None
  p = plan_run("qwen3-8b", "v5p", link_gbps=25, **KW)
  t = mt.side_by_side(mt.maxtext_command(p, "Streaming H=37 P=37 tau=0", **OUTER), dense, "2 x 64 v5p chips")
  assert t.loc["diloco_sync_period"].tolist() == ["37", "37"]
  assert t.loc["num_diloco_fragments"].tolist() == ["36", "36"]
  assert t.loc["diloco_outer_lr"].tolist() == ["0.3 to 0.9", "0.7"]
  assert t.loc["per_device_batch_size"].tolist() == [mt.NOT_STATED, "4"]
  assert t.loc["dataset_type"].tolist() == [mt.NOT_STATED, "–"]
