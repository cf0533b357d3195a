"""resdecay import-weights: official MAE, the authors' U-Net MAE and timm ViTs into resdecay checkpoints (issue 13, item 3)."""

import argparse
import re

import numpy as np
import pytest
import torch

from helpers import assert_one_line_error, run
from helpers.interop import authors_unet_layout, resdecay_checkpoint, same_mae_outputs, timm_blocks, tiny_timm
from resdecay import decayify
from resdecay.errors import CheckpointError
from resdecay.interop import save_decayified
from resdecay.interop.import_weights import import_weights
from resdecay.train.checkpoint import load_model
from resdecay.train.config import suggested_heads

# the encoder's dimensions come from the timm weights; heads and a small decoder from here
TIMM = ["model.num_heads=3", "model.decoder_embed_dim=32", "model.decoder_depth=2", "model.decoder_num_heads=2"]
RGB = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
_authors_unet_layout = authors_unet_layout  # its old name here, which tests/e2e/test_readme_commands.py imports


def test_official_mae_checkpoint(capsys, tmp_path):
    src, _ = resdecay_checkpoint(tmp_path / "src.pt", "mae-tiny-digits-plain")
    # facebookresearch/mae layout: {'model': state_dict} with the same names, plus what its
    # main_pretrain.py saves beside it (args as an argparse.Namespace, optimizer, scaler, epoch)
    opt = torch.optim.AdamW(src.parameters())
    torch.save({"model": src.state_dict(), "optimizer": opt.state_dict(), "epoch": 799, "scaler": {"scale": 65536.0},
                "args": argparse.Namespace(lr=None, blr=1.5e-4, mask_ratio=0.75, output_dir="./output_dir")},
               tmp_path / "mae_pretrain.pth")
    code, out, err = run(capsys, "import-weights", str(tmp_path / "mae_pretrain.pth"), "--format", "mae",
                         "--preset", "mae-tiny-digits-plain", "--out", str(tmp_path / "imp.pt"), "model.num_heads=2",
                         "model.decoder_num_heads=2")
    assert code == 0, err
    model, cfg = load_model(tmp_path / "imp.pt")
    assert (cfg.model.embed_dim, cfg.model.depth, cfg.model.decoder_depth, cfg.model.alpha_min) == (32, 4, 2, 1.0)
    assert cfg.model.encoder_norm and not cfg.model.skips
    assert same_mae_outputs(src, model)
    # resdecay eval accepts the imported checkpoint
    code, out, err = run(capsys, "eval", str(tmp_path / "imp.pt"), "--evals", "knn,rank", "--no-baselines", "--no-progress",
                         "--max-train", "200", "--max-test", "100", "--out", str(tmp_path / "ev"))
    assert code == 0, err
    assert (tmp_path / "ev").is_dir()


def test_authors_unet_mae_checkpoint(capsys, tmp_path):
    src, _ = resdecay_checkpoint(tmp_path / "src.pt", "mae-tiny-digits", ["alpha_min=0.7"])
    theirs = authors_unet_layout(src.state_dict())
    assert "skip.0.fc.0.weight" in theirs and not any(k.startswith("skip_fusions") for k in theirs)
    torch.save({"model": theirs}, tmp_path / "unet.pth")
    base = ["import-weights", str(tmp_path / "unet.pth"), "--format", "unet-mae", "--preset", "mae-tiny-digits",
            "--out", str(tmp_path / "imp.pt"), "model.num_heads=2", "model.decoder_num_heads=2"]
    assert_one_line_error(*run(capsys, *base)[::2], "needs --alpha-min")
    code, _, err = run(capsys, *base, "--alpha-min", "0.7")
    assert code == 0, err
    model, cfg = load_model(tmp_path / "imp.pt")
    assert cfg.model.alpha_min == 0.7 and cfg.model.skips and not cfg.model.encoder_norm
    assert torch.equal(model.alphas, src.alphas) and same_mae_outputs(src, model)
    # a wrong alpha_min imports, but it is a different network: outputs differ
    code, _, err = run(capsys, *base, "--alpha-min", "0.5")
    assert code == 0 and not same_mae_outputs(src, load_model(tmp_path / "imp.pt")[0])


def test_foreign_checkpoints_that_do_not_fit_are_refused(capsys, tmp_path):
    src, _ = resdecay_checkpoint(tmp_path / "src.pt", "mae-tiny-digits", ["alpha_min=0.7"])
    theirs = authors_unet_layout(src.state_dict())
    base = ["--format", "unet-mae", "--alpha-min", "0.7", "--preset", "mae-tiny-digits", "--out", str(tmp_path / "o.pt"),
            "model.num_heads=2", "model.decoder_num_heads=2"]
    cases = [
        ({k: v for k, v in theirs.items() if k != "decoder_pred.bias"}, "missing key"),
        ({**theirs, "extra.weight": torch.zeros(1)}, "unexpected key"),
        ({**theirs, "decoder_cls_token": torch.zeros(1, 1, 7)}, "shape mismatch"),
        ({k: v for k, v in theirs.items() if not k.startswith("skip.1.")}, "skip fusions"),
    ]
    for i, (state, fragment) in enumerate(cases):
        torch.save({"model": state}, tmp_path / f"bad{i}.pth")
        assert_one_line_error(*run(capsys, "import-weights", str(tmp_path / f"bad{i}.pth"), *base)[::2], fragment)
    assert_one_line_error(*run(capsys, "import-weights", str(tmp_path / "bad0.pth"), "--format", "mae", "--alpha-min", "0.6",
                               "--preset", "mae-tiny-digits", "--out", str(tmp_path / "o.pt"))[::2], "--alpha-min applies")
    assert_one_line_error(*run(capsys, "import-weights", str(tmp_path / "none.pth"), *base)[::2], "does not exist")
    (tmp_path / "junk.pth").write_bytes(b"junk")
    assert_one_line_error(*run(capsys, "import-weights", str(tmp_path / "junk.pth"), *base)[::2], "not a readable weights file")
    # the number of heads is not in the weights: at another width than the preset's it must be given
    assert_one_line_error(*run(capsys, "import-weights", str(tmp_path / "bad0.pth"), *base[:-2])[::2],
                          "embed_dim 32 but preset 'mae-tiny-digits' has 64", "model.num_heads=N")
    assert not (tmp_path / "o.pt").exists()


def test_the_heads_hint_suggests_a_number_of_heads_that_divides_the_width(capsys, tmp_path):
    """Issue 38.9: at embed_dim 32 the hint said "e.g. 0 for 64-wide heads" (32 // 64); what it suggests now is a
    divisor of the width (so at least 1), and the import it suggests runs."""
    assert all(w % suggested_heads(w) == 0 and suggested_heads(w) >= 1 for w in range(1, 1025))
    assert [suggested_heads(w) for w in (32, 100, 192, 768)] == [1, 2, 3, 12]
    src, _ = resdecay_checkpoint(tmp_path / "src.pt", "mae-tiny-digits", ["alpha_min=0.7"])
    torch.save({"model": authors_unet_layout(src.state_dict())}, tmp_path / "theirs.pth")
    argv = ["import-weights", str(tmp_path / "theirs.pth"), "--format", "unet-mae", "--alpha-min", "0.7", "--preset",
            "mae-tiny-digits", "--out", str(tmp_path / "o.pt")]
    given = []
    for heads in ("num_heads", "decoder_num_heads"):  # each hint in turn, followed as a user would
        code, _, err = run(capsys, *argv, *given)
        assert_one_line_error(code, err, f"give model.{heads}=N (e.g. ")
        n = int(re.search(r"\(e\.g\. (\d+):", err).group(1))
        assert n >= 1 and "e.g. 0" not in err
        given.append(f"model.{heads}={n}")
    code, _, err = run(capsys, *argv, *given)
    assert code == 0, err


@pytest.mark.parametrize("kw", [{"num_classes": 10}, {"num_classes": 5, "global_pool": "avg"},
                                {"num_classes": 10, "init_values": 0.1}, {"num_classes": 0}])
def test_timm_vit_into_classifier_or_encoder(tmp_path, kw):
    vit = tiny_timm(**kw)
    torch.save(vit.state_dict(), tmp_path / "vit.pth")
    out = import_weights(tmp_path / "vit.pth", "timm-vit", "mae-tiny-digits", tmp_path / "imp.pt",
                         overrides=TIMM)
    model, cfg = load_model(out)
    assert cfg.model.family == ("classifier" if kw["num_classes"] else "mae")
    with torch.no_grad():
        assert torch.allclose(model.forward_features(RGB), timm_blocks(vit, RGB), atol=1e-5)
        if kw["num_classes"]:
            assert torch.allclose(model(RGB), vit(RGB), atol=1e-5)
        else:
            assert torch.allclose(model.norm(model.forward_features(RGB)), vit.forward_features(RGB), atol=1e-5)


def test_decayified_timm_brings_its_alpha(tmp_path):
    vit = decayify(tiny_timm(num_classes=10), alpha_min=0.6, schedule="cosine")
    save_decayified(vit, tmp_path / "d.pt")
    out = import_weights(tmp_path / "d.pt", "timm-vit", "mae-tiny-digits", tmp_path / "imp.pt",
                         overrides=TIMM)
    model, cfg = load_model(out)
    assert cfg.model.alpha_min == 0.6 and cfg.model.schedule == "cosine"
    with torch.no_grad():
        assert torch.allclose(model(RGB), vit(RGB), atol=1e-5)
    with pytest.raises(Exception, match="stores alpha_min 0.6 but --alpha-min is 0.5"):
        import_weights(tmp_path / "d.pt", "timm-vit", "mae-tiny-digits", tmp_path / "x.pt", alpha_min=0.5,
                       overrides=TIMM)


@pytest.mark.parametrize("pool", ["avg", "token"])
def test_timm_round_trip_through_export(capsys, tmp_path, pool):
    from resdecay.interop import load_exported

    vit = decayify(tiny_timm(num_classes=5, global_pool=pool), alpha_min=0.7)
    save_decayified(vit, tmp_path / "d.pt")
    import_weights(tmp_path / "d.pt", "timm-vit", "mae-tiny-digits", tmp_path / "imp.pt", overrides=TIMM)
    code, _, err = run(capsys, "export", str(tmp_path / "imp.pt"), "--to", "timm", "--out", str(tmp_path / "v.safetensors"))
    assert code == 0, err
    back = load_exported(tmp_path / "v.safetensors")
    with torch.no_grad():
        assert torch.allclose(back(RGB), vit(RGB), atol=1e-5)
    with pytest.raises(CheckpointError, match="qk|q_norm|feature resdecay"):
        torch.save(tiny_timm(qk_norm=True).state_dict(), tmp_path / "qk.pth")
        import_weights(tmp_path / "qk.pth", "timm-vit", "mae-tiny-digits", tmp_path / "x.pt", overrides=TIMM)


@pytest.mark.parametrize("layout,fmt", [("mae", "mae"), ("unet", "unet-mae"), ("timm", "timm-vit")])
def test_eval_of_a_foreign_checkpoint_names_the_import_command(capsys, tmp_path, layout, fmt):
    """Issue 13 item 6: loading a timm / MAE checkpoint into `resdecay eval` printed raw ANSI escape
    codes and a sentence cut off in the middle. Now: one line naming the conversion."""
    src, _ = resdecay_checkpoint(tmp_path / "src.pt", "mae-tiny-digits", ["alpha_min=0.7"])
    sd = {"mae": {k: v for k, v in src.state_dict().items() if not k.startswith("skip_fusions")},
          "unet": authors_unet_layout(src.state_dict()),
          "timm": {k: v for k, v in src.state_dict().items() if not k.startswith(("decoder", "skip", "mask"))}}[layout]
    foreign = tmp_path / "foreign.pth"
    torch.save({"model": sd, "epoch": 3, "args": argparse.Namespace(lr=1e-3), "metric": np.float64(0.5)}, foreign)
    code, out, err = run(capsys, "eval", str(foreign), "--no-progress")
    assert_one_line_error(code, err, f"import-weights {foreign} --format {fmt}")
    assert "\x1b" not in err and "weights_only" not in err


def test_code_bearing_checkpoint_is_refused_in_plain_words(capsys, tmp_path):
    bad = tmp_path / "bad.pth"
    torch.save({"model": {}, "hook": print}, bad)  # a global weights_only does not admit
    for cmd in (["eval", str(bad)], ["import-weights", str(bad), "--format", "mae", "--preset", "mae-tiny-digits",
                                     "--out", str(tmp_path / "x.pt")]):
        code, out, err = run(capsys, *cmd)
        assert_one_line_error(code, err, "code-bearing Python objects such as print")
        assert "\x1b" not in err and "(1)" not in err
