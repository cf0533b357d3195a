"""diffusers' ``BasicTransformerBlock`` (DiT: ada_norm_zero, PixArt: ada_norm_single, UVit2D: ada_norm_continuous,
plain layer_norm / ada_norm) and UVit2D's ``SkipFFTransformerBlock``.

Its adds are inline with the adaLN-Zero gate (``gate * attn + x``; DiT's recipe starts the gate at 0), so no hook on a
branch module can reach them: the forward is replaced by ``basic_block_forward``, the library's forward
(diffusers 0.3x-0.4x) with ``residual_add`` in the self-attention and feed-forward adds. At alpha = 1
``residual_add`` is ``x + branch``, the library's ``branch + x`` in the same float order: outputs are
bit-identical (tests/nn/test_adapters.py). The cross-attention add (PixArt, a U-Net's cross-attention
blocks) is not on the schedule (a DiT block's two adds are), and keeps ``x + f``. In ``UNet2DConditionModel``
these blocks sit between one-add ``ResnetBlock2D``s (diffusers_unet.py): ``mixed_adds`` puts both on one
schedule over the adds in depth order; a DiT / PixArt, all of whose blocks have two adds, is scheduled as before.
"""

from __future__ import annotations

from ..residual import residual_add
from .hooks import last_linear
from .registry import forward_adapter, register_adapter, subblock_adapter

NORM_TYPES = ("layer_norm", "ada_norm", "ada_norm_zero", "ada_norm_single", "ada_norm_continuous")


def _pooled(added_cond_kwargs):
    return (added_cond_kwargs or {}).get("pooled_text_emb")


def _modulate_attn_input(self, x, timestep, class_labels, added_cond_kwargs):
    """Stage 0 of the library's forward: the normalised input of self-attention and the adaLN terms."""
    kind, mod = self.norm_type, {}
    if kind == "ada_norm_zero":
        h, mod["gate_msa"], mod["shift_mlp"], mod["scale_mlp"], mod["gate_mlp"] = self.norm1(
            x, timestep, class_labels, hidden_dtype=x.dtype)
    elif kind == "ada_norm_single":
        shift_msa, scale_msa, mod["gate_msa"], mod["shift_mlp"], mod["scale_mlp"], mod["gate_mlp"] = (
            self.scale_shift_table[None] + timestep.reshape(x.shape[0], 6, -1)).chunk(6, dim=1)
        h = self.norm1(x) * (1 + scale_msa) + shift_msa
    elif kind == "ada_norm":
        h = self.norm1(x, timestep)
    elif kind == "ada_norm_continuous":  # UVit2D: the pooled text embedding conditions every norm
        h = self.norm1(x, _pooled(added_cond_kwargs))
    else:
        h = self.norm1(x)
    return (self.pos_embed(h) if self.pos_embed is not None else h), mod


def _gate(kind, gate, out):
    if kind == "ada_norm_zero":
        return gate.unsqueeze(1) * out
    return gate * out if kind == "ada_norm_single" else out


def _cross_attention(self, x, timestep, encoder_hidden_states, encoder_attention_mask, kwargs, added_cond_kwargs):
    kind = self.norm_type
    if kind == "ada_norm_single":
        h = x  # PixArt applies no norm before cross-attention
    elif kind in ("ada_norm", "ada_norm_continuous"):
        h = self.norm2(x, timestep if kind == "ada_norm" else _pooled(added_cond_kwargs))
    else:
        h = self.norm2(x)
    if self.pos_embed is not None and kind != "ada_norm_single":
        h = self.pos_embed(h)
    return self.attn2(h, encoder_hidden_states=encoder_hidden_states, attention_mask=encoder_attention_mask, **kwargs) + x


def basic_block_forward(self, hidden_states, attention_mask=None, encoder_hidden_states=None,
                        encoder_attention_mask=None, timestep=None, cross_attention_kwargs=None, class_labels=None,
                        added_cond_kwargs=None):
    """``BasicTransformerBlock.forward`` with alpha * x in the self-attention and feed-forward adds."""
    (a_attn, a_ff), (b_attn, b_ff) = self.resdecay_factors
    kind = self.norm_type
    h, mod = _modulate_attn_input(self, hidden_states, timestep, class_labels, added_cond_kwargs)
    kwargs = dict(cross_attention_kwargs or {})
    gligen = kwargs.pop("gligen", None)
    attn = self.attn1(h, encoder_hidden_states=encoder_hidden_states if self.only_cross_attention else None,
                      attention_mask=attention_mask, **kwargs)
    hidden_states = residual_add(hidden_states, _gate(kind, mod.get("gate_msa"), attn), a_attn, b_attn)
    if hidden_states.ndim == 4:
        hidden_states = hidden_states.squeeze(1)
    if gligen is not None:
        hidden_states = self.fuser(hidden_states, gligen["objs"])
    if self.attn2 is not None:
        hidden_states = _cross_attention(self, hidden_states, timestep, encoder_hidden_states, encoder_attention_mask,
                                         kwargs, added_cond_kwargs)
    if kind == "ada_norm_single":
        h = self.norm2(hidden_states) * (1 + mod["scale_mlp"]) + mod["shift_mlp"]
    elif kind == "ada_norm_continuous":
        h = self.norm3(hidden_states, _pooled(added_cond_kwargs))
    else:
        h = self.norm3(hidden_states)
        if kind == "ada_norm_zero":
            h = h * (1 + mod["scale_mlp"][:, None]) + mod["shift_mlp"][:, None]
    if self._chunk_size is not None:
        from diffusers.models.attention import _chunked_feed_forward
        ff = _chunked_feed_forward(self.ff, h, self._chunk_dim, self._chunk_size)
    else:
        ff = self.ff(h)
    hidden_states = residual_add(hidden_states, _gate(kind, mod.get("gate_mlp"), ff), a_ff, b_ff)
    return hidden_states.squeeze(1) if hidden_states.ndim == 4 else hidden_states


# UVit2D's SkipFFTransformerBlock: attn1(norm1(x)) + x, then attn2(norm2(x)) + x (self- and cross-attention)
register_adapter(subblock_adapter(
    "diffusers SkipFFTransformerBlock (UVit2D)", ("diffusers.models.attention:SkipFFTransformerBlock",),
    pairs=lambda b: [(b.norm1, b.attn1), (b.norm2, b.attn2)], zero=lambda b: (b.attn1.to_out[0], b.attn2.to_out[0])))

register_adapter(forward_adapter(
    "diffusers BasicTransformerBlock (DiT / PixArt / UVit2D)", ("diffusers.models.attention:BasicTransformerBlock",), basic_block_forward,
    adds=2, zero=lambda b: (b.attn1.to_out[0], last_linear(b.ff)),
    accepts=lambda b: getattr(b, "norm_type", None) in NORM_TYPES,
    mixed_adds=True))  # UNet2DConditionModel: 2-add blocks between 1-add ResnetBlock2Ds on one schedule
