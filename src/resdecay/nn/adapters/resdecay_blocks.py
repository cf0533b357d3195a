"""resdecay's own ``Block``: its forward already is ``residual_add``; the adapter sets its factors."""

from __future__ import annotations

from ..blocks import Block
from ..residual import factors_of, set_block_factors
from .registry import BlockAdapter, register_adapter

register_adapter(BlockAdapter(
    "resdecay.nn.blocks.Block", (Block,), 2,
    install=lambda block, a, b: set_block_factors(block, *a, *b), factors=factors_of,
    zero_init=lambda block: block.zero_init_branches()))
