"""``resdecay export CKPT --to timm``: a resdecay encoder as a decayified timm VisionTransformer.

The encoder's parameter names are timm's already (``blocks.i.attn.qkv`` ...), so the weights
move key for key; what differs is handled here, and what cannot be reproduced is refused:

    final norm      a U-Net MAE has none: timm is built with ``final_norm=False``
    positions       resdecay's fixed sin-cos table is copied into timm's learned ``pos_embed``
    decay           re-applied with ``decayify`` from the stored spec; its per-sub-block alphas
                    are checked to equal the resdecay model's exactly (``model.shortcut`` other
                    than ``decay`` -- learnable or scaled shortcuts -- is refused)
    branch gains    ``model.branch_scale`` is timm's LayerScale (``init_values``, keys ``ls1.gamma`` /
                    ``ls2.gamma``); a ReZero / SkipInit scalar is written as that vector, ReZero's
                    one per block under both keys (``nn.branch_scale``); the drops act in training only
    classifier head ``ln_linear`` on ``patch_mean`` -> timm ``global_pool='avg'`` + ``fc_norm``;
                    on ``cls`` -> ``global_pool='token'`` with the head's LayerNorm as timm's
                    ``norm``; ``bn_linear`` and ``mean`` pooling have no timm form (refused)
    MAE decoder     not exported (timm's ViT is an encoder); ``num_classes=0``

resdecay's features (``forward_features``, what ``resdecay eval`` pools, ``mean`` = all tokens
including cls) are the raw last block: timm's ``forward_intermediates(x, norm=False)``, or the
blocks' output; timm's ``forward_features`` adds the final norm where the MAE has one.

The file is safetensors; its metadata holds ``resdecay_spec`` and ``timm_kwargs`` (JSON) and
``timm_model``, the registered architecture the kwargs override (every dimension is given).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn

from ..errors import CheckpointError, UserError
from ..nn.branch_scale import branch_settings
from ..nn.decayify import alphas_of, decayify
from ..nn.spec import check_spec
from .checkpoint_io import TIMM_FORMAT, exported_kwargs, load_strict, read_safetensors, source_model
from .files import check_out_file, write_bytes_atomically

FORMAT = TIMM_FORMAT  # "resdecay-timm-export-v1", the metadata file_meta.py recognises too
TIMM_MODEL = "vit_base_patch16_224"  # architecture template only: timm_kwargs set every dimension


def encoder_settings(cfg) -> tuple[object, dict | None]:
    """(the encoder's MAEConfig, the classifier head settings or None) of a model config."""
    if cfg.family == "mae":
        return cfg, None
    if cfg.family == "classifier":
        return cfg.encoder_config(), {"head": cfg.head, "pool": cfg.pool, "num_classes": cfg.num_classes}
    raise UserError(f"export --to timm takes an MAE or classifier checkpoint (a ViT encoder); this one is model.family "
                    f"{cfg.family!r}")


def spec_of(enc) -> dict:
    """The ``decayify`` spec that reproduces an encoder config's shortcuts, or a one-line refusal."""
    if getattr(enc, "hyper_streams", 1) > 1:  # nn.hyper: timm's ViT carries one residual stream
        raise UserError(f"model.hyper_streams={enc.hyper_streams} (hyper-connections) has no timm form: timm's ViT carries "
                        "one residual stream; export it --to hf (resdecay.from_pretrained)")
    if getattr(enc, "shortcut", "decay") != "decay":
        raise UserError(f"model.shortcut={enc.shortcut} has no decayify form (only fixed decayed shortcuts do); "
                        "export a model trained with model.shortcut=decay")
    # the structure only: the model's zero-init happened before training; replaying it would undo the weights
    return {"alpha_min": float(enc.alpha_min), "schedule": enc.schedule, "branches": getattr(enc, "decay_branches", "both")}


def timm_kwargs(enc, head: dict | None) -> dict:
    """``timm.create_model`` keyword arguments for a resdecay encoder (and classifier head)."""
    kw = {"img_size": enc.img_size, "patch_size": enc.patch_size, "in_chans": enc.in_chans, "embed_dim": enc.embed_dim,
          "depth": enc.depth, "num_heads": enc.num_heads, "mlp_ratio": enc.mlp_ratio, "qkv_bias": True,
          "class_token": True, "num_classes": 0, "global_pool": "token", "final_norm": bool(enc.encoder_norm)}
    if branch_settings(enc)["branch_scale"] != "none":  # timm's ls1 / ls2; the values are the checkpoint's
        kw["init_values"] = float(branch_settings(enc)["layerscale_init"])
    if head is None:
        return kw
    if head["head"] != "ln_linear" or head["pool"] not in ("patch_mean", "cls"):
        raise UserError(f"a classifier with model.head={head['head']} and model.pool={head['pool']} has no timm form; "
                        "export the pretraining (MAE) checkpoint, or a classifier with head ln_linear and pool patch_mean or cls")
    kw["num_classes"] = head["num_classes"]
    if head["pool"] == "patch_mean":  # timm 'avg' pools the patch tokens, then fc_norm (its norm is then Identity)
        kw.update(global_pool="avg", fc_norm=True, final_norm=True)
    else:  # LayerNorm on the cls token == timm's final norm on every token, then the cls one
        kw.update(global_pool="token", fc_norm=False, final_norm=True)
    return kw


def timm_state(state: dict, head: dict | None, dim: int | None = None) -> dict[str, torch.Tensor]:
    """resdecay encoder (+ head) weights under timm's names; ``dim``: the width a scalar branch gain (ReZero,
    SkipInit) is spread to, as timm's LayerScale holds one value per channel."""
    enc_prefixes = ("cls_token", "pos_embed", "patch_embed.", "blocks.")
    out = {k: v for k, v in state.items() if k.startswith(enc_prefixes)}
    for k in [k for k in out if k.endswith(".ls1.gamma") and out[k].numel() == 1]:
        out.setdefault(k.replace(".ls1.", ".ls2."), out[k])  # ReZero: the block's one gain, read by both adds
    for k in [k for k in out if k.endswith((".ls1.gamma", ".ls2.gamma")) and out[k].numel() == 1]:
        out[k] = out[k].expand(dim)
    if head is None:
        out.update({k: v for k, v in state.items() if k.startswith("norm.")})  # plain MAE's final norm
    else:  # a classifier's encoder norm is unused by its forward; its head norm is timm's fc_norm or norm
        target = "fc_norm." if head["pool"] == "patch_mean" else "norm."
        out.update({target + k[len("fc_norm."):]: v for k, v in state.items() if k.startswith("fc_norm.")})
        out.update({k: v for k, v in state.items() if k.startswith("head.")})
    return {k: v.detach().contiguous().clone() for k, v in out.items()}


def build_timm(kwargs: dict, spec: dict, state: dict, source: str) -> nn.Module:
    """A timm ViT with ``kwargs``, ``state`` loaded strictly and the decay of ``spec`` applied."""
    import timm

    try:
        model = timm.create_model(TIMM_MODEL, pretrained=False, **kwargs)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{source}: timm cannot build a ViT with {kwargs} ({e})") from None
    load_strict(model, state, source)
    decayify(model, **spec)  # spec: alpha_min, schedule, branches (check_spec drops a legacy zero_init)
    # what rebuilds it: resdecay.save_pretrained of this model needs no architecture arguments
    model.resdecay_architecture = {"library": "timm", "name": TIMM_MODEL, "kwargs": dict(kwargs)}
    return model.eval()


def export_to_timm(checkpoint: str | Path, out: str | Path, ema: bool = False) -> Path:
    """Write a resdecay MAE / classifier checkpoint's encoder as a timm ViT safetensors file.

    Args:
        checkpoint: a resdecay checkpoint (``<run>/checkpoints/step_*.pt`` or ``import-weights``
            output), or a folder ``save_pretrained`` / ``export --to hf`` wrote.
        out: the ``.safetensors`` file to write.
        ema: export the EMA weights; refused when the run kept none.

    Returns:
        The path written.
    """
    from safetensors.torch import save

    out = Path(out)
    if out.suffix != ".safetensors":
        raise UserError(f"--out {out} must end in .safetensors")
    check_out_file(out)
    model, model_cfg = source_model(checkpoint, ema)
    enc, head = encoder_settings(model_cfg)
    spec, kwargs = spec_of(enc), timm_kwargs(enc, head)
    vit = build_timm(kwargs, spec, timm_state(model.state_dict(), head, enc.embed_dim), str(checkpoint))
    got = torch.tensor([a for _, a in alphas_of(vit)], dtype=torch.float64)
    if got.shape != model.alphas.shape or not torch.equal(got, model.alphas.to(torch.float64)):
        raise UserError(f"decayify cannot reproduce the alphas of {checkpoint} exactly (schedule {spec['schedule']}, "
                        f"branches {spec['branches']}); it was not exported")
    meta = {"format": FORMAT, "timm_model": TIMM_MODEL, "timm_kwargs": json.dumps(kwargs),
            "resdecay_spec": json.dumps(spec), "source": str(checkpoint), "weights": "ema" if ema else "model"}
    # bytes written like every other output (atomically, mode 0666 & ~umask); safetensors' own
    # save_file would create its file 0600 (owner-only), whatever the umask
    write_bytes_atomically(save(vit.state_dict(), metadata=meta), out)
    return out


def load_exported(path: str | Path) -> nn.Module:
    """The decayified timm ViT (eval mode) of a file ``export_to_timm`` wrote.

    Args:
        path: the ``.safetensors`` file.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist; pass a file written by resdecay export --to timm")
    blob = read_safetensors(path)
    meta = blob["metadata"]
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"{path} was not written by resdecay export --to timm (no '{FORMAT}' metadata)")
    if "resdecay_spec" not in blob:
        raise CheckpointError(f"{path} carries no resdecay_spec, so its alphas are unknown; export it again")
    kwargs = exported_kwargs(meta, str(path))
    return build_timm(kwargs, check_spec(blob["resdecay_spec"], str(path)), blob["model"], str(path))
