"""The traced adapter: residual blocks no explicit adapter names, reached through their torch.fx graph.

Blocks with no explicit adapter (timm's MixerBlock, ResMLP ResBlock, ResPostBlock, ParallelThingsBlock,
MetaFormerBlock, ConvMixer's Residual, a user's block with an inline gate): each add is alpha * x + f(x) by
hand, alpha = 1 is the library's forward bit for bit (also the replaced forward's generated code, in train and
eval mode), and what cannot be proved is refused in one line naming the class and why."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from resdecay.nn.adapters import hooks
from resdecay.nn.adapters.traced import _replaced_forward, plan_block, traced_adapter
from resdecay.nn.adapters.traced_graph import TraceRefused


def _quiet(fn, *args, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # timm's deprecation notes
        return fn(*args, **kwargs)


def _jitter(module: nn.Module, seed: int = 0) -> nn.Module:
    """Random offsets on every weight (layer scales start near 0 in timm): every path counts."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g))
    return module.eval()


class GatedBlock(nn.Module):
    """A user's block whose branch is computed inline: x + sigmoid(gate(x)) * dropout(f(norm(x))), the dropout
    a function reading ``self.training`` (fixed while tracing: one generated forward per mode)."""

    def __init__(self, d: int = 8):
        super().__init__()
        self.norm, self.f, self.gate = nn.LayerNorm(d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        return x + torch.sigmoid(self.gate(x)) * F.dropout(self.f(self.norm(x)), 0.2, self.training)


# ----------------------------------------------------------------------------- one block of each kind, by hand
def _mixer():
    from timm.models.mlp_mixer import MixerBlock
    return MixerBlock(16, 4), (2, 4, 16)


def _resmlp():
    from timm.models.mlp_mixer import ResBlock
    return ResBlock(16, 4), (2, 4, 16)


def _respost():
    from timm.models.vision_transformer import ResPostBlock
    return ResPostBlock(16, 2), (2, 4, 16)


def _parallel():
    from timm.models.vision_transformer import ParallelThingsBlock
    return ParallelThingsBlock(16, 2), (2, 4, 16)


def _metaformer():
    from timm.models.metaformer import MetaFormerBlock
    return MetaFormerBlock(16), (2, 16, 4, 4)


def _convmixer_residual():
    from timm.models.convmixer import ConvMixer
    return ConvMixer(dim=16, depth=2, kernel_size=3, patch_size=4, num_classes=10).blocks[0][0], (2, 16, 4, 4)


def _two(first, second):
    """x -> a2 * h + second(h), h = a1 * x + first(x): a two-add block by hand."""
    def hand(b, x, a1, a2):
        h = a1 * x + first(b, x)
        return a2 * h + second(b, h)
    return hand


HAND = {  # name: (builder, the library's forward as alpha * x + f(x) per add, mechanism)
    "MixerBlock": (_mixer, _two(lambda b, x: b.mlp_tokens(b.norm1(x).transpose(1, 2)).transpose(1, 2),
                                lambda b, h: b.mlp_channels(b.norm2(h))), "forward"),
    "ResBlock (ResMLP)": (_resmlp, _two(lambda b, x: b.ls1 * b.linear_tokens(b.norm1(x).transpose(1, 2)).transpose(1, 2),
                                        lambda b, h: b.ls2 * b.mlp_channels(b.norm2(h))), "forward"),
    "ResPostBlock": (_respost, _two(lambda b, x: b.norm1(b.attn(x)), lambda b, h: b.norm2(b.mlp(h))), "hooks"),
    "ParallelThingsBlock": (_parallel, _two(lambda b, x: sum(f(x) for f in b.attns),
                                            lambda b, h: sum(f(h) for f in b.ffns)), "forward"),
    "MetaFormerBlock": (_metaformer, _two(lambda b, x: b.token_mixer(b.norm1(x)), lambda b, h: b.mlp(b.norm2(h))),
                        "hooks"),
    "ConvMixer Residual": (_convmixer_residual, lambda b, x, a: a * x + b.fn(x), "hooks"),
    "GatedBlock": (lambda: (GatedBlock(), (3, 5, 8)),
                   lambda b, x, a: a * x + torch.sigmoid(b.gate(x)) * b.f(b.norm(x)), "forward"),
}


def _built(name):
    torch.manual_seed(0)
    block, shape = _quiet(HAND[name][0])
    return _jitter(block), torch.randn(*shape, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", list(HAND))
def test_each_add_is_alpha_x_plus_branch_by_hand(name):
    plain, x = _built(name)
    adapter = traced_adapter(plain)
    assert adapter.name == f"traced {type(plain).__name__}"
    block = copy.deepcopy(plain)
    alphas = (0.7, 0.4)[:adapter.adds]
    adapter.install(block, alphas, (1.0,) * adapter.adds)
    assert adapter.factors(block) == (alphas, (1.0,) * adapter.adds)
    assert ("forward" in block.__dict__) == (HAND[name][2] == "forward")  # which mechanism reached the adds
    with torch.no_grad():
        got, want = block(x), HAND[name][1](plain, x, *alphas)
    assert torch.allclose(got, want, atol=1e-5), (got - want).abs().max()
    assert list(block.state_dict()) == list(plain.state_dict())


@pytest.mark.parametrize("name", [n for n in HAND if HAND[n][2] == "forward"])
def test_the_generated_forward_is_the_library_forward_at_alpha_one(name):
    """The replaced forward at alpha = 1 (forced: decayify installs nothing there) is the library's, bit for bit,
    in eval and in train mode (its dropout drawn in the same order), and a deepcopy runs the copy's weights."""
    plain, x = _built(name)
    plan = plan_block(plain)
    block = copy.deepcopy(plain)
    hooks.replace_forward(block, _replaced_forward(block, plan), (1.0,) * plan.adds, (1.0,) * plan.adds)
    with torch.no_grad():
        assert torch.equal(block(x), plain(x))
        block.train(), plain.train()
        torch.manual_seed(5)
        a = block(x)
        torch.manual_seed(5)
        assert torch.equal(a, plain(x))
        block.eval(), plain.eval()
        if name == "GatedBlock":  # its dropout: the train-mode code is not the eval-mode code
            assert not torch.equal(a, block(x))
        twin = copy.deepcopy(block)
        assert twin.forward.__self__ is twin and twin.forward.__func__ is block.forward.__func__
        with torch.no_grad():
            next(twin.parameters()).add_(1.0)
        assert not torch.equal(twin(x), block(x))


def test_zero_init_makes_each_branch_zero():
    for name in ("MixerBlock", "GatedBlock", "ConvMixer Residual", "ParallelThingsBlock"):
        block, x = _built(name)
        adapter = traced_adapter(block)
        adapter.zero_init(block)
        alphas = (0.7, 0.4)[:adapter.adds]
        adapter.install(block, alphas, (1.0,) * adapter.adds)
        with torch.no_grad():
            assert torch.allclose(block(x), torch.prod(torch.tensor(alphas)) * x, atol=1e-6), name


# ----------------------------------------------------------------------------- refusals: one line, the class, why
class DataDependent(nn.Module):
    def __init__(self):
        super().__init__()
        self.f = nn.Linear(4, 4)

    def forward(self, x):
        if x.sum() > 0:
            return x + self.f(x)
        return x


class InPlaceMethod(DataDependent):
    def forward(self, x):
        return x.add_(self.f(x))


class AugmentedAdd(DataDependent):
    def forward(self, x):
        out = self.f(x)
        out += x
        return out


class ScaledStream(DataDependent):
    def forward(self, x):
        return 0.5 * x + self.f(x)


class ParallelBranches(DataDependent):
    def forward(self, x):
        return x + self.f(x) + torch.tanh(x)


class NoAdd(DataDependent):
    def forward(self, x):
        return self.f(x)


class PostNorm(DataDependent):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(4)

    def forward(self, x):
        x = self.norm(x + self.f(x))
        return x + self.f(x)


@pytest.mark.parametrize("cls, why", [
    (DataDependent, "data-dependent control flow"),
    (InPlaceMethod, r"an in-place add_ on the stream at `return x.add_\(self.f\(x\)\)`"),
    (AugmentedAdd, r"an in-place add \(\+=\) on the stream at `out \+= x`"),
    (ScaledStream, r"a scaled stream \(gate \* x\)"),
    (ParallelBranches, "a term not computed from the stream"),
    (NoAdd, r"no residual add \(x \+ f\(x\)\)"),
    (PostNorm, "whose y is computed from the stream but is not the stream"),
])
def test_what_cannot_be_proved_is_refused_in_one_line(cls, why):
    block = cls()
    before = {k: v.clone() for k, v in block.state_dict().items()}
    with pytest.raises(TraceRefused, match=f"^{cls.__name__}: .*{why}") as info:
        traced_adapter(block)
    assert "\n" not in str(info.value)
    assert set(block.__dict__) == set(cls().__dict__)  # tracing left nothing on the block
    assert all(torch.equal(v, block.state_dict()[k]) for k, v in before.items())


def test_a_traced_flag_argument_is_held_to_its_default():
    """What is proved is the call with the stream alone: another value of an argument the trace fixed is refused
    at call time, on both paths (the hooks' guard; fx's own check in the generated code)."""
    from timm.models.vision_transformer import ResPostBlock
    torch.manual_seed(0)
    block, x = ResPostBlock(16, 2).eval(), torch.randn(2, 4, 16)
    traced_adapter(block).install(block, (0.5, 0.5), (1.0, 1.0))
    with torch.no_grad():
        assert torch.equal(block(x), block(x, attn_mask=None, is_causal=False))
        with pytest.raises(TypeError, match="ResPostBlock: decayify traced its residual adds for a call with x alone"):
            block(x, is_causal=True)
