"""Hugging Face transformers' ViT-family layers (``ViTLayer``, ``ViTMAELayer``, ``Dinov2Layer`` and the
layers built like them). Sub-blocks are found by role, so both major layouts work:

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
    "transformers ViTLayer / ViTMAELayer", ("transformers.:ViTLayer", "transformers.:ViTMAELayer",
                                            "transformers.:DeiTLayer", "transformers.:VideoMAELayer"),
    pairs=_vit_pairs, zero=_vit_zero, accepts=_vit_layout))

# DINOv2: drop_path(layer_scale(branch)) + residual, one drop_path module for both adds (4.x and 5.x)
register_adapter(subblock_adapter(
    "transformers Dinov2Layer", ("transformers.:Dinov2Layer", "transformers.:Dinov2WithRegistersLayer"),
    pairs=lambda b: [(b.norm1, b.drop_path), (b.norm2, b.drop_path)],
    zero=lambda b: (last_linear(b.attention), last_linear(b.mlp))))
