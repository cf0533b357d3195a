"""Issue 51 item 5: the families users reach for in 2026, each at a tiny size with random weights. decayify supports
it (alpha 1 is the library's model bit for bit, alpha 0.6 changes the output) or refuses it in one line of at most 300
characters naming the block class and why -- never takes a model it then breaks. (DINOv3, the Llama-style layers and
SAM, supported, have coverage-table rows: tests/nn/test_adapters*.py.)"""

from __future__ import annotations

import warnings

import pytest
import torch

from resdecay import decayify

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")
diffusers = pytest.importorskip("diffusers")


def _img(s=32, c=3):
    return torch.randn(1, c, s, s, generator=torch.Generator().manual_seed(1))


def _hf(model, config, **kw):
    return lambda: getattr(transformers, model)(getattr(transformers, config)(**kw)), lambda m: m(pixel_values=_img()).last_hidden_state


FAMILIES = {  # name: (build, call, the refusal's words, or None where decayify supports it)
    "transformers Swin": (*_hf("SwinModel", "SwinConfig", image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                               num_heads=[2, 2], window_size=4), "SwinStage (traced adapter: its forward needs argument"),
    "transformers PvtV2": (*_hf("PvtV2Model", "PvtV2Config", hidden_sizes=[16, 32], depths=[1, 1], num_encoder_blocks=2,
                                num_attention_heads=[1, 2], sr_ratios=[2, 1], patch_sizes=[7, 3], strides=[4, 2],
                                mlp_ratios=[2, 2]), "PvtV2EncoderLayer (traced adapter: its forward needs argument"),
    "transformers FocalNet": (*_hf("FocalNetModel", "FocalNetConfig", image_size=32, patch_size=4, embed_dim=16,
                                   depths=[1, 1], focal_levels=[2, 2], focal_windows=[3, 3]),
                              "FocalNetStage (traced adapter: its forward needs argument"),
    "timm XCiT": (lambda: timm.create_model("xcit_nano_12_p16_224", pretrained=False, img_size=32, depth=2),
                  lambda m: m(_img()), "XCABlock (traced adapter: its forward needs argument H"),
    "timm TinyViT": (lambda: timm.create_model("tiny_vit_5m_224", pretrained=False, embed_dims=(16, 32, 48, 64),
                                               depths=(1, 1, 1, 1), num_heads=(1, 2, 2, 2)),
                     lambda m: m(_img(64)), "TinyVitBlock (traced adapter: data-dependent control flow"),
    "timm MViTv2": (lambda: timm.create_model("mvitv2_tiny", pretrained=False, img_size=64), lambda m: m(_img(64)),
                    "MultiScaleVitStage (traced adapter: its forward needs argument feat_size"),
    "timm FastViT": (lambda: timm.create_model("fastvit_t8", pretrained=False), lambda m: m(_img(64)),
                     "MobileOneBlock (traced adapter: no add of the stream itself"),
    "diffusers Sana": (lambda: diffusers.SanaTransformer2DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
        num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16, caption_channels=12,
        sample_size=8, patch_size=2), lambda m: m(_img(8, 4), encoder_hidden_states=torch.randn(1, 5, 12),
                                                   timestep=torch.tensor([3])).sample,
        "SanaTransformerBlock (traced adapter: torch.fx cannot trace its forward"),
    "diffusers Lumina2": (lambda: diffusers.Lumina2Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, hidden_size=32, num_layers=2, num_refiner_layers=1,
        num_attention_heads=2, num_kv_heads=2, multiple_of=16, axes_dim_rope=(4, 6, 6), axes_lens=(32, 32, 32),
        cap_feat_dim=12), lambda m: m(_img(8, 4), torch.tensor([0.3]), torch.randn(1, 5, 12),
                                      torch.ones(1, 5, dtype=torch.bool)).sample,
        "Lumina2TransformerBlock (traced adapter: its forward needs argument"),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_each_family_is_supported_or_refused_in_one_short_line(name):
    build, call, refusal = FAMILIES[name]
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = build().eval()
    with pytest.raises(TypeError) as caught:
        decayify(model, alpha_min=0.6)
    text = str(caught.value)
    assert "\n" not in text and len(text) <= 300, (len(text), text)
    assert refusal in text and text.endswith("supported kinds: docs/coverage.md; add yours with register_adapter")
    with torch.no_grad():
        call(model)  # refused before anything was installed: the model still runs as the library's


def test_hunyuan_dit_is_refused_at_its_first_call_with_what_was_not_traced():
    """HunyuanDiT's blocks are traced for a call with the stream alone (temb=None); the model calls them with a
    time embedding, so the first forward is refused in one line rather than run unproved."""
    model = diffusers.HunyuanDiT2DModel(num_attention_heads=2, attention_head_dim=8, in_channels=4, patch_size=2,
                                        sample_size=8, hidden_size=16, num_layers=2, cross_attention_dim=16,
                                        cross_attention_dim_t5=16, pooled_projection_dim=16, text_len=5, text_len_t5=5,
                                        use_style_cond_and_image_meta_size=False).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        decayify(model, alpha_min=0.6)
    with pytest.raises(TypeError) as caught, torch.no_grad():
        model(_img(8, 4), timestep=torch.tensor([3.0]), encoder_hidden_states=torch.randn(1, 5, 16),
              text_embedding_mask=torch.ones(1, 5), encoder_hidden_states_t5=torch.randn(1, 5, 16),
              text_embedding_mask_t5=torch.ones(1, 5), image_meta_size=None, style=None, image_rotary_emb=None)
    assert "\n" not in str(caught.value) and "temb=Tensor, which was not traced" in str(caught.value)
