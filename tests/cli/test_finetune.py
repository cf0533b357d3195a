"""resdecay finetune: MAE fine-tuning and LARS linear probing of a pretrained encoder."""

import json

import pytest
import torch

from helpers import assert_one_line_error, run
from resdecay.commands.finetune import build_config, encoder_loader
from resdecay.models import build_model
from resdecay.models.classifier import classifier_param_groups
from resdecay.train import checkpoint as ckpt
from resdecay.train.config import load_config


def test_classifier_rebuilds_the_pretrained_encoder(tiny_checkpoints):
    cfg, state = build_config(tiny_checkpoints["decayed"], "finetune-mae", ["drop_path=0.2"])
    assert cfg.model.encoder["alpha_min"] == 0.6 and cfg.model.num_classes == 10 and cfg.model.drop_path == 0.2
    model = build_model(cfg.model)
    encoder_loader(state)(model)
    for k, v in model.state_dict().items():
        if not k.startswith(("head", "fc_norm")):
            assert torch.equal(v, state["model"][k]), k
    assert [b.alpha_mlp for b in model.blocks] == [b[1] for b in model.alphas.tolist()]
    assert model.blocks[-1].alpha_mlp == 0.6
    assert model.blocks[-1].drop_path.drop_prob == pytest.approx(0.2) and isinstance(model.blocks[0].drop_path, torch.nn.Identity)
    assert cfg.train.min_lr == 1e-6  # issue 23.9: main_finetune.py --min_lr 1e-6 (the preset had 0)


def test_layer_wise_lr_decay_groups(tiny_checkpoints):
    cfg, _ = build_config(tiny_checkpoints["decayed"], "finetune-mae", ["layer_decay=0.5"])
    model = build_model(cfg.model)
    groups = classifier_param_groups(model, 0.05)
    depth = len(model.blocks)  # 4
    scale_of = {id(p): g["lr_scale"] for g in groups for p in g["params"]}
    wd_of = {id(p): g["weight_decay"] for g in groups for p in g["params"]}
    assert scale_of[id(model.head.weight)] == 1.0
    assert scale_of[id(model.blocks[-1].mlp.fc1.weight)] == 0.5
    assert scale_of[id(model.blocks[0].mlp.fc1.weight)] == 0.5 ** depth
    assert scale_of[id(model.patch_embed.proj.weight)] == 0.5 ** (depth + 1)
    assert wd_of[id(model.blocks[0].norm1.weight)] == 0.0 and wd_of[id(model.head.weight)] == 0.05
    assert id(model.pos_embed) not in scale_of  # fixed sin-cos table is not trained


def test_linear_probe_freezes_the_encoder_and_uses_lars(tiny_checkpoints):
    cfg, _ = build_config(tiny_checkpoints["decayed"], "linprobe-mae", [])
    model = build_model(cfg.model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {"head.weight", "head.bias"} and cfg.train.optimizer == "lars"
    # issue 23.9: MAE's main_linprobe.py crops at torchvision's default scale (0.08, 1), not pretraining's (0.2, 1)
    assert cfg.data.augment == "rrc" and cfg.data.name == "digits"
    model.train()
    assert not model.blocks[0].training and model.fc_norm.training  # frozen encoder stays in eval mode


@pytest.mark.slow
def test_finetune_and_linprobe_end_to_end(tiny_checkpoints, tmp_path, capsys):
    before = {k: v.clone() for k, v in ckpt.load_checkpoint(tiny_checkpoints["decayed"])["model"].items()}
    # 256 of the 1,437 training digits (4 steps an epoch, not 22): the test split, the recipes and what is checked stay
    common = ["train.epochs=2", "train.warmup_epochs=1", "train.batch_size=64", "data.train_subset=256", "--no-progress"]
    code, out, err = run(capsys, "finetune", tiny_checkpoints["decayed"], *common, f"train.out_dir={tmp_path / 'ft'}")
    assert code == 0, err
    rep = json.loads((tmp_path / "ft" / "eval.json").read_text())
    res = rep["results"][0]
    assert res["metric"] == "finetune" and 0 <= res["values"]["top1"] <= res["values"]["top5"] <= 1
    card = res["protocol"]
    assert (card["layer_decay"], card["mixup"], card["cutmix"], card["drop_path"]) == (0.65, 0.8, 1.0, 0.1)
    assert card["test_images"] == 360 and card["train_augmentation"] == "randaug" and card["pretrained_step"] == 44
    ft_final = ckpt.load_checkpoint(ckpt.list_checkpoints(tmp_path / "ft" / "checkpoints")[-1])["model"]
    assert not torch.equal(ft_final["blocks.0.attn.qkv.weight"], before["blocks.0.attn.qkv.weight"])  # encoder trained

    code, out, err = run(capsys, "finetune", tiny_checkpoints["decayed"], "--preset", "linprobe-mae", *common,
                         "train.batch_size=128", f"train.out_dir={tmp_path / 'lp'}")
    assert code == 0, err
    lp_final = ckpt.load_checkpoint(ckpt.list_checkpoints(tmp_path / "lp" / "checkpoints")[-1])["model"]
    assert torch.equal(lp_final["blocks.0.attn.qkv.weight"], before["blocks.0.attn.qkv.weight"])  # encoder frozen
    assert json.loads((tmp_path / "lp" / "eval.json").read_text())["results"][0]["protocol"]["optimizer"] == "lars"
    # resume continues the fine-tuning run, not a fresh one from the MAE weights
    code, out, err = run(capsys, "finetune", tiny_checkpoints["decayed"], *common, "train.epochs=3",
                         f"train.out_dir={tmp_path / 'ft'}", "--resume", "auto")
    assert code == 0 and "resumed from" in out


def test_finetune_bad_input(tiny_checkpoints, tmp_path, capsys):
    code, _, err = run(capsys, "finetune", tiny_checkpoints["decayed"], "--preset", "mae-tiny-digits", "--no-progress")
    assert_one_line_error(code, err, "not a fine-tuning recipe")
    code, _, err = run(capsys, "finetune", str(tmp_path / "missing.pt"))
    assert_one_line_error(code, err, "does not exist")
    code, _, err = run(capsys, "finetune", tiny_checkpoints["decayed"], "layer_decay=1.5", "--no-progress")
    assert_one_line_error(code, err, "layer_decay must lie in (0, 1]")


@pytest.mark.slow
def test_plot_and_figures_commands(tiny_checkpoints, tmp_path, capsys):
    from helpers import TINY
    from helpers import train_online as train

    runs = []
    for a in ("0.6", "1.0"):
        # 256 training digits (4 steps an epoch, not 22): the plot reads the 3 online evaluations of each run from its
        # log.jsonl; the CSV tracker alone, as a tracker that shows images would get each evaluation's figures drawn
        cfg = load_config("mae-tiny-digits", [*TINY, "train.epochs=6", "train.online_eval_every=2", "train.online_eval_size=200",
                                              "data.train_subset=256", "train.loggers=[csv]", f"alpha_min={a}",
                                              f"train.out_dir={tmp_path / a}"])
        s = train(cfg, progress=False)
        (tmp_path / a / "summary.json").write_text(json.dumps(s))
        runs.append(str(tmp_path / a))
    code, out, err = run(capsys, "plot", *runs, "--out", str(tmp_path / "plot"))
    assert code == 0, err
    assert "Pearson r(rank, probe)" in out and (tmp_path / "plot" / "rank_and_accuracy.png").exists()
    report = json.loads((tmp_path / "plot" / "plot.json").read_text())
    assert set(report["figure5c"]) == {"0.6 (decay linear alpha_min 0.6, skips)", "1.0 (plain, skips)"}  # nn.shortcut_info
    code, _, err = run(capsys, "plot", str(tmp_path))
    assert_one_line_error(code, err, "no online evaluations", "train.online_eval_every")
    code, out, err = run(capsys, "figures", tiny_checkpoints["plain"], tiny_checkpoints["decayed"], "--per-class", "5",
                         "--out", str(tmp_path / "figs"))
    assert code == 0, err
    for png in ("tsne.png", "pca_maps.png", "reconstructions.png"):
        assert (tmp_path / "figs" / png).stat().st_size > 1000


def test_figures_refuse_checkpoints_with_different_inputs(tiny_checkpoints, fake_fmnist, tmp_path, capsys):
    from helpers import TINY
    from helpers import train_online as train

    cfg = load_config("mae-tiny-digits", [*TINY, "train.epochs=1", "train.batch_size=32", "data.name=fashion-mnist",
                                          f"data.path={fake_fmnist}", "model.img_size=28", "model.patch_size=4",
                                          f"train.out_dir={tmp_path / 'fm'}"])
    other = train(cfg, progress=False)["checkpoint"]
    code, _, err = run(capsys, "figures", tiny_checkpoints["decayed"], other, "--out", str(tmp_path / "f"))
    assert_one_line_error(code, err, "take different inputs")
