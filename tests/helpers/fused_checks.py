"""The fused add set against the correction hooks (tests/nn/test_fused_adds.py): one model decayified both ways,
the mechanism each decayed block got, and the relative difference of outputs and gradients."""

from __future__ import annotations

import copy

import torch

from helpers.adapter_checks import quiet_decayify
from resdecay import alphas_of
from resdecay.nn.adapters.fused import hooks_only, is_fused
from resdecay.nn.adapters.hooks import SLOT


def both_ways(model, **kw):
    """(hooks, fused): two decayified copies of ``model``, the first through the correction hooks only."""
    with hooks_only():
        hooked = quiet_decayify(copy.deepcopy(model), **kw)
    return hooked, quiet_decayify(copy.deepcopy(model), **kw)


def mechanisms(model) -> dict[str, str]:
    """name -> "fused" / "hooks" / "other" for every block with a decayed add."""
    out = {}
    for name, alphas in alphas_of(model):
        if all(a == 1.0 for a in alphas):
            continue
        block = model.get_submodule(name)
        hooked = any(SLOT in m.__dict__ for m in block.modules())
        out[name] = "fused" if is_fused(block) else "hooks" if hooked else "other"
    return out


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (float round-off of fp32 is about 1e-7)."""
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def output_and_grads(model, call) -> tuple[torch.Tensor, torch.Tensor]:
    """The output of ``call(model)`` and every parameter gradient of its mean square, flattened into one vector."""
    model.zero_grad(set_to_none=True)
    out = call(model)
    out.float().square().mean().backward()
    grads = [p.grad.flatten() for p in model.parameters() if p.grad is not None]
    return out.detach(), torch.cat(grads)
