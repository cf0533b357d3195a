"""The coverage table of docs/coverage.md as code: every library model ``decayify`` takes, at the
smallest size, with random weights, an input, and a hand-written ``alpha * x + f(x)`` for one block."""

from __future__ import annotations

import torch

G = torch.Generator().manual_seed(0)


def _img(c=3, s=32, b=2):
    return torch.randn(b, c, s, s, generator=torch.Generator().manual_seed(1))


def from_threads(call, threads: int = 4, calls: int = 5) -> tuple[list, list]:
    """(outputs, errors) of ``threads`` threads each running ``call()`` ``calls`` times at once (check (e))."""
    import threading
    outs, errors = [], []

    def work():
        try:
            outs.extend(call() for _ in range(calls))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
    workers = [threading.Thread(target=work) for _ in range(threads)]
    for t in workers:
        t.start()
    for t in workers:
        t.join()
    return outs, errors


# ----------------------------------------------------------------------------- builders: (model, call)
def timm_model(name, **kw):
    def build():
        import timm
        model = timm.create_model(name, pretrained=False, num_classes=10, **kw).eval()
        x = _img(s=kw.get("img_size", 32))
        return model, lambda m: m(x)
    return build


def hybrid_stem():
    import timm
    vit = timm.create_model("vit_small_r26_s32_224", pretrained=False, depth=2, img_size=64, embed_dim=64, num_heads=2)
    x = _img(s=64)
    return vit.patch_embed.backbone.eval(), lambda m: m(x)


def torchvision_vit():
    from torchvision.models import VisionTransformer
    x = _img()
    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64).eval()
    torch.nn.init.normal_(model.heads.head.weight, std=0.1)  # torchvision zero-inits the head: outputs would not move
    return model, lambda m: m(x)


def torchvision_convnext():
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt
    x = _img()
    return ConvNeXt([CNBlockConfig(8, 16, 2), CNBlockConfig(16, None, 1)], num_classes=10).eval(), lambda m: m(x)


def torchvision_swin(v2=False):
    def build():
        from torchvision.models import swin_transformer as sw
        extra = dict(block=sw.SwinTransformerBlockV2, downsample_layer=sw.PatchMergingV2) if v2 else {}
        x = _img()
        model = sw.SwinTransformer(patch_size=[4, 4], embed_dim=16, depths=[2, 1], num_heads=[1, 2], window_size=[2, 2],
                                   num_classes=10, **extra).eval()
        return model, lambda m: m(x)
    return build


def torchvision_resnet():
    import torchvision
    x = _img()
    return torchvision.models.resnet18(num_classes=10).eval(), lambda m: m(x)


def hf_vitmae(dropout=0.0):
    def build():
        from transformers import ViTMAEConfig, ViTMAEForPreTraining
        cfg = ViTMAEConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, image_size=32,
                           patch_size=8, decoder_hidden_size=32, decoder_num_hidden_layers=1, decoder_num_attention_heads=2,
                           decoder_intermediate_size=64, hidden_dropout_prob=dropout)
        torch.manual_seed(0)
        model = ViTMAEForPreTraining(cfg).eval()
        x, noise = _img(), torch.rand(2, 16, generator=torch.Generator().manual_seed(2))
        return model, lambda m: m(pixel_values=x, noise=noise).logits
    return build


def hf_encoder(model_name, config_name, **sizes):
    """A transformers ViT-family encoder at the smallest size: (model, call returning last_hidden_state)."""
    def build():
        import transformers
        torch.manual_seed(0)
        config = getattr(transformers, config_name)(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                   image_size=32, patch_size=8, **sizes)
        model, x = getattr(transformers, model_name)(config).eval(), _img()
        return model, lambda m: m(pixel_values=x).last_hidden_state
    return build


hf_vit = hf_encoder("ViTModel", "ViTConfig", intermediate_size=64)
hf_dinov2 = hf_encoder("Dinov2Model", "Dinov2Config", mlp_ratio=2)


def diffusers_dit():
    from diffusers import DiTTransformer2DModel
    torch.manual_seed(0)
    model = DiTTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, num_layers=2, sample_size=8,
                                  patch_size=2, num_embeds_ada_norm=10).eval()
    for p in model.parameters():  # random offsets on every weight: no branch or gate near zero, so that every path counts
        p.data.add_(0.05 * torch.randn(p.shape, generator=G))
    x, t, y = _img(c=4, s=8), torch.tensor([3, 7]), torch.tensor([1, 2])
    return model, lambda m: m(x, timestep=t, class_labels=y).sample


def diffusers_pixart():
    from diffusers import PixArtTransformer2DModel
    torch.manual_seed(0)
    model = PixArtTransformer2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=8,
                                     num_layers=2, cross_attention_dim=16, sample_size=8, patch_size=2,
                                     caption_channels=12).eval()
    for p in model.parameters():
        p.data.add_(0.05 * torch.randn(p.shape, generator=G))
    x, t = _img(c=4, s=8), torch.tensor([3, 7])
    text = torch.randn(2, 5, 12, generator=torch.Generator().manual_seed(3))
    cond = {"resolution": None, "aspect_ratio": None}
    return model, lambda m: m(x, encoder_hidden_states=text, timestep=t, added_cond_kwargs=cond).sample


def diffusers_uvit2d():
    from diffusers import UVit2DModel
    torch.manual_seed(0)
    model = UVit2DModel(hidden_size=32, micro_cond_encode_dim=8, micro_cond_embed_dim=40, in_channels=16,
                        block_out_channels=16, num_res_blocks=1, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, codebook_size=32, vocab_size=33, encoder_hidden_size=16,
                        cond_embed_dim=16).eval()
    for p in model.parameters():
        p.data.add_(0.05 * torch.randn(p.shape, generator=G))
    g = torch.Generator().manual_seed(3)
    ids, text = torch.randint(0, 33, (2, 8, 8), generator=g), torch.randn(2, 5, 16, generator=g)
    pooled, micro = torch.randn(2, 16, generator=g), torch.rand(2, 5, generator=g)
    return model, lambda m: m(ids, text, pooled, micro)


# ----------------------------------------------------------------------------- hand-written blocks
def _timm_vit(b, x, a1, a2):
    h = a1 * x + b.ls1(b.attn(b.norm1(x)))
    return a2 * h + b.ls2(b.mlp(b.norm2(h)))


def _eva(b, x, a1, a2):
    g1 = b.gamma_1 if b.gamma_1 is not None else 1.0
    g2 = b.gamma_2 if b.gamma_2 is not None else 1.0
    h = a1 * x + g1 * b.attn(b.norm1(x))
    return a2 * h + g2 * b.mlp(b.norm2(h))


def _timm_swin(b, x, a1, a2):
    B, H, W, C = x.shape
    h = (a1 * x + b._attn(b.norm1(x))).reshape(B, -1, C)
    return (a2 * h + b.mlp(b.norm2(h))).reshape(B, H, W, C)


def _cait(b, x, a1, a2):
    h = a1 * x + b.gamma_1 * b.attn(b.norm1(x))
    return a2 * h + b.gamma_2 * b.mlp(b.norm2(h))


def _timm_convnext(b, x, a):
    y = b.norm(b.conv_dw(x).permute(0, 2, 3, 1))
    y = b.mlp(y).permute(0, 3, 1, 2)
    return y.mul(b.gamma.reshape(1, -1, 1, 1)) + a * b.shortcut(x)


def _timm_basic(b, x, a):
    y = b.bn2(b.conv2(b.act1(b.bn1(b.conv1(x)))))
    s = x if b.downsample is None else b.downsample(x)
    return b.act2(y + a * s)


def _preact(b, x, a):
    xp = b.norm1(x)
    s = x if b.downsample is None else b.downsample(xp)
    return b.conv3(b.norm3(b.conv2(b.norm2(b.conv1(xp))))) + a * s


def _tv_encoder(b, x, a1, a2):
    h = b.ln_1(x)
    h = a1 * x + b.self_attention(h, h, h, need_weights=False)[0]
    return a2 * h + b.mlp(b.ln_2(h))


def _tv_cnblock(b, x, a):
    return b.layer_scale * b.block(x) + a * x


def _tv_swin(b, x, a1, a2):
    h = a1 * x + b.attn(b.norm1(x))
    return a2 * h + b.mlp(b.norm2(h))


def _tv_swin_v2(b, x, a1, a2):
    h = a1 * x + b.norm1(b.attn(x))
    return a2 * h + b.norm2(b.mlp(h))


def _hf_vit(b, x, a1, a2):
    h = a1 * x + b.dropout(b.attention(b.layernorm_before(x))[0])
    return a2 * h + b.dropout(b.mlp(b.layernorm_after(h)))


def _hf_dinov2(b, x, a1, a2):
    h = a1 * x + b.drop_path(b.layer_scale1(b.attention(b.norm1(x))[0]))
    return a2 * h + b.drop_path(b.layer_scale2(b.mlp(b.norm2(h))))


def _dit(b, x, a1, a2, t, y):
    h, gate_msa, shift_mlp, scale_mlp, gate_mlp = b.norm1(x, t, y, hidden_dtype=x.dtype)
    h = a1 * x + gate_msa.unsqueeze(1) * b.attn1(h)
    m = b.norm3(h) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
    return a2 * h + gate_mlp.unsqueeze(1) * b.ff(m)


# name: (builder, path of the block checked by hand, its input shape, hand-written forward, library versions)
MODELS = {
    "timm vit (Block)": (timm_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2), "blocks.1", (2, 17, 192), _timm_vit),
    "timm eva02 (EvaBlock)": (timm_model("eva02_tiny_patch14_224", img_size=28, depth=2), "blocks.1", (2, 5, 192), _eva),
    "timm swin (SwinTransformerBlock)": (timm_model("swin_tiny_patch4_window7_224", img_size=32, window_size=2, embed_dim=16,
                                                    depths=(2, 1), num_heads=(1, 2)), "layers.0.blocks.1", (2, 8, 8, 16), _timm_swin),
    "timm convnext (ConvNeXtBlock)": (timm_model("convnext_atto", depths=(2, 1, 1, 1), dims=(8, 16, 16, 16)), "stages.0.blocks.1",
                                      (2, 8, 8, 8), _timm_convnext),
    "timm cait (LayerScaleBlock)": (timm_model("cait_xxs24_224", img_size=32, patch_size=8, depth=2, embed_dim=32,
                                               num_heads=2, init_values=1.0), "blocks.1", (2, 16, 32), _cait),
    "timm resnet (BasicBlock)": (timm_model("resnet18"), "layer1.1", (2, 64, 8, 8), _timm_basic),
    "timm resnetv2 (PreActBottleneck)": (timm_model("resnetv2_50", layers=(2, 1, 1, 1)), "stages.0.blocks.1",
                                         (2, 256, 8, 8), _preact),
    "timm resnetv2 (PreActBottleneck, downsample path)": (timm_model("resnetv2_50", layers=(2, 1, 1, 1)),
                                                          "stages.1.blocks.0", (2, 256, 8, 8), _preact),
    "timm resnetv2 (Bottleneck, hybrid ViT stem)": (hybrid_stem, None, None, None),
    "torchvision vit_b_16 (EncoderBlock)": (torchvision_vit, "encoder.layers.encoder_layer_1", (2, 17, 32), _tv_encoder),
    "torchvision convnext (CNBlock)": (torchvision_convnext, "features.1.1", (2, 8, 8, 8), _tv_cnblock),
    "torchvision swin (SwinTransformerBlock)": (torchvision_swin(), "features.1.1", (2, 8, 8, 16), _tv_swin),
    "torchvision swin_v2 (SwinTransformerBlockV2)": (torchvision_swin(True), "features.1.1", (2, 8, 8, 16), _tv_swin_v2),
    "torchvision resnet (BasicBlock)": (torchvision_resnet, None, None, None),
    "transformers ViTMAEForPreTraining (ViTMAELayer)": (hf_vitmae(), "vit.layers.1", (2, 5, 32), _hf_vit),
    "transformers ViTModel (ViTLayer)": (hf_vit, "layers.1", (2, 17, 32), _hf_vit),
    "transformers Dinov2Model (Dinov2Layer)": (hf_dinov2, "encoder.layer.1", (2, 17, 32), _hf_dinov2),
    "diffusers DiTTransformer2DModel (BasicTransformerBlock, ada_norm_zero)": (diffusers_dit, "transformer_blocks.1",
                                                                             (2, 16, 16), _dit),
    "diffusers PixArtTransformer2DModel (BasicTransformerBlock, ada_norm_single)": (diffusers_pixart, None, None, None),
    "diffusers UVit2DModel (SkipFFTransformerBlock, BasicTransformerBlock ada_norm_continuous)": (diffusers_uvit2d, None,
                                                                                                 None, None),
}

from helpers.adapter_models_hf import MODELS_HF  # noqa: E402, I001  (the transformers vision towers, LeViT)
MODELS.update(MODELS_HF)
from helpers.adapter_models_diffusers import MODELS_DIFFUSERS  # noqa: E402, I001  (SD3 MM-DiT, UNet2DModel)
MODELS.update(MODELS_DIFFUSERS)
from helpers.adapter_models_diffusers import MIXED_DIFFUSERS  # noqa: E402, I001  (blocks of mixed add counts)

ROWS = {**MODELS, **MIXED_DIFFUSERS}  # every row of the coverage table (tools/adapter_coverage.py)

_FUSED_D_E = "d, e: the fused add is run under dynamo and threads on the ViTMAE, CLIP-family, LeViT and DINOv3 rows"
_HOOKS_D_E = "d, e: the correction hooks are run under dynamo and threads on the BEiT row"
_SHARED_D = "d: the fused add with one module ending both branches runs under dynamo on the ViTMAE row"
_FORWARD_D_E = "d, e: the replaced-forward mechanism is run under dynamo and threads on the DiT, SD3 and Mixer rows"
_SCALE_D_E = "d, e: the scaled-shortcut hooks are run under dynamo and threads on the UNet2DModel row"
WHY_NOT = {  # the checks a row does not run, and why (the "why not" column of the coverage table)
    "timm vit (Block)": _FUSED_D_E, "timm swin (SwinTransformerBlock)": _FUSED_D_E,
    "timm eva02 (EvaBlock)": "e: " + _FUSED_D_E[6:],
    "timm convnext (ConvNeXtBlock)": _SCALE_D_E, "timm resnet (BasicBlock)": _SCALE_D_E,
    "timm resnetv2 (PreActBottleneck)": _FUSED_D_E, "timm resnetv2 (PreActBottleneck, downsample path)": _SCALE_D_E,
    "timm resnetv2 (Bottleneck, hybrid ViT stem)": "b: the timm ResNet row's hand check (same adapter); " + _SCALE_D_E,
    "timm cait (LayerScaleBlock)": _SHARED_D,
    "torchvision vit_b_16 (EncoderBlock)": _FUSED_D_E, "torchvision swin_v2 (SwinTransformerBlockV2)": _FUSED_D_E,
    "torchvision convnext (CNBlock)": "e: " + _HOOKS_D_E[6:],
    "torchvision swin (SwinTransformerBlock)": _SHARED_D,
    "torchvision resnet (BasicBlock)": "b: the timm ResNet row's hand check (the same scaled downsample); " + _SCALE_D_E,
    "transformers ViTModel (ViTLayer)": "d, e: the same adapter as the ViTMAE row, which runs them",
    "transformers Dinov2Model (Dinov2Layer)": _FUSED_D_E,
    "diffusers PixArtTransformer2DModel (BasicTransformerBlock, ada_norm_single)": "b: DiT's replaced forward is checked "
        "by hand; PixArt's norm path is the library's code, bit-identical at alpha = 1 (a); " + _FORWARD_D_E,
    "diffusers UVit2DModel (SkipFFTransformerBlock, BasicTransformerBlock ada_norm_continuous)": _HOOKS_D_E,
    "diffusers SD3Transformer2DModel, dual attention (JointTransformerBlock, SD3.5)": "d, e: the SD3 row's replaced "
        "forward with one more add (d checked by hand: 0 graph breaks plain and decayified; not in the suite, for its time)",
    "timm resmlp (ResBlock)": _FORWARD_D_E, "timm vit block_fn=ParallelThingsBlock": _FORWARD_D_E,
    "a user's gated stack": _FORWARD_D_E, "timm poolformer (MetaFormerBlock)": _HOOKS_D_E,
    "timm convmixer (Residual)": _HOOKS_D_E, "timm vit block_fn=ResPostBlock": "d: " + _HOOKS_D_E[6:],
    "transformers Siglip2VisionModel (Siglip2EncoderLayer)": "d: SigLIP's adapter and layout, run under dynamo on the "
        "SigLIP row",
    "timm levit_conv_128s (LevitBlock, conv)": "d: LeViT's adapter, run under dynamo on the levit_128s row",
    "timm samvit (Block, windowed: the traced adapter)": "e: timm's SAM ViT itself gives outputs ~2e-7 apart between "
        "threads (plain, without decayify), so equality cannot be asked of it",
}
