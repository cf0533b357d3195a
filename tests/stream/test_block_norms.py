"""The per-layer profile's norm columns (``stream.norms.block_norms``), one path for every model: read where each add
is, with the factors the add uses."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from resdecay.nn.blocks import Block
from resdecay.nn.conditioning import AdaLNBlock
from resdecay.nn.residual import factors_of, residual_add, shortcut_plan
from resdecay.stream.norms import block_norms


class Stack(nn.Module):
    """The model contract's two members the norms read: ``blocks`` and ``forward_intermediates``."""

    def __init__(self, *blocks, c=None):
        super().__init__()
        self.blocks, self.c = nn.ModuleList(blocks), c

    def forward_intermediates(self, x, indices):
        outs = []
        for blk in self.blocks:
            x = blk(x) if self.c is None else blk(x, self.c)
            outs.append(x)
        return [outs[i] for i in indices]


def norm(t):
    return float(t.float().norm(dim=-1).mean())


def test_block_norms_read_the_factors_the_add_uses():
    torch.manual_seed(0)
    plan = shortcut_plan(1, 0.5, shortcut="scaled_sum")  # beta != 1: the branch column is beta * f(x)
    blk = Block(16, 2, **{**plan.block_kwargs()[0], "learnable_alpha": (True, False)}).eval()
    with torch.no_grad():
        blk.alpha_attn.fill_(0.3)  # a trained alpha is read at its current value
    x = torch.randn(2, 5, 16)
    (a1, a2), (b1, b2) = factors_of(blk)
    assert (a1, a2, b1, b2) == (pytest.approx(0.3), plan.alphas[0, 1].item(), plan.betas[0, 0].item(),
                                plan.betas[0, 1].item())
    row = block_norms(Stack(blk), x)[0]
    with torch.no_grad():
        f1 = blk.attn(blk.norm1(x))
        h = residual_add(x, f1, blk.alpha_attn, b1)
        f2 = blk.mlp(blk.norm2(h))
        out = blk(x)
    assert row["shortcut_attn"] == pytest.approx(norm(x) * a1) and row["branch_attn"] == pytest.approx(norm(f1) * b1)
    assert row["shortcut_mlp"] == pytest.approx(norm(h) * a2) and row["branch_mlp"] == pytest.approx(norm(f2) * b2)
    assert row["output"] == pytest.approx(norm(out))
    assert list(row) == ["shortcut_attn", "branch_attn", "shortcut_mlp", "branch_mlp", "output"]


def test_an_adaln_block_s_branch_is_the_gated_one_its_add_adds():
    """adaLN-Zero: x + gate * f(x); the profile's branch is gate * f(x), as the diagnostics' branch norms."""
    torch.manual_seed(0)
    blk = AdaLNBlock(16, 2).eval()
    with torch.no_grad():
        for p in blk.parameters():
            p.add_(0.1 * torch.randn(p.shape))
    x, c = torch.randn(2, 5, 16), torch.randn(2, 16)
    row = block_norms(Stack(blk, c=c), x)[0]
    with torch.no_grad():
        shift, scale, gate = blk.adaLN_modulation(c).chunk(6, dim=1)[:3]
        f = blk.attn(blk.norm1(x) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1))
    assert row["branch_attn"] == pytest.approx(norm(gate.unsqueeze(1) * f), rel=1e-5)
