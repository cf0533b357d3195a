"""resdecay's own ``Block``: its forward already is ``residual_add``; the adapter sets its factors. It is
tried before the libraries' adapters (priority 10 against their 0): a user's subclass of ``Block`` is taken
by it unless the user's own adapter has a higher priority."""

from __future__ import annotations

from ..blocks import Block
from ..residual import factors_of, set_block_factors
from .registry import AT_RESIDUAL_ADD, BlockAdapter, register_adapter

register_adapter(BlockAdapter(
    "resdecay.nn.blocks.Block", (Block,), 2,
    install=lambda block, a, b, update=None: set_block_factors(block, *a, *b, update=update), factors=factors_of,
    zero_init=lambda block: block.zero_init_branches(), priority=10,
    reads=lambda block: [AT_RESIDUAL_ADD] * 2, updates=lambda block: (block.update,) * 2))
