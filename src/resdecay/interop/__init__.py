"""Interoperability with the checkpoints and tools researchers already have: decayified weights
that carry their alpha (weights.py), importing official MAE / the authors' U-Net MAE / timm ViT
weights (import_weights.py) and exporting a resdecay encoder as a decayified timm ViT
(export_timm.py)."""

from .export_timm import export_to_timm, load_exported
from .import_weights import import_weights
from .weights import load_decayified, load_weights, save_decayified

__all__ = ["export_to_timm", "import_weights", "load_decayified", "load_exported", "load_weights", "save_decayified"]
