"""decayify on every model of docs/coverage.md's coverage table (tests/helpers/adapter_models.py): alpha_min = 1
is the library's model bit for bit with its own state_dict keys, one block is alpha * x + f(x) per
sub-block, the alpha table is the schedule, torch.compile traces it without new graph breaks, and
threads do not mix."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from helpers.adapter_checks import build, compile_adds_no_graph_break, quiet_decayify, threads_do_not_mix_inputs
from helpers.adapter_models import MODELS
from resdecay import alpha_schedule, alphas_of, decayify
from resdecay.nn.decayify import PartialDecayWarning, block_factors, residual_blocks

NAMES = list(MODELS)


@pytest.mark.parametrize("name", NAMES)
def test_alpha_one_is_the_library_model_and_keys_never_change(name):
    model, call = build(name)
    keys = list(model.state_dict())
    with torch.no_grad():
        before = call(model)
        assert torch.equal(call(decayify(copy.deepcopy(model), alpha_min=1.0)), before)
        decayed = quiet_decayify(copy.deepcopy(model), alpha_min=0.5)
        assert not torch.allclose(call(decayed), before)
    assert list(decayed.state_dict()) == keys
    decayed.load_state_dict(model.state_dict(), strict=True)


@pytest.mark.parametrize("name", NAMES)
def test_alpha_table_is_the_schedule(name):
    model = quiet_decayify(build(name)[0], alpha_min=0.4)
    table = alphas_of(model)
    adds = len(table[0][1])
    expected = alpha_schedule(len(table), 0.4, adds_per_block=adds) if adds == 2 else alpha_schedule(len(table), 0.4,
                                                                                                       adds_per_block=1)
    assert torch.allclose(torch.tensor([a for _, a in table], dtype=torch.float64).reshape(expected.shape), expected)


@pytest.mark.parametrize("name", [n for n in NAMES if MODELS[n][1] is not None])
def test_one_block_is_alpha_x_plus_branch(name):
    plain, _ = build(name)
    model = quiet_decayify(copy.deepcopy(plain), alpha_min=0.3)
    _, path, shape, hand = MODELS[name]
    block, library_block = model.get_submodule(path), plain.get_submodule(path)  # the oracle runs hook-free modules
    alphas = block_factors(block)[0]
    assert any(a != 1.0 for a in alphas)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        if "DiT" in name:
            t, y = torch.tensor([3, 7]), torch.tensor([1, 2])
            got, want = block(x, timestep=t, class_labels=y), hand(library_block, x, *alphas, t, y)
        else:
            got, want = block(x), hand(library_block, x, *alphas)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()


@pytest.mark.covers("b", "diffusers UVit2DModel (SkipFFTransformerBlock, BasicTransformerBlock ada_norm_continuous)")
def test_uvit2d_blocks_are_alpha_x_plus_branch():
    """UVit2D's SkipFFTransformerBlock (hooks) and its ada_norm_continuous BasicTransformerBlock (replaced
    forward), each against the hand-written adds on the library's own modules; its ConvNeXt blocks (one add
    beside two-add blocks) stay at alpha 1, named in one warning."""
    plain, _ = build("diffusers UVit2DModel (SkipFFTransformerBlock, BasicTransformerBlock ada_norm_continuous)")
    with pytest.warns(PartialDecayWarning, match="ConvNextBlock"):
        model = decayify(copy.deepcopy(plain), alpha_min=0.3)
    g = torch.Generator().manual_seed(4)
    x, text, pooled = torch.randn(2, 16, 16, generator=g), torch.randn(2, 5, 32, generator=g), torch.randn(2, 32, generator=g)
    with torch.no_grad():
        blk, lib = model.down_block.attention_blocks[0], plain.down_block.attention_blocks[0]
        (a1, a2), text16 = block_factors(blk)[0], text if lib.kv_mapper is None else lib.kv_mapper(F.silu(text))
        h = a1 * x + lib.attn1(lib.norm1(x), encoder_hidden_states=text16)
        want = a2 * h + lib.attn2(lib.norm2(h), encoder_hidden_states=text16)
        assert torch.allclose(blk(x, text, None), want, atol=1e-5)
        blk, lib = model.transformer_layers[0], plain.transformer_layers[0]
        (a1, a2), y = block_factors(blk)[0], torch.randn(2, 16, 32, generator=g)
        h = a1 * y + lib.attn1(lib.norm1(y, pooled))
        h = h + lib.attn2(lib.norm2(h, pooled), encoder_hidden_states=text)  # the cross-attention add keeps alpha 1
        want = a2 * h + lib.ff(lib.norm3(h, pooled))
        got = blk(y, encoder_hidden_states=text, added_cond_kwargs={"pooled_text_emb": pooled})
        assert torch.allclose(got, want, atol=1e-5)


def test_vitmae_shared_dropout_is_exact_at_any_rate():
    """transformers' ViT layers use ONE dropout module for both adds: the correction comes after it,
    so a decayed layer in train mode equals the hand-written one under the same dropout masks."""
    from helpers.adapter_models import _hf_vit, hf_vitmae
    plain, _ = hf_vitmae(dropout=0.5)()
    model = decayify(copy.deepcopy(plain), alpha_min=0.3)
    block, library_block = model.vit.layers[1].train(), plain.vit.layers[1].train()
    x = torch.randn(2, 5, 32, generator=torch.Generator().manual_seed(4))
    torch.manual_seed(9)
    got = block(x)
    torch.manual_seed(9)
    want = _hf_vit(library_block, x, *block_factors(block)[0])
    assert torch.allclose(got, want, atol=1e-6) and not torch.allclose(got, block.eval()(x))


@pytest.mark.parametrize("name", ["transformers ViTMAEForPreTraining (ViTMAELayer)", "timm cait (LayerScaleBlock)",
                                  "torchvision swin (SwinTransformerBlock)", "diffusers DiTTransformer2DModel "
                                  "(BasicTransformerBlock, ada_norm_zero)"])
def test_threads_do_not_mix_inputs(name):
    threads_do_not_mix_inputs(name)


@pytest.mark.parametrize("name", ["transformers ViTMAEForPreTraining (ViTMAELayer)", "timm eva02 (EvaBlock)",
                                  "torchvision convnext (CNBlock)",
                                  "diffusers DiTTransformer2DModel (BasicTransformerBlock, ada_norm_zero)"])
@pytest.mark.slow  # torch._dynamo.explain of two models: seconds each on 2 cores
def test_compile_adds_no_graph_break(name):
    compile_adds_no_graph_break(name)


def test_zero_init_makes_every_branch_zero():
    """The paper's init through each adapter: a zero-initialised DiT / ViTMAE block maps x to alpha * x."""
    for name in ("transformers ViTMAEForPreTraining (ViTMAELayer)", "timm convnext (ConvNeXtBlock)"):
        model, _ = build(name)
        quiet_decayify(model, alpha_min=0.5, zero_init=True)
        _, path, shape, _ = MODELS[name]
        block = model.get_submodule(path)
        a = block_factors(block)[0]
        x = torch.randn(*shape)
        with torch.no_grad():
            expected = x * torch.prod(torch.tensor(a))
            if "convnext" in name:  # the shortcut is an identity: alpha * x
                assert torch.allclose(block(x), expected, atol=1e-6)
            else:
                assert torch.allclose(block(x), expected, atol=1e-6)


def test_every_block_of_a_model_is_found_once():
    model = build("transformers ViTMAEForPreTraining (ViTMAELayer)")[0]
    names = [n for n, _, _ in residual_blocks(model)]
    assert names == ["vit.layers.0", "vit.layers.1", "decoder.decoder_layers.0"]


def test_transformers_4x_layout_is_found_by_role():
    """transformers 4.x puts the MLP add inside ViTOutput.forward(h, input_tensor) and gives each add its
    own dropout; the adapter finds the sub-blocks by role. The 4.x layer, as its source lays it out."""
    import torch.nn as nn

    class ViTSelfOutput(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense, self.dropout = nn.Linear(8, 8), nn.Dropout(0.0)

        def forward(self, h):
            return self.dropout(self.dense(h))

    class ViTAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention, self.output = nn.Linear(8, 8), ViTSelfOutput()

        def forward(self, h):
            return (self.output(torch.tanh(self.attention(h))),)

    class ViTOutput(nn.Module):
        def __init__(self):
            super().__init__()
            self.dense, self.dropout = nn.Linear(16, 8), nn.Dropout(0.0)

        def forward(self, h, input_tensor):
            return self.dropout(self.dense(h)) + input_tensor

    class ViTLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention, self.intermediate, self.output = ViTAttention(), nn.Linear(8, 16), ViTOutput()
            self.layernorm_before, self.layernorm_after = nn.LayerNorm(8), nn.LayerNorm(8)

        def forward(self, x):
            h = self.attention(self.layernorm_before(x))[0] + x
            return self.output(torch.relu(self.intermediate(self.layernorm_after(h))), h)

    for cls in (ViTSelfOutput, ViTAttention, ViTOutput, ViTLayer):
        cls.__module__ = "transformers.models.vit.modeling_vit"
    torch.manual_seed(0)
    plain = nn.Sequential(ViTLayer(), ViTLayer())
    model = decayify(copy.deepcopy(plain), alpha_min=0.4)
    (a1, a2), b = block_factors(model[1])[0], plain[1]
    x = torch.randn(3, 8)
    with torch.no_grad():
        h = a1 * x + b.attention(b.layernorm_before(x))[0]
        want = a2 * h + b.output.dropout(b.output.dense(torch.relu(b.intermediate(b.layernorm_after(h)))))
        assert torch.allclose(model[1](x), want, atol=1e-6)
        assert torch.equal(decayify(copy.deepcopy(plain), alpha_min=1.0)(x), plain(x))


def test_docs_examples_run(capsys):
    """docs/plug-and-play.md's Python blocks, executed as written (the ViTMAE, the U-Net MAE in transformers,
    the user adapter)."""
    import re
    from pathlib import Path
    text = (Path(__file__).parent.parent.parent / "docs" / "plug-and-play.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    assert len(blocks) >= 3
    for code in blocks:
        exec(compile(code, "plug-and-play.md", "exec"), {"__name__": "docs"})
    out = capsys.readouterr().out
    assert "('decoder.decoder_layers.0', (0.64" in out and "[('0', (1.0, 0.8333" in out
    assert "{'op': 'unet_skips', 'skip_sources': [3, 1], 'decoder_start': 'content_free'}" in out
    from resdecay.nn.adapters import unregister_adapter
    unregister_adapter("my MyBlock")
