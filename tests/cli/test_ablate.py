"""Ablation variants (Table 3, Table 5), the supervised ResNet and the paired grid runner."""

import json
import math
import statistics

import pytest
import torch
import yaml

from helpers import DIGITS_IMAGE, TINY, assert_one_line_error, run, tiny_config
from resdecay.commands.ablate import list_grids, load_grid, plan_grid, shared_init
from resdecay.models import MaskedAutoencoder, build_model
from resdecay.nn.residual import shortcut_factors
from resdecay.train.config import load_config


@pytest.mark.parametrize("shortcut,alpha,beta", [("scaled_sum", math.sqrt(0.5), math.sqrt(0.5)),
                                                 ("scaled_branch", 1.0, math.sqrt(0.5))])
def test_table3b_formulas(shortcut, alpha, beta):
    torch.manual_seed(0)
    model = MaskedAutoencoder(tiny_config("mae", **DIGITS_IMAGE, shortcut=shortcut, zero_init=False))
    blk = model.blocks[2]
    x = torch.randn(2, 5, 32)
    h = alpha * x + beta * blk.attn(blk.norm1(x))
    assert torch.allclose(blk(x), alpha * h + beta * blk.mlp(blk.norm2(h)), atol=1e-5)
    a, b = shortcut_factors(4, 0.6, shortcut=shortcut)
    assert torch.allclose(a, torch.full((4, 2), alpha, dtype=torch.float64)) and torch.allclose(b, torch.full((4, 2), beta, dtype=torch.float64))


def test_decay_one_branch_only():
    m = MaskedAutoencoder(tiny_config("mae", **DIGITS_IMAGE, alpha_min=0.5, decay_branches="attn"))
    assert all(b.alpha_mlp == 1.0 for b in m.blocks) and m.blocks[-1].alpha_attn < 1.0
    m = MaskedAutoencoder(tiny_config("mae", **DIGITS_IMAGE, alpha_min=0.5, decay_branches="mlp"))
    assert all(b.alpha_attn == 1.0 for b in m.blocks) and m.blocks[-1].alpha_mlp == 0.5


def test_learnable_alpha_gets_gradients_and_fixed_alpha_does_not():
    torch.manual_seed(0)
    m = MaskedAutoencoder(tiny_config("mae", **DIGITS_IMAGE, shortcut="learnable", zero_init=False))
    assert all(isinstance(b.alpha_attn, torch.nn.Parameter) and b.alpha_attn.item() == 1.0 for b in m.blocks)
    m(torch.randn(4, 1, 8, 8))[0].backward()
    assert all(b.alpha_attn.grad is not None and b.alpha_mlp.grad is not None for b in m.blocks)
    assert all(b.alpha_mlp.grad.abs() > 0 for b in m.blocks)
    fixed = MaskedAutoencoder(tiny_config("mae", **DIGITS_IMAGE))
    assert not any("alpha" in n for n, _ in fixed.named_parameters())  # a fixed alpha is no parameter
    from resdecay import alphas_of

    with torch.no_grad():
        m.blocks[1].alpha_mlp.fill_(0.42)
    assert alphas_of(m)[1][1][1] == pytest.approx(0.42)  # Table 5: the learned values are readable


def test_decoder_decay_switch():
    on = MaskedAutoencoder(tiny_config("mae", **DIGITS_IMAGE, alpha_min=0.6, decoder_decay=True))
    off = MaskedAutoencoder(tiny_config("mae", **DIGITS_IMAGE, alpha_min=0.6))
    assert on.decoder_blocks[-1].alpha_mlp == 0.6 and off.decoder_blocks[-1].alpha_mlp == 1.0


def test_shared_init_copies_matching_weights_but_keeps_zero_init():
    base_cfg = load_config("mae-tiny-digits", [*TINY, "alpha_min=1.0", "zero_init=false"]).model
    torch.manual_seed(0)
    reference = build_model(base_cfg).state_dict()
    variant = build_model(load_config("mae-tiny-digits", [*TINY, "alpha_min=0.6"]).model)  # zero-init
    shared_init(reference)(variant)
    sd = variant.state_dict()
    assert torch.equal(sd["blocks.0.attn.qkv.weight"], reference["blocks.0.attn.qkv.weight"])
    assert torch.all(sd["blocks.0.attn.proj.weight"] == 0)  # the variant's deliberate zero start survives
    assert torch.all(sd["decoder_pred.weight"] == 0)


@pytest.mark.slow
def test_supervised_resnet_end_to_end(tmp_path, capsys):
    args = ["train-supervised", "--preset", "resnet18-fmnist", "--no-progress", "data.name=digits", "model.img_size=8",
            "model.width=8", "model.layers=[1,1,2,1]", "alpha_min=0.7", "train.epochs=2", "train.batch_size=64",
            "data.augment=flip", "data.num_workers=0", f"train.out_dir={tmp_path}"]
    code, out, err = run(capsys, *args)
    assert code == 0, err
    rep = json.loads((tmp_path / "eval.json").read_text())
    sup, rank = rep["results"]
    assert sup["metric"] == "supervised" and 0 <= sup["values"]["top1"] <= 1 and rank["values"]["effective_rank"] >= 0
    assert [a[0] for a in rep["alphas"].values()] == pytest.approx(torch.linspace(1, 0.7, 5).tolist())
    assert "effective rank" in out
    code, _, err = run(capsys, "train-supervised", "--preset", "mae-tiny-digits")
    assert_one_line_error(code, err, "train-supervised takes resnet presets")


def test_shipped_grids_load_and_resolve():
    assert {"table2-toy", "table3a-toy", "table3b-toy", "figure7-toy", "table2-in100", "table3a-in100", "table3b-in100"} <= set(list_grids())
    for name in list_grids():
        g = load_grid(name)
        for v in g["variants"]:
            load_config(v.get("preset", g["preset"]), [*g.get("overrides", []), *v.get("overrides", [])])


def _tiny_grid(tmp_path, **extra):
    grid = {"name": "tiny", "preset": "mae-tiny-digits", "overrides": [*TINY, "train.epochs=1"], "baseline": "plain",
            "eval": {"evals": ["knn", "probe", "rank"], "probe_epochs": 3}, "paper": {"metric": "made-up", "compare_to": "knn_top1"},
            "variants": [{"name": "plain", "overrides": ["alpha_min=1.0"], "paper": 50.0},
                         {"name": "decay 0.6", "overrides": ["alpha_min=0.6"], "paper": 60.0},
                         {"name": "learnable", "overrides": ["shortcut=learnable"]}], **extra}
    path = tmp_path / "grid.yaml"
    path.write_text(yaml.safe_dump(grid))
    return path


@pytest.mark.slow
def test_grid_runs_compares_and_resumes(tmp_path, capsys, monkeypatch):
    path = _tiny_grid(tmp_path)
    out = tmp_path / "out"
    code, text, err = run(capsys, "ablate", "--grid", str(path), "--out", str(out), "--only", "plain,decay 0.6", "--no-progress")
    assert code == 0, err
    res = json.loads((out / "ablate.json").read_text())
    assert set(res["rows"]) == {"plain", "decay 0.6"}
    row = res["rows"]["decay 0.6"]
    assert row["paper_delta"] == 10.0 and row["direction"] in ("same", "opposite")
    assert res["rows"]["plain"]["delta"]["knn_top1"] == 0.0
    assert "d kNN" in text and (out / "ablate.png").stat().st_size > 1000
    # resume: the finished variants are read back (no training), the missing one is trained
    import resdecay.commands.ablate as ab

    trained = []
    real = ab.train
    monkeypatch.setattr(ab, "train", lambda cfg, **k: trained.append(cfg.out_dir.name) or real(cfg, **k))
    code, text, err = run(capsys, "ablate", "--grid", str(path), "--out", str(out), "--no-progress")
    assert code == 0, err
    assert trained == ["learnable"]
    res = json.loads((out / "ablate.json").read_text())
    learned = res["rows"]["learnable"]["alphas"]  # learned alpha per sub-block (Table 5)
    assert [k for k in learned if k.startswith("blocks.")] == [f"blocks.{i}" for i in range(4)]
    assert all(a != 1.0 for k in learned if k.startswith("blocks.") for a in learned[k])


def test_grid_bad_input(tmp_path, capsys):
    code, _, err = run(capsys, "ablate", "--grid", "table9-toy")
    assert_one_line_error(code, err, "grid 'table9-toy' does not exist", "table3b-toy")
    code, _, err = run(capsys, "ablate", "--grid", str(_tiny_grid(tmp_path)), "--only", "nope", "--out", str(tmp_path / "o"))
    assert_one_line_error(code, err, "variant 'nope' is not in grid tiny", "plain, decay 0.6, learnable")
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"name": "b", "preset": "mae-tiny-digits", "variantz": []}))
    code, _, err = run(capsys, "ablate", "--grid", str(bad))
    assert_one_line_error(code, err, "grid key 'variantz' does not exist", "variants")
    bad.write_text(yaml.safe_dump({"name": "b", "preset": "mae-tiny-digits", "variants": [{"name": "x", "overides": []}]}))
    code, _, err = run(capsys, "ablate", "--grid", str(bad))
    assert_one_line_error(code, err, "variant key 'overides' does not exist", "overrides")
    bad.write_text(yaml.safe_dump({"name": "b", "preset": "mae-tiny-digits", "variants": [{"name": "x", "overrides": ["shortcut=magic"]}]}))
    code, _, err = run(capsys, "ablate", "--grid", str(bad))
    assert_one_line_error(code, err, "model.shortcut 'magic' is unknown", "scaled_sum")


def test_eval_overrides_set_the_grids_evaluation_and_not_the_training(tmp_path, capsys):
    """table2-in100 extracts features with 10 loader workers: `eval.num_workers=2` (any eval. key) changes the grid's
    evaluation for this run, recorded as its protocol; the training overrides still reach every variant."""
    plan = plan_grid("table2-in100", str(tmp_path / "g"), extra=["eval.num_workers=2", "eval.batch-size=64",
                                                                  "train.epochs=3"])
    assert (plan.settings.num_workers, plan.settings.batch_size) == (2, 64) and plan.grid["eval"]["num_workers"] == 2
    assert plan.settings.evals == ("knn", "probe", "rank")  # the grid's own settings stay
    assert all(cfg.train.epochs == 3 and cfg.data.num_workers == 10 for cfg in plan.cfgs.values())
    assert load_grid("table2-in100")["eval"]["num_workers"] == 10  # the shipped grid is not changed
    bad = (("eval.workers=2", "eval.workers is not a setting", "num_workers"),
           ("eval.num_workers", "is not eval.KEY=VALUE", "eval.num_workers=2"),
           ("eval.num_workers=two", "eval.num_workers must be an integer", "'two'"),
           ("eval.num_workers=-1", "must be 0", "or more"), ("eval.batch_size=0", "must be a positive integer", "0"),
           ("eval.evals=[knn,bogus]", "unknown evaluation 'bogus'", "probe"), ("eval.data=digits", "eval.data", "valid"))
    for arg, *needles in bad:  # each refused before anything trains or any folder is made
        code, _, err = run(capsys, "ablate", "--grid", "table2-in100", arg, "--out", str(tmp_path / "bad"))
        assert_one_line_error(code, err, *needles)
        assert not (tmp_path / "bad").exists()
    assert plan_grid("table2-in100", str(tmp_path / "g"), extra=["eval.evals=knn,rank"]).settings.evals == ("knn", "rank")


# figure7-toy (the smallest shipped grid: ResNets, kNN + rank) shrunk to seconds: digits, width 8, one epoch
SEED_GRID = ["data.name=digits", "model.img_size=8", "model.width=8", "train.epochs=1", "train.batch_size=64",
             "train.warmup_epochs=0", "data.num_workers=0", "train.threads=1", "data.train_subset=256"]
SEED_ONLY = "8 blocks alpha 1.0,8 blocks alpha 0.7"


@pytest.mark.slow
def test_ablate_seeds_pools_seeds_and_reuses_the_manual_form(tmp_path, capsys, monkeypatch):
    """Issue 20.4: ``--seeds 0,1`` runs the grid once per seed into <out>/seed<N> exactly as
    ``--out <out>/seed<N> train.seed=<N>`` would (a folder made that way is read back, not retrained),
    then writes mean ± std over the seeds; run again, everything is read back."""
    import resdecay.commands.ablate as ab

    out = tmp_path / "g"
    code, _, err = run(capsys, "ablate", "--grid", "figure7-toy", "--only", SEED_ONLY, "--out", str(out / "seed0"),
                       *SEED_GRID, "train.seed=0", "--no-progress")
    assert code == 0, err
    trained = []
    real = ab.train
    monkeypatch.setattr(ab, "train",
                        lambda cfg, **k: trained.append((cfg.train.seed, cfg.out_dir.parent.name)) or real(cfg, **k))
    args = ["ablate", "--grid", "figure7-toy", "--only", SEED_ONLY, "--seeds", "0,1", "--out", str(out), *SEED_GRID, "--no-progress"]
    code, text, err = run(capsys, *args)
    assert code == 0, err
    assert trained == [(1, "seed1"), (1, "seed1")]  # seed 0's variants came from the manual run
    res = json.loads((out / "ablate.json").read_text())
    assert res["seeds"] == [0, 1] and set(res["rows"]) == {"8 blocks alpha 1.0", "8 blocks alpha 0.7"}
    per_seed = [json.loads((out / f"seed{s}" / "ablate.json").read_text())["rows"]["8 blocks alpha 0.7"] for s in (0, 1)]
    row = res["rows"]["8 blocks alpha 0.7"]
    for field in ("measures", "delta"):
        for key in ("knn_top1", "rank_cls"):
            st, values = row[field][key], [r[field][key] for r in per_seed]
            assert st["values"] == values and st["n"] == 2 and st["seeds"] == [0, 1]
            assert st["mean"] == pytest.approx(statistics.fmean(values)) and st["std"] == pytest.approx(statistics.stdev(values))
    assert res["rows"]["8 blocks alpha 1.0"]["delta"]["knn_top1"]["mean"] == 0.0
    assert per_seed[0]["measures"] != per_seed[1]["measures"]  # the seeds differ
    table = (out / "table.txt").read_text()
    assert "over seeds 0, 1" in table and "±" in table and "d kNN" in table and table in text
    assert (out / "ablate.png").stat().st_size > 1000
    trained.clear()
    code, _, err = run(capsys, *args)  # resumed: every variant of every seed read back
    assert code == 0 and trained == [], err


@pytest.mark.parametrize("seeds,needle", [("a,b", "'a' is not an integer"), ("0,0", "repeats a seed"),
                                          ("1,-1", "-1 is negative"), ("", "--seeds is empty"), ("0,,1", "'' is not")])
def test_ablate_seeds_bad_values_are_one_line(capsys, seeds, needle):
    assert_one_line_error(*run(capsys, "ablate", "--grid", "figure7-toy", "--seeds", seeds)[::2], needle, "--seeds 0,1,2")


def test_ablate_seeds_and_a_seed_override_contradict(capsys, tmp_path):
    code, _, err = run(capsys, "ablate", "--grid", "figure7-toy", "--seeds", "0,1", "--out", str(tmp_path), "train.seed=3")
    assert_one_line_error(code, err, "--seeds sets train.seed", "train.seed=3")
    assert not list(tmp_path.iterdir())
