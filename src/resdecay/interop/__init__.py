"""Interoperability with the checkpoints and tools researchers already have: decayified weights
that carry their alpha (weights.py), importing official MAE / the authors' U-Net MAE / timm ViT /
Hugging Face ViTMAE weights, or a plugin's source, through the import-format registry (import_weights.py;
the built-in foreign formats: foreign_formats.py; the registry: ``resdecay.train.import_formats``), exporting
a resdecay encoder as a decayified timm ViT (export_timm.py), and sharing a model as a huggingface_hub-style
folder with a model card (pretrained.py: save_pretrained / from_pretrained / push_to_hub), and ``restore``:
what resdecay did to a transformers / diffusers model, recorded in its own config, re-done after the
library's from_pretrained (hf_unet.py; the record itself: nn/config_record.py).

The formats stand side by side: each imports only the shared checkpoint I/O (checkpoint_io.py:
readers, strict loading, export metadata, save_pretrained folders, the model an export reads; files.py;
pretrained_config.py), never another format; import_weights.py converts whatever ``--format`` names."""

from ..train.import_formats import (
    IMPORT_FORMATS,
    ConvertedWeights,
    ImportFormat,
    SourceFile,
    register_import_format,
    unregister_import_format,
)
from . import foreign_formats  # noqa: F401  (registers mae, unet-mae, timm-vit and hf-vitmae, after resdecay's own)
from .export_timm import export_to_timm, load_exported
from .hf_unet import restore
from .import_weights import import_weights
from .pretrained import export_to_hf, from_pretrained, push_to_hub, save_pretrained
from .weights import load_decayified, load_weights, save_decayified

__all__ = ["IMPORT_FORMATS", "ConvertedWeights", "ImportFormat", "SourceFile", "export_to_hf", "export_to_timm",
           "from_pretrained", "import_weights", "load_decayified", "load_exported", "load_weights", "push_to_hub",
           "register_import_format", "restore", "save_decayified", "save_pretrained", "unregister_import_format"]
