"""The ViT state_dicts ``import-weights`` reads as files (``--format mae``, ``unet-mae``, ``timm-vit``):
the model fields their weights fix, and the weights under resdecay's names (see ``import_weights.py``
for the formats; what these files state beside their weights is ``file_meta.py``'s).

    mae       facebookresearch/mae's names are resdecay's: nothing is renamed
    unet-mae  the authors' ``skip.{i}.fc.0`` / ``fc.2`` / ``mask_token`` become ``skip_fusions.{i}.fc1`` /
              ``fc2`` / ``mask_token``
    timm-vit  LayerScale gammas folded into the branch's last Linear; a head (``head.*`` with
              ``fc_norm.*`` or the final ``norm.*``) becomes a classifier's
"""

from __future__ import annotations

import math
import re

import torch

from ..errors import CheckpointError, UserError
from ..models.mae import choose_skip_sources
from .checkpoint_io import fold_branch_gains


def _count(state: dict, prefix: str) -> int:
    """Number of blocks ``prefix.{i}.`` in a state_dict (indices must run 0..n-1)."""
    found = {int(m.group(1)) for k in state if (m := re.match(rf"{re.escape(prefix)}\.(\d+)\.", k))}
    if found and found != set(range(len(found))):
        raise CheckpointError(f"{prefix}.* indices {sorted(found)} are not 0..{len(found) - 1}")
    return len(found)


def _need(state: dict, key: str, source: str) -> torch.Tensor:
    if key not in state:
        raise CheckpointError(f"{source} has no {key!r}; is it a ViT checkpoint of the format given with --format?")
    return state[key]


def infer_encoder(state: dict, source: str) -> dict:
    """Encoder dimensions from ViT weights: img_size, patch_size, in_chans, embed_dim, depth, mlp_ratio."""
    proj = _need(state, "patch_embed.proj.weight", source)  # (D, C, p, p)
    D, C, p = int(proj.shape[0]), int(proj.shape[1]), int(proj.shape[2])
    n = int(_need(state, "pos_embed", source).shape[1]) - 1  # one cls slot
    grid = math.isqrt(n)
    if grid * grid != n:
        raise CheckpointError(f"{source}: pos_embed has {n} patch positions, not a square grid; only square images are supported")
    depth = _count(state, "blocks")
    if depth == 0:
        raise CheckpointError(f"{source} has no blocks.0.* weights")
    hidden = int(_need(state, "blocks.0.mlp.fc1.weight", source).shape[0])
    return {"img_size": grid * p, "patch_size": p, "in_chans": C, "embed_dim": D, "depth": depth, "mlp_ratio": hidden / D}


def infer_decoder(state: dict, source: str) -> dict:
    dec = _need(state, "decoder_norm.weight", source)
    return {"decoder_embed_dim": int(dec.shape[0]), "decoder_depth": _count(state, "decoder_blocks")}


def rename_unet(state: dict) -> dict:
    """The authors' skip names -> resdecay's ``skip_fusions`` names."""
    out = {}
    for k, v in state.items():
        k = re.sub(r"^skip\.(\d+)\.fc\.0\.", r"skip_fusions.\1.fc1.", k)
        k = re.sub(r"^skip\.(\d+)\.fc\.2\.", r"skip_fusions.\1.fc2.", k)
        out[re.sub(r"^skip\.(\d+)\.mask_token$", r"skip_fusions.\1.mask_token", k)] = v
    return out


def fold_layer_scale(state: dict, source: str) -> dict:
    """timm's LayerScale ``ls{1,2}.gamma`` folded into the branches' last Linears (``checkpoint_io.fold_branch_gains``);
    refuses timm features resdecay lacks."""
    bad = [k for k in state if re.search(r"\.(q_norm|k_norm|norm_pre|attn_norm|ffn_norm)\.|^(reg_token|norm_pre\.)", k)]
    if bad:
        raise CheckpointError(f"{source} uses {bad[0]}, a timm ViT feature resdecay's blocks do not have; "
                              "only plain pre-LN ViTs (optionally with LayerScale) import")
    return fold_branch_gains(state)


def _timm_head(state: dict, source: str) -> tuple[dict, dict | None]:
    """(encoder weights under resdecay's names, classifier settings or None) of a timm ViT."""
    enc = {k: v for k, v in state.items() if not k.startswith(("head.", "fc_norm.", "norm."))}
    if "head.weight" not in state:
        enc.update({k: v for k, v in state.items() if k.startswith("norm.")})
        return enc, None
    num_classes = int(state["head.weight"].shape[0])
    head = {k: v for k, v in state.items() if k.startswith("head.")}
    if any(k.startswith("fc_norm.") for k in state):  # timm global_pool='avg': mean of patches -> fc_norm
        if any(k.startswith("norm.") for k in state):
            raise CheckpointError(f"{source} normalises every token and again after pooling; resdecay's classifier has one norm")
        head.update({k: v for k, v in state.items() if k.startswith("fc_norm.")})
        return enc, {"num_classes": num_classes, "pool": "patch_mean", "weights": head}
    # timm global_pool='token': final norm on every token, then the cls token: LN(cls) in resdecay
    head.update({"fc_norm." + k[5:]: v for k, v in state.items() if k.startswith("norm.")})
    return enc, {"num_classes": num_classes, "pool": "cls", "weights": head}


def model_fields(fmt: str, state: dict, source: str) -> tuple[dict, dict, dict | None]:
    """(MAE config fields the weights fix, weights under resdecay's names, timm head or None)."""
    fields = {**infer_encoder(state, source), "shortcut": "decay"}
    if fmt == "timm-vit":
        weights, head = _timm_head(fold_layer_scale(state, source), source)
        return {**fields, "encoder_norm": "norm.weight" in weights}, weights, head
    if fmt == "unet-mae":
        state = rename_unet(state)
    fields.update(infer_decoder(state, source), skips=fmt == "unet-mae", encoder_norm="norm.weight" in state)
    return fields, state, None


def check_fusions(cfg, state: dict, source: str) -> None:
    """Refuse U-Net weights whose number of skip fusions the config's skip sources do not give."""
    fusions, wanted = _count(state, "skip_fusions"), len(choose_skip_sources(cfg.depth, cfg.decoder_depth, cfg.skip_sources))
    if fusions != wanted:
        raise UserError(f"{source} has {fusions} skip fusions but depth {cfg.depth} / decoder depth {cfg.decoder_depth} "
                        f"gives {wanted}; set model.skip_sources=[...] to the authors' source blocks")
