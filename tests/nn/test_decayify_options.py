"""decayify beyond one stack of like blocks: blocks of mixed add counts on one schedule (a U-Net), a model's own
order of depth (``DepthOrder``), adapter keywords (checked, recorded, re-applied), and the one-line refusal that
names the block class met and the nearest supported kind of its library."""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn as nn

from resdecay import alpha_schedule, alphas_of, decayify
from resdecay.errors import ConfigError
from resdecay.nn.adapters import (
    DepthOrder,
    register_adapter,
    register_depth_order,
    subblock_adapter,
    unregister_adapter,
    unregister_depth_order,
)
from resdecay.nn.adapters.registry import forward_adapter
from resdecay.nn.decayify import residual_blocks
from resdecay.nn.residual import residual_add
from resdecay.nn.spec import check_spec


class OneAdd(nn.Module):  # x + f(norm(x)): a ResNet-like block
    def __init__(self, d=6):
        super().__init__()
        self.norm, self.f = nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x):
        return x + self.f(self.norm(x))


class TwoAdd(nn.Module):  # attention-like and MLP-like adds
    def __init__(self, d=6):
        super().__init__()
        self.n1, self.f1, self.n2, self.f2 = nn.LayerNorm(d), nn.Linear(d, d), nn.LayerNorm(d), nn.Linear(d, d)

    def forward(self, x):
        x = x + self.f1(self.n1(x))
        return x + self.f2(self.n2(x))


class Gated(nn.Module):  # one add, gate inline, a keyword choosing whether the second stream decays
    def __init__(self, d=6):
        super().__init__()
        self.f, self.g = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        return x + torch.sigmoid(self.g(x)) * self.f(x)


def _gated_forward(self, x):
    (a,), (b,) = self.resdecay_factors
    a = 1.0 if self.resdecay_options["stream"] == "plain" else a
    return residual_add(x, torch.sigmoid(self.g(x)) * self.f(x), a, b)


class UNetToy(nn.Module):
    """Registered down, up, mid (as diffusers registers a U-Net); its forward runs down, mid, up."""

    def __init__(self):
        super().__init__()
        self.down, self.up, self.mid = nn.ModuleList([OneAdd(), TwoAdd()]), nn.ModuleList([TwoAdd(), OneAdd()]), OneAdd()

    def forward(self, x):
        for b in (*self.down, self.mid, *self.up):
            x = b(x)
        return x


def _unet_order(model, found, options):
    by = {id(b): entry for entry in found for b in [entry[1]]}
    down = [by[id(b)] for b in model.down]
    up = [by[id(b)] for b in model.up]
    if options["depth"] == "forward":
        return down + [by[id(model.mid)]] + up, []
    return down + [by[id(model.mid)]], up


@pytest.fixture
def toy_registry():
    register_adapter(subblock_adapter("toy OneAdd", (OneAdd,), pairs=lambda b: [(b.norm, b.f)], zero=lambda b: (b.f,),
                                      adds=1, mixed_adds=True))
    register_adapter(subblock_adapter("toy TwoAdd", (TwoAdd,), pairs=lambda b: [(b.n1, b.f1), (b.n2, b.f2)],
                                      zero=lambda b: (b.f1, b.f2), mixed_adds=True))
    register_adapter(forward_adapter("toy Gated", (Gated,), _gated_forward, adds=1, zero=lambda b: (b.f,),
                                     options={"stream": ("decay", "plain")}))
    register_depth_order(DepthOrder("toy U-Net", (UNetToy,), _unet_order, options={"depth": ("forward", "down")}))
    yield
    for name in ("toy OneAdd", "toy TwoAdd", "toy Gated"):
        unregister_adapter(name)
    unregister_depth_order("toy U-Net")


def test_mixed_add_counts_share_one_schedule_in_the_models_depth_order(toy_registry):
    torch.manual_seed(0)
    model = UNetToy()
    x = torch.randn(3, 6)
    with torch.no_grad():
        assert torch.equal(decayify(copy.deepcopy(model), alpha_min=1.0)(x), model(x))
    plain = copy.deepcopy(model)  # the oracle runs hook-free modules
    decayify(model, alpha_min=0.4)
    names = [n for n, _ in alphas_of(model)]
    assert names == ["down.0", "down.1", "mid", "up.0", "up.1"]  # depth order, not registration order
    flat = [a for _, alphas in alphas_of(model) for a in alphas]
    assert len(flat) == 1 + 2 + 1 + 2 + 1  # every add on one schedule: 1 -> 0.4 over 7 adds
    assert torch.allclose(torch.tensor(flat, dtype=torch.float64), alpha_schedule(7, 0.4, adds_per_block=1).flatten())
    # one block by hand: the mid block's add is alpha * x + f(norm(x))
    a = dict(alphas_of(model))["mid"][0]
    y = torch.randn(3, 6)
    with torch.no_grad():
        assert torch.allclose(model.mid(y), a * y + plain.mid.f(plain.mid.norm(y)), atol=1e-6)


def test_a_depth_order_keyword_keeps_blocks_at_one_and_is_recorded(toy_registry):
    model = decayify(UNetToy(), alpha_min=0.5, depth="down")
    table = dict(alphas_of(model))
    assert table["up.0"] == (1.0, 1.0) and table["up.1"] == (1.0,) and table["mid"] == (0.5,)
    assert model.resdecay_spec == {"alpha_min": 0.5, "schedule": "linear", "branches": "both", "depth": "down"}
    assert check_spec(model.resdecay_spec, "test") == model.resdecay_spec  # a saved spec with it is read back
    again = decayify(UNetToy(), **check_spec(model.resdecay_spec, "test"))
    assert alphas_of(again) == alphas_of(model)
    assert [n for n, _, _ in residual_blocks(model)][-2:] == ["up.0", "up.1"]


def test_adapter_keywords_reach_the_adapter_and_bad_ones_are_one_line(toy_registry):
    torch.manual_seed(0)
    stack = nn.Sequential(Gated(), Gated())
    x = torch.randn(2, 6)
    with torch.no_grad():
        want = stack(x)
        assert torch.allclose(decayify(copy.deepcopy(stack), alpha_min=0.5, stream="plain")(x), want)
        assert not torch.allclose(decayify(stack, alpha_min=0.5)(x), want)
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) colour for Sequential; its blocks take: stream \(decay/plain\)"):
        decayify(nn.Sequential(Gated(), Gated()), alpha_min=0.5, colour="red")
    with pytest.raises(ConfigError, match="stream 'sideways' is unknown; choose one of decay, plain"):
        decayify(nn.Sequential(Gated(), Gated()), alpha_min=0.5, stream="sideways")
    with pytest.raises(TypeError, match=r"unknown keyword\(s\) stream for Sequential; its blocks take: none"):
        decayify(nn.Sequential(TwoAdd(), TwoAdd()), alpha_min=0.5, stream="plain")


def test_mixed_adds_refuse_a_sub_block_choice(toy_registry):
    with pytest.raises(TypeError, match="branches=attn picks a transformer sub-block.*1/2 adds each.*use branches=both"):
        decayify(UNetToy(), alpha_min=0.5, branches="attn")


def test_a_stack_of_unsupported_layers_is_named_with_the_nearest_kind_of_its_library():
    """A model whose blocks are not named like blocks (CLIP's ``...EncoderLayer``) is refused naming that class,
    and the nearest supported kind comes from the same library when it has adapters."""

    class ToyEncoderLayer(nn.Module):
        def forward(self, x):
            return x

    ToyEncoderLayer.__module__ = "transformers.models.toy.modeling_toy"
    model = nn.Sequential(nn.Linear(2, 2), nn.Sequential(ToyEncoderLayer(), ToyEncoderLayer()))
    with pytest.raises(TypeError, match=r": ToyEncoderLayer; nearest supported: transformers "):
        decayify(model, alpha_min=0.5)


def _gpt2():
    import transformers
    return transformers.GPT2Model(transformers.GPT2Config(n_embd=16, n_layer=2, n_head=2, vocab_size=32, n_positions=8))


def _auraflow():
    import diffusers
    return diffusers.AuraFlowTransformer2DModel(sample_size=8, patch_size=2, in_channels=4, num_mmdit_layers=1,
                                                num_single_dit_layers=2, attention_head_dim=8, num_attention_heads=2,
                                                joint_attention_dim=16, caption_projection_dim=16, out_channels=4,
                                                pos_embed_max_size=16)


def _efficientnet():
    import torchvision
    return torchvision.models.efficientnet_b0(num_classes=10)


def _regnet_block():
    from timm.models.regnet import Bottleneck
    return Bottleneck(8, 16, stride=2)


REFUSED = {  # library: (a model no adapter takes and the trace cannot prove, the block class met, why the trace refused)
    "timm": (_regnet_block, "timm.models.regnet.Bottleneck", "a projection or a scale"),
    "torchvision": (_efficientnet, "torchvision.models.efficientnet.MBConv", r"an in-place add \(\+=\)"),
    "transformers": (_gpt2, "transformers.models.gpt2.modeling_gpt2.GPT2Block", r"takes \*\*kwargs"),
    "diffusers": (_auraflow, "diffusers.models.transformers.auraflow_transformer_2d.AuraFlowJointTransformerBlock",
                  "needs argument"),
}


@pytest.mark.parametrize("library", list(REFUSED))
def test_every_library_refusal_names_the_block_met_the_nearest_kind_of_that_library_and_why(library):
    """One line for each library: the block class met, the nearest supported kind among that library's adapters (not
    another library's), and the traced adapter's reason."""
    build, cls, why = REFUSED[library]
    with pytest.raises(TypeError) as caught:
        decayify(build(), alpha_min=0.6)
    text = str(caught.value)
    assert "\n" not in text and len(text) <= 300, (len(text), text)  # one short line, not the list of every kind
    assert f": {cls.rpartition('.')[2]} (traced adapter: " in text
    nearest = text.split("nearest supported: ", 1)[1]
    assert nearest.startswith(f"{library} "), nearest[:120]  # an adapter of the same library
    assert re.search(f"traced adapter: .*{why}", text), text
    assert text.endswith("supported kinds: docs/coverage.md; add yours with register_adapter")


def test_a_model_with_no_stack_names_its_own_class():
    class Lone(nn.Module):
        def forward(self, x):
            return x

    with pytest.raises(TypeError, match=r"in Lone: Lone.*; nearest supported: "):
        decayify(Lone(), alpha_min=0.6)
