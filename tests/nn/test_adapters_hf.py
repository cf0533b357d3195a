"""decayify on the transformers vision towers (CLIP, SigLIP, SigLIP2, BEiT, Data2Vec-vision, I-JEPA) and timm's LeViT
(tests/helpers/adapter_models_hf.py). Tests a-c run over them in tests/nn/test_adapters.py (its MODELS takes them
in); here: one block of the layers not called as ``block(x)`` against its hand-written ``alpha * x + f(x)``, torch.compile
without new graph breaks and threads that do not mix, per family; BEiT's layer scale untouched and its one drop_path
exact in train mode; the 4.x BeitLayer layout found by role; the paper's zero init; LeViT's downsample left at alpha 1."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch

from helpers import adapter_checks as shared  # checks d and e of tests/nn/test_adapters.py, run here on these models
from helpers import adapter_models_hf as hf
from resdecay import decayify
from resdecay.nn.adapters import adapter_for
from resdecay.nn.decayify import PartialDecayWarning, block_factors, residual_blocks

NAMES = list(hf.MODELS_HF)
# (d) once per adapter: SigLIP2 is SigLIP's adapter and layout, LeViT-conv LeViT's block with convolutions (each ~10 s)
COMPILED = [n for n in NAMES if n not in (hf.SIGLIP2, hf.LEVIT_CONV)]


@pytest.mark.parametrize("name", list(hf.BLOCKS_HF))
def test_one_block_is_alpha_x_plus_branch(name):
    """(b) for the layers that take a required attention_mask (CLIP / SigLIP) or return a tuple (Data2Vec-vision)."""
    plain, _ = shared.build(name)
    model = shared.quiet_decayify(copy.deepcopy(plain), alpha_min=0.3)
    path, shape, hand, call = hf.BLOCKS_HF[name]
    block, library_block = model.get_submodule(path), plain.get_submodule(path)  # the oracle runs hook-free modules
    alphas = block_factors(block)[0]
    assert all(a < 1.0 for a in alphas)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        got, want = call(block, x), hand(library_block, x, *alphas)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()


@pytest.mark.slow  # torch._dynamo.explain of two models: seconds each on 2 cores
@pytest.mark.parametrize("name", COMPILED)
def test_compile_adds_no_graph_break(name):
    """(d), as tests/nn/test_adapters.py's, with the copy taken before any forward: LeViT's eval-mode attention-bias
    cache keeps a non-leaf tensor after a forward with gradients on, which copy.deepcopy refuses (the library's
    model, decayed or not)."""
    import torch._dynamo as dynamo
    model, call = shared.build(name)
    decayed = shared.quiet_decayify(copy.deepcopy(model), alpha_min=0.5)
    plain = dynamo.explain(call)(model).graph_break_count
    dynamo.reset()
    assert dynamo.explain(call)(decayed).graph_break_count <= plain
    dynamo.reset()


# timm's SAM ViT gives outputs ~2e-7 apart between threads by itself (plain, no decayify): not the adapter's doing
@pytest.mark.parametrize("name", [n for n in NAMES if n != hf.SAM])
def test_threads_do_not_mix_inputs(name):
    shared.threads_do_not_mix_inputs(name)


@pytest.mark.parametrize("name", NAMES)
def test_zero_init_makes_every_branch_zero(name):
    """The paper's init through each adapter: a zero-initialised block maps x to alpha_attn * alpha_mlp * x."""
    model, _ = shared.build(name)
    shared.quiet_decayify(model, alpha_min=0.5, zero_init=True)
    if name in hf.BLOCKS_HF:
        path, shape, _, call = hf.BLOCKS_HF[name]
    else:
        (_, path, shape, _), call = hf.MODELS_HF[name], lambda b, x: b(x)
    block = model.get_submodule(path)
    a1, a2 = block_factors(block)[0]
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert torch.allclose(call(block, x), a1 * a2 * x, atol=1e-6)


@pytest.mark.parametrize("name", [hf.BEIT, hf.DATA2VEC])
def test_beit_layer_scale_is_untouched(name):
    """The decay scales the shortcut, never lambda: every parameter (lambda_1 / lambda_2 included) keeps its
    values, and the parameters are the same ones by name (lambda stays a parameter of the state_dict)."""
    model, _ = shared.build(name)
    before = {k: v.clone() for k, v in model.named_parameters()}
    decayify(model, alpha_min=0.3)
    after = dict(model.named_parameters())
    lambdas = [k for k in before if k.rpartition(".")[2] in ("lambda_1", "lambda_2")]
    assert len(lambdas) == 4 and list(after) == list(before)
    assert all(torch.equal(after[k], before[k]) for k in before)
    assert all(a < 1.0 for a in block_factors(model.get_submodule(lambdas[-1].rpartition(".")[0]))[0])


@pytest.mark.parametrize("model_name, config_name, hand", [("BeitModel", "BeitConfig", hf._beit),
                                                           ("Data2VecVisionModel", "Data2VecVisionConfig", hf._beit_4x)])
def test_beit_shared_drop_path_is_exact_at_any_rate(model_name, config_name, hand):
    """BEiT uses ONE drop_path (and one dropout) for both adds, lambda before it: the correction comes after the
    drop_path, so a decayed layer in train mode is alpha * x + drop_path(lambda * f(x)) under the same masks."""
    plain, _ = hf.hf_beit_family(model_name, config_name, drop_path_rate=0.5, hidden_dropout_prob=0.2)()
    model = decayify(copy.deepcopy(plain), alpha_min=0.3)
    path = "layers.1" if model_name == "BeitModel" else "encoder.layer.1"
    block, library_block = model.get_submodule(path).train(), plain.get_submodule(path).train()
    assert block.drop_path.drop_prob == 0.5
    call = (lambda b, x: b(x)) if model_name == "BeitModel" else (lambda b, x: b(x)[0])
    x = torch.randn(8, 17, 32, generator=torch.Generator().manual_seed(4))
    torch.manual_seed(9)
    got = call(block, x)
    torch.manual_seed(9)
    want = hand(library_block, x, *block_factors(block)[0])
    assert torch.allclose(got, want, atol=1e-6) and not torch.allclose(got, call(block.eval(), x))


def test_transformers_4x_beit_layout_is_found_by_role():
    """transformers 4.x's BeitLayer: attention(...)[0] -> lambda, intermediate -> output -> lambda, one drop_path,
    lambda None at layer_scale_init_value 0, a tuple returned. Data2VecVisionLayer is that class copied (its source
    says so), so the 4.x BeitLayer is it under the 4.x name and module."""
    import torch.nn as nn
    from transformers import Data2VecVisionConfig
    from transformers.models.data2vec.modeling_data2vec_vision import Data2VecVisionLayer

    BeitLayer = type("BeitLayer", (Data2VecVisionLayer,), {"__module__": "transformers.models.beit.modeling_beit"})
    config = Data2VecVisionConfig(hidden_size=16, num_attention_heads=2, intermediate_size=32, layer_scale_init_value=0.0)
    config._attn_implementation = "eager"  # what a model's from_config sets before it builds its layers
    torch.manual_seed(0)
    plain = nn.ModuleList([BeitLayer(config), BeitLayer(config, drop_path_rate=0.1)]).eval()
    assert plain[1].lambda_1 is None and adapter_for(plain[1]).name == "transformers BeitLayer / Data2VecVisionLayer"
    model = decayify(copy.deepcopy(plain), alpha_min=0.4)
    x = torch.randn(3, 5, 16)
    with torch.no_grad():
        assert torch.allclose(model[1](x)[0], hf._beit_4x(plain[1], x, *block_factors(model[1])[0]), atol=1e-6)
        assert torch.equal(decayify(copy.deepcopy(plain), alpha_min=1.0)[1](x)[0], plain[1](x)[0])
        decayify(model, alpha_min=0.4, zero_init=True)  # 4.x: attention.output.dense and output.dense
        (a1, a2) = block_factors(model[1])[0]
        assert torch.allclose(model[1](x)[0], a1 * a2 * x, atol=1e-6)


def test_clip_attention_weights_pass_through_the_correction():
    """CLIP's self_attn returns (output, weights): the correction changes the output only, so the weights
    transformers records for output_attentions are the library's (layer 0 sees the same input)."""
    plain, _ = shared.build(hf.CLIP)
    plain.set_attn_implementation("eager")
    model, x = decayify(copy.deepcopy(plain), alpha_min=0.5), hf._img()
    with torch.no_grad():
        want, got = plain(pixel_values=x, output_attentions=True), model(pixel_values=x, output_attentions=True)
        assert torch.equal(got.attentions[0], want.attentions[0])
        assert not torch.allclose(got.attentions[1], want.attentions[1])
        assert torch.equal(got.last_hidden_state, model(pixel_values=x).last_hidden_state)


def test_levit_downsample_and_stem_stay_at_alpha_one():
    """LeViT's schedule spans its LevitBlocks only: the stem has no add, a LevitDownsample's attention has no
    shortcut and its one MLP add keeps alpha 1 (no warning: it is left by design, see timm_blocks)."""
    plain, _ = shared.build(hf.LEVIT)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PartialDecayWarning)
        model = decayify(copy.deepcopy(plain), alpha_min=0.3)
    names = [n for n, _, _ in residual_blocks(model)]
    assert names == ["stages.0.blocks.0", "stages.0.blocks.1", "stages.1.blocks.0", "stages.1.blocks.1",
                     "stages.2.blocks.0"]
    x = torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        down, lib = model.stages[1].downsample, plain.stages[1].downsample
        assert torch.equal(down(x), lib(x))
        h = lib.attn_downsample(x)
        assert torch.allclose(down(x), h + lib.mlp(h))
