"""The fused add (adapters/fused.py): where an explicit adapter states its roles and the block's forward traces, each
decayed add is one ``torch.add(f, x, alpha=alpha)`` in a forward generated from the traced graph, instead of the
correction hooks. It equals the hooks to float round-off (outputs and gradients), keeps the hooks wherever it cannot
prove the block, and keeps what the hooks guarantee: deepcopy, remove, state_dict keys, factors read at call time,
the arguments a library passes beside the stream, gradient checkpointing, torch.compile and torch.export."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from helpers.adapter_checks import build, quiet_decayify
from helpers.adapter_models import MODELS
from helpers.fused_checks import both_ways, mechanisms, output_and_grads, relative
from resdecay import alphas_of, decayify
from resdecay.nn.adapters import register_adapter, subblock_adapter, unregister_adapter
from resdecay.nn.adapters.fused import is_fused
from resdecay.nn.adapters.hooks import remove

# the coverage table's rows whose decayed blocks the fused add reaches (explicit adapters with stated roles)
FUSED = ["timm vit (Block)", "timm eva02 (EvaBlock)", "timm swin (SwinTransformerBlock)", "timm cait (LayerScaleBlock)",
         "timm resnetv2 (PreActBottleneck)", "torchvision vit_b_16 (EncoderBlock)",
         "torchvision swin (SwinTransformerBlock)", "torchvision swin_v2 (SwinTransformerBlockV2)",
         "transformers ViTMAEForPreTraining (ViTMAELayer)", "transformers ViTModel (ViTLayer)",
         "transformers Dinov2Model (Dinov2Layer)", "transformers CLIPVisionModel (CLIPEncoderLayer)",
         "transformers SiglipVisionModel (SiglipEncoderLayer)", "transformers Siglip2VisionModel (Siglip2EncoderLayer)",
         "transformers Data2VecVisionModel (Data2VecVisionLayer, the 4.x BeitLayer layout)",
         "transformers IJepaModel (IJepaLayer)", "timm levit_128s (LevitBlock)", "timm levit_conv_128s (LevitBlock, conv)",
         "transformers DINOv3ViTModel (DINOv3ViTLayer)",
         "transformers LlamaModel (LlamaDecoderLayer)"]
# rows the hooks keep: BEiT's layer branches on attention_mask, torchvision's CNBlock adds in place (result += input)
HOOKED = ["transformers BeitModel (BeitLayer)", "torchvision convnext (CNBlock)"]


@pytest.mark.parametrize("name", FUSED)
def test_fused_add_equals_the_hooks_outputs_and_gradients(name):
    model, call = build(name)
    hooked, fused = both_ways(model, alpha_min=0.5)
    assert "fused" in mechanisms(fused).values() and "hooks" not in mechanisms(fused).values()
    assert "fused" not in mechanisms(hooked).values()
    out_h, grad_h = output_and_grads(hooked, call)
    out_f, grad_f = output_and_grads(fused, call)
    # alpha x + f against x + (f - (1 - alpha) x): float round-off. The gradients, summed over a batch through the
    # backward, are as far from a float64 run under either mechanism (1.1-1.6e-6 on the ViT / DINOv2 rows)
    assert relative(out_f, out_h) <= 1e-6 and relative(grad_f, grad_h) <= 1e-5
    assert alphas_of(fused) == alphas_of(hooked)
    assert list(fused.state_dict()) == list(model.state_dict())  # no new key: no submodule, no parameter


@pytest.mark.parametrize("name", HOOKED)
def test_a_block_the_trace_cannot_prove_keeps_the_hooks(name):
    model, call = build(name)
    hooked, fused = both_ways(model, alpha_min=0.5)
    assert set(mechanisms(fused).values()) == {"hooks"}
    with torch.no_grad():
        assert torch.equal(call(fused), call(hooked))


class _Block(nn.Module):
    """x + drop(f(norm(x))), twice (its subclasses below: forwards the fused add cannot prove)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.norm1, self.f1, self.drop1 = nn.LayerNorm(d), nn.Linear(d, d), nn.Identity()
        self.norm2, self.f2, self.drop2 = nn.LayerNorm(d), nn.Linear(d, d), nn.Identity()

    def forward(self, x):
        x = x + self.drop1(self.f1(self.norm1(x)))
        return x + self.drop2(self.f2(self.norm2(x)))


class _DataBranch(_Block):
    def forward(self, x):
        if x.sum() > 0:  # fx cannot trace a branch on a tensor's value
            x = x * 1.0
        return super().forward(x)


class _ArgumentBranch(_Block):
    def forward(self, x, mask=None):
        if mask is not None:  # fx would take this branch silently, whatever the call gives
            x = x * mask
        return super().forward(x)


class _VarArgs(_Block):
    def forward(self, x, *rest):  # what ``*rest`` holds, a generated forward could not name
        return super().forward(x)


KINDS = {"plain": _Block, "data-dependent branch": _DataBranch, "branch on an argument": _ArgumentBranch,
         "*args": _VarArgs}


class _Stack(nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        self.blocks = nn.Sequential(*[KINDS[kind]() for _ in range(3)])

    def forward(self, x):
        return self.blocks(x)


def _hand(block: _Block, x, a1: float, a2: float):
    h = a1 * x + block.f1(block.norm1(x))
    return a2 * h + block.f2(block.norm2(h))


@pytest.fixture
def toy_adapter():
    adapter = register_adapter(subblock_adapter(
        "test toy block", (_Block,), pairs=lambda b: [(b.norm1, b.drop1), (b.norm2, b.drop2)],
        zero=lambda b: (b.f1, b.f2), priority=100))
    yield adapter
    unregister_adapter(adapter.name)


@pytest.mark.parametrize("kind", ["data-dependent branch", "branch on an argument", "*args"])
def test_an_unprovable_forward_keeps_the_hooks_and_the_adds(kind, toy_adapter):
    """fx cannot trace a branch on a tensor's value; an argument tested in the block's own forward is not a plain
    pass-through; ``*rest`` has no name a generated forward could keep: the hooks, and the adds still alpha x + f."""
    torch.manual_seed(0)
    model = _Stack(kind)
    x = torch.randn(2, 5, 8)
    decayify(model, alpha_min=0.5)
    block = model.blocks[2]
    assert not is_fused(block) and set(mechanisms(model).values()) == {"hooks"}
    with torch.no_grad():
        assert torch.allclose(block(x), _hand(block, x, *alphas_of(model)[2][1]), atol=1e-6)


def test_the_toy_block_without_those_is_fused_exactly(toy_adapter):
    torch.manual_seed(0)
    model, x = _Stack("plain"), torch.randn(2, 5, 8)
    decayify(model, alpha_min=0.5)
    assert all(is_fused(b) for b in model.blocks[1:])  # blocks[0]: its first add keeps alpha 1, its second is fused
    with torch.no_grad():
        for block, (_, alphas) in zip(model.blocks, alphas_of(model), strict=True):
            assert torch.allclose(block(x), _hand(block, x, *alphas), atol=1e-6)


def _timm():
    model, call = build("timm vit (Block)")
    return model, call, torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def test_a_factor_set_by_hand_shows_in_the_next_forward():
    model, _, _ = _timm()
    fused = quiet_decayify(copy.deepcopy(model), alpha_min=0.5)
    _, path, shape, hand = MODELS["timm vit (Block)"]
    block, library_block = fused.get_submodule(path), model.get_submodule(path)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(4))
    a1 = alphas_of(fused)[1][1][0]
    block.drop_path2.resdecay_alpha = 0.1  # where the hooks also keep it: alphas_of reads it back
    assert is_fused(block) and alphas_of(fused)[1][1] == (a1, 0.1)
    with torch.no_grad():
        assert torch.allclose(block(x), hand(library_block, x, a1, 0.1), atol=1e-5)


def test_a_deepcopy_runs_its_own_forward_and_factors():
    model, call, _ = _timm()
    fused = quiet_decayify(copy.deepcopy(model), alpha_min=0.5)
    twin = copy.deepcopy(fused)  # EMA, torch.compile
    a, b = fused.blocks[1], twin.blocks[1]
    assert is_fused(b) and b.forward.block is b and a.forward.block is a
    with torch.no_grad():
        before = call(fused)
        assert torch.equal(call(twin), before)
        b.drop_path1.resdecay_alpha = 0.1
        assert torch.equal(call(fused), before) and not torch.allclose(call(twin), before)


def test_a_pickled_model_keeps_its_decay(tmp_path):
    """torch.save(model) pickles the fused forward as its block alone: loading proves and generates it again (a bound
    method of the generated code would come back as the library's forward, the decay silently lost)."""
    model, call, _ = _timm()
    fused = quiet_decayify(copy.deepcopy(model), alpha_min=0.5)
    torch.save(fused, tmp_path / "model.pt")
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    with torch.no_grad():
        assert is_fused(loaded.blocks[1]) and torch.equal(call(loaded), call(fused))
    assert alphas_of(loaded) == alphas_of(fused)


def test_remove_and_alpha_one_restore_the_library_forward_bit_for_bit():
    model, call, _ = _timm()
    fused = quiet_decayify(copy.deepcopy(model), alpha_min=0.5)
    with torch.no_grad():
        want = call(model)
        assert not torch.allclose(call(fused), want)
        decayify(fused, alpha_min=1.0)
        assert torch.equal(call(fused), want)
        assert not any("forward" in m.__dict__ for m in fused.modules())
        decayify(fused, alpha_min=0.5)
        for block in fused.blocks:
            remove(block)
        assert torch.equal(call(fused), want) and not any(is_fused(b) for b in fused.blocks)
    assert list(fused.state_dict()) == list(model.state_dict())


def test_arguments_beside_the_stream_pass_through():
    """timm's attn_mask / is_causal and a transformers layer's attention_mask and **kwargs reach the attention as the
    library passes them: the fused forward and the hooks agree on a masked call."""
    model, _, _ = _timm()
    hooked, fused = both_ways(model, alpha_min=0.5)
    x = torch.randn(2, 17, 192, generator=torch.Generator().manual_seed(2))
    mask = torch.zeros(2, 1, 17, 17).masked_fill(torch.rand(2, 1, 17, 17) < 0.3, float("-inf"))
    with torch.no_grad():
        got, want = fused.blocks[1](x, attn_mask=mask), hooked.blocks[1](x, attn_mask=mask)
        assert relative(got, want) <= 1e-6 and not torch.allclose(got, fused.blocks[1](x))
        assert relative(fused.blocks[1](x, None, True), hooked.blocks[1](x, None, True)) <= 1e-6  # is_causal
    model, _ = build("transformers ViTModel (ViTLayer)")
    hooked, fused = both_ways(model, alpha_min=0.5)
    x = torch.randn(2, 17, 32, generator=torch.Generator().manual_seed(2))
    mask = torch.zeros(2, 1, 17, 17).masked_fill(torch.rand(2, 1, 17, 17) < 0.3, float("-inf"))
    assert is_fused(fused.layers[1])
    with torch.no_grad():
        got = fused.layers[1](x, mask, output_attentions=False)
        assert relative(got, hooked.layers[1](x, mask, output_attentions=False)) <= 1e-6
        assert not torch.allclose(got, fused.layers[1](x))


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing_enable` is deprecated:FutureWarning")
def test_transformers_gradient_checkpointing_still_recomputes_the_layer():
    """transformers wraps every layer's forward to checkpoint it: the fused forward runs inside that wrapper, so the
    backward recomputes the layer (its first norm runs twice) and the gradients are those without checkpointing."""
    model, call = build("transformers ViTModel (ViTLayer)")
    fused = quiet_decayify(copy.deepcopy(model), alpha_min=0.5).train()
    _, plain_grads = output_and_grads(fused, call)
    fused.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    calls = []
    fused.layers[1].layernorm_before.register_forward_hook(lambda m, args, out: calls.append(1))
    _, grads = output_and_grads(fused, call)
    assert is_fused(fused.layers[1]) and len(calls) == 2 and torch.allclose(grads, plain_grads, atol=1e-6)


def test_compile_and_export_run_the_fused_forward():
    model, call, x = _timm()
    fused = quiet_decayify(copy.deepcopy(model), alpha_min=0.5)
    with torch.no_grad():
        want = call(fused)
        assert torch.allclose(call(torch.compile(fused, backend="eager")), want, atol=1e-6)
        exported = torch.export.export(fused.eval(), (x,))
        assert torch.allclose(exported.module()(x), fused(x), atol=1e-6)
