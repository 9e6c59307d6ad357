"""analysis.planning.plan: candidates, numbers by hand, the selection rule, the CLI round trip, errors."""

import math

import pytest

from analysis import __main__ as cli
from analysis import plan as pl
from analysis.planning.hardware import HardwareSpec
from diloco_core.spec.model_config import ModelConfig

# N = 2 * 10 * 8 (embeddings, head) + 2 * 656 (layers) + 8 (final norm) = 1480; fragment 0
# (everything outside the layers) = 168. FLOPs per token at T = 4: 6 * (2 * 640 + 80) matmul
# weights + 12 * L * h * d_h * T = 8160 + 768 = 8928.
TINY = ModelConfig(vocab_size=10, d_model=8, n_layers=2, n_heads=2, d_ff=16)
N, LAYER, FRAG0, FLOPS_TOKEN = 1480, 656, 168, 8928
# One chip per slice at C = 2 * 8928 * 1000 FLOP/s: at MFU 0.5 a step of 1000 tokens takes 1 s.
TOY = HardwareSpec(name="toy", peak_flops=2.0 * FLOPS_TOKEN * 1000, hbm_bytes=1e9,
                   hbm_bandwidth=1e9, ici_bandwidth=1e9, dcn_bandwidth_per_host=1e3,
                   chips_per_host=1)
U = 0.95
GBPS = 8 / 1e9  # Gbit/s in one byte/s
V = N * 2  # bytes each of M = 2 replicas sends per all-reduce of the model in bf16 (a(2) = 1)


def toy_plan(link_bytes_per_s, **kw):
  args = dict(slices=2, chips_per_slice=1, seq_len=4, global_batch_tokens=2000,
              link_gbps=link_bytes_per_s * GBPS, mfu=0.5, target=U)
  return pl.plan_run(TINY, TOY, **{**args, **kw})


def test_numbers_by_hand():
  p = toy_plan(1e9)
  assert p.step_time == pytest.approx(FLOPS_TOKEN * 1000 / (1 * TOY.peak_flops * 0.5)) == 1.0
  assert p.tokens_per_slice == 1000.0 and p.params == p.active_params == N and p.layers == 2
  assert p.dcn_gbps == pytest.approx(1e3 * GBPS)
  # B* = a(M) (b/8) N C / (f F_token W_dcn), f = 2/3 (the backward pass).
  assert p.dp_critical_tokens == pytest.approx(1 * 2 * N * TOY.peak_flops
                                               / (2 / 3 * FLOPS_TOKEN * 1e3))
  t = p.table
  slack = 1.0 * (1 - U) / U  # seconds of idle allowed per step of T = 1 s
  # Every payload is reduced during its sending step's backward pass (2/3 s), one chunk
  # per layer: layer 1's at 1/3 + 1/3 s, layer 0's when the step ends (1 s).
  # Candidates: H in {L + 1 = 3, 10, ..., 1000}; P = 3 for H = 3 (one layer per fragment),
  # else P = 2 (3 does not divide those H); tau in {0, 1, 5} below H.
  assert list(t.index[:6]) == ["DP", "DiLoCo H=3", "Streaming H=3 P=3 tau=0",
                               "Streaming H=3 P=3 tau=1", "DiLoCo H=10",
                               "Streaming H=10 P=2 tau=0"]
  assert len(t) == 1 + 3 + 7 * 4
  expect = {  # label: (Gbit/s, GB per sync, memory bytes)
      # The whole model in 2 chunks: it hides behind 1/3 s; layer 0's chunk hides not at
      # all and binds: (V/2) / slack > V / (slack + 1/3).
      "DP": ((V / 2) / slack, V, N * 16),
      "DiLoCo H=3": ((V / 2) / (3 * slack), V, N * 28),
      # Layer 0's fragment and fragment 0 (released when the step ends) wait their whole
      # transfer; layer 1's fragment hides behind layer 0's backward pass.
      "Streaming H=3 P=3 tau=0": ((2 * LAYER + 2 * FRAG0) / (3 * slack), 2 * LAYER,
                                  N * 24 + 1 * LAYER * 4),
      # hidden: the largest fragment (a layer, 1312 bytes) in one step, one sent per step;
      # ceil((tau + 1) / (H/P)) = 2 fragments in flight.
      "Streaming H=3 P=3 tau=1": (2 * LAYER / 1.0, 2 * LAYER, N * 24 + 2 * LAYER * 4),
      "DiLoCo H=10": (V / (10 * slack + 1 / 3), V, N * 28),
      # P = 2: fragment 1 holds both layers (2624 bytes), larger than fragment 0 (336); it
      # hides behind 1/3 s of its own step and tau = 1 step: 2624 / (4/3).
      "Streaming H=10 P=2 tau=1": (2 * 2 * LAYER / (4 / 3), 4 * LAYER, N * 24 + 2 * LAYER * 4),
      # tau = 5: the link must carry a fragment every H/P = 5 steps.
      "Streaming H=10 P=2 tau=5": (2 * 2 * LAYER / 5.0, 4 * LAYER, N * 24 + 2 * 2 * LAYER * 4),
      "Streaming H=1000 P=2 tau=0": (V / (1000 * slack + 1 / 3), 4 * LAYER,
                                     N * 24 + 2 * LAYER * 4),
  }
  for label, (bw, sync, mem) in expect.items():
    row = t.loc[label]
    assert row["Gbit/s per slice"] == pytest.approx(bw * GBPS, rel=1e-7), label
    assert row["GB per sync"] == pytest.approx(sync / 1e9), label
    assert row["memory GB/replica"] == pytest.approx(mem / 1e9), label
    assert row["memory GB/chip"] == pytest.approx(mem / 1e9), label
    assert row["fits DCN"] == (bw <= 1e3), label
  assert FRAG0 * 2 < 2 * LAYER  # fragment 0 is not the largest here


@pytest.mark.parametrize("link, choice", [
    ((V / 2) / ((1 - U) / U), "DP"),  # exactly what DP needs
    (3000.0, "Streaming H=3 P=3 tau=1"),  # the smallest H fits only with overlap
    (1000.0, "Streaming H=10 P=2 tau=5"),  # H = 3 needs 1312 B/s, H = 10 fits with tau = 5
    (100.0, "Streaming H=1000 P=2 tau=0"),  # only H = 1000 fits; P = 2 beats DiLoCo's P = 1
    (10.0, None),
])
def test_selection_rule_without_the_floor(link, choice):
  p = toy_plan(link * (1 + 1e-12), min_sync_every=1)  # the smallest H that fits, the bound
  assert p.choice == choice
  t = p.table
  fits = t[t["fits link"] & (t["method"] != "dp")]
  if choice == "DP":
    assert "no reason to trade quality" in p.reason
  elif choice is None:
    assert fits.empty and "No candidate fits" in p.reason
    least = t.loc[t["method"] != "dp", "Gbit/s per slice"].min()
    assert least == pytest.approx(V / (1000 * (1 - U) / U + 1 / 3) * GBPS)
    assert f"{least:,.4g} Gbit/s" in p.reason
  else:
    row = t.loc[choice]
    assert row["H"] == fits["H"].min()
    same_h = fits[fits["H"] == row["H"]]
    assert row["tau"] == same_h["tau"].min()
    assert row["P"] == same_h[same_h["tau"] == row["tau"]]["P"].max()
    assert choice in p.reason and f"{row['Gbit/s per slice']:,.4g} Gbit/s" in p.reason


# The toy's needs in B/s, by the closed forms of test_numbers_by_hand: DiLoCo H and Streaming
# H P=2 tau=0 need V / (H slack + 1/3) (P = 2 puts both layers in fragment 1: the same transfer
# as DiLoCo's, so the two tie and the larger P wins); Streaming H=20 P=2 tau=5 hides its
# 2624-byte fragment behind 1/3 + 5 s: 492; Streaming H P=2 tau=1 (H >= 10): 2624 / (4/3) = 1968;
# Streaming H=10 P=2 tau=5: 2624 / 5 = 524.8; Streaming H=3 P=3 tau=1: 1312.
SLACK = (1 - U) / U


@pytest.mark.parametrize("link, kw, choice, bound", [
    # H = 20 at tau = 0 needs V / (20 slack + 1/3) = 2135.7 <= 3000; H = 3 (1312) fits too: the bound.
    (3000.0, {}, "Streaming H=20 P=2 tau=0", 3),
    # H = 20 fits only with tau = 5 (492); H = 10 with tau = 5 (524.8) is the bound; H = 3 needs 1312.
    (1000.0, {}, "Streaming H=20 P=2 tau=5", 10),
    (600.0, {}, "Streaming H=20 P=2 tau=5", 10),
    # only H = 1000 fits: the floor does not bind.
    (100.0, {}, "Streaming H=1000 P=2 tau=0", 1000),
    # every H asked for is below the floor: the largest that fits, H = 10 (tau = 1: 1968 <= 2000).
    (2000.0, dict(sync_every=(3, 10)), "Streaming H=10 P=2 tau=1", 3),
    # a floor of 10: H = 10 at tau = 0 needs V / (10 slack + 1/3) = 3443 > 3000, at tau = 1 1968.
    (3000.0, dict(min_sync_every=10), "Streaming H=10 P=2 tau=1", 3),
])
def test_selection_rule_with_the_quality_floor(link, kw, choice, bound):
  p = toy_plan(link * (1 + 1e-12), **kw)
  assert (p.choice, p.h_bound) == (choice, bound)
  t = p.table
  if "sync_every" not in kw:
    assert t.loc["DiLoCo H=20", "Gbit/s per slice"] == pytest.approx(V / (20 * SLACK + 1 / 3) * GBPS)
    assert t.loc["Streaming H=20 P=2 tau=5", "Gbit/s per slice"] == pytest.approx(4 * LAYER / (5 + 1 / 3) * GBPS)
  floor = kw.get("min_sync_every", pl.MIN_SYNC_EVERY)
  assert p.min_sync_every == floor
  if t.loc[choice, "H"] < floor:
    assert f"the largest H that fits, below the quality floor (H >= {floor})" in p.reason
  elif bound < floor:
    assert f"at or above the quality floor (H >= {floor})" in p.reason
    assert f"The link carries H down to {bound} (" in p.reason
  else:
    assert "has the smallest H that fits (then the smallest tau, then the largest P)." in p.reason


def test_the_floor_is_the_ladders_rung_below_the_tuning_sweeps_best_h():
  """MIN_SYNC_EVERY is quality_floor of the H the stored H x M sweep found best at every M (one
  outer learning rate for every H), so no H the sweep measured as best is below it, and every
  measured H below it lost to one at or above it, at every M."""
  from analysis.lab import stored
  hm = stored.frame("h_m")
  dl = hm[hm["algorithm"] == "diloco"]
  assert dl["outer_lr"].nunique() == 1  # the reading holds at one η; with η tuned per H it may not
  means = dl.groupby(["replicas", "sync_every"])["final_eval_loss"].mean()
  best = {m: int(means.loc[m].idxmin()) for m in sorted(dl["replicas"].unique())}
  assert pl.quality_floor(min(best.values())) == pl.MIN_SYNC_EVERY
  for m in best:
    below = means.loc[m][means.loc[m].index < pl.MIN_SYNC_EVERY]
    assert len(below) and (below > means.loc[m].min()).all()


def test_selection_order_by_hand():
  import pandas as pd
  rows = pd.DataFrame({"H": [3, 3, 10, 20, 20, 20, 50], "P": [3, 1, 2, 1, 2, 2, 2],
                       "tau": [1, 0, 0, 0, 0, 1, 0], "outer overlap": ["none"] * 7},
                      index=list("abcdefg"))
  assert list(pl.selection_order(rows, 20).index) == ["e", "d", "f", "g", "c", "b", "a"]
  assert list(pl.selection_order(rows, 1).index) == ["b", "a", "c", "e", "d", "f", "g"]
  eager = rows.assign(**{"outer overlap": ["none", "none", "none", "eager", "none", "none", "none"]})
  assert list(pl.selection_order(eager, 20).index)[:3] == ["e", "f", "d"]  # eager after the others of its H


def test_huge_link_is_dp_and_tiny_link_is_none_for_the_recipes():
  kw = dict(hardware="v5p", slices=2, chips_per_slice=64, seq_len=4096,
            global_batch_tokens=2**21)
  for model in ("qwen3-8b", "qwen3-30b-a3b"):
    assert pl.plan_run(model, link_gbps=1e5, **kw).choice == "DP"
    assert pl.plan_run(model, link_gbps=1e-3, **kw).choice is None
    p = pl.plan_run(model, link_gbps=10, **kw)
    assert p.choice is not None and p.choice != "DP"
    assert p.table.loc[p.choice, "Gbit/s per slice"] <= 10


@pytest.mark.parametrize("model", ["qwen3-8b", "qwen3-30b-a3b", "llama3-70b", TINY])
def test_every_candidate_is_a_valid_trainer_config(model):
  p = pl.plan_run(model, "v5p", slices=4, chips_per_slice=16, seq_len=512,
                  global_batch_tokens=2**20, link_gbps=10)
  L = p.layers
  for _, row in p.table.iterrows():
    h, f, tau = int(row["H"]), int(row["P"]), int(row["tau"])
    assert h % f == 0 and (f == 1 or L % (f - 1) == 0) and 0 <= tau < h
  # MaxText's H = P = L + 1 (one layer per fragment) is among the candidates.
  assert f"Streaming H={L + 1} P={L + 1} tau=1" in p.table.index


def test_candidates_follow_the_trainers_schedule_rules():
  # Every candidate passes diloco_core.spec.validity.check_schedule with the model's L, as the
  # trainer's configs do; the table is candidate_table's, which the roofline command uses.
  from diloco_core.spec.validity import check_schedule
  cands = pl.candidates(TINY.n_layers)
  for method, h, p, tau in cands:
    assert check_schedule(h, p, tau, num_layers=TINY.n_layers) == (h, p, tau)
  t = toy_plan(1e9).table
  assert list(t.index) == [pl.label(*c) for c in cands]


def test_largest_fragments():
  assert pl.largest_fragments(37, 36) == 37 and pl.largest_fragments(100, 36) == 10
  assert pl.largest_fragments(7, 4) == 1  # 7 is prime and 7 - 1 does not divide 4
  for h in range(1, 60):
    for layers in (1, 2, 12, 36, 48):
      p = pl.largest_fragments(h, layers)
      valid = [q for q in range(1, h + 1) if h % q == 0 and (q == 1 or layers % (q - 1) == 0)]
      assert p == max(valid)


def test_custom_candidates_and_no_rounding():
  p = toy_plan(1e9, sync_every=(20, 6), overlaps=2, global_batch_tokens=2001)
  assert p.tokens_per_slice == 1000.5  # not rounded to a whole number of tokens
  assert list(p.table.index) == ["DP", "DiLoCo H=6", "Streaming H=6 P=3 tau=2", "DiLoCo H=20",
                                 "Streaming H=20 P=2 tau=2"]
  assert p.sync_every == (6, 20) and p.overlaps == (2,)


def test_command_round_trip(capsys):
  p = pl.plan_run("qwen3-30b-a3b", "v5p", slices=2, chips_per_slice=64, seq_len=4096,
                  global_batch_tokens=2**21, link_gbps=100, sync_every=[10, 49, 100],
                  overlaps=(0, 1))
  argv = p.command()
  assert argv[:4] == ["python", "-m", "analysis", "plan"]
  assert argv[argv.index("--sync-every") + 1:argv.index("--overlaps")] == ["10", "49", "100"]
  assert cli.main(argv[3:]) == 0
  out = capsys.readouterr().out
  assert f"choice: {p.choice}\n" in out and f"reason: {p.reason}\n" in out
  assert f"trainer options: {' '.join(p.train_args())}\n" in out
  for label in p.table.index:
    assert label in out
  default = pl.plan_run("qwen3-8b", "v5p", slices=2, chips_per_slice=64, seq_len=4096,
                        global_batch_tokens=2**21, link_gbps=0.5, mfu=0.4, bits=4)
  assert "--sync-every" not in default.command() and "--overlaps" not in default.command()
  assert cli.main(default.command()[3:]) == 0
  assert f"choice: {default.choice or 'none'}\n" in capsys.readouterr().out
  floor = pl.plan_run("qwen3-8b", "v5p", slices=2, chips_per_slice=64, seq_len=4096,
                      global_batch_tokens=2**21, link_gbps=20, min_sync_every=1)
  assert floor.command()[-2:] == ["--min-sync-every", "1"]
  assert "--min-sync-every" not in p.command()
  assert cli.main(floor.command()[3:]) == 0
  assert f"choice: {floor.choice}\n" in capsys.readouterr().out
  odd_bits = default.command()[3:]
  odd_bits[odd_bits.index("--bits") + 1] = "12"
  assert cli.main(odd_bits) == 0
  assert "trainer options: none (bits=12 is not the width of a trainer wire format" in capsys.readouterr().out
  with pytest.raises(ValueError, match="Plan.command\\(\\) needs a catalog name for model"):
    toy_plan(1.0).command()


@pytest.mark.parametrize("change, message", [
    (dict(model="gpt-9"), r"model must be one of \["),
    (dict(hardware="v9"), r"hardware must be one of \["),
    (dict(slices=0), "slices must be an integer >= 1, got 0."),
    (dict(slices=2.0), "slices must be an integer >= 1, got 2.0."),
    (dict(chips_per_slice=-1), "chips_per_slice must be an integer >= 1, got -1."),
    (dict(seq_len=True), "seq_len must be an integer >= 1, got True."),
    (dict(global_batch_tokens=1.5e6), "global_batch_tokens must be an integer >= 1"),
    (dict(mfu=0), r"mfu must be a finite number in \(0, 1\], got 0."),
    (dict(mfu=1.5), r"mfu must be a finite number in \(0, 1\], got 1.5."),
    (dict(mfu="high"), r"mfu must be a finite number in \(0, 1\], got 'high'."),
    (dict(target=1.0), r"target must be a finite number in \(0, 1\), got 1.0."),
    (dict(link_gbps=-1), "link_gbps must be a finite number > 0, got -1."),
    (dict(link_gbps=math.nan), "link_gbps must be a finite number > 0, got nan."),
    (dict(bits=0), "bits must be a finite number > 0, got 0."),
    (dict(sync_every=[10, 0]), "sync_every must be an integer >= 1, got 0."),
    (dict(sync_every="10"), "sync_every must be an integer or a sequence of integers"),
    (dict(sync_every=[]), "sync_every must not be empty."),
    (dict(overlaps=[0, -1]), "overlaps must be an integer >= 0, got -1."),
    (dict(overlaps=[1.5]), "overlaps must be an integer >= 0, got 1.5."),
    (dict(min_sync_every=0), "min_sync_every must be an integer >= 1, got 0."),
])
def test_bad_input_is_one_line_naming_the_option(change, message):
  args = dict(model="qwen3-8b", hardware="v5p", slices=2, chips_per_slice=64, seq_len=4096,
              global_batch_tokens=2**21, link_gbps=100)
  args.update(change)
  with pytest.raises(ValueError, match=message) as e:
    pl.plan_run(args.pop("model"), args.pop("hardware"), **args)
  assert "\n" not in str(e.value)


def test_eager_candidates_are_opt_in_and_taken_after_the_others_of_their_h():
  plain, eager = toy_plan(1e9, sync_every=(6,)), toy_plan(1e9, sync_every=(6,), eager=True)
  assert "DiLoCo H=6 eager" not in plain.table.index and not plain.eager and eager.eager
  catalog = dict(slices=2, chips_per_slice=64, seq_len=4096, global_batch_tokens=2**21, link_gbps=20)
  assert pl.plan_run("qwen3-8b", "v5p", eager=True, **catalog).command()[-1] == "--eager"
  assert "--eager" not in pl.plan_run("qwen3-8b", "v5p", **catalog).command()
  row = eager.table.loc["DiLoCo H=6 eager"]
  assert row["outer overlap"] == "eager" and row["tau"] == 0
  # Its bandwidth is DiLoCo's with τ = H - 1 (due at the next send, H steps later).
  same = pl.candidate_bandwidth("diloco", target=U, payload=1.0, step_time=1.0, layers=2,
                                sync_every=6, overlap=5)
  assert pl.candidate_bandwidth("diloco", target=U, payload=1.0, step_time=1.0, layers=2,
                                sync_every=6, outer_overlap="eager") == same
  assert row["Gbit/s per slice"] < eager.table.loc["DiLoCo H=6", "Gbit/s per slice"]
  # A link only the eager candidate fits: it is chosen; one DiLoCo H=6 fits too: not.
  w = float(row["Gbit/s per slice"])
  others = eager.table.drop(index=["DiLoCo H=6 eager", "DP"])["Gbit/s per slice"]
  assert w < others.min()
  assert toy_plan(w / GBPS, sync_every=(6,), eager=True).choice == "DiLoCo H=6 eager"
  assert toy_plan(others.min() / GBPS, sync_every=(6,), eager=True).choice != "DiLoCo H=6 eager"


def test_plan_refuses_overlaps_beyond_every_h():
  kw = dict(slices=2, chips_per_slice=64, seq_len=4096, global_batch_tokens=2**21, link_gbps=100)
  with pytest.raises(ValueError, match=r"^overlaps \(40, 60\) leave no Streaming candidate: τ must be below H,"
                     r" and the largest H considered for Streaming is 40; give overlaps in \[0, 39\].$"):
    pl.plan_run("qwen3-8b", "v5p", sync_every=(20, 40), overlaps=(40, 60), **kw)
  plan = pl.plan_run("qwen3-8b", "v5p", sync_every=(20, 40), overlaps=(1, 60), **kw)  # one usable τ: runs
  assert plan.overlaps == (1, 60)


def test_moe_plan_computes_with_active_params_and_sends_total_params():
  """Qwen3-30B-A3B: the step time follows the 3.4B routed params, the bytes the 30.5B stored."""
  from analysis.planning.hardware import get_hardware
  from analysis.planning.models import get_model
  from diloco_core.spec.model_config import flops_per_token, param_count
  cfg, hw = get_model("qwen3-30b-a3b"), get_hardware("v5p")
  p = pl.plan_run("qwen3-30b-a3b", "v5p", slices=2, chips_per_slice=64, seq_len=4096,
                  global_batch_tokens=2**21, link_gbps=100, mfu=0.5)
  total, active = param_count(cfg), param_count(cfg, active=True)
  assert (p.params, p.active_params) == (total, active) and 9 * active < total
  # T = F_token (active) x B/M / (n C MFU)
  assert p.step_time == pytest.approx(flops_per_token(cfg, 4096) * 2**20 / (64 * hw.peak_flops * 0.5),
                                      rel=1e-12)
  dense_flops = 6 * total  # what the step would cost if every stored param were computed
  assert flops_per_token(cfg, 4096) < dense_flops / 5
  # every stored param travels: bf16 total params per DiLoCo sync, a P-th per Streaming send
  assert p.table.loc["DiLoCo H=10", "GB per sync"] == pytest.approx(2 * total / 1e9, rel=1e-12)
  streaming = p.table[p.table["method"] == "streaming"].iloc[0]
  assert streaming["GB per sync"] < p.table.loc["DiLoCo H=10", "GB per sync"]


@pytest.mark.parametrize("link, expected", [
    (1e9, "--algorithm dp --replicas 2"),
    (3000.0, "--algorithm streaming --replicas 2 --sync-every 3 --fragments 3 --overlap 1 --compression bf16"),
    (100.0, "--algorithm streaming --replicas 2 --sync-every 1000 --fragments 2 --overlap 0 --compression bf16"),
])
def test_train_args_are_the_trainers_options_for_the_choice(link, expected):
  from diloco_core.run.cli import build_parser, config_from_args
  p = toy_plan(link * (1 + 1e-12), min_sync_every=1)
  argv = p.train_args()
  assert " ".join(argv) == expected
  # the trainer parses them into exactly the suggested schedule, valid for the model's L
  config = config_from_args(build_parser().parse_args(argv + ["--model", "tiny", "--layers", "2"]))
  config.algo.validate(num_layers=2)
  row = p.table.loc[p.choice]
  assert (config.algo.algorithm, config.algo.replicas) == (row["method"], 2)
  if row["method"] != "dp":
    assert (config.algo.sync_every, config.algo.fragments, config.algo.overlap) == (row["H"], row["P"], row["tau"])


def test_train_args_of_eager_other_bits_and_no_choice():
  w = float(toy_plan(1e9, sync_every=(6,), eager=True).table.loc["DiLoCo H=6 eager", "Gbit/s per slice"])
  eager = toy_plan(w / GBPS, sync_every=(6,), eager=True)
  assert eager.train_args() == ["--algorithm", "diloco", "--replicas", "2", "--sync-every", "6",
                                "--outer-overlap", "eager", "--compression", "bf16"]
  assert toy_plan(100.0 * (1 + 1e-12), bits=8).train_args()[-2:] == ["--compression", "fp8"]
  assert toy_plan(1000.0, bits=32).train_args()[-2:] == ["--compression", "none"]
  with pytest.raises(ValueError, match=r"^bits=12 is not the width of a trainer wire format; the trainer sends \[4, 8, 16, 32\] bits.$"):
    toy_plan(100.0 * (1 + 1e-12), bits=12).train_args()
  with pytest.raises(ValueError, match=r"^the plan suggests nothing to train: No candidate fits"):
    toy_plan(10.0).train_args()


def test_topk_plans_with_the_sparse_bits_per_parameter_and_keeps_dp_dense():
  """Top-64 of 4096 at 4 bits: (64·(4 + 12) + 32) / 4096 bits per parameter for DiLoCo and
  Streaming (the same table as a dense plan at that width), DP's row unchanged at 4 bits."""
  kw = dict(slices=2, chips_per_slice=64, seq_len=4096, global_batch_tokens=2**21, link_gbps=1)
  sparse_plan = pl.plan_run("qwen3-8b", "v5p", bits=4, topk=64, **kw)
  eff = (64 * (4 + 12) + 32) / 4096
  dense_eff = pl.plan_run("qwen3-8b", "v5p", bits=eff, **kw)
  dense_4 = pl.plan_run("qwen3-8b", "v5p", bits=4, **kw)
  rows = [r for r in sparse_plan.table.index if r != "DP"]
  assert list(sparse_plan.table.loc[rows, "Gbit/s per slice"]) == list(dense_eff.table.loc[rows, "Gbit/s per slice"])
  assert sparse_plan.table.loc["DP", "Gbit/s per slice"] == dense_4.table.loc["DP", "Gbit/s per slice"]
  assert sparse_plan.train_args()[-7:] == ["--compression", "fp4", "--topk", "64", "--topk-chunk", "4096",
                                           "--error-feedback"]
  assert sparse_plan.command()[-4:] == ["--topk", "64", "--topk-chunk", "4096"]
  with pytest.raises(ValueError, match="bits=0.257812 is not the width of a trainer wire format"):
    pl.wire_format(eff)  # a dense plan at that width has no trainer wire format
  with pytest.raises(ValueError, match=r"`topk` must be an integer in \[1, topk_chunk=4096\]"):
    pl.plan_run("qwen3-8b", "v5p", bits=4, topk=5000, **kw)
