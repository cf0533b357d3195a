"""timm's SAM ViT (issue 51): its class is also named ``Block``, and the timm ViT adapter once took it by that bare
name, installing the correction on ``drop_path1`` -- inside the window partition, where the branch has another shape
than x -- so the decayified model crashed at its first forward. Adapters now match a class by its module path; the
SAM block falls to the traced adapter, which proves its adds: alpha 1 is bit-exact, one block matches a hand
computation, the keys are unchanged."""

from __future__ import annotations

import pytest
import torch

from resdecay import alphas_of, decayify
from resdecay.nn.adapters import adapter_for

timm = pytest.importorskip("timm")
sam = pytest.importorskip("timm.models.vision_transformer_sam")


def _sam():
    torch.manual_seed(0)
    return timm.create_model("samvit_base_patch16", pretrained=False, img_size=64, patch_size=16, embed_dim=32, depth=2,
                             num_heads=2, window_size=2, global_attn_indexes=(1,), neck_chans=16).eval()


def test_the_timm_vit_adapter_matches_by_module_path_not_by_the_name_block():
    model = _sam()
    assert adapter_for(model.blocks[0]) is None  # not "timm VisionTransformer Block": that one is for ViT's Block
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, depth=1)
    assert adapter_for(vit.blocks[0]).name == "timm VisionTransformer Block"


def test_sam_vit_is_decayified_exactly():
    model, x = _sam(), torch.randn(2, 3, 64, 64)
    reference, keys = model(x), list(model.state_dict())
    assert torch.equal(decayify(model, alpha_min=1.0)(x), reference)  # alpha 1: bit for bit
    decayify(model, alpha_min=0.6)
    assert list(model.state_dict()) == keys
    (_, a0), (_, a1) = alphas_of(model)
    assert a0 == (1.0, pytest.approx(13 / 15)) and a1[1] == pytest.approx(0.6)
    assert not torch.allclose(model(x), reference)
    # block 0 by hand, from its own modules: alpha_1 * x + window_unpartition(attn(window_partition(norm1(x)))),
    # then alpha_2 * y + mlp(norm2(y)) on the (B, H*W, C) view (drop_path and layer scale are identities here)
    block = model.blocks[0]
    with torch.no_grad():
        h = model.patch_embed(x) + model.pos_embed  # (B, H, W, C)
        B, H, W, C = h.shape
        parts, pad = sam.window_partition(block.norm1(h), block.window_size)
        y = a0[0] * h + sam.window_unpartition(block.attn(parts), block.window_size, (H, W), pad)
        y = y.reshape(B, H * W, C)
        expected = (a0[1] * y + block.mlp(block.norm2(y))).reshape(B, H, W, C)
        assert torch.allclose(block(h), expected, atol=1e-6)


def test_a_video_resnets_basic_block_is_refused_in_one_line_not_accepted_then_broken():
    """torchvision's video ResNet has its own ``BasicBlock`` (``out += residual`` after a 3-D conv stack): the image
    ResNet adapter took it by name and the model then failed at decayify (no ``bn2``). Now no adapter takes it, and
    the traced adapter refuses its in-place add in one short line."""
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.video.r3d_18(num_classes=4)
    assert all(adapter_for(m) is None for m in model.modules())
    with pytest.raises(TypeError) as caught:
        decayify(model, alpha_min=0.6)
    text = str(caught.value)
    assert "\n" not in text and len(text) <= 300
    assert text.startswith("decayify found no supported residual block in VideoResNet: BasicBlock (traced adapter: "
                           "an in-place add (+=)")


def test_an_explicit_adapter_whose_roles_are_not_the_blocks_is_not_taken():
    """An adapter states its roles (which module receives x, which ends the branch); they are checked against the
    block's traced graph. Here the add's branch is ``2 * post(...)``, not ``post``'s output: the hooks would correct
    the wrong tensor, so the adapter does not take the block and the traced adapter proves its add instead."""
    import torch.nn as nn

    from resdecay.nn.adapters import register_adapter, subblock_adapter, unregister_adapter

    class Doubled(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm, self.f, self.post = nn.LayerNorm(8), nn.Linear(8, 8), nn.Identity()

        def forward(self, x):
            return x + 2 * self.post(self.f(self.norm(x)))

    class Plain(Doubled):
        def forward(self, x):
            return x + self.post(self.f(self.norm(x)))

    register_adapter(subblock_adapter("test stated roles", (Doubled,), pairs=lambda b: [(b.norm, b.post)],
                                      zero=lambda b: (b.f,), adds=1))
    try:
        assert adapter_for(Plain()).name == "test stated roles"  # roles that hold: taken
        model = nn.Sequential(Doubled(), Doubled())
        assert adapter_for(model[0]) is None
        x = torch.randn(3, 8)
        decayify(model, alpha_min=0.5)
        (_, (a0,)), (_, (a1,)) = alphas_of(model)
        with torch.no_grad():
            h = a0 * x + 2 * model[0].f(model[0].norm(x))
            assert torch.allclose(model(x), a1 * h + 2 * model[1].f(model[1].norm(h)), atol=1e-6)
    finally:
        unregister_adapter("test stated roles")
