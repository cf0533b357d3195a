"""The one residual add (resdecay.nn.residual): its three forms agree, the shortcut formula registry
reaches the blocks of every family, and every family accepts a formula or refuses it in one line."""

import copy
import dataclasses
import math

import pytest
import torch
import torch.nn as nn
from timm.models.vision_transformer import VisionTransformer

from resdecay import alpha_schedule, decayify, register_shortcut, residual_add
from resdecay.errors import ConfigError, RegistryError
from resdecay.models import FAMILIES, build_model, tiny_config
from resdecay.nn import residual
from resdecay.nn.blocks import Block, decayed_add
from resdecay.nn.conditioning import AdaLNBlock
from resdecay.nn.decayify import block_factors
from resdecay.nn.residual import (
    ShortcutScale,
    residual_correction,
    scale_branch,
    scale_identity,
    shortcut_names,
    shortcut_plan,
    unregister_shortcut,
)
from resdecay.train.config import load_config


def two_minus(depth, alpha_min, schedule, adds_per_block):
    """The guide's example formula: x * alpha + f * (2 - alpha)."""
    alphas = alpha_schedule(depth, alpha_min, schedule, adds_per_block=adds_per_block)
    return alphas, 2.0 - alphas


@pytest.fixture(autouse=True, scope="module")
def registered_two_minus():
    register_shortcut("two_minus")(two_minus)  # as a user's own file would
    yield
    unregister_shortcut("two_minus")


FORMULAS = sorted(set(shortcut_names()) | {"two_minus"})
# the package's own families (a plugin family registered by another test module is not ours to judge)
PACKAGE_FAMILIES = sorted(n for n, f in FAMILIES.items() if f.config.__module__.startswith("resdecay.models."))
BUILTIN = ("decay", "learnable", "scaled_sum", "scaled_branch")


# ----------------------------------------------------------------------------- the add and its forms
def test_residual_add_is_the_old_decayed_add_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    x, f = torch.randn(3, 5, 8, generator=g), torch.randn(3, 5, 8, generator=g)
    assert decayed_add is residual_add
    assert torch.equal(residual_add(x, f, 0.7), torch.add(f, x, alpha=0.7))
    assert torch.equal(residual_add(x, f, 1.0), x + f)
    a = torch.tensor(0.3)
    assert torch.equal(residual_add(x, f, a), f + a * x)
    h = math.sqrt(0.5)
    assert torch.equal(residual_add(x, f, h, h), torch.add(f * h, x, alpha=h))


@pytest.mark.parametrize("alpha,beta", [(0.7, 1.0), (1.0, 1.0), (1.0, math.sqrt(0.5)), (math.sqrt(0.5), math.sqrt(0.5)),
                                        (0.6, 1.4)])
def test_correction_and_scaled_paths_give_the_same_add(alpha, beta):
    g = torch.Generator().manual_seed(1)
    x, f = torch.randn(2, 7, 16, generator=g), torch.randn(2, 7, 16, generator=g)
    want = residual_add(x, f, alpha, beta)
    assert torch.allclose(x + residual_correction(x, f, alpha, beta), want, atol=1e-6)  # a timm block's own add
    assert torch.allclose(scale_branch(f, beta) + scale_identity(x, alpha), want, atol=1e-6)  # a ResNet block's
    assert torch.allclose(scale_branch(f, beta) + ShortcutScale(alpha)(x), want, atol=1e-6)
    if beta == 1.0:  # decayify's hook before issue 21, exactly
        assert torch.equal(residual_correction(x, f, alpha), f - (1.0 - alpha) * x)


# ----------------------------------------------------------------------------- the registry
def test_builtin_formulas_are_table_3():
    assert {"mae", "classifier", "resnet", "uvit", "sit"} <= set(PACKAGE_FAMILIES)
    h = math.sqrt(0.5)
    assert set(BUILTIN) <= set(shortcut_names())
    decay = shortcut_plan(4, 0.6)
    assert torch.equal(decay.alphas, alpha_schedule(4, 0.6)) and torch.all(decay.betas == 1) and not decay.learnable.any()
    learn = shortcut_plan(4, 0.6, shortcut="learnable")
    assert torch.all(learn.alphas == 1) and torch.all(learn.betas == 1) and learn.learnable.all()
    assert torch.all(shortcut_plan(4, 0.6, shortcut="scaled_sum").alphas == h)
    assert torch.all(shortcut_plan(4, 0.6, shortcut="scaled_sum").betas == h)
    assert torch.all(shortcut_plan(4, 0.6, shortcut="scaled_branch").alphas == 1)
    assert torch.all(shortcut_plan(4, 0.6, shortcut="scaled_branch").betas == h)
    for branches, col in (("attn", 0), ("mlp", 1)):  # the unnamed sub-block keeps the plain x + f, for every formula
        for name in FORMULAS:
            plan = shortcut_plan(5, 0.5, "cosine", branches, name)
            full = shortcut_plan(5, 0.5, "cosine", "both", name)
            other = 1 - col
            assert torch.equal(plan.alphas[:, col], full.alphas[:, col]) and torch.equal(plan.betas[:, col], full.betas[:, col])
            assert torch.all(plan.alphas[:, other] == 1) and torch.all(plan.betas[:, other] == 1)
            assert not plan.learnable[:, other].any()
        assert torch.equal(shortcut_plan(5, 0.5, "cosine", branches).alphas, alpha_schedule(5, 0.5, "cosine", branches))


@pytest.mark.parametrize("shortcut", FORMULAS)
def test_tables_stay_on_cpu_when_models_are_built_on_meta(shortcut):
    with torch.device("meta"):  # how parameter counts and shape checks build ViT-L / SiT-XL
        plan = shortcut_plan(6, 0.6, "linear", "mlp", shortcut)
        kwargs = plan.block_kwargs()
    assert {t.device.type for t in (plan.alphas, plan.betas, plan.learnable)} == {"cpu"} and len(kwargs) == 6


def test_registry_refuses_clashes_and_bad_tables():
    with pytest.raises(RegistryError, match="already registered by resdecay.nn.residual.decay"):
        register_shortcut("decay")(two_minus)
    register_shortcut("two_minus")(two_minus)  # the same function again is no clash
    register_shortcut("bad_shape")(lambda d, a, s, n: (torch.ones(d + 1, n), 1.0))
    try:
        with pytest.raises(ValueError, match=r"returned alphas of shape \(5, 2\); expected \(4, 2\)"):
            shortcut_plan(4, 0.6, shortcut="bad_shape")
    finally:
        unregister_shortcut("bad_shape")
    with pytest.raises(ConfigError, match="shortcut 'magic' is unknown; choose one of decay, learnable"):
        shortcut_plan(4, 0.6, shortcut="magic")


# ----------------------------------------------------------------------------- every formula x every family
def with_shortcut(cfg, shortcut: str, branches: str, **extra):
    """``cfg`` with model.shortcut / model.decay_branches set (a classifier's live in its encoder's config)."""
    names = {f.name for f in dataclasses.fields(cfg)}
    if "shortcut" in names:
        return dataclasses.replace(cfg, shortcut=shortcut, decay_branches=branches, **extra)
    return dataclasses.replace(cfg, encoder={**cfg.encoder, "shortcut": shortcut, "decay_branches": branches, **extra})


def refuses(family: str, shortcut: str, branches: str) -> bool:
    """The combinations a family refuses: a ResNet has one add per block, holds fixed factors and adds feature maps
    (no token stream for a residual update)."""
    formula = residual.SHORTCUT_FORMULAS[shortcut]
    return family == "resnet" and (branches != "both" or formula.learnable or formula.update is not None)


def assert_blocks_carry(blocks, plan) -> None:
    assert len(blocks) == plan.alphas.shape[0]
    for i, blk in enumerate(blocks):
        alphas, betas = block_factors(blk)
        assert alphas == tuple(plan.alphas[i].tolist()) and betas == tuple(plan.betas[i].tolist()), i
        if isinstance(blk, (Block, AdaLNBlock)):
            trained = tuple(isinstance(a, nn.Parameter) for a in (blk.alpha_attn, blk.alpha_mlp))
            assert trained == tuple(plan.learnable[i].tolist()), i
            assert blk.update == plan.update, i  # the formula's residual update (orthogonal), or None


@pytest.mark.parametrize("branches", ["both", "attn"])
@pytest.mark.parametrize("shortcut", FORMULAS)
@pytest.mark.parametrize("family", PACKAGE_FAMILIES)
def test_every_family_takes_every_formula_or_refuses_in_one_line(family, shortcut, branches):
    torch.manual_seed(0)
    cfg = with_shortcut(tiny_config(family), shortcut, branches)
    if refuses(family, shortcut, branches):
        with pytest.raises(ConfigError) as err:
            cfg.validate()
        msg = str(err.value)
        assert "\n" not in msg and ("model.shortcut" in msg or "model.decay_branches" in msg) and "use " in msg
        with pytest.raises(ConfigError):
            build_model(cfg)
        return
    cfg.validate()
    model = build_model(cfg)
    adds = len(block_factors(model.blocks[0])[0])
    plan = shortcut_plan(len(model.blocks), cfg.alpha_min, cfg.schedule, branches, shortcut, adds)
    assert_blocks_carry(model.blocks, plan)
    assert torch.equal(torch.as_tensor(model.alphas, dtype=torch.float64), plan.alphas)


@pytest.mark.parametrize("shortcut", FORMULAS)
def test_mae_decoder_follows_the_formula_only_with_decoder_decay(shortcut):
    cfg = with_shortcut(tiny_config("mae"), shortcut, "both", alpha_min=0.5)
    plain = build_model(cfg)
    assert_blocks_carry(plain.decoder_blocks, shortcut_plan(cfg.decoder_depth, 1.0))  # MAE's x + f decoder
    decayed = build_model(dataclasses.replace(cfg, decoder_decay=True))
    assert_blocks_carry(decayed.decoder_blocks, shortcut_plan(cfg.decoder_depth, 0.5, cfg.schedule, "both", shortcut))


@pytest.mark.parametrize("family", ["mae", "uvit", "sit", "resnet"])
def test_a_formula_registered_by_the_user_is_a_valid_setting(family):
    preset = {"mae": "mae-tiny-digits", "uvit": "uvit-tiny-fmnist", "sit": "sit-tiny-fmnist", "resnet": "resnet18-fmnist"}[family]
    cfg = load_config(preset, ["model.shortcut=two_minus", "model.alpha_min=0.5"])
    assert cfg.model.shortcut == "two_minus"
    with pytest.raises(ConfigError, match=r"model.shortcut 'magic' is unknown; choose one of .*two_minus"):
        load_config(preset, ["model.shortcut=magic"])


def test_registered_formula_runs_through_every_block_kind():
    """x * alpha + f * (2 - alpha), computed by hand, equals what Block, AdaLNBlock, a decayified timm
    block and a decayified ResNet block compute."""
    torch.manual_seed(0)
    plan = shortcut_plan(1, 0.5, shortcut="two_minus")
    (a1, a2), (b1, b2) = plan.alphas[0].tolist(), plan.betas[0].tolist()
    x = torch.randn(2, 5, 16)
    blk = Block(16, 2, **plan.block_kwargs()[0])
    h = a1 * x + b1 * blk.attn(blk.norm1(x))
    assert torch.allclose(blk(x), a2 * h + b2 * blk.mlp(blk.norm2(h)), atol=1e-5)
    ada = AdaLNBlock(16, 2, **plan.block_kwargs()[0])
    nn.init.normal_(ada.adaLN_modulation[-1].weight, std=0.1)
    c = torch.randn(2, 16)
    sh1, sc1, g1, sh2, sc2, g2 = ada.adaLN_modulation(c).chunk(6, dim=1)
    mod = lambda t, sh, sc: t * (1 + sc.unsqueeze(1)) + sh.unsqueeze(1)  # noqa: E731
    h = a1 * x + b1 * g1.unsqueeze(1) * ada.attn(mod(ada.norm1(x), sh1, sc1))
    assert torch.allclose(ada(x, c), a2 * h + b2 * g2.unsqueeze(1) * ada.mlp(mod(ada.norm2(h), sh2, sc2)), atol=1e-5)

    vit = VisionTransformer(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=0).eval()
    ref = copy.deepcopy(vit)
    decayify(vit, 0.5, shortcut="two_minus")
    assert vit.resdecay_spec == {"alpha_min": 0.5, "schedule": "linear", "branches": "both", "shortcut": "two_minus"}
    vplan = shortcut_plan(2, 0.5, shortcut="two_minus")
    assert_blocks_carry(vit.blocks, vplan)
    (a1, a2), (b1, b2) = vplan.alphas[1].tolist(), vplan.betas[1].tolist()
    with torch.no_grad():
        r = ref.blocks[1]
        h = a1 * x + b1 * r.attn(r.norm1(x))
        assert torch.allclose(vit.blocks[1](x), a2 * h + b2 * r.mlp(r.norm2(h)), atol=1e-5)


def test_resnet_formula_scales_identity_and_branch():
    torch.manual_seed(0)
    model = build_model(with_shortcut(tiny_config("resnet"), "scaled_sum", "both")).eval()
    plan = shortcut_plan(len(model.blocks), 0.7, shortcut="scaled_sum", adds_per_block=1)
    assert_blocks_carry(model.blocks, plan)
    blk = model.blocks[1]  # stage 2: a downsample path
    x = torch.randn(2, 8, 8, 8)
    h = math.sqrt(0.5)
    with torch.no_grad():
        pre = blk.conv2(blk.relu(blk.bn1(blk.conv1(x))))
        branch = nn.BatchNorm2d.forward(blk.bn2, pre)  # the branch without the beta hook
        assert torch.equal(blk.bn2(pre), branch * h)  # the hook: beta * branch
        identity = blk.downsample[1](blk.downsample[0](x))  # the downsample path without the alpha hook
        assert torch.allclose(blk(x), torch.relu(h * branch + h * identity), atol=1e-5)
    again = decayify(model.net, 1.0)  # re-decayify replaces the settings: every hook is gone
    assert all(block_factors(b) == ((1.0,), (1.0,)) for b in model.blocks) and "shortcut" not in again.resdecay_spec


def test_decayify_refuses_a_learnable_formula_in_one_line():
    vit = VisionTransformer(img_size=16, patch_size=4, embed_dim=16, depth=1, num_heads=2, num_classes=0)
    with pytest.raises(ConfigError) as err:
        decayify(vit, 0.6, shortcut="learnable")
    assert "\n" not in str(err.value) and "shortcut=learnable trains alpha" in str(err.value) and "use one of decay" in str(err.value)


def test_decayified_spec_with_a_formula_saves_and_loads(tmp_path):
    from resdecay.interop import load_decayified, save_decayified

    torch.manual_seed(0)
    vit = decayify(VisionTransformer(img_size=16, patch_size=4, embed_dim=16, depth=2, num_heads=2, num_classes=0),
                   0.6, shortcut="scaled_branch")
    save_decayified(vit, tmp_path / "v.pt")
    fresh = load_decayified(tmp_path / "v.pt", VisionTransformer(img_size=16, patch_size=4, embed_dim=16, depth=2,
                                                                  num_heads=2, num_classes=0))
    assert fresh.resdecay_spec["shortcut"] == "scaled_branch"
    assert [block_factors(b) for b in fresh.blocks] == [block_factors(b) for b in vit.blocks]
