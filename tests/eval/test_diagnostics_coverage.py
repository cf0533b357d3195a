"""The diagnostics on every row of the coverage table (docs/coverage.md): each library model ``decayify`` takes is
diagnosed, every stage of a staged model included, and where its blocks add ``alpha * x + f`` the path decomposition
rebuilds the stream to float round-off; feature maps are read as tokens with the right layout (a staged model's pixel
R^2 per stage equals scikit-learn's on the tokens read by hand)."""

from __future__ import annotations

import warnings

import pytest
import torch

from helpers.adapter_models import ROWS
from helpers.traced_blocks import MODELS as TRACED
from resdecay import decayify
from resdecay.eval.diagnostics import diagnose
from resdecay.stream.sites import stream_blocks

# rows whose blocks do not end in a bare add, so the decomposition cannot rebuild the stream (the diagnostics say so
# in their reconstruction error; the branch norms and the knock-out are measured all the same)
NOT_ADDITIVE = {
    "torchvision resnet (BasicBlock)": "relu(alpha x + f): the ReLU after the add",
    "diffusers PixArtTransformer2DModel (BasicTransformerBlock, ada_norm_single)": "its cross-attention add is left at "
        "alpha 1 by the adapter and is not one of the block's stated adds",
    "diffusers UNet2DConditionModel (ResnetBlock2D, BasicTransformerBlock)": "the same cross-attention add",
}
STAGED = {"timm swin (SwinTransformerBlock)", "timm convnext (ConvNeXtBlock)", "timm resnet (BasicBlock)",
          "torchvision swin (SwinTransformerBlock)", "torchvision convnext (CNBlock)", "timm levit_128s (LevitBlock)",
          "timm levit_conv_128s (LevitBlock, conv)", "timm poolformer (MetaFormerBlock)"}


def _row(name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the libraries' deprecation notes
        if name in TRACED:
            build, _, shape = TRACED[name]
            x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
            return build().eval(), lambda m: m(x)
        return ROWS[name][0]()


@pytest.mark.parametrize("name", [*ROWS, *TRACED])
def test_every_coverage_row_is_diagnosed(name):
    model, call = _row(name)
    model = decayify(model, alpha_min=0.6)
    report = diagnose(model, torch.zeros(2, 3, 8, 8), forward=lambda m, _x: call(m), batch_size=2,
                      which=("paths", "branches", "knockout"))
    blocks = [n for n, _ in stream_blocks(model)]
    assert report["blocks"] and sorted(report["blocks"]) == sorted(blocks)  # every stage, in the order they ran
    if name in STAGED:
        assert len({b.rpartition(".")[0] for b in blocks}) > 1
    paths = report["paths"]
    errors = [e for e in paths["reconstruction_error"] if e is not None]
    assert errors  # at least one stage is decomposed
    if name not in NOT_ADDITIVE:
        assert max(errors) < 1e-5, name
    branches, knock = report["branches"], report["knockout"]
    assert len(branches["shortcut_norm"]) == len(report["sub_blocks"])
    assert all(torch.isfinite(torch.tensor(v)) for v in branches["shortcut_norm"] + branches["branch_norm"])
    assert len(knock["change_tokens"]) == len(report["blocks"])
    assert all(v >= 0 for v in knock["change_tokens"])


@pytest.mark.parametrize("name", ["torchvision resnet (BasicBlock)", "timm mixer (MixerBlock)",
                                  "diffusers PixArtTransformer2DModel (BasicTransformerBlock, ada_norm_single)"])
def test_a_block_left_at_alpha_one_is_read_as_the_library_runs_it(name):
    """Replaced forwards installed only for the reading: the report equals the plain model's, and nothing stays."""
    model, call = _row(name)
    which = ("paths", "branches", "knockout")  # pixels: the images are the call's own, not these
    plain = diagnose(model, torch.zeros(2, 3, 8, 8), forward=lambda m, _x: call(m), batch_size=2, which=which)
    ones = decayify(model, alpha_min=1.0)
    assert diagnose(ones, torch.zeros(2, 3, 8, 8), forward=lambda m, _x: call(m), batch_size=2, which=which) == plain
    assert not any("forward" in m.__dict__ or "resdecay_factors" in m.__dict__ for m in ones.modules())


@pytest.mark.parametrize("name, block, first", [
    ("timm convnext (ConvNeXtBlock)", "stages.1.blocks.0", True),  # (B, C, H, W) maps
    ("timm swin (SwinTransformerBlock)", "layers.1.blocks.0", False),  # (B, H, W, C) maps
])
def test_a_staged_model_s_pixel_r2_is_scikit_learn_s_on_each_stage_s_tokens(name, block, first):
    """At 32 px, the second stage's 4x4 map of tokens and its 8x8-pixel patches: one ridge, by hand."""
    from sklearn.linear_model import Ridge
    from sklearn.metrics import r2_score

    from resdecay.eval.diagnostics.pixels import pixel_targets
    model, _ = _row(name)
    images = torch.rand(12, 3, 32, 32, generator=torch.Generator().manual_seed(3))
    report = diagnose(model, images, which=("pixels",), pixel_patches=None, batch_size=12)
    pixels = report["pixels"]
    layer = report["blocks"].index(block) + 1  # 0 is x_0
    assert pixels["patch"][0] == [4, 4] and pixels["patch"][layer] == [8, 8]
    maps = []
    handle = model.get_submodule(block).register_forward_hook(lambda m, a, o: maps.append(o))
    with torch.no_grad():
        model.forward_features(images)
    handle.remove()
    tokens = (maps[0].flatten(2).transpose(1, 2) if first else maps[0].flatten(1, 2)).double()  # (B, 16, C)
    target = pixel_targets(images, (8, 8), 2.0)[0].double()
    fit, score = torch.arange(12) % 2 == 0, torch.arange(12) % 2 == 1
    ridge = Ridge(alpha=pixels["lambda"][layer]).fit(tokens[fit].reshape(-1, tokens.shape[-1]),
                                                     target[fit].reshape(-1, target.shape[-1]))
    pred = ridge.predict(tokens[score].reshape(-1, tokens.shape[-1]))
    want = r2_score(target[score].reshape(-1, target.shape[-1]), pred, multioutput="variance_weighted")
    assert pixels["r2_pixels"][layer] == pytest.approx(want, abs=1e-6)


def test_a_u_net_s_blocks_are_read_in_the_order_they_run():
    """container="all": a U-Net's down, middle and up blocks; diffusers registers a down block's attentions before
    the ResNet blocks they follow, the diagnostics order them as the forward runs them."""
    model, call = _row("diffusers UNet2DModel (ResnetBlock2D, Attention residual_connection)")
    order = []
    hooks = [m.register_forward_pre_hook(lambda m, a, n=n: order.append(n)) for n, m in stream_blocks(model, "all")]
    call(model)
    for h in hooks:
        h.remove()
    report = diagnose(decayify(model, alpha_min=0.6), torch.zeros(2, 3, 8, 8), forward=lambda m, _x: call(m),
                      container="all", which=("paths", "knockout"), batch_size=2)
    assert report["blocks"] == list(dict.fromkeys(order)) and len(report["blocks"]) > 4
    assert max(e for e in report["paths"]["reconstruction_error"] if e is not None) < 1e-5
