"""A model trained elsewhere read through ``ForeignEncoder``: a feature map's positions become tokens in the layout
its block uses ((B, C, H, W) for a conv block, (B, H, W, C) for Swin), never channels and positions mixed."""

from __future__ import annotations

import pytest
import torch

from helpers.adapter_models import ROWS
from resdecay.stream.foreign import ForeignEncoder


@pytest.mark.parametrize("name, flatten", [
    ("timm swin (SwinTransformerBlock)", lambda t: t.flatten(1, 2)),  # channels last
    ("timm convnext (ConvNeXtBlock)", lambda t: t.flatten(2).transpose(1, 2)),  # channels first
])
def test_a_feature_map_is_read_as_tokens_in_its_block_s_layout(name, flatten):
    model, _ = ROWS[name][0]()
    encoder = ForeignEncoder(model, name, img_size=32, in_chans=3)
    x = torch.rand(2, 3, 32, 32, generator=torch.Generator().manual_seed(0))
    maps = []
    handle = encoder.blocks[0].register_forward_hook(lambda m, a, o: maps.append(o))
    with torch.no_grad():
        tokens = encoder.forward_intermediates(x, [0])[0]
    handle.remove()
    assert torch.equal(tokens, flatten(maps[0]))
    assert tokens.shape[-1] == (maps[0].shape[-1] if name.startswith("timm swin") else maps[0].shape[1])
