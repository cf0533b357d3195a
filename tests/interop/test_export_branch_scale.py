"""Exports of an MAE trained with branch gains (``model.branch_scale``): ``--to timm`` holds them in timm's
LayerScale (ReZero's one gain per block and SkipInit's scalars spread over the channels); ``--to hf-vitmae``
folds them into each branch's last Linear."""

from __future__ import annotations

import pytest
import torch

from helpers import DIGITS_IMAGE, run, tiny_config
from helpers.interop import resdecay_checkpoint, timm_blocks
from resdecay.interop import load_exported
from resdecay.interop.hf_vitmae import mae_to_vitmae_state, vitmae_to_mae_state
from resdecay.models import build_model
from resdecay.models.mae import MAEConfig
from resdecay.train.checkpoint import load_model

RGB = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(3))
RGB32 = ["model.in_chans=3", "model.img_size=32", "model.patch_size=8"]


@pytest.mark.parametrize("kind", ["layerscale", "rezero", "skipinit"])
def test_an_exported_encoder_keeps_its_branch_gains(capsys, tmp_path, kind):
    resdecay_checkpoint(tmp_path / "c.pt", "mae-tiny-digits", [*RGB32, f"model.branch_scale={kind}",
                                                               "model.drop_identity=0.1", "model.drop_branch=0.1"])
    state = torch.load(tmp_path / "c.pt", weights_only=True)
    gen = torch.Generator().manual_seed(0)
    for k, v in state["model"].items():
        if k.endswith("gamma"):  # trained gains, away from their start (0 or epsilon)
            v.copy_(torch.rand(v.shape, generator=gen) + 0.5)
    torch.save(state, tmp_path / "c.pt")
    code, _, err = run(capsys, "export", str(tmp_path / "c.pt"), "--to", "timm", "--out", str(tmp_path / "v.safetensors"))
    assert code == 0, err
    src, _ = load_model(tmp_path / "c.pt")
    vit = load_exported(tmp_path / "v.safetensors")
    assert vit.blocks[0].ls1.gamma.shape == (src.cfg.embed_dim,)
    if kind == "rezero":  # one gain per block, under both of timm's keys
        assert torch.equal(vit.blocks[0].ls1.gamma, vit.blocks[0].ls2.gamma)
    with torch.no_grad():
        assert torch.allclose(timm_blocks(vit, RGB), src.eval().forward_features(RGB), atol=1e-5)


@pytest.mark.parametrize("kind", ["layerscale", "rezero", "skipinit"])
def test_a_vitmae_export_folds_the_gains_into_the_branches(kind):
    """transformers' ViTMAE has no branch gains: each is folded into its branch's last Linear, so the
    converted weights (read back as a plain MAE) compute the same function."""
    cfg = tiny_config("mae", **DIGITS_IMAGE, alpha_min=1.0, skips=False, zero_init=False, encoder_norm=True,
                      branch_scale=kind, decoder_decay=True)
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("gamma"):
                p.copy_(torch.rand(p.shape) + 0.5)
    hf_state, hf_config = mae_to_vitmae_state(model.state_dict(), cfg)
    state, kwargs = vitmae_to_mae_state(hf_state, hf_config)
    plain = build_model(MAEConfig(**kwargs)).eval()
    plain.load_state_dict(state, strict=True)
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        assert torch.allclose(plain.forward_features(x), model.forward_features(x), atol=1e-5)
        torch.manual_seed(1)
        want = model(x)[1]
        torch.manual_seed(1)
        assert torch.allclose(plain(x)[1], want, atol=1e-5)  # the decoder's gains too
