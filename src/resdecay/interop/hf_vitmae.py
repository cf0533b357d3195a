"""Weights both ways between resdecay's plain MAE and Hugging Face ``ViTMAEForPreTraining``.

The two are the same network (pre-LN ViT encoder with a final LayerNorm, MAE decoder, fixed
sin-cos positions, argsort-of-noise masking drawn right after the patch embedding, the same
norm-pix loss); only the names differ, and resdecay fuses q, k, v into one ``attn.qkv`` Linear::

    resdecay                      transformers 5.x (4.x)
    patch_embed.proj              vit.embeddings.patch_embeddings.projection
    cls_token / pos_embed         vit.embeddings.cls_token / position_embeddings
    blocks.i.norm1 / norm2        vit.layers.i.layernorm_before / layernorm_after   (vit.encoder.layer.i.)
    blocks.i.attn.qkv             vit.layers.i.attention.{q,k,v}_proj             (attention.attention.{query,key,value})
    blocks.i.attn.proj            vit.layers.i.attention.o_proj                    (attention.output.dense)
    blocks.i.mlp.fc1 / fc2        vit.layers.i.mlp.fc1 / fc2                       (intermediate.dense / output.dense)
    decoder_blocks.j              decoder.decoder_layers.j                         (the same; 5.x's save_pretrained
                                                                                    writes decoder.decoder_encoder.layer.j)
    norm                          vit.layernorm
    decoder_embed, mask_token, decoder_pos_embed, decoder_blocks.j, decoder_norm, decoder_pred
                                  decoder.decoder_embed, ... decoder.decoder_layers.j, ...

One difference is not in the weights: transformers' ``layer_norm_eps`` defaults to 1e-12, resdecay
uses 1e-6. Exports write 1e-6; an import of a 1e-12 model warns once (``LayerNormEpsWarning``).

A decayed model (alpha_min < 1) is exported with its decay recorded under ``"resdecay"`` in
config.json (``resdecay.nn.config_record``'s schema: the decayify steps that give it) and a ``DecayDroppedWarning``:
transformers ignores that key and runs it as a plain MAE (other outputs), while
``resdecay.interop.restore(model)`` after ``from_pretrained`` and ``resdecay import-weights --format
hf-vitmae`` restore the decay. A U-Net MAE (long skips) has no ViTMAE form and is refused. Nothing here
imports transformers.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from pathlib import Path

import torch

from ..errors import CheckpointError, UserError
from ..nn.config_record import VERSION, parse
from .checkpoint_io import Stated, fold_branch_gains, read_weights_file, source_model, state_dict_of
from .files import check_out_file, read_json_object, write_bytes_atomically

RESDECAY_EPS = 1e-6
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
DECAY_KEYS = ("alpha_min", "schedule", "decay_branches", "decoder_decay")

# 4.x sub-layer names -> 5.x, applied to keys once the layer prefix is rewritten
_V4_TO_V5 = {"attention.attention.query": "attention.q_proj", "attention.attention.key": "attention.k_proj",
             "attention.attention.value": "attention.v_proj", "attention.output.dense": "attention.o_proj",
             "intermediate.dense": "mlp.fc1", "output.dense": "mlp.fc2"}
_BLOCK = {"layernorm_before": "norm1", "layernorm_after": "norm2", "attention.o_proj": "attn.proj",
          "mlp.fc1": "mlp.fc1", "mlp.fc2": "mlp.fc2"}
_FLAT = {"vit.embeddings.cls_token": "cls_token", "vit.embeddings.position_embeddings": "pos_embed",
         "vit.embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
         "vit.embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
         "vit.layernorm.weight": "norm.weight", "vit.layernorm.bias": "norm.bias",
         "decoder.mask_token": "mask_token", "decoder.decoder_pos_embed": "decoder_pos_embed",
         **{f"decoder.{n}.{p}": f"{n}.{p}" for n in ("decoder_embed", "decoder_norm", "decoder_pred") for p in ("weight", "bias")}}


# MAEConfig field -> the ViTMAE config.json key that states it
HF_NAMES = {"img_size": "image_size", "patch_size": "patch_size", "in_chans": "num_channels", "embed_dim": "hidden_size",
            "depth": "num_hidden_layers", "mlp_ratio": "intermediate_size / hidden_size", "decoder_embed_dim": "decoder_hidden_size",
            "decoder_depth": "decoder_num_hidden_layers"}


class LayerNormEpsWarning(UserWarning):
    """An imported ViTMAE used another LayerNorm epsilon than resdecay's 1e-6."""


class DecayDroppedWarning(UserWarning):
    """A decayed model was exported to a format whose library runs it without the decay."""


def _v5_names(hf_state: dict) -> dict:
    """A ViTMAE state_dict under transformers 5.x names (4.x names are rewritten)."""
    out = {}
    for key, value in hf_state.items():
        key = re.sub(r"^vit\.encoder\.layer\.", "vit.layers.", key)
        # transformers 5.x's save_pretrained writes its decoder layers back under this name
        key = re.sub(r"^decoder\.decoder_encoder\.layer\.", "decoder.decoder_layers.", key)
        for old, new in _V4_TO_V5.items():
            key = re.sub(rf"^((?:vit\.layers|decoder\.decoder_layers)\.\d+\.){re.escape(old)}\.", rf"\g<1>{new}.", key)
        out[key] = value
    return out


def _count(state: dict, prefix: str) -> int:
    found = {int(m.group(1)) for k in state if (m := re.match(rf"{re.escape(prefix)}\.(\d+)\.", k))}
    if found != set(range(len(found))):
        raise CheckpointError(f"{prefix}.* layer indices {sorted(found)} are not 0..{len(found) - 1}; the weights are damaged")
    return len(found)


def _blocks_to_mae(state: dict, hf_prefix: str, prefix: str, depth: int) -> dict:
    out = {}
    for i in range(depth):
        src, dst = f"{hf_prefix}.{i}.", f"{prefix}.{i}."
        for p in ("weight", "bias"):
            out[f"{dst}attn.qkv.{p}"] = torch.cat([state.pop(f"{src}attention.{x}_proj.{p}") for x in "qkv"])
            for theirs, ours in _BLOCK.items():
                out[f"{dst}{ours}.{p}"] = state.pop(f"{src}{theirs}.{p}")
    return out


def _need(cfg: dict, key: str, default=None):
    value = cfg.get(key, default)
    if isinstance(value, (list, tuple)) and len(value) == 2 and value[0] == value[1]:
        value = value[0]  # image_size / patch_size given as [h, w]: resdecay takes squares
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CheckpointError(f"config.json {key} is {value!r}, not a number (square images only); pass a ViTMAE config.json")
    return value


def _config_fields(cfg: dict) -> dict:
    """MAEConfig fields the ViTMAE config.json states (dimensions, heads, loss, mask ratio)."""
    if cfg.get("model_type", "vit_mae") != "vit_mae":
        raise CheckpointError(f"config.json is a {cfg.get('model_type')!r} model, not vit_mae; --format hf-vitmae takes a "
                              "ViTMAEForPreTraining folder")
    if cfg.get("hidden_act", "gelu") != "gelu":
        raise CheckpointError(f"config.json hidden_act {cfg['hidden_act']!r}: resdecay's MLPs use exact gelu only")
    D, Dd = _need(cfg, "hidden_size", 768), _need(cfg, "decoder_hidden_size", 512)
    ratio = _need(cfg, "intermediate_size", 3072) / D
    return {"img_size": _need(cfg, "image_size", 224), "patch_size": _need(cfg, "patch_size", 16),
            "in_chans": _need(cfg, "num_channels", 3), "embed_dim": D, "depth": _need(cfg, "num_hidden_layers", 12),
            "num_heads": _need(cfg, "num_attention_heads", 12), "mlp_ratio": ratio, "decoder_embed_dim": Dd,
            "decoder_depth": _need(cfg, "decoder_num_hidden_layers", 8),
            "decoder_num_heads": _need(cfg, "decoder_num_attention_heads", 16),
            "mask_ratio": float(_need(cfg, "mask_ratio", 0.75)), "norm_pix_loss": bool(cfg.get("norm_pix_loss", False))}


def _weight_fields(state: dict) -> dict:
    """The dimensions the (5.x-named) weights have."""
    proj = state["vit.embeddings.patch_embeddings.projection.weight"]
    n = int(state["vit.embeddings.position_embeddings"].shape[1]) - 1
    D, Dd = int(proj.shape[0]), int(state["decoder.decoder_norm.weight"].shape[0])
    return {"img_size": math.isqrt(n) * int(proj.shape[2]), "patch_size": int(proj.shape[2]), "in_chans": int(proj.shape[1]),
            "embed_dim": D, "depth": _count(state, "vit.layers"), "mlp_ratio": int(state["vit.layers.0.mlp.fc1.weight"].shape[0]) / D,
            "decoder_embed_dim": Dd, "decoder_depth": _count(state, "decoder.decoder_layers")}


def _decay_section(hf_config: dict) -> dict:
    """The decay config.json records under "resdecay" (``resdecay.nn.config_record``'s schema, or the one exports wrote
    before it) as MAE fields: alpha 1 when there is none; a record resdecay's MAE cannot express (the
    decay of the whole model in one schedule, skips, a decoder decayed otherwise than the encoder) is refused."""
    section = hf_config.get("resdecay")
    if section is None:
        return {"alpha_min": 1.0}
    try:
        steps, _ = parse(section, "config.json")
    except UserError as e:
        raise CheckpointError(str(e)) from None
    by_on = {s.get("on"): s for s in steps}
    encoder = by_on.get("ViTMAEModel")
    decoder = by_on.get("ViTMAEDecoder")
    same = decoder is None or {k: v for k, v in decoder.items() if k != "on"} == {k: v for k, v in encoder.items() if k != "on"}
    if not steps or len(by_on) != len(steps) or set(by_on) - {"ViTMAEModel", "ViTMAEDecoder"} or encoder is None or not same \
            or encoder.get("shortcut", "decay") != "decay":
        what = "; ".join(f"{s['op']} {s.get('on', '')}".strip() for s in steps) or "no step"
        raise CheckpointError(f"config.json's \"resdecay\" section records {what}, which resdecay's MAE cannot express (its "
                              "decay is the encoder's, the decoder's only alike, and no skips); load it with transformers' "
                              "from_pretrained and resdecay.interop.restore(model, folder)")
    return {"alpha_min": encoder["alpha_min"], "schedule": encoder["schedule"], "decay_branches": encoder["branches"],
            "decoder_decay": decoder is not None}


def vitmae_to_mae_state(hf_state: dict, hf_config: dict) -> tuple[dict, dict]:
    """A ``ViTMAEForPreTraining`` state_dict (transformers 5.x or 4.x names) and its config.json as
    resdecay's plain MAE: (state_dict, ``MAEConfig`` keyword arguments).

    A config that disagrees with the weights' shapes, or a ViTMAE resdecay cannot express, is a
    one-line ``CheckpointError``. ``layer_norm_eps`` other than 1e-6 warns (``LayerNormEpsWarning``).

    Args:
        hf_state: the weights, e.g. ``ViTMAEForPreTraining.state_dict()``.
        hf_config: its config, e.g. ``model.config.to_dict()`` or config.json.
    """
    state = _v5_names(hf_state)
    if not any(k.startswith("decoder.decoder_layers.") for k in state) or "vit.embeddings.cls_token" not in state:
        raise CheckpointError("the weights are not a ViTMAEForPreTraining (no vit.embeddings.* / decoder.decoder_layers.*); "
                              "save the pretraining model, not ViTMAEModel, with its decoder")
    fields = _config_fields(hf_config)
    try:
        have = _weight_fields(state)
    except KeyError as e:
        raise CheckpointError(f"the ViTMAE weights have no {e.args[0]}; they are damaged or not a ViTMAEForPreTraining") from None
    for key, value in have.items():
        if fields[key] != value:
            raise CheckpointError(f"config.json says {HF_NAMES[key]} {fields[key]:g} (model.{key} = {fields[key]:g}) but the "
                                  f"weights have {value:g}; the config and weights come from different models: save them "
                                  "together with save_pretrained")
    dec_ratio = _need(hf_config, "decoder_intermediate_size", 2048) / fields["decoder_embed_dim"]
    if dec_ratio != fields["mlp_ratio"]:
        raise CheckpointError(f"config.json has an encoder MLP ratio {fields['mlp_ratio']:g} but a decoder one {dec_ratio:g}; "
                              "resdecay's MAE uses one model.mlp_ratio for both, so this ViTMAE has no resdecay form")
    if not hf_config.get("qkv_bias", True):  # no bias == a zero bias: resdecay's qkv always has one
        for prefix in ("vit.layers", "decoder.decoder_layers"):
            for k in [k for k in state if k.startswith(prefix) and re.search(r"attention\.[qkv]_proj\.weight$", k)]:
                state.setdefault(k[:-len("weight")] + "bias", torch.zeros(state[k].shape[0], dtype=state[k].dtype))
    eps = hf_config.get("layer_norm_eps", 1e-12)
    if eps != RESDECAY_EPS:
        warnings.warn(f"config.json has layer_norm_eps {eps:g} but resdecay's LayerNorms use {RESDECAY_EPS:g}, so its outputs "
                      "differ from transformers' (by about that epsilon over the activations' variance)", LayerNormEpsWarning, stacklevel=2)
    try:
        out = {ours: state.pop(theirs) for theirs, ours in _FLAT.items()}
        out.update(_blocks_to_mae(state, "vit.layers", "blocks", fields["depth"]))
        out.update(_blocks_to_mae(state, "decoder.decoder_layers", "decoder_blocks", fields["decoder_depth"]))
    except KeyError as e:
        raise CheckpointError(f"the ViTMAE weights have no {e.args[0]}; they are damaged or not a ViTMAEForPreTraining") from None
    if state:
        raise CheckpointError(f"the ViTMAE weights hold {len(state)} key(s) resdecay's MAE has no place for (first "
                              f"{next(iter(state))}); only plain ViTMAEForPreTraining weights import")
    kwargs = {**fields, **_decay_section(hf_config), "shortcut": "decay", "skips": False, "encoder_norm": True,
              "zero_init": False}
    return out, kwargs


def _blocks_to_hf(state: dict, prefix: str, hf_prefix: str, depth: int, v4: bool) -> dict:
    out = {}
    for i in range(depth):
        src, dst = f"{prefix}.{i}.", f"{hf_prefix}.{i}."
        for p in ("weight", "bias"):
            for x, part in zip("qkv", state[f"{src}attn.qkv.{p}"].chunk(3), strict=True):
                out[f"{dst}attention.{x}_proj.{p}"] = part.clone()
            out.update({f"{dst}{theirs}.{p}": state[f"{src}{ours}.{p}"] for theirs, ours in _BLOCK.items()})
    if v4:  # the hub's layout, which transformers 4.x reads and 5.x converts on load
        back = {new: old for old, new in _V4_TO_V5.items()}
        out = {re.sub(r"^vit\.layers\.", "vit.encoder.layer.", k): v for k, v in out.items()}
        out = {re.sub(r"\.(attention\.[qkvo]_proj|mlp\.fc[12])\.", lambda m: f".{back[m.group(1)]}.", k): v for k, v in out.items()}
    return out


def vitmae_config(mae_config) -> dict:
    """The ViTMAE config.json of an ``MAEConfig`` (plain or decayed, without skips), refusing in one
    line what ViTMAE cannot express."""
    c = mae_config
    if getattr(c, "family", "mae") != "mae":
        raise UserError(f"--to hf-vitmae exports an MAE; this is model.family {c.family!r}")
    if c.skips:
        raise UserError("a U-Net MAE (model.skips=true) has no ViTMAE form: transformers' ViTMAE has no encoder->decoder "
                        "skips; export it --to hf (resdecay.from_pretrained) or --to timm (its encoder)")
    if not c.encoder_norm or c.shortcut != "decay" or getattr(c, "hyper_streams", 1) > 1:
        what = ("no final encoder norm" if not c.encoder_norm else f"model.shortcut={c.shortcut}" if c.shortcut != "decay"
                else f"model.hyper_streams={c.hyper_streams} (hyper-connections)")
        raise UserError(f"this MAE has {what}, which ViTMAE cannot express; export it --to hf instead")
    hidden, dec_hidden = c.embed_dim * c.mlp_ratio, c.decoder_embed_dim * c.mlp_ratio
    if hidden != int(hidden) or dec_hidden != int(dec_hidden):
        raise UserError(f"model.mlp_ratio {c.mlp_ratio} gives a fractional MLP width; ViTMAE needs whole ones")
    cfg = {"architectures": ["ViTMAEForPreTraining"], "model_type": "vit_mae", "hidden_size": c.embed_dim,
           "num_hidden_layers": c.depth, "num_attention_heads": c.num_heads, "intermediate_size": int(hidden),
           "hidden_act": "gelu", "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0, "initializer_range": 0.02,
           "layer_norm_eps": RESDECAY_EPS, "image_size": c.img_size, "patch_size": c.patch_size, "num_channels": c.in_chans,
           "qkv_bias": True, "decoder_hidden_size": c.decoder_embed_dim, "decoder_num_hidden_layers": c.decoder_depth,
           "decoder_num_attention_heads": c.decoder_num_heads, "decoder_intermediate_size": int(dec_hidden),
           "mask_ratio": c.mask_ratio, "norm_pix_loss": c.norm_pix_loss}
    if c.alpha_min < 1:  # resdecay.nn.config_record's schema: what decayify would have recorded
        decay = {"alpha_min": c.alpha_min, "schedule": c.schedule, "branches": c.decay_branches}
        ons = ("ViTMAEModel", "ViTMAEDecoder") if c.decoder_decay else ("ViTMAEModel",)
        cfg["resdecay"] = {"version": VERSION, "steps": [{"op": "decayify", "on": on, **decay} for on in ons],
                           "note": "transformers ignores this section and runs the model without its decayed shortcuts; "
                           "resdecay.interop.restore(model) after from_pretrained re-applies them, and resdecay "
                           "import-weights --format hf-vitmae reads them"}
    return cfg


def mae_to_vitmae_state(state: dict, mae_config, *, layout: str = "v5") -> tuple[dict, dict]:
    """resdecay's MAE weights as ``ViTMAEForPreTraining``'s: (state_dict, config.json dict).

    A decayed model (alpha_min < 1) is converted with its decay under ``"resdecay"`` in the config
    and a ``DecayDroppedWarning`` (transformers runs it without the decay); a U-Net MAE is refused.
    Branch gains (``model.branch_scale``) are folded into each branch's last Linear.

    Args:
        state: the MAE's ``state_dict()``.
        mae_config: its ``MAEConfig``.
        layout: ``"v5"`` (transformers 5.x names: ``load_state_dict`` on a 5.x model) or ``"v4"``
            (the hub's 4.x names, which both 4.x and 5.x ``from_pretrained`` read).
    """
    if layout not in ("v4", "v5"):
        raise UserError(f"layout must be 'v4' or 'v5', got {layout!r}")
    cfg = vitmae_config(mae_config)
    if "resdecay" in cfg:
        warnings.warn(f"this MAE has decayed shortcuts (alpha_min {mae_config.alpha_min:g}); transformers' ViTMAE runs it "
                      "without them (other outputs): the decay is kept under \"resdecay\" in config.json, and "
                      "resdecay.interop.restore(model) after from_pretrained (or resdecay import-weights --format "
                      "hf-vitmae) re-applies it", DecayDroppedWarning, stacklevel=2)
    state = fold_branch_gains(state)  # ViTMAE has no branch gains (model.branch_scale): into the Linears
    out = {theirs: state[ours] for theirs, ours in _FLAT.items()}
    out.update(_blocks_to_hf(state, "blocks", "vit.layers", mae_config.depth, layout == "v4"))
    out.update(_blocks_to_hf(state, "decoder_blocks", "decoder.decoder_layers", mae_config.decoder_depth, layout == "v4"))
    return {k: v.detach().to("cpu").contiguous().clone() for k, v in out.items()}, cfg


# ----------------------------------------------------------------------------- folders
def read_vitmae(src: str | Path) -> tuple[dict, dict, dict]:
    """(weights, config.json, where) of a ViTMAE folder, or of its weights file beside its config.json."""
    src = Path(src)
    folder = src if src.is_dir() else src.parent
    if src.is_dir():
        found = [src / name for name in WEIGHT_FILES if (src / name).is_file()]
        if not found:
            sharded = any(src.glob("*.index.json"))
            raise CheckpointError(f"{src} holds no {' or '.join(WEIGHT_FILES)}" + (" (sharded weights are not supported: save "
                                  "with save_pretrained(max_shard_size='100GB'))" if sharded else "; pass a folder written "
                                  "by ViTMAEForPreTraining.save_pretrained"))
        src = found[0]
    elif not src.is_file():
        raise CheckpointError(f"{src} does not exist; pass a ViTMAE folder (config.json + model.safetensors) or its weights file")
    config_path = folder / "config.json"
    if not config_path.is_file():
        raise CheckpointError(f"{folder} has no config.json beside {src.name}; --format hf-vitmae reads the sizes, mask ratio "
                              "and loss from it: pass the whole save_pretrained folder")
    config = read_json_object(config_path, "JSON config", "pass a ViTMAE config.json")
    return state_dict_of(read_weights_file(src), str(src)), config, str(folder)


def import_fields(src: str | Path) -> tuple[dict, dict, Stated]:
    """For ``import-weights --format hf-vitmae``: (MAE fields the weights fix, the weights under
    resdecay's names, what config.json states beside them, with where)."""
    hf_state, config, source = read_vitmae(src)
    try:
        state, kwargs = vitmae_to_mae_state(hf_state, config)
    except CheckpointError as e:
        raise CheckpointError(f"{source}: {e}") from None
    where = f"{source}/config.json"
    stated: Stated = {k: (kwargs[k], where) for k in ("num_heads", "decoder_num_heads", "mask_ratio", "norm_pix_loss")}
    decay_where = f"{where}'s resdecay section" if "resdecay" in config else f"{where} (a plain ViTMAE: no resdecay section)"
    stated.update({k: (kwargs[k], decay_where) for k in DECAY_KEYS if k in kwargs})
    fixed = {k: v for k, v in kwargs.items() if k not in stated}
    return fixed, state, stated


def export_to_vitmae(checkpoint: str | Path, out: str | Path, ema: bool = False) -> Path:
    """``resdecay export CKPT --to hf-vitmae``: a folder (config.json, model.safetensors) that
    ``transformers.ViTMAEForPreTraining.from_pretrained(out)`` loads, with resdecay's outputs.

    Args:
        checkpoint: a plain (or decayed, see the module doc) MAE checkpoint, or a save_pretrained folder of one.
        out: the folder to write (new, empty, or an earlier hf-vitmae export).
        ema: export the EMA weights; refused when the run kept none.
    """
    from safetensors.torch import save

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"--out {out} is a file; pass a folder to write config.json and model.safetensors into")
    if out.is_dir() and any(out.iterdir()) and not _exported_here(out):
        raise UserError(f"--out {out} already holds other files; pass a new or empty folder (an earlier hf-vitmae export is overwritten)")
    check_out_file(out / "config.json")
    model, cfg = source_model(checkpoint, ema)
    if getattr(model, "resdecay_spec", None) is not None:  # decayify on top of the family's own decay
        raise UserError(f"{checkpoint} was decayified after training (model.resdecay_spec), which ViTMAE cannot record; "
                        "export it --to hf")
    state, config = mae_to_vitmae_state(model.state_dict(), cfg, layout="v4")
    config["resdecay_export"] = {"source": Path(checkpoint).name, "weights": "ema" if ema else "model"}
    # transformers refuses a safetensors file without format "pt" in its metadata
    write_bytes_atomically(save(state, metadata={"format": "pt"}), out / "model.safetensors")
    write_bytes_atomically((json.dumps(config, indent=2) + "\n").encode(), out / "config.json")
    return out


def _exported_here(folder: Path) -> bool:
    try:
        return "resdecay_export" in json.loads((folder / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError, TypeError):
        return False
