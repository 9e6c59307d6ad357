"""Field metadata: every field list is read from the fields, and a new field flows everywhere."""

import dataclasses

import pytest

from diloco_core import CONFIG_HYPERPARAMS, DiLoCoConfig

from diloco_core.spec import fields
from diloco_core.store.checkpoint import check_compatible
from diloco_core.run.cli import build_parser, config_from_args, to_flags
from diloco_core.model.transformer import init_model, lm_loss
from diloco_core.run.programs import inner_hyperparams, make_algorithm, program_key
from diloco_core.run.config import TrainConfig
from tiny_run import tiny


def test_the_lists_read_from_the_metadata_are_the_former_hand_kept_ones():
  assert CONFIG_HYPERPARAMS == {"sync_every": "int32", "overlap": "int32", "outer_lr": "float32",
                                "outer_momentum": "float32", "outer_beta2": "float32",
                                "alpha": "float32", "error_feedback_decay": "float32"}
  assert fields.traced_fields(TrainConfig) == {"inner_lr": "float32", "muon_momentum": "float32",
                                               "weight_decay": "float32", "grad_clip": "float32"}
  must = fields.must_match_fields(TrainConfig)
  assert {p for p in must if "." not in p} == {"model", "n_layers", "vocab_size", "positions", "batch_size",
                                               "seq_len", "seed", "inner_optimizer", "inner_lr", "muon_momentum", "warmup_steps", "weight_decay",
                                               "grad_clip", "num_experts", "experts_per_token",
                                               "aux_loss_coef", "z_loss_coef"}
  assert {p for p in must if p.startswith("algo.")} == {f"algo.{f.name}" for f in dataclasses.fields(DiLoCoConfig)}
  assert {p for p in must if p.startswith("data.")} == {f"data.{f.name}" for f in dataclasses.fields(TrainConfig().data)
                                                       if f.name != "workers"}  # read-ahead threads: same batches
  assert fields.non_result_fields(TrainConfig) == ("nondeterministic", "out", "overwrite", "progress",
                                                  "communication", "allow_data_change")
  workers = fields.spec(next(f for p, f in fields.walk(TrainConfig) if p == "data.workers"))
  assert not workers.result and not workers.must_match
  assert set(fields.result_fields(TrainConfig)) | {"nondeterministic", "out", "overwrite", "progress",
                                                   "communication", "allow_data_change"} == {
      f.name for f in dataclasses.fields(TrainConfig)}
  assert fields.program_fields(TrainConfig) == ("batch_size", "seq_len", "steps", "inner_optimizer", "mesh")


# A run config with two new fields: a traced hyperparameter and a compiled-in (structural) one.
Extended = dataclasses.make_dataclass("Extended", [
    ("label_smoothing", float, fields.field(0.0, flag="label-smoothing", help="label smoothing", symbol="ε",
                                            group="model", traced="float32", must_match=True)),
    ("width_mult", int, fields.field(1, flag="width-mult", help="width multiplier", group="model",
                                     program=True, must_match=True)),
], bases=(TrainConfig,), frozen=True)


def test_a_new_field_flows_to_the_cli_the_traced_dict_the_program_key_and_the_resume_check():
  base = Extended(**{f.name: getattr(tiny(), f.name) for f in dataclasses.fields(TrainConfig)})
  # command line: a flag with its symbol and default, parsed back into the field
  parser = build_parser(base)
  assert "ε: label smoothing" in parser.format_help() and "--width-mult" in parser.format_help()
  cfg = config_from_args(parser.parse_args(["--label-smoothing", "0.1", "--width-mult", "2"]), base)
  assert type(cfg) is Extended and (cfg.label_smoothing, cfg.width_mult) == (0.1, 2)
  assert cfg.model == "tiny" and cfg.algo == base.algo  # everything else: the given defaults
  # traced: in the step's hyperparameters dict (float32), not in the program key
  assert inner_hyperparams(cfg) == {"inner_lr": 3e-3, "muon_momentum": 0.95, "weight_decay": 0.1, "grad_clip": 1.0,
                                    "label_smoothing": 0.1}
  apply_fn, params = init_model(cfg.model_config(vocab_size=16), 0)
  algo = make_algorithm(cfg, lambda p, t: lm_loss(apply_fn, p, t), params)
  assert algo.hyperparams["label_smoothing"] == 0.1
  assert algo.with_hyperparams(label_smoothing=0.2).hyperparams["label_smoothing"] == 0.2
  key = lambda c: program_key(c, c.model_config())
  assert key(dataclasses.replace(cfg, label_smoothing=0.3)) == key(cfg)
  assert key(dataclasses.replace(cfg, width_mult=3)) != key(cfg)
  # resume: both must match the checkpoint; the CLI names the flag
  must = fields.must_match_fields(Extended)
  assert {"label_smoothing", "width_mult"} <= set(must)
  with pytest.raises(ValueError) as e:
    check_compatible(dataclasses.asdict(base), dataclasses.asdict(cfg), "ck/2", must)
  assert "label_smoothing=0.0 but this run has label_smoothing=0.1 (`label_smoothing`)" in str(e.value)
  assert "(--label-smoothing)" in to_flags(str(e.value), Extended)
  assert "label_smoothing" not in fields.non_result_fields(Extended)


def test_field_rejects_a_field_both_traced_and_compiled_in():
  with pytest.raises(ValueError, match="either traced or compiled into the program"):
    fields.field(1.0, traced="float32", program=True)
  with pytest.raises(ValueError, match="traced must be None or one of"):
    fields.field(1, traced="int64")


def test_every_flag_name_comes_from_the_field_metadata():
  """One source of flags: the parser, cli.to_flags, the launcher and the analysis command line
  all read fields.flag_names (a field's ``flag``), never ``name.replace("_", "-")``."""
  from analysis.flag_names import as_flags
  from diloco_core.launch import faults, supervisor
  from diloco_core.run.cli import FLAGS
  table = fields.flag_names(TrainConfig)
  assert {k: FLAGS[k] for k in table} == table
  assert table["n_layers"] == "--layers" and table["progress"] == "--no-progress"
  assert table["data.vocab_size"] == "--data-vocab" and table["sync_every"] == "--sync-every"
  parsed = {a.dest: a.option_strings[0] for a in build_parser()._actions if a.option_strings}
  assert all(parsed[path] == table[fields.option_name(path)] for path, f in fields.walk(TrainConfig)
             if fields.spec(f).flag)
  assert as_flags("lower `n_layers` or `topk`", {"topk": "--topk"}) == "lower --layers or --topk"
  assert faults.train_flag_value(["--model", "tiny", table["out"], "runs/a"], "out") == "runs/a"
  with pytest.raises(ValueError, match=f"pass {table['elastic']} to the trainer"):
    supervisor.parse_args(["--restart", "--", "--model", "tiny"])
