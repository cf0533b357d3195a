"""A block only the traced adapter reaches (a user's own, its branch computed inline), and the library models whose
blocks only the traced adapter reaches: the traced adapter's tests, the coverage table's traced rows, the diagnostics'
walk of the table."""

from __future__ import annotations

import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F


class GatedBlock(nn.Module):
    """A user's block whose branch is computed inline: x + sigmoid(gate(x)) * dropout(f(norm(x))), the dropout
    a function reading ``self.training`` (fixed while tracing: one generated forward per mode)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.norm, self.f, self.gate = nn.LayerNorm(d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        return x + torch.sigmoid(self.gate(x)) * F.dropout(self.f(self.norm(x)), 0.2, self.training)


def quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # timm's deprecation notes
        return fn(*args, **kwargs)


def jitter(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random offsets on every weight (layer scales start near 0 in timm): every path counts."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return module.eval()


def _metaformer_model():
    from timm.layers import GroupNorm1
    from timm.models.metaformer import MetaFormer
    return MetaFormer(num_classes=10, depths=(2, 1, 1, 1), dims=(8, 16, 16, 16), downsample_norm=None, mlp_act=nn.GELU,
                      mlp_bias=True, norm_layers=GroupNorm1, layer_scale_init_values=1e-5, res_scale_init_values=None,
                      use_mlp_head=False)  # poolformer_s12's recipe at the smallest size


def _mixer_model(**kw):
    from timm.models.mlp_mixer import MlpMixer
    return MlpMixer(num_classes=10, img_size=32, patch_size=8, num_blocks=3, embed_dim=16, **kw)


def _resmlp_model():
    from timm.models.mlp_mixer import Affine, ResBlock
    return _mixer_model(mlp_ratio=4, block_layer=ResBlock, norm_layer=Affine)  # resmlp_12_224's recipe


def _vit(block_fn):
    def build():
        from timm.models import vision_transformer as vt
        return vt.VisionTransformer(img_size=32, patch_size=8, embed_dim=16, depth=2, num_heads=2, num_classes=10,
                                    block_fn=getattr(vt, block_fn))
    return build


def _convmixer_model():
    from timm.models.convmixer import ConvMixer
    return ConvMixer(dim=16, depth=3, kernel_size=3, patch_size=4, num_classes=10)


MODELS = {  # name: (builder, the block class the traced adapter reaches, its input)
    "timm mixer (MixerBlock)": (_mixer_model, "MixerBlock", (2, 3, 32, 32)),
    "timm resmlp (ResBlock)": (_resmlp_model, "ResBlock", (2, 3, 32, 32)),
    "timm vit block_fn=ResPostBlock": (_vit("ResPostBlock"), "ResPostBlock", (2, 3, 32, 32)),
    "timm vit block_fn=ParallelThingsBlock": (_vit("ParallelThingsBlock"), "ParallelThingsBlock", (2, 3, 32, 32)),
    "timm poolformer (MetaFormerBlock)": (_metaformer_model, "MetaFormerBlock", (2, 3, 32, 32)),
    "timm convmixer (Residual)": (_convmixer_model, "Residual", (2, 3, 32, 32)),
    "a user's gated stack": (lambda: nn.Sequential(*[GatedBlock() for _ in range(3)]), "GatedBlock", (3, 5, 8)),
}
