"""What a foreign checkpoint says about its model beyond the shapes of its weights.

``import-weights`` takes the dimensions from the weights; the settings below from the file
itself, where it states them, ahead of ``--preset``. A ``--alpha-min`` or ``model.*`` override that
contradicts the file, or a file that contradicts its own weights, is refused in one line (taking
the flag would write a model that differs from the one trained):

    resdecay_spec        ``save_decayified`` / ``resdecay export`` output: alpha_min, schedule, branches
    args.min_decay       the authors' U-Net MAE training script (an ``argparse.Namespace``; default 1.0)
    args.mask_ratio, args.norm_pix_loss, args.input_size
                         facebookresearch/mae's ``main_pretrain.py`` (and the authors' script built on it)
    args.model           ``mae_vit_base_patch16`` ...: the number of heads (and widths, depths, patch
                         sizes, checked against the weights); a timm model name (timm's ``train.py``)
                         is resolved by timm itself
    timm_kwargs          ``resdecay export`` metadata: every dimension, the heads included
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

import torch

from ..errors import CheckpointError
from ..nn.spec import check_spec
from .checkpoint_io import TIMM_FORMAT, Stated, exported_kwargs

# ViT sizes (width, depth, heads) as MAE's models_mae.py and timm name them
VIT_SIZES = {"tiny": (192, 12, 3), "small": (384, 12, 6), "base": (768, 12, 12), "large": (1024, 24, 16),
             "huge": (1280, 32, 16)}
MAE_DECODER = (512, 8, 16)  # models_mae.py's "dec512d8b": every released MAE's decoder (width, depth, heads)


def training_args(blob: Any) -> dict | None:
    """The ``args`` a training script saved beside the weights, as a dict (or None)."""
    args = blob.get("args") if isinstance(blob, Mapping) else None
    if args is None:
        return None
    if isinstance(args, Mapping):
        return dict(args)
    return dict(vars(args)) if hasattr(args, "__dict__") else None


def _alpha_from_args(args: dict, source: str) -> Stated:
    a = args.get("min_decay")
    if a is None:
        return {}
    if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < a <= 1:
        raise CheckpointError(f"{source}: args.min_decay is {a!r}, not a shortcut factor in (0, 1]; the file is damaged")
    return {"alpha_min": (float(a), "args.min_decay")}


def _sizes_from_name(name: Any, where: str, decoder: tuple[int, int] | None) -> Stated:
    """Heads (and the dimensions to check) that an MAE-style model name such as
    ``mae_vit_base_patch16`` implies; nothing for a name it does not know."""
    m = re.search(r"vit_(tiny|small|base|large|huge)_patch(\d+)", str(name or ""))
    if not m:
        return {}
    width, depth, heads = VIT_SIZES[m.group(1)]
    out: Stated = {"embed_dim": (width, where), "depth": (depth, where), "num_heads": (heads, where),
                   "patch_size": (int(m.group(2)), where)}
    if str(name).startswith("mae_") and decoder == MAE_DECODER[:2]:  # MAE's decoder: its heads too
        out["decoder_num_heads"] = (MAE_DECODER[2], where)
    return out


def _mae_args(args: dict, decoder: tuple[int, int] | None, source: str) -> Stated:
    out = _alpha_from_args(args, source)
    if isinstance(args.get("mask_ratio"), (int, float)) and not isinstance(args["mask_ratio"], bool):
        out["mask_ratio"] = (float(args["mask_ratio"]), "args.mask_ratio")
    if isinstance(args.get("norm_pix_loss"), bool):
        out["norm_pix_loss"] = (args["norm_pix_loss"], "args.norm_pix_loss")
    if isinstance(args.get("input_size"), int) and not isinstance(args["input_size"], bool):
        out["img_size"] = (args["input_size"], "args.input_size")
    return {**out, **_sizes_from_name(args.get("model"), f"args.model {args.get('model')!r}", decoder)}


def _timm_name(name: Any, kwargs: Any, where: str) -> Stated:
    """Heads and dimensions of a registered timm ViT with timm ``train.py``'s ``--model-kwargs``,
    built on the meta device (no memory, no download); nothing for a name timm does not know."""
    import timm

    if not isinstance(name, str) or not timm.is_model(name):
        return {}
    try:
        with torch.device("meta"):
            vit = timm.create_model(name, pretrained=False, **(kwargs if isinstance(kwargs, Mapping) else {}))
        attn = vit.blocks[0].attn
        return {"embed_dim": (int(vit.embed_dim), where), "depth": (len(vit.blocks), where),
                "num_heads": (int(attn.num_heads), where), "patch_size": (int(vit.patch_embed.patch_size[0]), where)}
    except Exception:  # not a VisionTransformer (or timm cannot build it): the name says nothing here
        return {}


def _exported(meta: Mapping, source: str) -> Stated:
    """Dimensions and heads from ``resdecay export`` metadata (``timm_kwargs``)."""
    if meta.get("format") != TIMM_FORMAT:
        return {}
    kw = exported_kwargs(meta, source)
    return {k: (kw[k], "its timm_kwargs") for k in ("img_size", "patch_size", "in_chans", "embed_dim", "depth",
                                                     "num_heads", "mlp_ratio") if k in kw}


def stated_by_file(fmt: str, blob: Any, decoder: tuple[int, int] | None, source: str) -> Stated:
    """Every model setting the file states, with where it states it.

    Args:
        fmt: the ``--format``.
        blob: what ``read_weights_file`` returned.
        decoder: (width, depth) of the decoder in the weights, or None.
        source: the file, for error messages.
    """
    out: Stated = {}
    args = training_args(blob)
    if args is not None:
        where = f"args.model {args.get('model')!r}" + (" with args.model_kwargs" if args.get("model_kwargs") else "")
        _merge(out, _mae_args(args, decoder, source) if fmt in ("mae", "unet-mae") else
               _timm_name(args.get("model"), args.get("model_kwargs"), where)
               or _sizes_from_name(args.get("model"), where, None), source)
    meta = blob.get("metadata") if isinstance(blob, Mapping) else None
    if isinstance(meta, Mapping) and "timm_kwargs" in meta:
        _merge(out, _exported(meta, source), source)
    spec = blob.get("resdecay_spec") if isinstance(blob, Mapping) else None
    if spec is not None:
        spec = check_spec(spec, source)
        where = "its resdecay_spec"
        _merge(out, {"alpha_min": (spec["alpha_min"], where), "schedule": (spec["schedule"], where),
                     "decay_branches": (spec["branches"], where)}, source)
    return out


def _merge(into: Stated, more: Stated, source: str) -> None:
    """``into`` updated with ``more``; two places in one file that disagree are refused."""
    for key, (value, where) in more.items():
        if key in into and into[key][0] != value:
            raise CheckpointError(f"{source}: {into[key][1]} says model.{key} = {into[key][0]} but {where} says {value}; "
                                  "the file contradicts itself (a damaged or hand-edited checkpoint)")
        into[key] = (value, where)


def check_against_weights(stated: Stated, fixed: dict, source: str) -> None:
    """Refuse a file whose stated settings contradict its own weights.

    Args:
        stated: what ``stated_by_file`` found.
        fixed: the model fields the weights fix (dimensions).
        source: the file, for the error message.
    """
    for key, (value, where) in stated.items():
        if key in fixed and fixed[key] != value:
            raise CheckpointError(f"{source}: {where} says model.{key} = {value} but its weights have {fixed[key]}; "
                                  "the file contradicts itself (a damaged or hand-edited checkpoint)")


def describe(stated: Stated) -> dict[str, str]:
    """``{field: "value (where)"}``, kept in the imported checkpoint's ``imported_from``."""
    return {k: f"{json.dumps(v)} ({where})" for k, (v, where) in sorted(stated.items())}
