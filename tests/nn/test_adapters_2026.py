"""The 2026 families of issue 51 that decayify now takes with an explicit adapter: transformers' DINOv3 ViT and the
Llama-style decoder layers, whose forwards take RoPE position embeddings, a mask and **kwargs beside the stream.
(alpha = 1 bit for bit, keys unchanged and the schedule: their rows in tests/nn/test_adapters.py.) Here: one block
of each by hand, called with the very arguments the model's own forward gave it."""

from __future__ import annotations

import copy

import pytest
import torch

from helpers.adapter_models_hf import DINOV3, LLAMA, hf_dinov3, hf_llama
from resdecay import alphas_of, decayify

pytest.importorskip("transformers")


def _second_block_call(model, call, block):
    """The (args, kwargs) the model's forward calls ``block`` with."""
    seen = {}
    handle = block.register_forward_pre_hook(lambda m, a, k: seen.update(args=a, kwargs=k), with_kwargs=True)
    with torch.no_grad():
        call(model)
    handle.remove()
    return seen["args"], seen["kwargs"]


@pytest.mark.covers("b", DINOV3)
def test_a_dinov3_layer_is_alpha_x_plus_its_branches_with_rope_passed_through():
    plain, call = hf_dinov3()
    model = decayify(copy.deepcopy(plain), alpha_min=0.6)
    block, b = model.model.layer[1], plain.model.layer[1]  # the oracle runs the plain model's hook-free modules
    (x, *rest), kw = _second_block_call(model, call, block)
    (a1, a2) = dict(alphas_of(model))["model.layer.1"]
    with torch.no_grad():
        attn = b.attention(b.norm1(x), attention_mask=kw.get("attention_mask"), position_embeddings=kw["position_embeddings"])[0]
        h = a1 * x + b.drop_path(b.layer_scale1(attn))
        expected = a2 * h + b.drop_path(b.layer_scale2(b.mlp(b.norm2(h))))
        assert torch.allclose(block(x, *rest, **kw), expected, atol=1e-6)
    assert a2 == pytest.approx(0.6) and kw["position_embeddings"] is not None


@pytest.mark.covers("b", LLAMA)
def test_a_llama_decoder_layer_is_alpha_x_plus_its_branches_with_every_keyword_passed_through():
    plain, call = hf_llama()
    model = decayify(copy.deepcopy(plain), alpha_min=0.6)
    block, b = model.layers[1], plain.layers[1]  # the oracle runs the plain model's hook-free modules
    (x, *rest), kw = _second_block_call(model, call, block)
    (a1, a2) = dict(alphas_of(model))["layers.1"]
    with torch.no_grad():
        h = a1 * x + b.self_attn(hidden_states=b.input_layernorm(x), **kw)[0]
        expected = a2 * h + b.mlp(b.post_attention_layernorm(h))
        assert torch.allclose(block(x, *rest, **kw), expected, atol=1e-6)
    assert a2 == pytest.approx(0.6) and "position_embeddings" in kw
