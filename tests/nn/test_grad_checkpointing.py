"""Activation checkpointing (model.grad_checkpointing / set_grad_checkpointing) in every transformer family:
the loss and every gradient equal the run without it, with stochastic depth and dropout draws replayed,
under torch.compile too; a resumed run may switch it; a family without transformer blocks refuses it."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from resdecay.errors import ConfigError
from resdecay.models import build_model, tiny_config
from resdecay.models.registry import get_family
from resdecay.nn.blocks import Block
from resdecay.nn.checkpointing import set_grad_checkpointing
from resdecay.nn.conditioning import AdaLNBlock
from resdecay.train.checkpoint import model_differences

FAMILIES = ["mae", "sit", "uvit", "classifier"]


def loss_and_grads(family: str, checkpointed: bool, compiled: bool = False):
    spec = get_family(family)
    cfg = tiny_config(family)
    if family == "classifier":
        cfg = dataclasses.replace(cfg, drop_path=0.3)  # random stochastic depth: the replay must draw the same
    cfg = dataclasses.replace(cfg, grad_checkpointing=checkpointed)
    torch.manual_seed(0)
    model = build_model(cfg).train()
    blocks = [m for m in model.modules() if isinstance(m, (Block, AdaLNBlock))]
    assert blocks and all(b.grad_checkpointing == checkpointed for b in blocks)
    batch = spec.example_batch(model, 3)
    run = torch.compile(model, backend="aot_eager") if compiled else model  # traced as compile traces, no codegen
    torch.manual_seed(1)  # masks, noise times and drop-path draws
    loss = spec.objective(run, batch.images, batch.labels)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("family", FAMILIES)
def test_gradients_equal_the_run_without_checkpointing(family):
    loss_a, grads_a = loss_and_grads(family, False)
    loss_b, grads_b = loss_and_grads(family, True)
    assert torch.equal(loss_a, loss_b) and grads_a.keys() == grads_b.keys()
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], rtol=1e-5, atol=1e-7), name


def test_under_torch_compile():
    loss_a, grads_a = loss_and_grads("mae", False)
    loss_b, grads_b = loss_and_grads("mae", True, compiled=True)
    assert torch.allclose(loss_a, loss_b, rtol=1e-5)
    assert all(torch.allclose(grads_a[n], grads_b[n], rtol=1e-4, atol=1e-6) for n in grads_a)


def test_the_timm_style_method_and_the_refusals():
    model = build_model(tiny_config("mae"))
    model.set_grad_checkpointing()
    assert all(b.grad_checkpointing for b in model.blocks)
    model.set_grad_checkpointing(False)
    assert not any(b.grad_checkpointing for b in model.blocks)
    with pytest.raises(ConfigError, match="no resdecay transformer blocks to checkpoint"):
        set_grad_checkpointing(torch.nn.Linear(2, 2))
    saved = dataclasses.asdict(tiny_config("mae"))
    assert model_differences(saved, {**saved, "grad_checkpointing": True}) == []  # a resume may switch it
