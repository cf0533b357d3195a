"""``resdecay import-weights``: foreign checkpoints into resdecay checkpoints that ``load_model``,
``resdecay eval`` and ``resdecay finetune`` accept.

Formats (``--format``):

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

Dimensions (width, depth, patch, image size, MLP ratio, decoder) come from the weights; what the
file states beside them (alpha, schedule, mask ratio, loss, the number of heads: see
``file_meta``) from the file; the rest (heads the file does not state, data, training) from
``--preset`` and ``key=value`` overrides. A flag or override that contradicts the file, and every
mismatch, is refused in one line.

This module is the command's dispatcher over its formats, which stand side by side and import only
the shared ``checkpoint_io.py`` / ``files.py``: ``foreign_vit.py`` (the weights of ``mae``, ``unet-mae``,
``timm-vit``) with ``file_meta.py`` (what those files state), and ``hf_vitmae.py`` (``hf-vitmae``).
"""

from __future__ import annotations

import dataclasses
import warnings
from pathlib import Path

import torch

from ..errors import CheckpointError, UserError
from ..io import atomic_save
from ..models import ClassifierConfig, build_model
from ..train.checkpoint import FORMAT, load_model
from ..train.config import _read_preset, from_dict, parse_overrides
from .checkpoint_io import Stated, load_strict, read_weights_file, state_dict_of
from .file_meta import check_against_weights, describe, stated_by_file
from .files import check_out_file, make_parent, unwritable
from .foreign_vit import (  # noqa: F401  (infer_*, rename_unet, fold_layer_scale: public here before)
    check_fusions,
    fold_layer_scale,
    infer_decoder,
    infer_encoder,
    model_fields,
    rename_unet,
)
from .hf_vitmae import import_fields

FORMATS = ("mae", "unet-mae", "timm-vit", "hf-vitmae")


class AlphaUnknownWarning(UserWarning):
    """A timm ViT file states no alpha: it is imported as a plain model, which is wrong if it was decayified."""


def _alpha_flag(flag: float | None, override: object) -> tuple[float | None, str]:
    """The alpha the user gave, as ``--alpha-min`` or as ``model.alpha_min=`` (the same setting), and
    how they gave it."""
    if override is not None and flag is not None and override != flag:
        raise UserError(f"--alpha-min {flag:g} and model.alpha_min={override} disagree; give one")
    if override is not None and (isinstance(override, bool) or not isinstance(override, (int, float))):
        raise UserError(f"model.alpha_min must be a number in (0, 1], got {override!r}")
    return (flag, "--alpha-min") if flag is not None else (override, "model.alpha_min")


def _alpha_settings(fmt: str, alpha_min: float | None, stated: Stated, source: str, flag: str = "--alpha-min") -> dict:
    """alpha_min for the imported model when the file does not state it, from the flag; a flag
    that contradicts the file is refused (taking it would write a model other than the file's)."""
    if alpha_min is not None and not 0 < alpha_min <= 1:
        raise UserError(f"{flag} must lie in (0, 1], got {alpha_min}")
    if "alpha_min" in stated:
        value, where = stated["alpha_min"]
        if alpha_min is not None and alpha_min != value:
            raise UserError(f"{source} stores alpha_min {value:g} but {flag} is {alpha_min:g}; drop {flag}: "
                            f"the file's value ({where}) is the one its model was trained with")
        return {}
    if fmt == "mae":
        if alpha_min not in (None, 1.0):
            raise UserError("--alpha-min applies to --format unet-mae or timm-vit (so does model.alpha_min); the official "
                            "MAE is a plain (alpha 1) model")
        return {"alpha_min": 1.0}
    if fmt == "unet-mae" and alpha_min is None:
        raise UserError(f"--format unet-mae needs --alpha-min for {source}: it carries no args.min_decay (the authors' "
                        "training script saves it in 'args'; this file has none), e.g. --alpha-min 0.6")
    if alpha_min is None:  # a timm ViT: plain, unless it was decayified and saved without its spec
        warnings.warn(f"{source} states no alpha (no resdecay_spec), so it was imported as a plain alpha 1 model; if it was "
                      "decayified, import it again with --alpha-min A (and model.schedule=... as it was trained); "
                      "--alpha-min 1 says it is plain and silences this", AlphaUnknownWarning, stacklevel=4)
        return {"alpha_min": 1.0}
    return {"alpha_min": float(alpha_min)}


# what a format implies where its files say nothing: ahead of the preset, behind a key=value override
FORMAT_DEFAULTS = {"unet-mae": {"schedule": "linear", "decay_branches": "both", "decoder_decay": False}}


def suggested_heads(width: int) -> int:
    """A number of heads for ``width`` channels: a divisor of it (so at least 1), nearest to 64-wide heads."""
    return min((h for h in range(1, width + 1) if width % h == 0), key=lambda h: (abs(h - width / 64), h))


def _run_config(preset: str, fixed: dict, where: dict, defaults: dict, given: dict[str, dict]):
    """The preset, then the format's defaults, the user's overrides and what the weights and the
    file fix (``fixed``; an override that contradicts one is refused, naming ``where`` it comes from)."""
    raw = _read_preset(preset)
    family = (raw.get("model") or {}).get("family", "mae")
    if family != "mae":
        raise UserError(f"--preset must be an MAE preset (its heads, data and training settings), not family {family!r}")
    for key, value in given.get("model", {}).items():
        if key in fixed and value != fixed[key]:
            raise UserError(f"{where.get(key, 'the weights')} set model.{key} = {fixed[key]} for this import; "
                            f"drop the override model.{key}={value}")
    preset_model = raw.get("model") or {}
    # weights do not show the number of heads: the preset's is only trusted at the preset's width
    for width, heads in (("embed_dim", "num_heads"), ("decoder_embed_dim", "decoder_num_heads")):
        if (width in fixed and fixed[width] != preset_model.get(width) and heads not in given.get("model", {})
                and heads not in fixed):
            n = suggested_heads(fixed[width])
            raise UserError(f"the weights have {width} {fixed[width]} but preset {preset!r} has {preset_model.get(width)}, so its "
                            f"{heads} may not be theirs; give model.{heads}=N (e.g. {n}: {fixed[width] // n}-wide heads)")
    raw["model"] = {**preset_model, **defaults, **given.get("model", {}), **fixed}
    for section, values in given.items():
        if section != "model":
            raw.setdefault(section, {}).update(values)
    return from_dict(raw, preset=Path(preset).stem if preset.endswith((".yaml", ".yml")) else preset)


def import_weights(src: str | Path, fmt: str, preset: str, out: str | Path, alpha_min: float | None = None,
                   overrides: list[str] | None = None) -> Path:
    """Convert a foreign checkpoint into a resdecay checkpoint.

    Args:
        src: the foreign checkpoint (``torch.save`` format; read with ``weights_only=True``), or
            for ``hf-vitmae`` a transformers folder (or its weights file beside its config.json).
        fmt: one of ``FORMATS``.
        preset: a resdecay MAE preset for what the weights do not say (heads, data, training).
        out: the resdecay checkpoint to write.
        alpha_min: the decay of the source model, for a file that does not state it (a unet-mae
            file without ``args``); one that contradicts the file is refused.
        overrides: ``key=value`` settings applied to the preset (e.g. ``model.num_heads=6``).

    Returns:
        The path written; ``resdecay.checkpoint.load_model(out)`` rebuilds the model.
    """
    _check_format(fmt)
    out = check_out_file(out)  # an unwritable --out is said before any work
    cfg, model, imported = convert_weights(src, fmt, preset, alpha_min, overrides)
    make_parent(out)
    try:
        atomic_save(imported_state(cfg, model, imported), out)
    except OSError as e:
        if isinstance(e, UserError):  # a full disk, already said in one line by resdecay.io
            raise
        raise unwritable(out, e) from None
    load_model(out)  # the written file must rebuild; fail here, not in a later eval
    return out


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise UserError(f"--format {fmt!r} is unknown; choose one of {', '.join(FORMATS)}")


def imported_state(cfg, model: torch.nn.Module, imported: dict) -> dict:
    """The resdecay checkpoint (weights only, step 0) that ``import_weights`` writes."""
    return {"format": FORMAT, "model": model.state_dict(), "config": cfg.to_dict(),
            "train_state": {"step": 0, "epoch": 0, "step_in_epoch": 0}, "imported_from": imported}


def convert_weights(src: str | Path, fmt: str, preset: str, alpha_min: float | None = None,
                    overrides: list[str] | None = None):
    """``import_weights`` without writing a file (``resdecay finetune --from`` imports in memory):
    (RunConfig, the model with the imported weights, ``imported_from`` record: path, format, ...)."""
    _check_format(fmt)
    source = str(src)
    if fmt == "hf-vitmae":  # a folder: config.json states what the weights do not
        fields, weights, stated = import_fields(src)
        head = None
    else:
        blob = read_weights_file(src)
        state = state_dict_of(blob, source)
        fields, weights, head = model_fields(fmt, state, source)
        decoder = (fields["decoder_embed_dim"], fields["decoder_depth"]) if "decoder_embed_dim" in fields else None
        stated = stated_by_file(fmt, blob, decoder, source)
    check_against_weights(stated, fields, source)
    given = parse_overrides(overrides or [], "mae")
    flag, how = _alpha_flag(alpha_min, given.get("model", {}).get("alpha_min"))
    alpha = _alpha_settings(fmt, flag, stated, source, how)
    fixed = {**fields, **{k: v for k, (v, _) in stated.items()}, **alpha}
    where = {k: f"{source}'s {w}" for k, (_, w) in stated.items()}
    if alpha:
        where["alpha_min"] = how if flag is not None else f"--format {fmt} (no alpha in the file: 1)"
    cfg = _run_config(preset, fixed, where, {"zero_init": False, **FORMAT_DEFAULTS.get(fmt, {})}, given)
    if fmt == "unet-mae":
        check_fusions(cfg.model, weights, source)
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
    imported = {"path": source, "format": fmt, "decoder": "new" if fresh_decoder else "imported", "stated_by_file": describe(stated)}
    return cfg, model, imported


_ENCODER = ("cls_token", "pos_embed", "patch_embed.", "blocks.", "norm.")
