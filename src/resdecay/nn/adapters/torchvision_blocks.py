"""torchvision's residual blocks. Matched by class name under ``torchvision.``."""

from __future__ import annotations

from .hooks import last_linear
from .registry import register_adapter, shortcut_adapter, subblock_adapter


def _last_norm(block):
    return block.bn3 if hasattr(block, "bn3") else block.bn2  # Bottleneck / BasicBlock


# relu(branch + identity): the identity (downsample or the empty place) is scaled on its own; beta
# scales the branch's last BatchNorm output.
register_adapter(shortcut_adapter(
    "torchvision BasicBlock / Bottleneck", ("torchvision.models.resnet:BasicBlock", "torchvision.models.resnet:Bottleneck"),
    shortcut="downsample", branch_end=_last_norm, zero=lambda b: (_last_norm(b),),
    accepts=lambda b: hasattr(b, "downsample")))

# ViT EncoderBlock: dropout(attn(ln_1(x))) + x, then x + mlp(ln_2(x))
register_adapter(subblock_adapter(
    "torchvision ViT EncoderBlock", ("torchvision.models.vision_transformer:EncoderBlock",),
    pairs=lambda b: [(b.ln_1, b.dropout), (b.ln_2, b.mlp)],
    zero=lambda b: (b.self_attention.out_proj, last_linear(b.mlp))))

# ConvNeXt CNBlock: stochastic_depth(layer_scale * block(x)) + x
register_adapter(subblock_adapter(
    "torchvision ConvNeXt CNBlock", ("torchvision.models.convnext:CNBlock",), adds=1,
    pairs=lambda b: [(b.block, b.stochastic_depth)], zero=lambda b: (last_linear(b.block),)))

# Swin V1 x + sd(attn(norm1(x))) and V2 x + sd(norm1(attn(x))): one stochastic_depth for both adds
register_adapter(subblock_adapter(
    "torchvision SwinTransformerBlock", ("torchvision.models.swin_transformer:SwinTransformerBlock",),
    pairs=lambda b: [(b.norm1, b.stochastic_depth), (b.norm2, b.stochastic_depth)],
    zero=lambda b: (b.attn.proj, last_linear(b.mlp))))
register_adapter(subblock_adapter(
    "torchvision SwinTransformerBlockV2", ("torchvision.models.swin_transformer:SwinTransformerBlockV2",),
    pairs=lambda b: [(b.attn, b.stochastic_depth), (b.mlp, b.stochastic_depth)],
    zero=lambda b: (b.attn.proj, last_linear(b.mlp))))
