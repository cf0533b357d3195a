"""Weights both ways with Hugging Face ViTMAE (issue 31, item 4): import-weights --format hf-vitmae
and export --to hf-vitmae, checked against transformers' own ViTMAEForPreTraining under the same masking noise."""

import json
import re

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import ViTMAEConfig, ViTMAEForPreTraining

from helpers import assert_one_line_error, run
from helpers.interop import resdecay_checkpoint
from resdecay.errors import CheckpointError, UserError
from resdecay.interop.hf_vitmae import LayerNormEpsWarning, mae_to_vitmae_state, vitmae_to_mae_state
from resdecay.models import build_model
from resdecay.models.mae import MAEConfig
from resdecay.train.checkpoint import load_model

# a digits-sized ViTMAE (8x8 grey images, patch 2): the preset mae-tiny-digits-plain gives data and training
HF = dict(hidden_size=32, num_hidden_layers=3, num_attention_heads=2, intermediate_size=128, image_size=8, patch_size=2,
          num_channels=1, decoder_hidden_size=32, decoder_num_hidden_layers=2, decoder_num_attention_heads=4,
          decoder_intermediate_size=128, mask_ratio=0.75, norm_pix_loss=True)
IMGS = torch.randn(3, 1, 8, 8, generator=torch.Generator().manual_seed(4))
PRESET = ["--preset", "mae-tiny-digits-plain"]


def tiny_vitmae(seed=0, **kw):
    torch.manual_seed(seed)
    model = ViTMAEForPreTraining(ViTMAEConfig(**{**HF, "layer_norm_eps": 1e-6, **kw})).eval()
    with torch.no_grad():  # random biases and LayerNorm affines, so that every weight matters in a comparison
        for p in model.parameters():
            if p.dim() == 1:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def differences(hf, ours, imgs=IMGS, seed=3):
    """(|loss difference|, max |prediction difference|, masks equal) under the same masking noise:
    resdecay draws torch.rand(B, N) right after its patch embedding, so the same seed gives transformers' noise."""
    n = hf.config.image_size // hf.config.patch_size
    with torch.no_grad():
        torch.manual_seed(seed)
        out = hf(imgs, noise=torch.rand(len(imgs), n * n))
        torch.manual_seed(seed)
        loss, pred, mask = ours(imgs)
    return (loss - out.loss).abs().item(), (pred - out.logits).abs().max().item(), torch.equal(mask, out.mask)


def v4_layout(state):
    """transformers 4.x key names (vit.encoder.layer.i.attention.attention.query ...)."""
    names = {"attention.q_proj": "attention.attention.query", "attention.k_proj": "attention.attention.key",
             "attention.v_proj": "attention.attention.value", "attention.o_proj": "attention.output.dense",
             "mlp.fc1": "intermediate.dense", "mlp.fc2": "output.dense"}
    out = {}
    for k, v in state.items():
        k = re.sub(r"^vit\.layers\.", "vit.encoder.layer.", k)
        for new, old in names.items():
            k = k.replace(f".{new}.", f".{old}.")
        out[k] = v
    return out


def test_mapping_functions_both_ways_are_exact():
    hf = tiny_vitmae()
    state, kwargs = vitmae_to_mae_state(hf.state_dict(), hf.config.to_dict())
    assert kwargs["num_heads"] == 2 and kwargs["decoder_num_heads"] == 4 and kwargs["alpha_min"] == 1.0
    ours = build_model(MAEConfig(**kwargs)).eval()
    ours.load_state_dict(state, strict=True)
    loss_diff, pred_diff, same_mask = differences(hf, ours)
    assert same_mask and loss_diff < 1e-6 and pred_diff < 1e-5
    # the 4.x names map to the same weights
    state4, kwargs4 = vitmae_to_mae_state(v4_layout(hf.state_dict()), hf.config.to_dict())
    assert kwargs4 == kwargs and all(torch.equal(state4[k], state[k]) for k in state)
    # and back: transformers 5.x loads the converted weights strictly, every tensor as it was
    back, config = mae_to_vitmae_state(ours.state_dict(), ours.cfg)
    fresh = ViTMAEForPreTraining(ViTMAEConfig(**{k: v for k, v in config.items() if k != "architectures"})).eval()
    fresh.load_state_dict(back, strict=True)
    assert all(torch.equal(fresh.state_dict()[k], v) for k, v in hf.state_dict().items())


@pytest.mark.parametrize("src", ["folder", "safetensors-file", "bin-4x"])
def test_import_cli_equals_transformers(capsys, tmp_path, src):
    hf = tiny_vitmae()
    hf.save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf"
    if src == "safetensors-file":
        path = path / "model.safetensors"
    elif src == "bin-4x":  # a 4.x-era pytorch_model.bin beside its config.json
        (path / "model.safetensors").unlink()
        torch.save(v4_layout(hf.state_dict()), path / "pytorch_model.bin")
    code, out, err = run(capsys, "import-weights", str(path), "--format", "hf-vitmae", *PRESET, "--out", str(tmp_path / "i.pt"))
    assert code == 0, err
    assert "warning" not in out  # eps 1e-6: nothing to warn about
    model, cfg = load_model(tmp_path / "i.pt")
    m = cfg.model
    assert (m.embed_dim, m.depth, m.num_heads, m.decoder_num_heads, m.img_size, m.in_chans) == (32, 3, 2, 4, 8, 1)
    assert (m.alpha_min, m.skips, m.encoder_norm, m.norm_pix_loss, m.mask_ratio) == (1.0, False, True, True, 0.75)
    loss_diff, pred_diff, same_mask = differences(hf, model.eval())
    assert same_mask and loss_diff < 1e-6 and pred_diff < 1e-5


def test_eps_1e12_import_warns_in_one_line_and_differs_by_that_eps(capsys, tmp_path):
    hf = tiny_vitmae(layer_norm_eps=1e-12)  # transformers' default
    hf.save_pretrained(tmp_path / "hf")
    code, out, err = run(capsys, "import-weights", str(tmp_path / "hf"), "--format", "hf-vitmae", *PRESET,
                         "--out", str(tmp_path / "i.pt"))
    assert code == 0, err
    warned = [ln for ln in out.splitlines() if ln.startswith("warning:")]
    assert len(warned) == 1 and "layer_norm_eps 1e-12" in warned[0] and "1e-06" in warned[0]
    model = load_model(tmp_path / "i.pt")[0].eval()
    loss_diff, pred_diff, same_mask = differences(hf, model)
    assert same_mask and 0 < pred_diff < 0.1  # close, but not the same function
    hf.config.layer_norm_eps = 1e-6  # the same model with resdecay's epsilon: equal
    for layer in hf.modules():
        if isinstance(layer, torch.nn.LayerNorm):
            layer.eps = 1e-6
    assert differences(hf, model)[1] < 1e-5
    with pytest.warns(LayerNormEpsWarning):
        vitmae_to_mae_state(hf.state_dict(), {**hf.config.to_dict(), "layer_norm_eps": 1e-12})


def test_export_cli_loads_in_transformers_with_equal_outputs(capsys, tmp_path):
    ours, _ = resdecay_checkpoint(tmp_path / "c.pt", "mae-tiny-digits-plain", ["model.decoder_num_heads=4"])
    code, out, err = run(capsys, "export", str(tmp_path / "c.pt"), "--to", "hf-vitmae", "--out", str(tmp_path / "hf"))
    assert code == 0, err
    assert "ViTMAEForPreTraining.from_pretrained" in out and "warning" not in out
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["layer_norm_eps"] == 1e-6 and "resdecay" not in config
    hf = ViTMAEForPreTraining.from_pretrained(tmp_path / "hf").eval()
    loss_diff, pred_diff, same_mask = differences(hf, ours)
    assert same_mask and loss_diff < 1e-6 and pred_diff < 1e-5
    # and back into resdecay: the same weights, tensor for tensor
    code, _, err = run(capsys, "import-weights", str(tmp_path / "hf"), "--format", "hf-vitmae", *PRESET, "--out", str(tmp_path / "b.pt"))
    assert code == 0, err
    back = load_model(tmp_path / "b.pt")[0]
    assert all(torch.equal(back.state_dict()[k], v) for k, v in ours.state_dict().items())
    # a second export into the same folder overwrites it; a folder of other files is refused
    assert run(capsys, "export", str(tmp_path / "c.pt"), "--to", "hf-vitmae", "--out", str(tmp_path / "hf"))[0] == 0
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("x")
    assert_one_line_error(*run(capsys, "export", str(tmp_path / "c.pt"), "--to", "hf-vitmae", "--out",
                               str(tmp_path / "busy"))[::2], "already holds other files")


def test_decayed_export_warns_keeps_its_decay_and_unet_is_refused(capsys, tmp_path):
    ours, _ = resdecay_checkpoint(tmp_path / "d.pt", "mae-tiny-digits-plain", ["alpha_min=0.6", "model.schedule=cosine"])
    code, out, err = run(capsys, "export", str(tmp_path / "d.pt"), "--to", "hf-vitmae", "--out", str(tmp_path / "hf"))
    assert code == 0, err
    warned = [ln for ln in out.splitlines() if ln.startswith("warning:")]
    assert len(warned) == 1 and "without them" in warned[0] and "alpha_min 0.6" in warned[0]
    section = json.loads((tmp_path / "hf" / "config.json").read_text())["resdecay"]  # resdecay.nn.config_record's schema
    assert section["version"] == 1 and section["steps"] == [{"op": "decayify", "on": "ViTMAEModel", "alpha_min": 0.6,
                                                             "schedule": "cosine", "branches": "both"}]
    hf = ViTMAEForPreTraining.from_pretrained(tmp_path / "hf").eval()
    assert differences(hf, ours)[1] > 1e-3  # transformers runs it plain: another function, as the warning says
    code, _, err = run(capsys, "import-weights", str(tmp_path / "hf"), "--format", "hf-vitmae", *PRESET, "--out", str(tmp_path / "b.pt"))
    assert code == 0, err
    back, cfg = load_model(tmp_path / "b.pt")
    assert (cfg.model.alpha_min, cfg.model.schedule) == (0.6, "cosine") and torch.equal(back.alphas, ours.alphas)
    # a folder an earlier export wrote (the MAE's decay fields under "resdecay") imports the same
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    config["resdecay"] = {"alpha_min": 0.6, "schedule": "cosine", "decay_branches": "both", "decoder_decay": False}
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    code, _, err = run(capsys, "import-weights", str(tmp_path / "hf"), "--format", "hf-vitmae", *PRESET, "--out", str(tmp_path / "o.pt"))
    assert code == 0, err
    assert torch.equal(load_model(tmp_path / "o.pt")[0].alphas, ours.alphas)
    # a record resdecay's MAE cannot express (the whole model's decay in one schedule) is one line
    config["resdecay"] = {"version": 1, "steps": [{"op": "decayify", "on": "ViTMAEForPreTraining", "alpha_min": 0.5}]}
    (tmp_path / "hf" / "config.json").write_text(json.dumps(config))
    assert_one_line_error(*run(capsys, "import-weights", str(tmp_path / "hf"), "--format", "hf-vitmae", *PRESET, "--out",
                               str(tmp_path / "x.pt"))[::2], "decayify ViTMAEForPreTraining", "resdecay.interop.restore")
    with torch.no_grad():
        torch.manual_seed(1)
        a = ours(IMGS)
        torch.manual_seed(1)
        b = back(IMGS)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    # the U-Net MAE has no ViTMAE form, nor a classifier
    resdecay_checkpoint(tmp_path / "u.pt", "mae-tiny-digits")
    assert_one_line_error(*run(capsys, "export", str(tmp_path / "u.pt"), "--to", "hf-vitmae", "--out", str(tmp_path / "u"))[::2],
                          "U-Net MAE", "no ViTMAE form")
    with pytest.raises(UserError, match="exports an MAE"):
        mae_to_vitmae_state({}, type("C", (), {"family": "classifier"})())


def test_bad_folders_are_refused_in_one_line(capsys, tmp_path):
    tiny_vitmae().save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    base = ["--format", "hf-vitmae", *PRESET, "--out", str(tmp_path / "o.pt")]

    def case(name, edit_config=None, edit_state=None):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(edit_config(dict(config)) if edit_config else config))
        state = load_file(tmp_path / "hf" / "model.safetensors")
        save_file(edit_state(state) if edit_state else state, folder / "model.safetensors", metadata={"format": "pt"})
        return run(capsys, "import-weights", str(folder), *base)[::2]

    assert_one_line_error(*case("wide", lambda c: {**c, "hidden_size": 64}), "hidden_size 64", "embed_dim = 64", "weights have 32")
    assert_one_line_error(*case("deep", lambda c: {**c, "num_hidden_layers": 4}), "num_hidden_layers 4", "weights have 3")
    assert_one_line_error(*case("ratio", lambda c: {**c, "decoder_intermediate_size": 64}), "one model.mlp_ratio")
    assert_one_line_error(*case("bert", lambda c: {**c, "model_type": "bert"}), "not vit_mae")
    assert_one_line_error(*case("extra", edit_state=lambda s: {**s, "vit.pooler.weight": torch.zeros(2)}), "vit.pooler.weight")
    assert_one_line_error(*case("encoder-only", edit_state=lambda s: {k: v for k, v in s.items() if not k.startswith("decoder.")}),
                          "not a ViTMAEForPreTraining")
    (tmp_path / "nocfg").mkdir()
    (tmp_path / "hf" / "model.safetensors").rename(tmp_path / "nocfg" / "model.safetensors")
    assert_one_line_error(*run(capsys, "import-weights", str(tmp_path / "nocfg"), *base)[::2], "no config.json")
    assert_one_line_error(*run(capsys, "import-weights", str(tmp_path / "hf"), *base)[::2], "holds no model.safetensors")
    (tmp_path / "wide" / "config.json").write_text(json.dumps(config))  # a plain ViTMAE: alpha 1, no other
    assert_one_line_error(*run(capsys, "import-weights", str(tmp_path / "wide"), *base, "--alpha-min", "0.5")[::2],
                          "stores alpha_min 1", "drop --alpha-min")
    with pytest.raises(CheckpointError, match="weights have"):  # the function itself, as another caller uses it
        vitmae_to_mae_state(load_file(tmp_path / "deep" / "model.safetensors"), {**config, "patch_size": 4})


def test_resuming_an_imported_file_is_one_line_pointing_to_eval_and_finetune(capsys, tmp_path):
    """An import holds weights only: --resume of it was a KeyError('optimizer') from deep in the trainer."""
    tiny_vitmae().save_pretrained(tmp_path / "hf")
    code, _, err = run(capsys, "import-weights", str(tmp_path / "hf"), "--format", "hf-vitmae", *PRESET,
                       "--out", str(tmp_path / "i.pt"))
    assert code == 0, err
    code, _, err = run(capsys, "pretrain", *PRESET, "--resume", str(tmp_path / "i.pt"), f"train.out_dir={tmp_path / 'run'}",
                       "model.embed_dim=32", "model.depth=3", "model.num_heads=2", "model.decoder_embed_dim=32",
                       "model.decoder_depth=2", "model.decoder_num_heads=4", "model.patch_size=2")
    assert_one_line_error(code, err, "holds model weights only", "resdecay finetune")
