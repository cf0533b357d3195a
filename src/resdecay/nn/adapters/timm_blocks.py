"""timm's residual blocks. Matched by class name under ``timm.`` (timm is not imported to look)."""

from __future__ import annotations

from . import hooks
from .registry import BlockAdapter, Role, register_adapter, shortcut_adapter, subblock_adapter


def _both(block):
    return (block.attn.proj, block.mlp.fc2)


def _has_paths(block) -> bool:
    return all(hasattr(block, n) for n in ("norm1", "drop_path1", "norm2", "drop_path2"))


# x + drop_path(ls(attn(norm(x)))): ViT Block (DeiT-3, BEiT-less ViTs, registers), EVA / EVA-02, Swin
# (norm1 sees the (B, H, W, C) x its first add uses; norm2 the reshaped x of the second).
register_adapter(subblock_adapter(
    "timm VisionTransformer Block", ("timm.models.vision_transformer:Block", "timm.models.eva:EvaBlock",
     "timm.models.swin_transformer:SwinTransformerBlock"),
    pairs=lambda b: [(b.norm1, b.drop_path1), (b.norm2, b.drop_path2)], zero=_both, accepts=_has_paths))

# CaiT's LayerScaleBlock: one drop_path shared by both adds (the shared-post form of the hooks)
register_adapter(subblock_adapter(
    "timm CaiT LayerScaleBlock", ("timm.models.cait:LayerScaleBlock",),
    pairs=lambda b: [(b.norm1, b.drop_path), (b.norm2, b.drop_path)], zero=_both))

# ConvNeXt: drop_path(branch) + shortcut(x), the shortcut an Identity (or a projection) module
register_adapter(shortcut_adapter(
    "timm ConvNeXtBlock", ("timm.models.convnext:ConvNeXtBlock",), shortcut="shortcut", branch_end=lambda b: b.drop_path,
    zero=lambda b: (b.mlp.fc2,), accepts=lambda b: hasattr(b, "shortcut")))


def _resnet_end(block):
    """The last module of a timm ResNet branch before ``x += shortcut`` (drop_path, se or the last BN)."""
    for name in ("drop_path", "se"):
        if getattr(block, name, None) is not None:
            return getattr(block, name)
    return block.bn3 if hasattr(block, "bn3") else block.bn2


register_adapter(shortcut_adapter(
    "timm ResNet BasicBlock / Bottleneck", ("timm.models.resnet:BasicBlock", "timm.models.resnet:Bottleneck"),
    shortcut="downsample", branch_end=_resnet_end,
    zero=lambda b: (b.bn3 if hasattr(b, "bn3") else b.bn2,),  # the last BN to 0, as timm's zero_init_last
    accepts=lambda b: hasattr(b, "downsample")))
register_adapter(shortcut_adapter(
    "timm ResNetV2 Bottleneck", ("timm.models.resnetv2:Bottleneck",), shortcut="downsample",
    branch_end=lambda b: b.drop_path, zero=lambda b: (b.norm3,)))


# PreActBottleneck: the shortcut is x itself, or downsample(norm1(x)); the branch ends in drop_path.
# Without a downsample the identity is reached by the correction (x is norm1's input); with one, the
# downsample's output is scaled.
def _preact_install(block, a, b):
    if block.downsample is None:
        hooks.correct_subblocks(block, [(block.norm1, block.drop_path)], a, b)
    else:
        hooks.scale_shortcut(block, "downsample", a[0])
        hooks.scale_branch_end(block, block.drop_path, b[0])


def _preact_factors(block):
    if block.downsample is None:
        return hooks.subblock_factors([(block.norm1, block.drop_path)])
    return (hooks.shortcut_factor(block, "downsample"),), (float(block.drop_path.__dict__.get("resdecay_beta", 1.0)),)


def _preact_reads(block):
    if block.downsample is None:
        return [Role(block.norm1, block.drop_path)]
    return [Role(block, block.drop_path, block.downsample)]


register_adapter(BlockAdapter(
    "timm ResNetV2 PreActBottleneck", ("timm.models.resnetv2:PreActBottleneck",), 1, _preact_install,
    _preact_factors, zero_init=lambda b: hooks.zero_(b.conv3), reads=_preact_reads))


# LeViT's LevitBlock: x + drop_path1(attn(x)), then x + drop_path2(mlp(x)). LeViT has no norm before a branch
# (its BatchNorms sit inside LinearNorm / ConvNorm), so the pre-hook goes on the branch's first module, ``attn``
# / ``mlp``, which receives x itself. The same for the ``levit_conv_*`` variants ((B, C, H, W) tokens).
# Left at alpha 1, by design: the stem (Stem16 / Stem8) has no residual add; a stage's LevitDownsample is
# attn_downsample(x) with no shortcut (resolution and width change: the identity path ends there), then ONE
# add x + drop_path(mlp(x)). That one-add block beside the two-add LevitBlocks cannot share their schedule
# (decayify takes one number of adds per block), so it is not registered: the schedule spans the LevitBlocks'
# adds, and each stage's stream starts from the downsample's projection.
register_adapter(subblock_adapter(
    "timm LevitBlock", ("timm.models.levit:LevitBlock",),
    pairs=lambda b: [(b.attn, b.drop_path1), (b.mlp, b.drop_path2)],
    zero=lambda b: (b.attn.proj.ln.bn, b.mlp.ln2.bn),  # the last BatchNorm of each branch, as timm's bn_weight_init=0
    accepts=lambda b: all(hasattr(b, n) for n in ("attn", "drop_path1", "mlp", "drop_path2"))))
