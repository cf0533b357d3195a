"""A source of pretrained weights of your own: your lab's MAE script saved the model it trained inside
DistributedDataParallel (every key starts with ``module.``) as ``{"net": state_dict, "decay": alpha_min, ...}``.
Registered, such a file is detected by ``finetune --from`` and ``pretrain --from`` and converted by
``import-weights --format lab-mae``, as the official MAE's is.
"""

from __future__ import annotations

from resdecay.interop import ConvertedWeights, ImportFormat, SourceFile, register_import_format
from resdecay.interop.foreign_vit import infer_decoder, infer_encoder


def is_lab_checkpoint(source: SourceFile) -> bool:
    """A file holding the lab script's two keys (``contents`` is None for a folder)."""
    blob = source.contents
    return isinstance(blob, dict) and isinstance(blob.get("net"), dict) and "decay" in blob


def convert_lab_checkpoint(source: SourceFile) -> ConvertedWeights:
    """resdecay's names (DDP's ``module.`` taken off), the sizes the weights fix, the decay the file states."""
    blob = source.contents
    weights = {k.removeprefix("module."): v for k, v in blob["net"].items()}
    sizes = {**infer_encoder(weights, source.given), **infer_decoder(weights, source.given)}
    return ConvertedWeights(
        fields={**sizes, "skips": False, "encoder_norm": "norm.weight" in weights},
        weights=weights,
        stated={"alpha_min": (float(blob["decay"]), "its 'decay'")},  # wins over the preset; a contrary flag is refused
    )


register_import_format(ImportFormat("lab-mae", "lab MAE (DDP-wrapped, with its decay)", is_lab_checkpoint,
                                    convert_lab_checkpoint), replace=True)
