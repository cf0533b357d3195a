"""diffusers' MM-DiTs (SD3, SD3.5, Flux) and U-Nets (UNet2DModel, UNet2DConditionModel) at the smallest sizes,
random weights, with an input: the coverage table's diffusers rows beyond DiT / PixArt / UVit2D.

``MODELS_DIFFUSERS`` (in the format of ``adapter_models.MODELS``) holds the models of one add count per block, which
tests/nn/test_adapters.py runs through (a) and (c); ``MIXED_DIFFUSERS`` the models whose blocks have different add
counts on one schedule (Flux: 2 + 1, SD3.5: 3 + 2, UNet2DConditionModel: 1 + 2), whose alpha table is not a
rectangle: tests/nn/test_adapters_diffusers.py checks them. Every block takes several inputs (a stream and its
context, an embedding of the timestep), so the block path is None and the hand-written adds are in that file.
"""

from __future__ import annotations

import torch

G = torch.Generator().manual_seed(0)


def _jitter(model):
    """Random offsets on every weight: no gate, branch or output layer at zero (SD3 / Flux zero some), so every
    path counts."""
    for p in model.parameters():
        p.data.add_(0.05 * torch.randn(p.shape, generator=G))
    return model.eval()


def _inputs(*shapes, seed=3):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g) for s in shapes]


def sd3(dual_attention_layers=(), num_layers=3):
    """SD3Transformer2DModel: 16 wide (2 heads x 8), 8x8 latents of 4 channels, 2x2 patches; its last block is
    ``context_pre_only``. ``dual_attention_layers`` makes those blocks SD3.5's (attn2, 3 adds)."""
    def build():
        from diffusers import SD3Transformer2DModel
        torch.manual_seed(0)
        model = _jitter(SD3Transformer2DModel(
            sample_size=8, patch_size=2, in_channels=4, num_layers=num_layers, attention_head_dim=8,
            num_attention_heads=2, joint_attention_dim=12, caption_projection_dim=16, pooled_projection_dim=8,
            out_channels=4, pos_embed_max_size=8, dual_attention_layers=dual_attention_layers,
            qk_norm="rms_norm" if dual_attention_layers else None))
        x, text, pooled = _inputs((2, 4, 8, 8), (2, 5, 12), (2, 8))
        t = torch.tensor([3.0, 700.0])
        return model, lambda m: m(x, encoder_hidden_states=text, pooled_projections=pooled, timestep=t).sample
    return build


def flux():
    """FluxTransformer2DModel: 2 double-stream and 2 single-stream blocks, 16 wide (2 heads x 8, rope axes 2+2+4),
    16 image tokens of 8 channels, 5 text tokens."""
    from diffusers import FluxTransformer2DModel
    torch.manual_seed(0)
    model = _jitter(FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=2, num_single_layers=2,
                                           attention_head_dim=8, num_attention_heads=2, joint_attention_dim=12,
                                           pooled_projection_dim=8, axes_dims_rope=(2, 2, 4)))
    x, text, pooled = _inputs((2, 16, 8), (2, 5, 12), (2, 8))
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(4.0), indexing="ij"),
                          -1).reshape(16, 3)
    txt_ids, t = torch.zeros(5, 3), torch.tensor([0.1, 0.8])
    return model, lambda m: m(x, encoder_hidden_states=text, pooled_projections=pooled, timestep=t, img_ids=img_ids,
                              txt_ids=txt_ids).sample


def unet2d():
    """UNet2DModel: a plain and an attention down block (and up block), its attention mid block; 8 and 16
    channels, 8x8 images. Registered down, up, mid; each block's attentions before its resnets."""
    from diffusers import UNet2DModel
    torch.manual_seed(0)
    model = _jitter(UNet2DModel(sample_size=8, in_channels=3, out_channels=3, block_out_channels=(8, 16),
                                layers_per_block=1, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                                up_block_types=("AttnUpBlock2D", "UpBlock2D"), norm_num_groups=4, attention_head_dim=8))
    (x,), t = _inputs((2, 3, 8, 8)), torch.tensor([3, 700])
    return model, lambda m: m(x, t).sample


def unet2d_condition():
    """UNet2DConditionModel: a cross-attention down block (Transformer2DModel + BasicTransformerBlock) and a plain
    one, the cross-attention mid block, and the mirror up blocks; 8 and 16 channels, 8x8 latents, text 16 wide."""
    from diffusers import UNet2DConditionModel
    torch.manual_seed(0)
    model = _jitter(UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, block_out_channels=(8, 16), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        norm_num_groups=4, cross_attention_dim=16, attention_head_dim=4))
    x, text = _inputs((2, 4, 8, 8), (2, 5, 16))
    t = torch.tensor([3, 700])
    return model, lambda m: m(x, t, encoder_hidden_states=text).sample


# name: (builder, block path checked by hand in test_adapters.py (None: multi-input, checked in
# test_adapters_diffusers.py), its input shape, hand-written forward)
MODELS_DIFFUSERS = {
    "diffusers SD3Transformer2DModel (JointTransformerBlock)": (sd3(), None, None, None),
    "diffusers UNet2DModel (ResnetBlock2D, Attention residual_connection)": (unet2d, None, None, None),
}

MIXED_DIFFUSERS = {
    "diffusers SD3Transformer2DModel, dual attention (JointTransformerBlock, SD3.5)": (sd3((0,)), None, None, None),
    "diffusers FluxTransformer2DModel (FluxTransformerBlock, FluxSingleTransformerBlock)": (flux, None, None, None),
    "diffusers UNet2DConditionModel (ResnetBlock2D, BasicTransformerBlock)": (unet2d_condition, None, None, None),
}
