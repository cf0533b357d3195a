"""Residual updates (``nn.updates``): the orthogonal update's three scopes, the formulas that name an update
(``model.shortcut=orthogonal``), resdecay's blocks and models built with them, and where they are refused."""

from __future__ import annotations

import pytest
import torch

from resdecay import decayify
from resdecay.errors import ConfigError, RegistryError
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


def test_where_an_update_cannot_go_it_is_refused_in_one_line():
    import timm
    vit = timm.create_model("vit_tiny_patch16_224", img_size=32, patch_size=8, depth=2, num_classes=0)
    with pytest.raises(TypeError) as e:
        decayify(vit, alpha_min=0.6, shortcut="orthogonal")
    assert "\n" not in str(e.value) and "model.shortcut=orthogonal" in str(e.value)
    with pytest.raises(ConfigError) as e:
        shortcut_plan(2, 0.6, shortcut="orthogonal", adds_per_block=1)  # a ResNet's feature maps
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
