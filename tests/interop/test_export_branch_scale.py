"""``resdecay export --to timm`` of an encoder trained with branch gains (``model.branch_scale``): timm's
LayerScale holds them, ReZero's one gain per block and SkipInit's scalars spread over the channels."""

from __future__ import annotations

import pytest
import torch

from helpers import run
from helpers.interop import resdecay_checkpoint, timm_blocks
from resdecay.interop import load_exported
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
