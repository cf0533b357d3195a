"""The coverage table's transformers vision towers (CLIP, SigLIP, SigLIP2, BEiT, Data2Vec-vision, I-JEPA) and timm's
LeViT as code, in the format of ``helpers.adapter_models.MODELS`` (which takes them in): each at the smallest size,
random weights, ``.eval()``, a fixed input, and a hand-written ``alpha * x + f(x)`` for one block.

The CLIP / SigLIP layers take a required ``attention_mask`` and Data2Vec-vision's layer returns a tuple, so their
block is not called as ``block(x)``: ``MODELS_HF`` gives them no block, and ``BLOCKS_HF`` gives their block, input
shape, hand-written forward and how the block is called (tests/nn/test_adapters_hf.py checks them).

No import of ``helpers.adapter_models`` here: that module imports this one at its end.
"""

from __future__ import annotations

import torch

G = torch.Generator().manual_seed(0)


def _img(c=3, s=32, b=2):
    return torch.randn(b, c, s, s, generator=torch.Generator().manual_seed(1))


# ----------------------------------------------------------------------------- builders: (model, call)
def hf_tower(model_name, config_name, **sizes):
    """A transformers vision tower at the smallest size (32 px, 8 px patches, 2 layers of width 32):
    (model, call returning last_hidden_state)."""
    def build():
        import transformers
        torch.manual_seed(0)
        config = getattr(transformers, config_name)(hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                                   intermediate_size=64, image_size=32, patch_size=8, **sizes)
        model, x = getattr(transformers, model_name)(config).eval(), _img()
        return model, lambda m: m(pixel_values=x).last_hidden_state
    return build


def hf_siglip2():
    """SigLIP2's NaFlex tower takes patches, not images: 16 patches of 3 x 8 x 8 values, a 4 x 4 grid each."""
    from transformers import Siglip2VisionConfig, Siglip2VisionModel
    torch.manual_seed(0)
    config = Siglip2VisionConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                                 patch_size=8, num_patches=16)
    model = Siglip2VisionModel(config).eval()
    patches = torch.randn(2, 16, 3 * 8 * 8, generator=torch.Generator().manual_seed(1))
    mask, shapes = torch.ones(2, 16, dtype=torch.long), torch.tensor([[4, 4], [4, 4]])
    return model, lambda m: m(pixel_values=patches, pixel_attention_mask=mask, spatial_shapes=shapes).last_hidden_state


def hf_beit_family(model_name, config_name, drop_path_rate=0.1, **extra):
    """BEiT / Data2Vec-vision with their default layer scale and drop path (layer 0 at rate 0: an nn.Identity
    drop_path; layer 1 at ``drop_path_rate``): lambda_1 / lambda_2 set to random values per channel, so a factor
    put on lambda instead of the shortcut would show. ``extra``: more config fields (hidden_dropout_prob)."""
    def build():
        model, call = hf_tower(model_name, config_name, drop_path_rate=drop_path_rate, **extra)()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.rpartition(".")[2] in ("lambda_1", "lambda_2"):
                    p.copy_(0.1 + torch.rand(p.shape, generator=G))
        return model, call
    return build


def timm_levit(name):
    """timm's LeViT at 64 px (a 4 x 4 token grid after its stride-16 stem), three stages of widths 32 / 48 / 64."""
    def build():
        import timm
        torch.manual_seed(0)
        model = timm.create_model(name, pretrained=False, num_classes=10, img_size=64, embed_dim=(32, 48, 64),
                                  key_dim=8, num_heads=(2, 3, 4), depth=(2, 2, 1))
        with torch.no_grad():  # timm starts each branch's last BatchNorm at 0: random offsets make every branch count
            for p in model.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=G))
        model, x = model.eval(), _img(s=64)
        return model, lambda m: m(x)
    return build


hf_clip = hf_tower("CLIPVisionModel", "CLIPVisionConfig")
hf_siglip = hf_tower("SiglipVisionModel", "SiglipVisionConfig")
hf_ijepa = hf_tower("IJepaModel", "IJepaConfig")
hf_beit = hf_beit_family("BeitModel", "BeitConfig")
hf_data2vec = hf_beit_family("Data2VecVisionModel", "Data2VecVisionConfig")


# ----------------------------------------------------------------------------- hand-written blocks
def _lam(v):
    return 1.0 if v is None else v  # lambda: a parameter, 1.0 (5.x) or None (4.x) at layer_scale_init_value 0


def _clip(b, x, a1, a2):
    h = a1 * x + b.self_attn(b.layer_norm1(x), attention_mask=None)[0]
    return a2 * h + b.mlp(b.layer_norm2(h))


def _beit(b, x, a1, a2):
    """5.x BeitLayer: alpha * x + drop_path(lambda * dropout(f(x))); lambda untouched by the decay."""
    h = a1 * x + b.drop_path(_lam(b.lambda_1) * b.dropout(b.attention(b.layernorm_before(x))[0]))
    return a2 * h + b.drop_path(_lam(b.lambda_2) * b.dropout(b.mlp(b.layernorm_after(h))))


def _beit_4x(b, x, a1, a2):
    """4.x BeitLayer (Data2VecVisionLayer keeps it in 5.x): the MLP is intermediate -> output."""
    h = a1 * x + b.drop_path(_lam(b.lambda_1) * b.attention(b.layernorm_before(x))[0])
    return a2 * h + b.drop_path(_lam(b.lambda_2) * b.output(b.intermediate(b.layernorm_after(h))))


def _hf_vit(b, x, a1, a2):
    h = a1 * x + b.dropout(b.attention(b.layernorm_before(x))[0])
    return a2 * h + b.dropout(b.mlp(b.layernorm_after(h)))


def _levit(b, x, a1, a2):
    h = a1 * x + b.drop_path1(b.attn(x))
    return a2 * h + b.drop_path2(b.mlp(h))


def _with_no_mask(block, x):
    return block(x, None)


def _first(block, x):
    return block(x)[0]


CLIP = "transformers CLIPVisionModel (CLIPEncoderLayer)"
SIGLIP = "transformers SiglipVisionModel (SiglipEncoderLayer)"
SIGLIP2 = "transformers Siglip2VisionModel (Siglip2EncoderLayer)"
BEIT = "transformers BeitModel (BeitLayer)"
DATA2VEC = "transformers Data2VecVisionModel (Data2VecVisionLayer, the 4.x BeitLayer layout)"
IJEPA = "transformers IJepaModel (IJepaLayer)"
LEVIT = "timm levit_128s (LevitBlock)"
LEVIT_CONV = "timm levit_conv_128s (LevitBlock, conv)"

# name: (builder, path of the block checked by hand, its input shape, hand-written forward), as MODELS
MODELS_HF = {
    CLIP: (hf_clip, None, None, None),  # its block: BLOCKS_HF
    SIGLIP: (hf_siglip, None, None, None),
    SIGLIP2: (hf_siglip2, None, None, None),
    BEIT: (hf_beit, "layers.1", (2, 17, 32), _beit),
    DATA2VEC: (hf_data2vec, None, None, None),
    IJEPA: (hf_ijepa, "layers.1", (2, 16, 32), _hf_vit),
    LEVIT: (timm_levit("levit_128s"), "stages.0.blocks.1", (2, 16, 32), _levit),
    LEVIT_CONV: (timm_levit("levit_conv_128s"), "stages.0.blocks.1", (2, 32, 4, 4), _levit),
}

# name: (path of the block checked by hand, its input shape, hand-written forward, call(block, x) -> tensor)
BLOCKS_HF = {
    CLIP: ("encoder.layers.1", (2, 17, 32), _clip, _with_no_mask),
    SIGLIP: ("encoder.layers.1", (2, 16, 32), _clip, _with_no_mask),
    SIGLIP2: ("encoder.layers.1", (2, 16, 32), _clip, _with_no_mask),
    DATA2VEC: ("encoder.layer.1", (2, 17, 32), _beit_4x, _first),
}


# ----------------------------------------------------------------------------- the 2026 families (issue 51)
# Their layers take RoPE position embeddings beside the stream, made once by the model: the builders keep them here
# for the block-level checks (the hand forward and the calls of BLOCKS_HF).
ROPE: dict = {}


def hf_dinov3():
    """DINOv3's ViT: RoPE position embeddings made by the model and passed to every layer, layer scale 1."""
    import transformers
    torch.manual_seed(0)
    config = transformers.DINOv3ViTConfig(image_size=32, patch_size=8, hidden_size=32, intermediate_size=64,
                                          num_hidden_layers=2, num_attention_heads=2, num_register_tokens=2,
                                          layerscale_value=1.0)
    model, x = transformers.DINOv3ViTModel(config).eval(), _img()
    with torch.no_grad():
        ROPE["dinov3"] = model.rope_embeddings(x)
    return model, lambda m: m(pixel_values=x).last_hidden_state


def hf_llama():
    """A Llama decoder stack: each layer takes the mask, RoPE position embeddings and **kwargs beside the stream."""
    import transformers
    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=2, vocab_size=50)
    model, ids = transformers.LlamaModel(config).eval(), torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ROPE["llama"] = model.rotary_emb(torch.zeros(2, 7, 32), torch.arange(7)[None].expand(2, 7))
    return model, lambda m: m(input_ids=ids, use_cache=False).last_hidden_state


def _dinov3(b, x, a1, a2):
    h = a1 * x + b.drop_path(b.layer_scale1(b.attention(b.norm1(x), position_embeddings=ROPE["dinov3"])[0]))
    return a2 * h + b.drop_path(b.layer_scale2(b.mlp(b.norm2(h))))


def _llama(b, x, a1, a2):
    h = a1 * x + b.self_attn(hidden_states=b.input_layernorm(x), position_embeddings=ROPE["llama"], attention_mask=None)[0]
    return a2 * h + b.mlp(b.post_attention_layernorm(h))


DINOV3 = "transformers DINOv3ViTModel (DINOv3ViTLayer)"
LLAMA = "transformers LlamaModel (LlamaDecoderLayer)"
MODELS_HF.update({DINOV3: (hf_dinov3, None, None, None), LLAMA: (hf_llama, None, None, None)})  # their block: BLOCKS_HF
BLOCKS_HF.update({
    DINOV3: ("model.layer.1", (2, 19, 32), _dinov3, lambda b, x: b(x, position_embeddings=ROPE["dinov3"])),
    LLAMA: ("layers.1", (2, 7, 32), _llama, lambda b, x: b(x, position_embeddings=ROPE["llama"], attention_mask=None)),
})


def timm_sam():
    """timm's SAM ViT: windowed attention (the window partition sits between the branch end and its add), at 64 px."""
    import timm
    torch.manual_seed(0)
    model = timm.create_model("samvit_base_patch16", pretrained=False, img_size=64, patch_size=16, embed_dim=32, depth=2,
                              num_heads=2, window_size=2, global_attn_indexes=(1,), neck_chans=16).eval()
    x = _img(s=64)
    return model, lambda m: m(x)


def _sam(b, x, a1, a2):
    from timm.models.vision_transformer_sam import window_partition, window_unpartition

    B, H, W, C = x.shape
    parts, pad = window_partition(b.norm1(x), b.window_size)
    h = (a1 * x + window_unpartition(b.attn(parts), b.window_size, (H, W), pad)).reshape(B, H * W, C)
    return (a2 * h + b.mlp(b.norm2(h))).reshape(B, H, W, C)


SAM = "timm samvit (Block, windowed: the traced adapter)"
MODELS_HF[SAM] = (timm_sam, "blocks.0", (2, 4, 4, 32), _sam)
