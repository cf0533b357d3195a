"""``resdecay import-weights``: foreign checkpoints into resdecay checkpoints that ``load_model``,
``resdecay eval`` and ``resdecay finetune`` accept.

Formats (``--format``):

    mae       an official facebookresearch/mae pretraining checkpoint (``{'model': state_dict}``)
              -> resdecay's plain MAE (alpha 1, no skips, final encoder norm). Its key names are
              resdecay's (``blocks.i.attn.qkv``, ``mask_token``, ``decoder_*``): nothing is renamed.
    unet-mae  the authors' U-Net MAE: ``skip.{i}.fc.0`` / ``skip.{i}.fc.2`` / ``skip.{i}.mask_token``
              become ``skip_fusions.{i}.fc1`` / ``fc2`` / ``mask_token``; the rest is resdecay's.
              Their files do not store alpha, so ``--alpha-min`` is required.
    timm-vit  a timm VisionTransformer state_dict (or ``save_decayified`` output, whose spec is used)
              -> a classifier checkpoint when it has a head, else an MAE checkpoint whose decoder
              is newly initialised (the encoder is what eval and finetune use). LayerScale gammas
              are folded into the branch's last Linear. A state_dict does not say how timm pools:
              ``fc_norm.*`` means ``global_pool='avg'`` (resdecay ``patch_mean``), a head without it
              timm's default ``'token'`` (resdecay ``cls``, the final norm becoming the head's).

Dimensions (width, depth, patch, image size, MLP ratio, decoder) come from the weights; the
number of heads, the data and the training settings from ``--preset`` and ``key=value``
overrides. Every mismatch is refused in one line.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path

import torch

from ..errors import CheckpointError, UserError
from ..io import atomic_save
from ..models import ClassifierConfig, build_model
from ..models.mae import choose_skip_sources
from ..train.checkpoint import FORMAT, load_model
from ..train.config import _read_preset, from_dict, parse_overrides
from .weights import check_spec, load_strict, read_weights_file, state_dict_of

FORMATS = ("mae", "unet-mae", "timm-vit")


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
    """timm's LayerScale ``ls{1,2}.gamma`` multiplies the branch output: fold it into the branch's
    last Linear (attn.proj / mlp.fc2), which is exact. Refuses timm features resdecay lacks."""
    bad = [k for k in state if re.search(r"\.(q_norm|k_norm|norm_pre|attn_norm|ffn_norm)\.|^(reg_token|norm_pre\.)", k)]
    if bad:
        raise CheckpointError(f"{source} uses {bad[0]}, a timm ViT feature resdecay's blocks do not have; "
                              "only plain pre-LN ViTs (optionally with LayerScale) import")
    out = dict(state)
    for key in [k for k in state if k.endswith((".ls1.gamma", ".ls2.gamma"))]:
        block, which = key.rsplit(".", 2)[0], key.split(".")[-2]
        layer = f"{block}.attn.proj" if which == "ls1" else f"{block}.mlp.fc2"
        gamma = out.pop(key)
        out[f"{layer}.weight"] = out[f"{layer}.weight"] * gamma[:, None]
        out[f"{layer}.bias"] = out[f"{layer}.bias"] * gamma
    return out


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


def _alpha_settings(fmt: str, alpha_min: float | None, blob, source: str) -> dict:
    """alpha_min / schedule / branches for the imported model, from the flag or a stored spec."""
    spec = blob.get("resdecay_spec") if isinstance(blob, dict) else None
    if fmt == "mae":
        if alpha_min not in (None, 1.0):
            raise UserError("--alpha-min applies to --format unet-mae or timm-vit; the official MAE is a plain (alpha 1) model")
        return {"alpha_min": 1.0}
    if fmt == "unet-mae" and alpha_min is None:
        raise UserError("--format unet-mae needs --alpha-min: the authors' checkpoints do not store the alpha they were "
                        "trained with (e.g. --alpha-min 0.6)")
    if spec is not None:
        spec = check_spec(spec, source)
        if alpha_min is not None and alpha_min != spec["alpha_min"]:
            raise UserError(f"{source} stores alpha_min {spec['alpha_min']:g} but --alpha-min is {alpha_min:g}; drop --alpha-min")
        return {"alpha_min": spec["alpha_min"], "schedule": spec["schedule"], "decay_branches": spec["branches"]}
    if alpha_min is not None and not 0 < alpha_min <= 1:
        raise UserError(f"--alpha-min must lie in (0, 1], got {alpha_min}")
    return {"alpha_min": 1.0 if alpha_min is None else float(alpha_min)}


def _model_fields(fmt: str, state: dict, alpha: dict, source: str) -> tuple[dict, dict, dict | None]:
    """(MAE config fields the weights fix, weights under resdecay's names, timm head or None)."""
    fields = {**infer_encoder(state, source), "shortcut": "decay", "zero_init": False, **alpha}
    if fmt == "timm-vit":
        weights, head = _timm_head(fold_layer_scale(state, source), source)
        return {**fields, "encoder_norm": "norm.weight" in weights}, weights, head
    if fmt == "unet-mae":
        state = rename_unet(state)
    fields.update(infer_decoder(state, source), skips=fmt == "unet-mae", encoder_norm="norm.weight" in state)
    return fields, state, None


def _check_fusions(cfg, state: dict, source: str) -> None:
    fusions, wanted = _count(state, "skip_fusions"), len(choose_skip_sources(cfg.depth, cfg.decoder_depth, cfg.skip_sources))
    if fusions != wanted:
        raise UserError(f"{source} has {fusions} skip fusions but depth {cfg.depth} / decoder depth {cfg.decoder_depth} "
                        f"gives {wanted}; set model.skip_sources=[...] to the authors' source blocks")


def _run_config(preset: str, fields: dict, overrides: list[str]):
    """The preset with the weights' dimensions, then the user's overrides, checked."""
    raw = _read_preset(preset)
    family = (raw.get("model") or {}).get("family", "mae")
    if family != "mae":
        raise UserError(f"--preset must be an MAE preset (its heads, data and training settings), not family {family!r}")
    given = parse_overrides(overrides, "mae")
    preset_model = raw.get("model") or {}
    # weights do not show the number of heads: the preset's is only trusted at the preset's width
    for width, heads in (("embed_dim", "num_heads"), ("decoder_embed_dim", "decoder_num_heads")):
        if width in fields and fields[width] != preset_model.get(width) and heads not in given.get("model", {}):
            raise UserError(f"the weights have {width} {fields[width]} but preset {preset!r} has {preset_model.get(width)}, so its "
                            f"{heads} may not be theirs; give model.{heads}=N (e.g. {fields[width] // 64} for 64-wide heads)")
    raw["model"] = {**preset_model, **fields}
    for section, values in given.items():
        raw.setdefault(section, {}).update(values)
    return from_dict(raw, preset=Path(preset).stem if preset.endswith((".yaml", ".yml")) else preset)


def import_weights(src: str | Path, fmt: str, preset: str, out: str | Path, alpha_min: float | None = None,
                   overrides: list[str] | None = None) -> Path:
    """Convert a foreign checkpoint into a resdecay checkpoint.

    Args:
        src: the foreign checkpoint (``torch.save`` format; read with ``weights_only=True``).
        fmt: one of ``FORMATS``.
        preset: a resdecay MAE preset for what the weights do not say (heads, data, training).
        out: the resdecay checkpoint to write.
        alpha_min: the decay of the source model (required for unet-mae).
        overrides: ``key=value`` settings applied to the preset (e.g. ``model.num_heads=6``).

    Returns:
        The path written; ``resdecay.checkpoint.load_model(out)`` rebuilds the model.
    """

    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r} is unknown; choose one of {', '.join(FORMATS)}")
    source = str(src)
    blob = read_weights_file(src)
    state = state_dict_of(blob, source)
    alpha = _alpha_settings(fmt, alpha_min, blob, source)
    fields, weights, head = _model_fields(fmt, state, alpha, source)
    cfg = _run_config(preset, fields, overrides or [])
    if fmt == "unet-mae":
        _check_fusions(cfg.model, weights, source)
    fresh_decoder = fmt == "timm-vit" and head is None  # encoder only: an MAE whose decoder starts fresh
    if head is not None:
        cfg.model = ClassifierConfig(encoder=dataclasses.asdict(cfg.model), num_classes=head["num_classes"],
                                     head="ln_linear", pool=head["pool"], pretrained=source)
        weights = {**weights, **head["weights"]}
        cfg.validate()
    model = build_model(cfg.model)
    if fresh_decoder:  # keep the new decoder, load the whole encoder strictly
        own = model.state_dict()
        extra = sorted(set(weights) - set(own))
        if extra:
            raise CheckpointError(f"{source} does not fit {type(model).__name__}: unexpected key {extra[0]}")
        weights = {**{k: v for k, v in own.items() if not k.startswith(_ENCODER)}, **weights}
    load_strict(model, weights, source)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_save({"format": FORMAT, "model": model.state_dict(), "config": cfg.to_dict(),
                 "train_state": {"step": 0, "epoch": 0, "step_in_epoch": 0},
                 "imported_from": {"path": source, "format": fmt, "decoder": "new" if fresh_decoder else "imported"}}, out)
    load_model(out)  # the written file must rebuild; fail here, not in a later eval
    return out


_ENCODER = ("cls_token", "pos_embed", "patch_embed.", "blocks.", "norm.")
