"""Residual updates (``nn.updates``): the orthogonal update's three scopes, the formulas that name an update
(``model.shortcut=orthogonal``), resdecay's blocks and models built with them, and where they are refused."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from resdecay import decayify
from resdecay.errors import ConfigError, RegistryError, UserError
from resdecay.eval.diagnostics import diagnose
from resdecay.models.mae import TINY_MAE, MAEConfig, MaskedAutoencoder
from resdecay.nn.blocks import Block
from resdecay.nn.residual import register_shortcut, residual_add, shortcut_plan, unregister_shortcut
from resdecay.nn.updates import EPS, orthogonal, orthogonal_global, orthogonal_tokens, register_update

G = torch.Generator().manual_seed(0)


def _pair(shape=(3, 7, 16), dtype=torch.float64):
    return torch.randn(*shape, generator=G, dtype=dtype), torch.randn(*shape, generator=G, dtype=dtype)


@pytest.mark.parametrize("update, dims", [(orthogonal, (-1,)), (orthogonal_global, (1, 2)), (orthogonal_tokens, (1,))])
def test_the_update_is_f_minus_its_projection_on_x_in_its_scope(update, dims):
    x, f = _pair()
    u = update(x, f)
    coef = (x * f).sum(dims, keepdim=True) / ((x * x).sum(dims, keepdim=True) + EPS)
    assert torch.allclose(u, f - coef * x, rtol=0, atol=1e-12)
    dot, norm2 = (x * f).sum(dims), (x * x).sum(dims)
    # orthogonal to x in that scope up to eps: <u, x> = <x, f> * eps / (||x||^2 + eps)
    assert torch.allclose((u * x).sum(dims), dot * EPS / (norm2 + EPS), rtol=1e-6, atol=1e-12)


def test_residual_add_applies_the_update_before_the_factors():
    x, f = _pair()
    want = 0.7 * x + 0.5 * orthogonal(x, f)
    assert torch.allclose(residual_add(x, f, 0.7, 0.5, orthogonal), want, rtol=0, atol=1e-12)
    assert torch.equal(residual_add(x, f, 1.0), x + f)  # no update: the plain add, bit for bit


def test_a_block_with_the_orthogonal_formula_adds_the_orthogonal_part_by_hand():
    torch.manual_seed(0)
    plan = shortcut_plan(3, 0.6, shortcut="orthogonal_decay")
    assert plan.update == "orthogonal" and plan.alphas.tolist() == shortcut_plan(3, 0.6).alphas.tolist()
    blk = Block(16, 2, **plan.block_kwargs()[2]).eval()
    (a1, a2) = plan.alphas[2].tolist()
    x = torch.randn(2, 5, 16)
    with torch.no_grad():
        h = a1 * x + orthogonal(x, blk.attn(blk.norm1(x)))
        want = a2 * h + orthogonal(h, blk.mlp(blk.norm2(h)))
        assert torch.allclose(blk(x), want, atol=1e-6)
    assert "update=orthogonal" in repr(blk)


def test_an_mae_with_the_orthogonal_update_is_read_by_the_diagnostics():
    """The tap reads the branch actually added: the decomposition still rebuilds the stream, and every add's branch
    is orthogonal to its (scaled) shortcut, token by token."""
    torch.manual_seed(0)
    model = MaskedAutoencoder(MAEConfig(**{**TINY_MAE, "shortcut": "orthogonal"})).eval()
    assert all(b.update == "orthogonal" for b in model.blocks)
    x = torch.rand(6, 3, 16, 16)
    report = diagnose(model, x, which=("paths", "branches"))
    assert max(report["paths"]["reconstruction_error"]) < 1e-5
    assert max(abs(c) for c in report["branches"]["cosine"]) < 1e-3


def _tiny_timm_vit():
    import timm
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=3, num_classes=0).eval()


def _orthogonal_by_hand(vit, x: torch.Tensor, alphas) -> torch.Tensor:
    """timm's ViT forward with each add written out as ``alpha * x + u(x, f)`` (the orthogonal update)."""
    h = vit.norm_pre(vit._pos_embed(vit.patch_embed(x)))
    for b, (a1, a2) in zip(vit.blocks, alphas, strict=True):
        h = a1 * h + orthogonal(h, b.drop_path1(b.ls1(b.attn(b.norm1(h)))))
        h = a2 * h + orthogonal(h, b.drop_path2(b.ls2(b.mlp(b.norm2(h)))))
    return vit.norm(h)


@pytest.mark.parametrize("mechanism", ["fused", "hooks"])
@pytest.mark.parametrize("shortcut", ["orthogonal", "orthogonal_decay"])
def test_decayify_carries_the_update_into_a_timm_vit(mechanism, shortcut):
    """Both mechanisms that reach a timm ViT's adds (the fused add, the correction hooks) add u(x, f): equal to the
    block written out by hand, and recorded in the spec so that a reload applies it again."""
    from resdecay.nn import alphas_of
    from resdecay.nn.adapters.fused import hooks_only, is_fused

    vit, x = _tiny_timm_vit(), torch.rand(2, 3, 32, 32)
    with torch.no_grad():
        plain = vit.forward_features(x)
    if mechanism == "hooks":
        with hooks_only():
            decayify(vit, alpha_min=0.6, shortcut=shortcut)
    else:
        decayify(vit, alpha_min=0.6, shortcut=shortcut)
    assert is_fused(vit.blocks[0]) == (mechanism == "fused")
    alphas = [a for _, a in alphas_of(vit)]
    assert (alphas[-1][-1] == 1.0) == (shortcut == "orthogonal")
    with torch.no_grad():
        got, want = vit.forward_features(x), _orthogonal_by_hand(vit, x, alphas)
    assert (got - want).abs().max() < 1e-5 and (got - plain).abs().max() > 1e-2
    assert vit.resdecay_spec["shortcut"] == shortcut
    decayify(vit, alpha_min=1.0)  # a second call replaces the settings: the plain model again
    with torch.no_grad():
        assert torch.equal(vit.forward_features(x), plain)


@pytest.mark.parametrize("mechanism", ["fused", "hooks"])
def test_the_diagnostics_read_the_updated_branch_of_a_decayified_timm_vit(mechanism):
    """Where the adds are read at the branch's last module (hooks and fused blocks alike), the branch read is u(x, f):
    orthogonal to its shortcut token by token, and the decomposition still rebuilds the stream."""
    from resdecay.nn.adapters.fused import hooks_only

    vit = _tiny_timm_vit()
    if mechanism == "hooks":
        with hooks_only():
            decayify(vit, alpha_min=1.0, shortcut="orthogonal")
    else:
        decayify(vit, alpha_min=1.0, shortcut="orthogonal")
    report = diagnose(vit, torch.rand(6, 3, 32, 32), which=("paths", "branches"))
    assert max(report["paths"]["reconstruction_error"]) < 1e-4
    assert max(abs(c) for c in report["branches"]["cosine"]) < 1e-3


def test_the_traced_adapter_carries_the_update_and_a_feature_map_is_refused_at_its_first_add():
    """A user's block that only tracing reaches (its branch gated inline: a replaced forward) adds u(x, f) as written
    by hand; a feature-map stream (PoolFormer's (B, C, H, W)) is refused in one line, not projected over a wrong axis."""
    from helpers.traced_blocks import MODELS, GatedBlock, jitter, quiet

    torch.manual_seed(0)
    stack = nn.Sequential(*[GatedBlock() for _ in range(3)]).eval()
    x = torch.randn(3, 5, 8)
    with torch.no_grad():
        h = x
        for b in stack:
            h = 0.5 * h + orthogonal(h, torch.sigmoid(b.gate(h)) * b.f(b.norm(h)))  # eval: no dropout
        quiet(decayify, stack, alpha_min=0.5, schedule="constant", shortcut="orthogonal_decay")
        assert (stack(x) - h).abs().max() < 1e-6
    pool = jitter(MODELS["timm poolformer (MetaFormerBlock)"][0]())
    quiet(decayify, pool, alpha_min=1.0, shortcut="orthogonal")
    with pytest.raises(UserError) as e:
        pool(torch.rand(2, 3, 32, 32))
    assert "\n" not in str(e.value) and "(B, T, D) token streams" in str(e.value)


def test_where_an_update_cannot_go_it_is_refused_in_one_line():
    from helpers.adapter_models import diffusers_dit

    dit, _ = diffusers_dit()  # adaLN-Zero blocks: a replaced forward adds the branch as it is
    with pytest.raises(TypeError) as e:
        decayify(dit, alpha_min=0.6, shortcut="orthogonal")
    assert "\n" not in str(e.value) and "BasicTransformerBlock" in str(e.value) and "replaced forward" in str(e.value)
    assert not hasattr(dit, "resdecay_spec")
    from resdecay.models.resnet import ResNetConfig
    with pytest.raises(ConfigError) as e:
        ResNetConfig(shortcut="orthogonal").validate()  # a ResNet's feature maps, refused before anything is built
    assert "\n" not in str(e.value) and "feature maps" in str(e.value)


def test_updates_register_as_every_registry_does():
    with pytest.raises(RegistryError):
        register_update("orthogonal")(lambda x, f: f)
    with pytest.raises(ConfigError) as e:
        register_shortcut("mine", update="no_such_update")
    assert "orthogonal" in str(e.value)
    register_shortcut("ortho_half", update="orthogonal")(lambda depth, alpha_min, schedule, adds: (1.0, 0.5))
    try:
        assert shortcut_plan(2, 1.0, shortcut="ortho_half").block_kwargs()[0]["update"] == "orthogonal"
    finally:
        unregister_shortcut("ortho_half")
