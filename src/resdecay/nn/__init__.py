"""Network pieces every model family is built from: the decayed pre-LN block and its parts
(``blocks``), DiT's conditioning pieces for the diffusion transformers (``conditioning``), and
``decayify`` for models people already have."""

from .blocks import Attention, Block, Mlp, PatchEmbed, decayed_add, patchify, unpatchify
from .decayify import alphas_of, decayify

__all__ = ["Attention", "Block", "Mlp", "PatchEmbed", "alphas_of", "decayed_add", "decayify", "patchify", "unpatchify"]
