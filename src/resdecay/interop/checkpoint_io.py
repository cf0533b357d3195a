"""Checkpoint I/O that every interop format shares, so that the formats stand side by side: each
format file imports this module (and ``files.py``, ``pretrained_config.py``), never another format.

    reading weights     ``read_weights_file`` (``torch.load(weights_only=True)`` or safetensors),
                        ``read_safetensors``, ``state_dict_of``, ``load_strict`` (one line for the first
                        mismatch; a ``torch.compile`` wrapper on either side is looked through)
    what a file states  ``Stated``: model field -> (value, where the file says it), as ``file_meta.py``
                        and ``hf_vitmae.py`` report it to ``import_weights.py``
    timm exports        ``TIMM_FORMAT`` and ``exported_kwargs``: the metadata ``export_timm.py`` writes,
                        read back by ``export_timm.load_exported`` and ``file_meta.py``
    shared folders      the ``save_pretrained`` layout (``CONFIG_NAME``, ``WEIGHTS_NAME`` ...) and
                        ``load_folder``: the model such a folder holds, checked (``pretrained.py``'s
                        ``from_pretrained`` adds the hub methods)
    the model to export ``source_model``: a resdecay checkpoint or a save_pretrained folder, as
                        ``export --to timm`` and ``export --to hf-vitmae`` take them

The format files: ``weights.py`` (decayified weights with their spec), ``export_timm.py`` (timm ViT),
``file_meta.py`` + ``foreign_vit.py`` (official MAE, the authors' U-Net MAE, timm ViT state_dicts),
``hf_vitmae.py`` (HF ViTMAE), ``hf_unet.py`` (skips inside HF ViTMAE) and ``pretrained.py``
(save_pretrained folders); ``import_weights.py`` dispatches ``import-weights --format`` to them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import torch
import torch.nn as nn

from ..errors import CheckpointError, UserError
from ..io import safe_load
from ..nn.spec import COMPILED_PREFIX, unwrap_compiled
from ..train.checkpoint import load_checkpoint, load_model
from ..train.import_formats import Stated  # noqa: F401  (model field -> (value, where the file says it); the formats import it from here)
from ..train.sharded_checkpoint import is_dcp_folder
from .files import read_json_object
from .pretrained_config import (
    architecture_dict,
    build_from_config,
    check_config,
    check_factors,
    check_weights_metadata,
    family_config,
)

TIMM_FORMAT = "resdecay-timm-export-v1"  # the "format" metadata of ``resdecay export --to timm`` files
WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors")
# the files of a save_pretrained folder (huggingface_hub's layout)
CONFIG_NAME, WEIGHTS_NAME, CARD_NAME, EVAL_NAME = "config.json", "model.safetensors", "README.md", "eval.json"


# ----------------------------------------------------------------------------- reading weights
def read_weights_file(path: str | Path) -> Any:
    """The contents of a weights file on CPU, or a one-line CheckpointError: ``torch.load(path,
    weights_only=True)``, or for ``.safetensors`` ``{"model": tensors, "metadata": {...}}`` (with
    ``resdecay_spec`` parsed from the metadata where ``resdecay export`` stored it).

    Args:
        path: a ``.pt`` / ``.pth`` / ``.safetensors`` file.
    """
    path = Path(path)
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES)[:3]
        hint = f" (it holds {', '.join(inside)})" if inside else f" (it holds no {' / '.join(WEIGHT_SUFFIXES)} file)"
        raise CheckpointError(f"{path} is a folder; pass the checkpoint file itself, a .pt / .pth / .safetensors file{hint}")
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist; pass a checkpoint file")
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    return safe_load(path, CheckpointError, f"{path} is not a readable weights file ({{reason}})")


def read_safetensors(path: Path) -> dict:
    """``{"model": tensors, "metadata": {...}}`` of a safetensors file (it holds no code to run);
    ``resdecay_spec`` beside them when the metadata carries one."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
        state = load_file(str(path))
    except Exception as e:
        raise CheckpointError(f"{path} is not a readable safetensors file ({' '.join(str(e).split())[:120]})") from None
    blob: dict[str, Any] = {"model": state, "metadata": meta}
    if "resdecay_spec" in meta:
        try:
            blob["resdecay_spec"] = json.loads(meta["resdecay_spec"])
        except ValueError as e:
            raise CheckpointError(f"{path}: its resdecay_spec metadata is not JSON ({e}); export it again") from None
    return blob


def state_dict_of(obj: Any, source: str) -> dict[str, torch.Tensor]:
    """The state_dict inside a loaded checkpoint: ``obj["model"]``, ``obj["state_dict"]`` or ``obj``.

    Args:
        obj: what ``torch.load`` returned.
        source: where it came from, for the error message.
    """
    if isinstance(obj, Mapping):
        for key in ("model", "state_dict"):
            if isinstance(obj.get(key), Mapping):
                obj = obj[key]
                break
        if obj and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
            return dict(obj)
    raise CheckpointError(f"{source} holds no state_dict (expected a dict of tensors, or one under 'model')")


def without_compiled_prefix(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with the ``_orig_mod.`` of a compiled model's ``state_dict`` taken off (files written from
    ``torch.compile(model).state_dict()``); other states as they are."""
    if state and all(k.startswith(COMPILED_PREFIX) for k in state):
        return {k[len(COMPILED_PREFIX):]: v for k, v in state.items()}
    return dict(state)


def load_strict(model: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """``model.load_state_dict(state)`` that names the first mismatch in one line. A ``torch.compile``
    wrapper on either side (the model, or ``_orig_mod.`` keys in the file) is looked through.

    Args:
        model: the target module.
        state: the weights (keys as ``model.state_dict()``).
        source: where they came from, for the error message.

    Raises:
        CheckpointError: missing keys, unexpected keys, or a tensor of another shape.
    """
    model, state = unwrap_compiled(model), without_compiled_prefix(state)
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k} {tuple(state[k].shape)} vs model {tuple(v.shape)}" for k, v in own.items()
              if k in state and tuple(state[k].shape) != tuple(v.shape)]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing key(s) (first {missing[0]})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected key(s) (first {unexpected[0]})")
    if shapes:
        problems.append(f"{len(shapes)} shape mismatch(es) (first {shapes[0]})")
    if problems:
        raise CheckpointError(f"{source} does not fit {type(model).__name__}: {'; '.join(problems)}; "
                              "build the model with the checkpoint's dimensions")
    model.load_state_dict(state, strict=True)


# ----------------------------------------------------------------------------- timm exports
def exported_kwargs(meta: dict, source: str) -> dict:
    """The ``timm_kwargs`` of an export's metadata (every dimension, the heads included), checked.

    Args:
        meta: the safetensors metadata ``resdecay export`` wrote.
        source: the file, for the error message.
    """
    try:
        kwargs = json.loads(meta["timm_kwargs"])
    except (KeyError, ValueError) as e:
        raise CheckpointError(f"{source}: unreadable export metadata ({e}); export it again") from None
    if not isinstance(kwargs, dict):
        raise CheckpointError(f"{source}: export metadata timm_kwargs is not a dict; export it again")
    return kwargs


# ----------------------------------------------------------------------------- save_pretrained folders
def read_folder(folder: Path) -> tuple[dict, dict, dict]:
    """(config.json, the weights, their safetensors metadata) of a save_pretrained folder, each
    checked, or a one-line error."""
    config_path, weights_path = folder / CONFIG_NAME, folder / WEIGHTS_NAME
    for path, what in ((config_path, "the model's config"), (weights_path, "its weights")):
        if not path.is_file():
            raise CheckpointError(f"{folder} holds no {path.name} ({what}); pass a folder written by resdecay.save_pretrained "
                                  "or resdecay export --to hf (a download may have been cut short: fetch it again)")
    config = check_config(read_json_object(config_path, CONFIG_NAME, "save the model again"), str(config_path))
    blob = read_safetensors(weights_path)
    return config, blob["model"], blob["metadata"]


def load_folder(folder: Path) -> tuple[nn.Module, dict]:
    """(the model, its config.json) of a local save_pretrained folder: rebuilt, decay re-applied, the
    weights loaded strictly and the factors checked against config.json; a one-line error otherwise."""
    config, state, meta = read_folder(folder)
    model, _ = build_from_config(config, str(folder / CONFIG_NAME))  # an unregistered family is named first
    # the weights repeat config.json in their metadata: a config.json from another save is refused, not trusted
    check_weights_metadata(config, meta, str(folder), CONFIG_NAME, WEIGHTS_NAME)
    load_strict(model, state, str(folder / WEIGHTS_NAME))
    check_factors(model, config, str(folder))
    return model, config


# ----------------------------------------------------------------------------- the model an export reads
def source_model(checkpoint: str | Path, ema: bool) -> tuple[nn.Module, object]:
    """(model, its model config) of a resdecay checkpoint or of a ``save_pretrained`` folder."""
    if Path(checkpoint).is_dir() and not is_dcp_folder(checkpoint):  # (a sharded run's checkpoint is a folder too)
        if ema:
            raise UserError(f"--ema applies to a checkpoint; {checkpoint} is a save_pretrained folder with one set of weights")
        model, config = load_folder(Path(checkpoint))
        if config["kind"] != "resdecay":
            raise UserError(f"{checkpoint} holds a decayified {architecture_dict(config)['library']} model, not a resdecay encoder; "
                            "load it with resdecay.from_pretrained")
        return model.eval(), family_config(model)
    state = load_checkpoint(checkpoint)
    if ema and "ema" not in state:  # load_model would fall back to the raw weights without a word
        raise UserError(f"{checkpoint} holds no EMA weights (the run was trained with train.ema_decay=0); "
                        "drop --ema to export its weights")
    model, cfg = load_model(checkpoint, ema=ema, state=state)
    return model, cfg.model


def fold_branch_gains(state: dict) -> dict:
    """A block's branch gain ``ls{1,2}.gamma`` (timm's LayerScale, resdecay's ``model.branch_scale``) multiplies the
    branch output: folded into the branch's last Linear (attn.proj / mlp.fc2), exactly up to float rounding, for a
    format whose blocks have no gain. A single ``ls1.gamma`` without ``ls2`` is resdecay's ReZero, one gain for both adds."""
    out = dict(state)
    for key in [k for k in state if k.endswith((".ls1.gamma", ".ls2.gamma"))]:
        block, which = key.rsplit(".", 2)[0], key.split(".")[-2]
        gamma = out.pop(key)  # (D,), or (1,) for resdecay's ReZero / SkipInit scalar (nn.branch_scale)
        layers = [f"{block}.attn.proj" if which == "ls1" else f"{block}.mlp.fc2"]
        if which == "ls1" and f"{block}.ls2.gamma" not in state:  # resdecay's ReZero: one gain for both adds
            layers.append(f"{block}.mlp.fc2")
        for layer in layers:
            out[f"{layer}.weight"] = out[f"{layer}.weight"] * gamma[:, None]
            out[f"{layer}.bias"] = out[f"{layer}.bias"] * gamma
    return out

