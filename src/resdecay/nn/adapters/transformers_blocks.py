"""Hugging Face transformers' layers: the ViT family (``ViTLayer``, ``ViTMAELayer``, ``IJepaLayer``, ``Dinov2Layer``,
``DINOv3ViTLayer`` and the layers built like them), the CLIP / SigLIP towers, BEiT / Data2Vec-vision, and the
Llama-style decoder layers.
Sub-blocks are found by role, so both major layouts work (the ViT family's below; the others' at their
adapters):

* transformers 5.x: the layer adds ``dropout(attention(...)) + residual`` and ``dropout(mlp(...)) + residual``
  itself, with ONE ``dropout`` module for both adds (the shared-post form of the hooks; the correction
  comes after the dropout, so it is exact at any hidden_dropout_prob).
* transformers 4.x: the attention add is the layer's (its branch ends in ``attention.output``) and the
  MLP add is inside ``ViTOutput.forward(h, input_tensor)`` (``dropout(dense(h)) + input_tensor``): the
  hook goes on ``output.dropout``, whose output that add takes.

In both, ``layernorm_before`` / ``layernorm_after`` (DINOv2: ``norm1`` / ``norm2``) receive the sub-block
input x first.
"""

from __future__ import annotations

from .hooks import last_linear
from .registry import register_adapter, subblock_adapter


def _vit_pairs(b):
    if hasattr(b, "dropout"):  # 5.x
        return [(b.layernorm_before, b.dropout), (b.layernorm_after, b.dropout)]
    return [(b.layernorm_before, b.attention.output), (b.layernorm_after, b.output.dropout)]  # 4.x


def _vit_zero(b):
    mlp = b.mlp if hasattr(b, "mlp") else b.output  # 5.x ViTMLP / 4.x ViTOutput.dense
    return (last_linear(b.attention), last_linear(mlp))  # 5.x o_proj / 4.x attention.output.dense


def _vit_layout(b) -> bool:
    return hasattr(b, "layernorm_before") and (hasattr(b, "dropout") or hasattr(getattr(b, "output", None), "dropout"))


register_adapter(subblock_adapter(
    "transformers ViTLayer / ViTMAELayer", ("transformers.models.vit:ViTLayer", "transformers.models.vit_mae:ViTMAELayer",
                                            "transformers.models.deit:DeiTLayer", "transformers.models.videomae:VideoMAELayer",
                                            "transformers.models.ijepa:IJepaLayer"),
    pairs=_vit_pairs, zero=_vit_zero, accepts=_vit_layout))

# DINOv2 and DINOv3: drop_path(layer_scale(branch)) + residual, one drop_path module for both adds (4.x and 5.x).
# DINOv3's forward also takes attention_mask, position_embeddings (RoPE) and **kwargs: the hooks sit on norm1 / norm2
# and drop_path, so those pass through untouched.
register_adapter(subblock_adapter(
    "transformers Dinov2Layer / DINOv3ViTLayer", ("transformers.models.dinov2:Dinov2Layer",
                                                  "transformers.models.dinov2_with_registers:Dinov2WithRegistersLayer",
                                                  "transformers.models.dinov3_vit:DINOv3ViTLayer"),
    pairs=lambda b: [(b.norm1, b.drop_path), (b.norm2, b.drop_path)],
    zero=lambda b: (last_linear(b.attention), last_linear(b.mlp))))


def _by_name(pre1: str, post1: str, pre2: str, post2: str) -> dict:
    """pairs, zero and accepts of a layer adding ``x + post1(pre1(x))[0]`` then ``x + post2(pre2(x))``, by attribute."""
    return dict(pairs=lambda b: [(getattr(b, pre1), getattr(b, post1)), (getattr(b, pre2), getattr(b, post2))],
                zero=lambda b: (last_linear(getattr(b, post1)), last_linear(getattr(b, post2))),
                accepts=lambda b: all(hasattr(b, n) for n in (pre1, post1, pre2, post2)))

# CLIP / SigLIP / SigLIP2 encoder layers (both towers of the dual models use them):
# x + self_attn(layer_norm1(x))[0], then x + mlp(layer_norm2(x)). The same four roles in 4.x and 5.x; only
# what the layer returns differs (4.x a tuple, 5.x the tensor), which no hook sees. ``self_attn`` returns
# (output, weights): the correction goes into the output and leaves the weights as they are. SigLIP's pooling
# head (``SiglipMultiheadAttentionPoolingHead``) has one add of its own after the encoder, outside the stream
# the schedule spans: it keeps alpha 1. A dual model (``CLIPModel``) has both towers' layers in one depth
# order (text, then vision); decayify the tower you mean (``model.vision_model``).
register_adapter(subblock_adapter(
    "transformers CLIPEncoderLayer / SiglipEncoderLayer", ("transformers.models.clip:CLIPEncoderLayer",
                                                          "transformers.models.siglip:SiglipEncoderLayer",
                                                          "transformers.models.siglip2:Siglip2EncoderLayer"),
    **_by_name("layer_norm1", "self_attn", "layer_norm2", "mlp")))


# BEiT / Data2Vec-vision: drop_path(lambda * branch) + x, with the layer scale lambda_1 / lambda_2 *inside*
# the branch and one ``drop_path`` module (nn.Identity at rate 0) for both adds. The correction goes on
# drop_path's output, so the add is alpha * x + drop_path(lambda * f(x)): alpha scales the shortcut, lambda
# stays the trained branch scale (paper eq. 3 with f = lambda * branch), exact at any drop-path rate.
# 5.x BeitLayer: attention -> dropout -> lambda, mlp -> dropout -> lambda. 4.x BeitLayer (and
# Data2VecVisionLayer in 5.x, copied from it): attention(...)[0] -> lambda, intermediate -> output -> lambda,
# lambda None at layer_scale_init_value 0. layernorm_before / layernorm_after receive x first in both.
def _beit_zero(b):
    mlp = b.mlp if hasattr(b, "mlp") else b.output  # 5.x BeitMLP / 4.x BeitOutput.dense
    return (last_linear(b.attention), last_linear(mlp))  # 5.x o_proj / 4.x attention.output.dense


register_adapter(subblock_adapter(
    "transformers BeitLayer / Data2VecVisionLayer", ("transformers.models.beit:BeitLayer", "transformers.models.data2vec:Data2VecVisionLayer"),
    pairs=lambda b: [(b.layernorm_before, b.drop_path), (b.layernorm_after, b.drop_path)], zero=_beit_zero,
    accepts=lambda b: all(hasattr(b, n) for n in ("layernorm_before", "layernorm_after", "drop_path"))))


# Llama-style decoder layers (Llama, Mistral, Qwen2): x + self_attn(input_layernorm(x))[0], then
# x + mlp(post_attention_layernorm(x)). ``self_attn`` returns (output, weights): the correction goes into the output.
# attention_mask, position_embeddings, the cache and **kwargs pass through the layer untouched.
register_adapter(subblock_adapter(
    "transformers LlamaDecoderLayer (Llama-style)", ("transformers.models.llama:LlamaDecoderLayer",
                                                     "transformers.models.mistral:MistralDecoderLayer",
                                                     "transformers.models.qwen2:Qwen2DecoderLayer"),
    **_by_name("input_layernorm", "self_attn", "post_attention_layernorm", "mlp")))
