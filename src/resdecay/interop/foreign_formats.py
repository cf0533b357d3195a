"""The four foreign sources of pretrained weights built in, as entries of the import-format registry
(``train/import_formats.py``; resdecay's own checkpoint is the first entry, ``train/checkpoint.py``'s). Registered
when ``resdecay.interop`` is imported; ``import-weights --format``, ``finetune --from`` and ``pretrain --from``
take them, and a plugin's entry, alike.

    mae       an official facebookresearch/mae pretraining checkpoint (``{'model': state_dict}``)
              -> resdecay's plain MAE (alpha 1, no skips, final encoder norm). Its key names are
              resdecay's (``blocks.i.attn.qkv``, ``mask_token``, ``decoder_*``): nothing is renamed.
    unet-mae  the authors' U-Net MAE: ``skip.{i}.fc.0`` / ``skip.{i}.fc.2`` / ``skip.{i}.mask_token``
              become ``skip_fusions.{i}.fc1`` / ``fc2`` / ``mask_token``; the rest is resdecay's.
              alpha_min is the ``args.min_decay`` their training script saves; ``--alpha-min``
              is needed only for a file that carries no ``args``. Their schedule is linear.
    timm-vit  a timm VisionTransformer state_dict (or ``save_decayified`` output, whose spec is used)
              -> a classifier checkpoint when it has a head, else an MAE checkpoint whose decoder
              is newly initialised (the encoder is what eval and finetune use). LayerScale gammas
              are folded into the branch's last Linear. A state_dict does not say how timm pools:
              ``fc_norm.*`` means ``global_pool='avg'`` (resdecay ``patch_mean``), a head without it
              timm's default ``'token'`` (resdecay ``cls``, the final norm becoming the head's).
    hf-vitmae a Hugging Face ``ViTMAEForPreTraining`` folder (config.json + model.safetensors or
              pytorch_model.bin), or its weights file beside its config.json -> the plain MAE; sizes,
              heads, mask ratio and norm_pix_loss from config.json, alpha 1 unless a resdecay export
              recorded its decay there (``hf_vitmae.py`` holds the key mapping).

Detection: ViT weights (``blocks.0.*``) with the authors' ``skip.*`` are unet-mae, with ``decoder_*`` and no
``skip.*`` mae, with neither timm-vit; a folder (or its weights file) whose config.json says ``vit_mae`` is
hf-vitmae. The weights of the first three are ``foreign_vit.py``'s and what their files state ``file_meta.py``'s;
hf-vitmae's both ``hf_vitmae.py``'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from ..train.import_formats import ConvertedWeights, ImportFormat, SourceFile, register_import_format
from .checkpoint_io import state_dict_of
from .file_meta import stated_by_file
from .files import read_json_object
from .foreign_vit import check_fusions, model_fields
from .hf_vitmae import WEIGHT_FILES, import_fields


def vit_weights(name: str) -> Callable[[SourceFile], ConvertedWeights]:
    """``convert`` of the ViT state_dict files (``mae``, ``unet-mae``, ``timm-vit``): their weights under
    resdecay's names and what the file states beside them."""

    def convert(source: SourceFile) -> ConvertedWeights:
        # a folder has no contents: its reader refuses it, naming the weights files inside to pass instead
        blob = source.read(source.path) if source.contents is None else source.contents
        state = state_dict_of(blob, source.given)
        fields, weights, head = model_fields(name, state, source.given)
        decoder = (fields["decoder_embed_dim"], fields["decoder_depth"]) if "decoder_embed_dim" in fields else None
        return ConvertedWeights(fields, weights, stated_by_file(name, blob, decoder, source.given), head)

    return convert


def is_unet_mae(source: SourceFile) -> bool:
    return source.has("blocks.0.") and source.has("skip.")


def is_official_mae(source: SourceFile) -> bool:
    return source.has("blocks.0.") and source.has("decoder_") and not source.has("skip.")


def is_timm_vit(source: SourceFile) -> bool:
    return source.has("blocks.0.") and not source.has("decoder_") and not source.has("skip.")


def _says_vit_mae(folder: Path) -> bool:
    config = folder / "config.json"
    return config.is_file() and read_json_object(config, "JSON config", "pass a ViTMAE save_pretrained folder").get(
        "model_type") == "vit_mae"


def is_vitmae_folder(source: SourceFile) -> bool:
    """A transformers ViTMAE folder, or its weights file beside its config.json (nothing is read but config.json)."""
    if source.path.is_dir():
        return _says_vit_mae(source.path)
    return source.path.name in WEIGHT_FILES and _says_vit_mae(source.path.parent)


def convert_vitmae(source: SourceFile) -> ConvertedWeights:
    fields, weights, stated = import_fields(source.path)
    folder = source.path
    weights_file = next((folder / n for n in WEIGHT_FILES if (folder / n).is_file()), None) if folder.is_dir() else folder
    return ConvertedWeights(fields, weights, stated, weights_file=weights_file)


register_import_format(ImportFormat("mae", "facebookresearch/mae", is_official_mae, vit_weights("mae"),
                                    unstated_alpha="plain"))
register_import_format(ImportFormat(
    "unet-mae", "U-Net MAE (the authors' layout)", is_unet_mae, vit_weights("unet-mae"), unstated_alpha="ask",
    alpha_source="args.min_decay (the authors' training script saves it in 'args'; this file has none)",
    model_defaults={"schedule": "linear", "decay_branches": "both", "decoder_decay": False}, check=check_fusions))
register_import_format(ImportFormat("timm-vit", "timm ViT", is_timm_vit, vit_weights("timm-vit"), has_decoder=False,
                                    alpha_source="resdecay_spec"))
# a plain ViTMAE's config.json states alpha 1 (import_fields), a resdecay export its decay: never unstated
register_import_format(ImportFormat("hf-vitmae", "Hugging Face ViTMAE", is_vitmae_folder, convert_vitmae,
                                    unstated_alpha="plain"))
