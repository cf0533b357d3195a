"""diffusers' two-stream MM-DiT blocks: SD3 / SD3.5's ``JointTransformerBlock`` and Flux's
``FluxTransformerBlock`` (double-stream) and ``FluxSingleTransformerBlock`` (one joint stream).

Every add is inline with an adaLN-Zero gate (``x + gate * f(x)``), so the forward is replaced by the
library's (diffusers 0.4x) with ``residual_add`` in each add: at alpha = 1 ``residual_add(x, branch)`` is
the library's ``x + branch`` in the same float order, so outputs are bit-identical
(tests/nn/test_adapters_diffusers.py). The text stream's adds are ``side_add`` (the same arithmetic): the image
stream is the one the diagnostics read at ``residual_add``. On the schedule (paper eq. 3, x_{l+1} = alpha_l * x_l + f_l(x_l)):

* the *image* stream's adds: attention and feed-forward (2 per block; SD3.5's dual-attention blocks have a
  second self-attention add between them: 3);
* the *context* (text) stream's adds of the same block take the alphas of the image adds of that block
  (attention with attention, feed-forward with feed-forward): both streams are residual streams of the same
  depth, and the paper decays every residual add of a diffusion model. ``decayify(...,
  context_stream="plain")`` keeps them at alpha 1 instead. SD3's last block (``context_pre_only``) has no
  context adds at all (no MLP on the context stream; its context output is dropped).
* Flux's single blocks run one add on the joint (text + image) stream; with ``context_stream="plain"`` its text
  tokens keep alpha 1, so that the text stream is plain through the double *and* the single blocks.

All three adapters allow mixed add counts (``mixed_adds``): Flux's 2-add double blocks and 1-add single blocks,
and SD3.5's 3-add dual-attention blocks beside 2-add ones, share one schedule over the adds in depth order
(double blocks first, as the model registers and runs them). Flux's IP-adapter output (a third attention output)
is added after the feed-forward add as the library adds it, off the schedule, as PixArt's cross-attention add is.
"""

from __future__ import annotations

import torch

from ..residual import residual_add, side_add
from .hooks import last_linear
from .registry import forward_adapter, register_adapter

CONTEXT_STREAM = {"context_stream": ("decay", "plain")}  # default first: decay the context stream too


def _context_plain(self) -> bool:
    return self.__dict__.get("resdecay_options", {}).get("context_stream", "decay") == "plain"


def _context_factors(self, a: float, b: float) -> tuple[float, float]:
    """The factors of a context-stream add whose image-stream twin has (a, b)."""
    return (1.0, 1.0) if _context_plain(self) else (a, b)


def _dual(block) -> bool:
    """SD3.5's dual-attention block (``attn2``; older diffusers have no ``use_dual_attention``)."""
    return bool(getattr(block, "use_dual_attention", False))


def _feed_forward(self, ff, h):
    if getattr(self, "_chunk_size", None) is not None:  # "feed_forward_chunk_size", as the library does
        from diffusers.models.attention import _chunked_feed_forward
        return _chunked_feed_forward(ff, h, self._chunk_dim, self._chunk_size)
    return ff(h)


def _context_adds(self, c, attn_out, mod, a_attn, a_ff):
    """The context stream's attention and feed-forward adds (SD3 and Flux double blocks lay them out alike).

    Args:
        c: the context stream before the block; attn_out: the joint attention's context output;
        mod: (c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp); a_attn, a_ff: the (alpha, beta) of the
            image stream's attention and feed-forward adds.
    """
    c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = mod
    c = side_add(c, c_gate_msa.unsqueeze(1) * attn_out, *_context_factors(self, *a_attn))
    h = self.norm2_context(c) * (1 + c_scale_mlp[:, None]) + c_shift_mlp[:, None]
    return side_add(c, c_gate_mlp.unsqueeze(1) * _feed_forward(self, self.ff_context, h),
                    *_context_factors(self, *a_ff))


def joint_block_forward(self, hidden_states, encoder_hidden_states, temb, joint_attention_kwargs=None):
    """``JointTransformerBlock.forward`` (SD3, SD3.5) with alpha * x in every add; returns (context, image)."""
    alphas, betas = self.resdecay_factors
    first, last = (alphas[0], betas[0]), (alphas[-1], betas[-1])  # attention, feed-forward
    kwargs = joint_attention_kwargs or {}
    dual = _dual(self)
    if dual:
        h, gate_msa, shift_mlp, scale_mlp, gate_mlp, h2, gate_msa2 = self.norm1(hidden_states, emb=temb)
    else:
        h, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(hidden_states, emb=temb)
    if self.context_pre_only:
        c = self.norm1_context(encoder_hidden_states, temb)
    else:
        c, *c_mod = self.norm1_context(encoder_hidden_states, emb=temb)
    attn_output, context_attn_output = self.attn(hidden_states=h, encoder_hidden_states=c, **kwargs)
    hidden_states = residual_add(hidden_states, gate_msa.unsqueeze(1) * attn_output, *first)
    if dual:  # SD3.5: a second self-attention add, the block's second add on the schedule
        attn_output2 = gate_msa2.unsqueeze(1) * self.attn2(hidden_states=h2, **kwargs)
        hidden_states = residual_add(hidden_states, attn_output2, alphas[1], betas[1])
    h = self.norm2(hidden_states) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
    hidden_states = residual_add(hidden_states, gate_mlp.unsqueeze(1) * _feed_forward(self, self.ff, h), *last)
    if self.context_pre_only:
        return None, hidden_states
    return _context_adds(self, encoder_hidden_states, context_attn_output, c_mod, first, last), hidden_states


def flux_double_forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None,
                        joint_attention_kwargs=None):
    """``FluxTransformerBlock.forward`` with alpha * x in every add; returns (context, image)."""
    (a_attn, a_ff), (b_attn, b_ff) = self.resdecay_factors
    h, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(hidden_states, emb=temb)
    c, *c_mod = self.norm1_context(encoder_hidden_states, emb=temb)
    outputs = self.attn(hidden_states=h, encoder_hidden_states=c, image_rotary_emb=image_rotary_emb,
                        **(joint_attention_kwargs or {}))
    attn_output, context_attn_output = outputs[0], outputs[1]
    hidden_states = residual_add(hidden_states, gate_msa.unsqueeze(1) * attn_output, a_attn, b_attn)
    h = self.norm2(hidden_states) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
    hidden_states = residual_add(hidden_states, gate_mlp.unsqueeze(1) * self.ff(h), a_ff, b_ff)
    if len(outputs) == 3:  # an IP-adapter's attention output: added as the library adds it
        hidden_states = hidden_states + outputs[2]
    c = _context_adds(self, encoder_hidden_states, context_attn_output, c_mod, (a_attn, b_attn), (a_ff, b_ff))
    if c.dtype == torch.float16:
        c = c.clip(-65504, 65504)
    return c, hidden_states


def flux_single_forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None,
                        joint_attention_kwargs=None):
    """``FluxSingleTransformerBlock.forward``: one add, alpha * x + gate * proj_out([attn, mlp]) on the joint
    stream (the text tokens at alpha 1 under ``context_stream="plain"``); returns (context, image)."""
    (a,), (b,) = self.resdecay_factors
    text_seq_len = encoder_hidden_states.shape[1]
    residual = torch.cat([encoder_hidden_states, hidden_states], dim=1)
    h, gate = self.norm(residual, emb=temb)
    mlp_hidden_states = self.act_mlp(self.proj_mlp(h))
    attn_output = self.attn(hidden_states=h, image_rotary_emb=image_rotary_emb, **(joint_attention_kwargs or {}))
    branch = gate.unsqueeze(1) * self.proj_out(torch.cat([attn_output, mlp_hidden_states], dim=2))
    if _context_plain(self):  # the text tokens are the context stream: plain; the image tokens decayed
        hidden_states = torch.cat([side_add(residual[:, :text_seq_len], branch[:, :text_seq_len], 1.0),
                                   residual_add(residual[:, text_seq_len:], branch[:, text_seq_len:], a, b)], dim=1)
    else:
        hidden_states = residual_add(residual, branch, a, b)
    if hidden_states.dtype == torch.float16:
        hidden_states = hidden_states.clip(-65504, 65504)
    return hidden_states[:, :text_seq_len], hidden_states[:, text_seq_len:]


def _joint_zero(b):
    """The last layer of every branch: attention outputs (both streams), attn2, the feed-forwards."""
    out = [b.attn.to_out[0], last_linear(b.ff)]
    if getattr(b.attn, "to_add_out", None) is not None:
        out.append(b.attn.to_add_out)
    if getattr(b, "attn2", None) is not None:
        out.append(b.attn2.to_out[0])
    if getattr(b, "ff_context", None) is not None:
        out.append(last_linear(b.ff_context))
    return tuple(out)


# SD3 / SD3.5: 2 adds, 3 in a dual-attention block (SD3.5's ``dual_attention_layers``)
register_adapter(forward_adapter(
    "diffusers JointTransformerBlock (SD3 MM-DiT)", ("diffusers.models.attention:JointTransformerBlock",), joint_block_forward,
    adds=2, zero=_joint_zero, accepts=lambda b: hasattr(b, "context_pre_only") and not _dual(b), mixed_adds=True,
    options=CONTEXT_STREAM))
register_adapter(forward_adapter(
    "diffusers JointTransformerBlock, dual attention (SD3.5 MM-DiT-X)", ("diffusers.models.attention:JointTransformerBlock",),
    joint_block_forward, adds=3, zero=_joint_zero,
    accepts=lambda b: hasattr(b, "context_pre_only") and _dual(b), mixed_adds=True, options=CONTEXT_STREAM))

register_adapter(forward_adapter(
    "diffusers FluxTransformerBlock (Flux double-stream)", ("diffusers.models.transformers.transformer_flux:FluxTransformerBlock",), flux_double_forward,
    adds=2, zero=_joint_zero, accepts=lambda b: hasattr(b, "norm1_context") and hasattr(b, "ff_context"),
    mixed_adds=True, options=CONTEXT_STREAM))
register_adapter(forward_adapter(
    "diffusers FluxSingleTransformerBlock (Flux single-stream)", ("diffusers.models.transformers.transformer_flux:FluxSingleTransformerBlock",),
    flux_single_forward, adds=1, zero=lambda b: (b.proj_out,),
    accepts=lambda b: all(hasattr(b, n) for n in ("norm", "proj_mlp", "proj_out", "attn")),
    mixed_adds=True, options=CONTEXT_STREAM))
