"""Activation checkpointing for resdecay's transformer blocks (timm's ``set_grad_checkpointing``)."""

from __future__ import annotations

import torch.nn as nn

from ..errors import ConfigError
from .blocks import Block
from .conditioning import AdaLNBlock


def set_grad_checkpointing(model: nn.Module, enable: bool = True) -> int:
    """Activation checkpointing (timm's ``set_grad_checkpointing``) on every ``Block`` / ``AdaLNBlock`` of
    ``model``: a block keeps only its input and recomputes its activations in the backward pass (about
    one more forward of compute for a block's activation memory). The recomputation replays the same
    dropout / drop-path draws (the RNG state is saved), so gradients equal those without it. Returns
    the number of blocks set; a model without such blocks is refused (the flag would do nothing)."""
    blocks = [m for m in model.modules() if isinstance(m, (Block, AdaLNBlock))]
    if not blocks:
        raise ConfigError(f"set_grad_checkpointing: {type(model).__name__} has no resdecay transformer blocks to "
                          "checkpoint; drop model.grad_checkpointing")
    for block in blocks:
        block.grad_checkpointing = bool(enable)
    return len(blocks)
