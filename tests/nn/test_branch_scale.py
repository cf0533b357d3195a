"""Branch gains and stochastic depth (``nn.branch_scale``; ``model.branch_scale``, ``model.layerscale_init``,
``model.drop_branch``, ``model.drop_identity``): every setting at its identity value is the plain model bit for
bit, the gains' starts and names, the drops' rates and expectation, the refusals and the run's label."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from helpers import tiny_config
from resdecay.errors import ConfigError
from resdecay.models import build_model
from resdecay.nn.blocks import Block
from resdecay.nn.branch_scale import depth_rates
from resdecay.nn.conditioning import AdaLNBlock
from resdecay.nn.residual import residual_add
from resdecay.nn.shortcut_info import describe_model
from resdecay.train.config import load_config

FAMILIES = ("mae", "sit", "uvit")


def _inputs(cfg, batch=3):
    torch.manual_seed(1)
    x = torch.randn(batch, cfg.in_chans, cfg.img_size, cfg.img_size)
    return (x, torch.rand(batch), torch.arange(batch) % 10) if cfg.family in ("sit", "uvit") else (x,)


def _forward(model, cfg, seed=2):
    torch.manual_seed(seed)  # the MAE's masks, the drops
    out = model(*_inputs(cfg))
    return out[1] if cfg.family == "mae" else out


def _build(family, seed=0, **settings):
    torch.manual_seed(seed)
    extra = {"decoder_decay": True} if family == "mae" else {}
    cfg = tiny_config(family, **extra, **settings)
    return build_model(cfg), cfg


def _plain_adds(block, x, c=None):
    """The block's two adds as they were before the gains and drops existed (the reference)."""
    if c is None:
        x = residual_add(x, block.drop_path(block.attn(block.norm1(x))), block.alpha_attn, block.beta_attn, block.update_fn)
        return residual_add(x, block.drop_path(block.mlp(block.norm2(x))), block.alpha_mlp, block.beta_mlp, block.update_fn)
    from resdecay.nn.conditioning import modulate

    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = block.adaLN_modulation(c).chunk(6, dim=1)
    x = residual_add(x, gate_msa.unsqueeze(1) * block.attn(modulate(block.norm1(x), shift_msa, scale_msa)),
                     block.alpha_attn, block.beta_attn, block.update_fn)
    return residual_add(x, gate_mlp.unsqueeze(1) * block.mlp(modulate(block.norm2(x), shift_mlp, scale_mlp)),
                        block.alpha_mlp, block.beta_mlp, block.update_fn)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("shortcut", ["decay", "orthogonal_decay"])
def test_the_defaults_are_the_plain_blocks_bit_for_bit(family, shortcut, monkeypatch):
    model, cfg = _build(family, shortcut=shortcut, alpha_min=0.6)
    assert not any(".ls1." in k or ".ls2." in k for k in model.state_dict())  # no new weights
    for training in (False, True):
        model.train(training)
        got = _forward(model, cfg)
        for cls in (Block, AdaLNBlock):
            monkeypatch.setattr(cls, "_residual_adds", _plain_adds)
        want = _forward(model, cfg)
        monkeypatch.undo()
        assert torch.equal(got, want)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_drops_in_eval_mode_and_layerscale_at_one_are_the_plain_model(family):
    plain, cfg = _build(family, alpha_min=0.7)
    want = _forward(plain.eval(), cfg)
    dropped, _ = _build(family, alpha_min=0.7, drop_branch=0.5, drop_identity=0.5)
    assert torch.equal(_forward(dropped.eval(), cfg), want)  # eval: no drop, no rescale
    scaled, _ = _build(family, alpha_min=0.7, branch_scale="layerscale")
    gammas = {k: v for k, v in scaled.state_dict().items() if k.endswith(("ls1.gamma", "ls2.gamma"))}
    assert "blocks.0.ls1.gamma" in gammas and "blocks.0.ls2.gamma" in gammas  # timm's names
    assert all(v.shape == (cfg.embed_dim,) and torch.all(v == 1e-5) for v in gammas.values())
    with torch.no_grad():
        for k in gammas:
            scaled.get_parameter(k).fill_(1.0)
    # the same draws built every other weight, so the model is the plain one with a gain of exactly 1
    assert torch.equal(_forward(scaled.eval(), cfg), want)


@pytest.mark.parametrize("kind", ["rezero", "skipinit"])
@pytest.mark.parametrize("block_cls", [Block, AdaLNBlock])
def test_a_zero_gain_silences_the_branch_and_still_trains(kind, block_cls):
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    if block_cls is Block:
        block = Block(16, 2, alpha_attn=0.9, alpha_mlp=0.8, zero_init=True, branch_scale=kind)
        assert block.attn.proj.weight.abs().sum() > 0  # the gain is the zero start: the layer is not zeroed too
        args = (x,)
    else:  # SiT's start: adaLN-Zero's Linear zeroed, then the gates opened for a zero-start gain
        block = AdaLNBlock(16, 2, alpha_attn=0.9, alpha_mlp=0.8, branch_scale=kind)
        torch.nn.init.zeros_(block.adaLN_modulation[-1].weight)
        torch.nn.init.zeros_(block.adaLN_modulation[-1].bias)
        block.open_gates()
        args = (x, torch.randn(2, 16))
    out = block(*args)
    assert torch.equal(out, x * 0.9 * 0.8)  # alpha_attn * alpha_mlp * x: the branches add exact zeros
    out.square().sum().backward()
    assert block.ls1.gamma.grad.abs().sum() > 0  # not a dead start: the gain gets a gradient
    keys = [k for k in block.state_dict() if "ls" in k]
    assert keys == (["ls1.gamma"] if kind == "rezero" else ["ls1.gamma", "ls2.gamma"])
    assert block.ls1.gamma.shape == (1,)


def test_rezero_is_one_gain_per_block_and_skipinit_one_per_add():
    torch.manual_seed(0)
    x = torch.randn(2, 5, 16)
    rezero = Block(16, 2, branch_scale="rezero")
    with torch.no_grad():
        rezero.ls1.gamma.fill_(0.5)
    f_attn = 0.5 * rezero.attn(rezero.norm1(x))
    y = x + f_attn
    assert torch.equal(rezero(x), y + 0.5 * rezero.mlp(rezero.norm2(y)))  # the MLP's add reads the same gain
    skip = Block(16, 2, branch_scale="skipinit")
    assert skip.ls1.gamma is not skip.ls2.gamma


def test_the_sit_family_opens_its_gates_only_for_a_zero_start_gain():
    for kind, gate in (("none", 0.0), ("layerscale", 0.0), ("rezero", 1.0), ("skipinit", 1.0)):
        model, cfg = _build("sit", branch_scale=kind)
        bias = model.blocks[0].adaLN_modulation[-1].bias.view(6, -1)
        assert torch.all(bias[[2, 5]] == gate) and torch.all(bias[[0, 1, 3, 4]] == 0)


def test_the_gain_acts_before_the_update_so_the_orthogonal_add_stays_orthogonal():
    torch.manual_seed(0)
    block = Block(16, 2, update="orthogonal", branch_scale="layerscale", layerscale_init=0.5)
    with torch.no_grad():
        block.ls1.gamma.uniform_(-2, 2)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    block = block.double()
    f = block.attn(block.norm1(x))
    added = residual_add(x, block.ls1(f), 1.0, 1.0, block.update_fn) - x  # u(x, gamma * f)
    assert (added * x).sum(-1).abs().max() < 1e-6  # orthogonal to x up to the update's eps
    after = block.ls1(block.update_fn(x, f))  # gamma * u(x, f), the gain after the update, would not be
    assert (after * x).sum(-1).abs().max() > 1e-2


def test_the_identity_drop_is_unbiased_in_training_and_absent_in_eval():
    torch.manual_seed(0)
    block = Block(8, 2, alpha_attn=0.9, alpha_mlp=0.8, drop_identity=0.2)
    torch.nn.init.zeros_(block.mlp.fc2.weight)  # the MLP adds nothing: out = k2 * 0.8 * (k1 * 0.9 * x + f(x))
    torch.nn.init.zeros_(block.mlp.fc2.bias)
    x = torch.randn(1, 3, 8).expand(20000, 3, 8)  # one sample, repeated: each copy draws its own keeps
    want = block.eval()(x[:1])
    torch.manual_seed(1)
    got = block.train()(x)
    dropped = (got == 0).all(-1).all(-1).float().mean()  # the MLP add's shortcut dropped, and its branch is 0
    assert 0.18 < dropped < 0.22  # p = 0.2 of the samples
    assert torch.allclose(got.mean(0), want[0], atol=0.05)  # E[keep / (1 - p)] = 1 for each shortcut
    assert torch.equal(block.eval()(x[:1]), want)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_drops_rise_linearly_with_depth_as_timm(family):
    model, cfg = _build(family, drop_branch=0.3, drop_identity=0.1)
    blocks = list(model.blocks)
    timm_dpr = [x.item() for x in torch.linspace(0, 0.3, len(blocks))]
    branch = [getattr(b.drop_path, "drop_prob", 0.0) for b in blocks]
    assert branch[0] == 0.0 and branch[-1] == 0.3 and branch == pytest.approx(timm_dpr)
    assert [b.drop_identity.p for b in blocks] == pytest.approx(depth_rates(0.1, len(blocks)))


def test_the_mae_decoder_takes_the_settings_only_with_decoder_decay():
    for decoder_decay in (False, True):
        torch.manual_seed(0)
        model = build_model(tiny_config("mae", branch_scale="layerscale", drop_identity=0.2, decoder_decay=decoder_decay))
        dec = model.decoder_blocks[-1]
        assert isinstance(dec.ls1, torch.nn.Identity) != decoder_decay
        assert dec.drop_identity.p == (0.2 if decoder_decay else 0.0)
        assert model.blocks[-1].drop_identity.p == 0.2 and model.blocks[-1].ls1.gamma.shape == (32,)


def test_a_classifier_keeps_the_encoders_gains_and_uses_its_own_drops():
    encoder = dataclasses.asdict(tiny_config("mae", branch_scale="layerscale", drop_identity=0.3, drop_branch=0.3))
    model = build_model(tiny_config("classifier", encoder=encoder, drop_path=0.1))
    assert "blocks.0.ls1.gamma" in model.state_dict()  # the pretrained gains load
    assert [b.drop_identity.p for b in model.blocks] == [0.0] * len(model.blocks)
    assert model.blocks[-1].drop_path.drop_prob == pytest.approx(0.1)


@pytest.mark.parametrize("preset", ["mae-tiny-digits", "sit-tiny-fmnist", "uvit-tiny-fmnist"])
@pytest.mark.parametrize("override, words", [
    ("model.drop_branch=1.0", "model.drop_branch must be a probability in [0, 1)"),
    ("model.drop_identity=-0.1", "model.drop_identity must be a probability in [0, 1)"),
    ("model.layerscale_init=0", "model.layerscale_init must be a positive finite number"),
    ("model.layerscale_init=.inf", "model.layerscale_init must be a positive finite number"),
    ("model.branch_scale=layerscal", "model.branch_scale 'layerscal' is unknown; choose one of none, rezero, layerscale"),
])
def test_bad_settings_are_one_line(preset, override, words):
    with pytest.raises(ConfigError) as err:
        load_config(preset, [override])
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_resnet_family_has_no_branch_settings():
    with pytest.raises(ConfigError, match=r"'model.branch_scale' is not a setting; valid model keys: alpha_min"):
        load_config("resnet18-fmnist", ["model.branch_scale=layerscale"])


def test_the_run_label_names_the_settings():
    cfg = tiny_config("mae", alpha_min=0.6, branch_scale="layerscale", drop_identity=0.1)
    assert describe_model(cfg) == "decay linear alpha_min 0.6 + layerscale 1e-05 + drop_identity 0.1, skips"
    cfg = tiny_config("sit", alpha_min=1.0, branch_scale="rezero", drop_branch=0.2)
    assert describe_model(cfg) == "plain + rezero + drop_branch 0.2, skips"
    assert describe_model(tiny_config("uvit", alpha_min=0.7)) == "decay linear alpha_min 0.7, skips"
    encoder = dataclasses.asdict(tiny_config("mae", alpha_min=0.6, branch_scale="skipinit", drop_identity=0.1))
    assert describe_model(tiny_config("classifier", encoder=encoder)) == "decay linear alpha_min 0.6 + skipinit"


def test_activation_checkpointing_recomputes_the_same_drops():
    torch.manual_seed(0)
    block = Block(16, 2, alpha_attn=0.9, drop_path=0.3, drop_identity=0.3, branch_scale="layerscale", layerscale_init=0.1)
    x = torch.randn(8, 5, 16, requires_grad=True)
    runs = []
    for checkpointing in (False, True):
        block.grad_checkpointing, x.grad = checkpointing, None
        block.zero_grad()
        torch.manual_seed(5)
        y = block(x)
        y.square().sum().backward()
        runs.append((y.detach(), x.grad.clone(), block.ls1.gamma.grad.clone()))
    assert all(torch.equal(a, b) for a, b in zip(*runs, strict=True))
