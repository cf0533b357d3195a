"""Network pieces every model family is built from: the residual add and the shortcut formula
registry (``residual``), the residual updates a formula may name (``updates``: the orthogonal update), the decayed pre-LN block and its parts (``blocks``), DiT's conditioning
pieces for the diffusion transformers (``conditioning``), and ``decayify`` for models people
already have."""

from .blocks import Attention, Block, Mlp, PatchEmbed, patchify, unpatchify
from .decayify import alphas_of, block_factors, decayify
from .residual import (
    decayed_add,
    factors_of,
    register_shortcut,
    residual_add,
    shortcut_factors,
    shortcut_names,
    shortcut_plan,
)
from .updates import register_update

__all__ = ["Attention", "Block", "Mlp", "PatchEmbed", "alphas_of", "block_factors", "decayed_add", "decayify", "factors_of", "patchify",
           "register_shortcut", "register_update", "residual_add", "shortcut_factors", "shortcut_names", "shortcut_plan", "unpatchify"]
