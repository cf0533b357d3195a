"""The traced adapter: residual blocks no explicit adapter names, reached through their torch.fx graph.

Blocks with no explicit adapter (timm's MixerBlock, ResMLP ResBlock, ResPostBlock, ParallelThingsBlock,
MetaFormerBlock, ConvMixer's Residual, a user's block with an inline gate): each add is alpha * x + f(x) by
hand, alpha = 1 is the library's forward bit for bit (also the replaced forward's generated code, in train and
eval mode), and what cannot be proved is refused in one line naming the class and why."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn as nn

from helpers.adapter_models import from_threads
from helpers.traced_blocks import MODELS, GatedBlock, jitter, quiet
from resdecay import alpha_schedule, alphas_of, decayify
from resdecay.nn.adapters import hooks
from resdecay.nn.adapters.traced import _replaced_forward, plan_block, traced_adapter
from resdecay.nn.adapters.traced_graph import TraceRefused
from resdecay.nn.decayify import PartialDecayWarning, block_factors, residual_blocks


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
    block, shape = quiet(HAND[name][0])
    return jitter(block), torch.randn(*shape, generator=torch.Generator().manual_seed(1))


ROW_OF = {"MixerBlock": "timm mixer (MixerBlock)", "ResBlock (ResMLP)": "timm resmlp (ResBlock)",  # coverage-table rows
          "ResPostBlock": "timm vit block_fn=ResPostBlock", "ParallelThingsBlock": "timm vit block_fn=ParallelThingsBlock",
          "MetaFormerBlock": "timm poolformer (MetaFormerBlock)", "ConvMixer Residual": "timm convmixer (Residual)",
          "GatedBlock": "a user's gated stack"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.covers("b", ROW_OF[n])) for n in HAND])
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


# ----------------------------------------------------------------------------- through decayify
def _model(name):
    torch.manual_seed(0)
    model = jitter(quiet(MODELS[name][0]))
    return model, torch.randn(*MODELS[name][2], generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", list(MODELS))
def test_alpha_one_is_the_library_model_and_keys_never_change(name):
    model, x = _model(name)
    keys = list(model.state_dict())
    with torch.no_grad():
        before = model(x)
        assert torch.equal(decayify(copy.deepcopy(model), alpha_min=1.0)(x), before)
        decayed = decayify(copy.deepcopy(model), alpha_min=0.5)
        assert not torch.allclose(decayed(x), before)
        assert torch.equal(decayify(decayed, alpha_min=1.0)(x), before)  # a second call replaces the settings
        decayify(decayed, alpha_min=0.5)
    assert list(decayed.state_dict()) == keys
    decayed.load_state_dict(model.state_dict(), strict=True)
    kinds = {adapter for _, _, adapter in residual_blocks(decayed)}
    assert kinds == {f"traced {MODELS[name][1]}"}  # reached by tracing, and the table says so


@pytest.mark.parametrize("name", list(MODELS))
def test_alpha_table_is_the_schedule(name):
    model, _ = _model(name)
    decayify(model, alpha_min=0.4)
    table = alphas_of(model)
    adds = len(table[0][1])
    want = alpha_schedule(len(table), 0.4, adds_per_block=adds)
    assert torch.allclose(torch.tensor([a for _, a in table], dtype=torch.float64).reshape(want.shape), want)


def test_one_block_of_a_decayified_model_is_alpha_x_plus_branch():
    """A MixerBlock (replaced forward) and a ResPostBlock (hooks) inside their models, against the hand-written
    adds on the library's own hook-free block."""
    for name, path, shape, hand in (("timm mixer (MixerBlock)", "blocks.1", (2, 16, 16), HAND["MixerBlock"][1]),
                                    ("timm vit block_fn=ResPostBlock", "blocks.1", (2, 17, 16), HAND["ResPostBlock"][1])):
        plain, _ = _model(name)
        model = decayify(copy.deepcopy(plain), alpha_min=0.3)
        block, library = model.get_submodule(path), plain.get_submodule(path)
        alphas = block_factors(block)[0]
        assert all(a < 1.0 for a in alphas)
        x = torch.randn(*shape, generator=torch.Generator().manual_seed(4))
        with torch.no_grad():
            assert torch.allclose(block(x), hand(library, x, *alphas), atol=1e-5), name


def test_deepcopy_of_a_decayified_traced_model_gives_the_same_outputs():
    for name in ("timm mixer (MixerBlock)", "timm vit block_fn=ResPostBlock"):
        model, x = _model(name)
        decayify(model, alpha_min=0.5)
        twin = copy.deepcopy(model)
        with torch.no_grad():
            assert torch.equal(twin(x), model(x))
            for p in twin.parameters():  # the copy runs its own weights (the replaced forward is bound to it)
                p.mul_(0.5)
            assert not torch.equal(twin(x), model(x))
        assert alphas_of(twin) == alphas_of(model)


@pytest.mark.covers("d", "timm mixer (MixerBlock)")
def test_compile_adds_no_graph_break():
    import torch._dynamo as dynamo
    model, x = _model("timm mixer (MixerBlock)")
    plain = dynamo.explain(model)(x).graph_break_count
    dynamo.reset()
    decayed = decayify(copy.deepcopy(model), alpha_min=0.5)
    explained = dynamo.explain(decayed)(x)
    dynamo.reset()
    assert explained.graph_break_count <= plain, explained.break_reasons


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.covers("e", n))
                                  for n in ("timm mixer (MixerBlock)", "timm vit block_fn=ResPostBlock")])
def test_threads_give_the_single_thread_outputs(name):
    model, x = _model(name)
    decayify(model, alpha_min=0.5)
    with torch.no_grad():
        want = model(x)
        outs, errors = from_threads(lambda: model(x))
    assert not errors and len(outs) == 20 and all(torch.equal(o, want) for o in outs)


def test_a_refused_block_beside_decayed_ones_is_named_in_the_warning():
    class Wide(DataDependent):
        def __init__(self):
            super().__init__()
            self.f = nn.Linear(8, 8)

    model = nn.Sequential(GatedBlock(), GatedBlock(), nn.Sequential(Wide(), Wide()))
    with pytest.warns(PartialDecayWarning, match=r"the traced adapter refused 2: 2\.0, 2\.1 \(Wide: data-dependent "
                                                 r"control flow"):
        decayify(model, alpha_min=0.5)
    assert [n for n, _ in alphas_of(model)] == ["0", "1"]


@pytest.mark.parametrize("cls, why", [(DataDependent, "data-dependent control flow"),
                                      (AugmentedAdd, r"an in-place add \(\+=\)")])
def test_a_model_with_nothing_reachable_is_one_type_error(cls, why):
    with pytest.raises(TypeError, match=f"no supported residual block in Sequential: {cls.__name__} "
                                        f"\\(traced adapter: {why}") as info:
        decayify(nn.Sequential(cls(), cls()), alpha_min=0.5)
    assert "\n" not in str(info.value)
