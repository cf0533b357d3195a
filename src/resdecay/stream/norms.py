"""Per-block norms of the residual stream: the per-layer profile's columns (``shortcut_attn``, ``branch_attn``,
``shortcut_mlp``, ``branch_mlp``, ``output``), read by the stream's own hooks for any model behind the model contract
(``blocks``, ``forward_intermediates``): resdecay's, or one trained elsewhere (``ForeignEncoder``). One path for both.

Each column is the mean over tokens (and images) of the per-token L2 norm, in float32: ``||alpha * x||`` of an add's
input scaled by the alpha its add uses (paper eq. 3), ``||g||`` of the branch as the block adds it (``beta * f(x)``,
with the adaLN-Zero gate where a block has one), and ``||x_{l+1}||`` of the block's output. A one-add block (a
ResNet's) fills the attention columns; adds beyond two are not columns of the profile.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from .record import Pass, hooked
from .runner import reading
from .sites import Site, sites_of

ROLES = ("attn", "mlp")  # the profile's columns, in the order a block runs its adds


def token_norm(t: torch.Tensor) -> float:
    """The mean per-token L2 norm of (B, T, D) tokens, in float32."""
    return float(t.detach().float().norm(dim=-1).mean())


class BlockNorms:
    """The ``on_pair`` reader of ``hooked``: one row per block of the profile's shortcut and branch columns."""

    def __init__(self, sites: list[Site]):
        self.sites = sites
        self.rows: list[dict] = [{} for _ in sites]

    def __call__(self, i: int, j: int, x: torch.Tensor, g: torch.Tensor) -> None:
        if j < len(ROLES):
            self.rows[i][f"shortcut_{ROLES[j]}"] = token_norm(x) * self.sites[i].subs[j].alpha
            self.rows[i][f"branch_{ROLES[j]}"] = token_norm(g)


@torch.no_grad()
def block_norms(model: nn.Module, images: torch.Tensor) -> list[dict]:
    """The profile's norm columns of each of ``model.blocks`` on ``images`` (one forward), in block order.

    Args:
        model: a model of the contract (``blocks``, ``forward_intermediates``).
        images: (B, C, H, W), on the model's device.
    """
    sites = sites_of(model, model.blocks)
    norms, rec = BlockNorms(sites), Pass()
    with reading(sites), hooked(sites, rec, on_pair=norms):
        model.forward_intermediates(images, [len(sites) - 1])
    for i, row in enumerate(norms.rows):
        row["output"] = token_norm(rec.outputs[i])
    return norms.rows
