"""U-ViT and SiT backbones with decayed shortcuts (models/uvit.py, models/sit.py)."""

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from helpers import tiny_config
from resdecay.models.sit import AdaLNBlock, SiT, SiTConfig
from resdecay.models.uvit import UViT, UViTConfig
from resdecay.nn.blocks import Block
from resdecay.schedule import alpha_schedule

FMNIST = dict(img_size=28, in_chans=1, patch_size=4, embed_dim=96, num_heads=3)  # the -tiny-fmnist presets
# the tiny U-ViT (5 blocks) and SiT (4 blocks) on two-channel 8x8 inputs, unconditional and undecayed unless a
# test says otherwise
TINY = dict(in_chans=2, num_classes=0, alpha_min=1.0)


def uvit(**kw):
    return UViT(tiny_config("uvit", **{**TINY, **kw}))


def sit(**kw):
    return SiT(tiny_config("sit", **{**TINY, **kw}))


BUILDERS = {"uvit": uvit, "sit": sit}


def count(model):
    return sum(p.numel() for p in model.parameters())


def inputs(B=3, C=2, S=8):
    torch.manual_seed(0)
    return torch.randn(B, C, S, S), torch.tensor([0.0, 500.0, 999.0][:B])


@pytest.mark.parametrize("family", ["uvit", "sit"])
@pytest.mark.parametrize("num_classes", [0, 5])
def test_output_has_input_shape(family, num_classes):
    model = BUILDERS[family](num_classes=num_classes, alpha_min=0.7)
    x, t = inputs()
    y = torch.tensor([0, 4, 5]) if num_classes else None  # 5 = the null label
    assert model(x, t, y).shape == x.shape
    assert model(x, torch.rand(3)).shape == x.shape  # interpolant times in [0, 1]; y=None -> null label


def test_tiny_fmnist_presets_run():
    x = torch.randn(2, 1, 28, 28)
    for model in (UViT(UViTConfig(**FMNIST, depth=7)), SiT(SiTConfig(**FMNIST, depth=6, num_classes=10))):
        assert model(x, torch.tensor([1.0, 2.0])).shape == x.shape


@pytest.mark.parametrize("family,depth", [("uvit", 7), ("sit", 6)])
@pytest.mark.parametrize("schedule", ["linear", "paper"])
def test_alphas_follow_the_schedule_over_the_whole_network(family, depth, schedule):
    model = BUILDERS[family](depth=depth, alpha_min=0.6, schedule=schedule)
    assert model.num_blocks == depth == len(model.blocks)
    assert torch.equal(model.alphas, alpha_schedule(depth, 0.6, schedule))
    assert model.alphas[-1].min() == 0.6  # the decay ends at alpha_min in the LAST block
    if schedule == "linear":
        assert model.alphas[0, 0] == 1.0 and model.alphas[-1, -1] == 0.6
    used = torch.tensor([[b.alpha_attn, b.alpha_mlp] for b in model.blocks], dtype=torch.float64)
    assert torch.equal(used, model.alphas)  # block i really uses row i
    assert torch.all(BUILDERS[family](depth=depth, alpha_min=1.0).alphas == 1.0)


def test_uvit_zero_init_blocks_start_as_scaled_identity():
    model = uvit(depth=7, alpha_min=0.6)
    x = torch.randn(2, 5, 32)
    for blk, (a, m) in zip(model.blocks, model.alphas.tolist(), strict=True):
        assert isinstance(blk, Block)
        torch.testing.assert_close(blk(x), a * m * x)
    plain = uvit(depth=7, alpha_min=0.6, zero_init=False)
    assert not torch.allclose(plain.blocks[0](x), x)


def test_sit_starts_at_zero_output_and_scaled_identity_blocks():
    model = sit(depth=6, alpha_min=0.7, num_classes=3)
    x, t = inputs()
    assert torch.equal(model(x, t, torch.tensor([0, 1, 2])), torch.zeros_like(x))  # adaLN-Zero + zero final layer
    tokens, c = torch.randn(3, 16, 32), torch.randn(3, 32)
    for blk, (a, m) in zip(model.blocks, model.alphas.tolist(), strict=True):
        assert isinstance(blk, AdaLNBlock)
        torch.testing.assert_close(blk(tokens, c), a * m * tokens)
    assert not any(torch.all(lin.weight == 0) for lin in model.skip_linears)  # the authors' xavier default
    assert all(torch.all(lin.weight == 0) for lin in sit(depth=6, zero_init=True).skip_linears)


def test_skips_add_the_expected_linears():
    D = 32
    assert count(uvit(depth=7)) - count(uvit(depth=7, skips=False)) == 3 * (2 * D * D + D)  # 3 out blocks
    assert count(sit(depth=6)) - count(sit(depth=6, skips=False)) == 3 * (D * D + D)  # 3 decoder blocks
    assert len(uvit(depth=7, skips=False).skip_linears) == len(sit(depth=6, skips=False).skip_linears) == 0


def _record_outputs(model):
    outputs = {}
    for i, blk in enumerate(model.blocks):
        blk.register_forward_hook(lambda m, args, out, i=i: outputs.__setitem__(i, out))
    return outputs


def test_uvit_skip_wiring_mirrors_in_blocks():
    """Out block j concatenates [stream, output of in block n-1-j] before its Linear(2D -> D)."""
    model, n = uvit(depth=7), 3
    outputs, seen = _record_outputs(model), []
    for j, lin in enumerate(model.skip_linears):
        lin.register_forward_hook(lambda m, args, out, j=j: seen.append((j, args[0])))
    model(*inputs())
    assert [j for j, _ in seen] == [0, 1, 2]
    for j, cat in seen:
        assert torch.equal(cat[..., :32], outputs[n + j]) and torch.equal(cat[..., 32:], outputs[n - 1 - j])


def test_sit_skip_wiring_mirrors_encoder_half():
    """Decoder block j (block half+j) gets Linear(output of encoder block half-1-j) added."""
    model = sit(depth=6)
    outputs, seen = _record_outputs(model), []
    for j, lin in enumerate(model.skip_linears):
        lin.register_forward_hook(lambda m, args, out, j=j: seen.append((j, args[0])))
    model(*inputs())
    assert [(j, enc is outputs[2 - j]) for j, enc in seen] == [(0, True), (1, True), (2, True)]


@pytest.mark.parametrize("family", ["uvit", "sit"])
def test_label_dropout_only_in_training(family):
    model = BUILDERS[family](num_classes=4, class_dropout=0.5)
    seen = []
    model.y_embedder.embedding_table.register_forward_hook(lambda m, args, out: seen.append(args[0].clone()))
    B = 256
    x, t, y = torch.randn(B, 2, 8, 8), torch.rand(B), torch.arange(B) % 4
    model.eval()
    model(x, t, y)
    assert torch.equal(seen[-1], y)
    model(x, t)  # no labels: every sample gets the null label 4
    assert torch.all(seen[-1] == 4)
    model.train()
    torch.manual_seed(0)
    model(x, t, y)
    dropped = seen[-1] == 4
    assert 0.35 < dropped.float().mean() < 0.65 and torch.equal(seen[-1][~dropped], y[~dropped])
    model(x, t, y, force_drop_ids=torch.zeros(B, dtype=torch.long))  # forced: no random dropout
    assert torch.equal(seen[-1], y)


@pytest.mark.parametrize("family", ["uvit", "sit"])
def test_labels_for_an_unconditional_model_raise(family):
    with pytest.raises(ValueError, match="unconditional model"):
        BUILDERS[family]()(*inputs(), torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("family", ["uvit", "sit"])
def test_forward_intermediates(family):
    model = BUILDERS[family](depth=7 if family == "uvit" else 6, num_classes=3, alpha_min=0.7).eval()
    x, t = inputs()
    T = 16 + model.num_prefix_tokens  # uvit: [time, label] + 16 patches; sit: 16 patches
    feats = model.forward_intermediates(x, t, torch.tensor([0, 1, 2]), indices=[0, 2, -1])
    assert len(feats) == 3 and all(f.shape == (3, T, 32) for f in feats)
    last = model.forward_intermediates(x, t, torch.tensor([0, 1, 2]))
    assert len(last) == 1 and torch.equal(last[0], feats[-1])
    outputs = _record_outputs(model)
    model(x, t, torch.tensor([0, 1, 2]))
    assert torch.equal(outputs[model.num_blocks - 1], feats[-1]) and torch.equal(outputs[2], feats[1])
    for bad in ([model.num_blocks], [-model.num_blocks - 1]):
        with pytest.raises(ValueError, match=f"0..{model.num_blocks - 1}"):
            model.forward_intermediates(x, t, None, indices=bad)
        with pytest.raises(IndexError):
            model.forward_intermediates(x, t, None, indices=bad)


@pytest.mark.parametrize("family", ["uvit", "sit"])
def test_gradients_reach_every_parameter(family):
    torch.manual_seed(0)
    model = BUILDERS[family](depth=5 if family == "uvit" else 4, num_classes=3, alpha_min=0.6)
    with torch.no_grad():  # move the zero-initialised weights off zero so every path carries signal
        for p in model.parameters():
            if p.requires_grad:
                p.add_(0.05 * torch.randn_like(p))
    x, t = inputs()
    out = model.train()(x, t, torch.tensor([0, 1, 2]))
    (out**2).mean().backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and (p.grad is None or not p.grad.abs().sum() > 0)]
    assert not missing


@pytest.mark.parametrize("family", ["uvit", "sit"])
def test_flops_match_torch_flop_counter(family):
    model = BUILDERS[family](depth=5 if family == "uvit" else 4, num_classes=3)
    x, t = inputs()
    with FlopCounterMode(display=False) as counter:
        model(x, t, torch.tensor([0, 1, 2]))
    counted = counter.get_total_flops() / 3
    if not any("scaled_dot_product" in str(op) for op in counter.get_flop_counts()["Global"]):
        T = 16 + model.num_prefix_tokens  # this torch/CPU SDPA kernel is not counted: add QK^T and AV
        counted += model.num_blocks * 4 * T * T * 32
    assert counted == model.flops_per_sample()


def test_sit_xl2_matches_sit_size():
    cfg = dict(img_size=32, in_chans=4, patch_size=2, embed_dim=1152, depth=28, num_heads=16, num_classes=1000)
    with torch.device("meta"):
        plain, skipped = SiT(SiTConfig(**cfg, skips=False)), SiT(SiTConfig(**cfg, alpha_min=0.8))
    # SiT-XL/2 (= DiT-XL/2) has 675.13 M parameters with its learn_sigma head (p*p*8 outputs); without
    # it (p*p*4 outputs, 1152*16 + 16 fewer) 675.11 M, fixed sin-cos table included.
    assert count(plain) == 675_111_184 == 675_129_632 - (1152 * 16 + 16)
    assert count(skipped) == count(plain) + 14 * (1152 * 1152 + 1152) == 693_706_768  # 14 skip Linears
    assert abs(plain.flops_per_sample() / 2 - 118.6e9) < 0.01 * 118.6e9  # DiT's 118.6 GFLOPs are MACs


def test_presets_build():
    """The sizes the presets use build (on the meta device: no memory, no time)."""
    sizes = {  # U-ViT-S/2 ~44 M and U-ViT-M/2 ~131 M as in the U-ViT paper (+0.4 M time MLP)
        "uvit-s2": (UViTConfig(img_size=32, in_chans=3, patch_size=2, embed_dim=512, depth=13, num_heads=8), 44_649_568),
        "uvit-m2": (UViTConfig(img_size=32, in_chans=4, patch_size=2, embed_dim=768, depth=17, num_heads=12), 130_910_372),
        "sit-s2": (SiTConfig(img_size=32, in_chans=4, patch_size=2, embed_dim=384, depth=12, num_heads=6), 33_459_856),
        "sit-b2": (SiTConfig(img_size=32, in_chans=4, patch_size=2, embed_dim=768, depth=12, num_heads=12), 133_274_896),
    }
    for name, (cfg, params) in sizes.items():
        with torch.device("meta"):
            model = (UViT if name.startswith("uvit") else SiT)(cfg)
        assert count(model) == params, name


@pytest.mark.parametrize("family,field,value,words", [
    ("uvit", "depth", 6, "model.depth 6 must be odd"),
    ("uvit", "depth", 1, "model.depth 1 must be odd and >= 3"),
    ("sit", "depth", 5, "model.depth 5 must be even"),
    ("sit", "alpha_min", 0.0, "model.alpha_min"),
    ("uvit", "schedule", "exp", "model.schedule 'exp' is unknown; choose one of linear"),
    ("sit", "patch_size", 3, "not divisible by patch size 3"),
    ("uvit", "num_heads", 3, "model.embed_dim 32 must be divisible by model.num_heads 3"),
    ("sit", "objective", "x0", "model.objective 'x0' is unknown; choose one of ddpm-eps, interp-v"),
    ("uvit", "noise_schedule", "sigmoid", "model.noise_schedule 'sigmoid' is unknown; choose one of linear, cosine"),
    ("sit", "class_dropout", 1.0, "model.class_dropout must lie in"),
    ("uvit", "num_classes", -1, "model.num_classes"),
    ("sit", "family", "uvit", "model.family must be 'sit'"),
])
def test_config_validation_names_the_field(family, field, value, words):
    with pytest.raises(ValueError, match=words.replace("(", r"\(")):
        BUILDERS[family](**{field: value})


def test_plain_sit_may_have_odd_depth():
    assert sit(depth=5, skips=False).num_blocks == 5
