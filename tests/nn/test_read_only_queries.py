"""Issue 51 item 1: read-only queries (``alphas_of``, ``residual_blocks``) change nothing on the model; ``decayify``,
which changes it anyway, keeps what it traced on the blocks."""

from __future__ import annotations

import copy

import torch.nn as nn

from helpers.traced_blocks import GatedBlock
from resdecay import alphas_of, decayify
from resdecay.nn.decayify import residual_blocks


def test_read_only_queries_change_nothing_on_the_model(monkeypatch):
    """``alphas_of`` / ``residual_blocks`` on a model whose blocks only the traced adapter reaches keep what they traced
    beside the model, not on it (no attribute appears on any module), and trace each block once; ``decayify`` then
    keeps it on the blocks, so that a copy of the decayified model carries it."""
    from resdecay.nn.adapters import traced as traced_module

    model = nn.Sequential(GatedBlock(), GatedBlock())
    before = [dict(m.__dict__) for m in model.modules()]
    calls = []
    real = traced_module.traced_adapter
    monkeypatch.setattr(traced_module, "traced_adapter", lambda m: calls.append(m) or real(m))
    assert [a for _, a in alphas_of(model)] == [(1.0,), (1.0,)] and len(residual_blocks(model)) == 2
    assert [set(m.__dict__) for m in model.modules()] == [set(b) for b in before]  # nothing kept on the model
    assert len(calls) == 2  # each block traced once, the second query read the first's
    decayify(model, alpha_min=0.5)
    assert all("_resdecay_adapter" in b.__dict__ for b in model)
    assert [a for _, a in alphas_of(copy.deepcopy(model))] == [a for _, a in alphas_of(model)]
