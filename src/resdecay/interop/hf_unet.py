"""The paper's U-Net MAE inside Hugging Face transformers: encoder->decoder long skips for a
``ViTMAEForPreTraining``, wired as resdecay's U-Net MAE (= the authors' code) wires them.

The decay alone on an HF ViTMAE is the paper's worst cell (Table 3a: LP 61.5 without skips against 83.6
with them), so ``unet_skips`` adds the rest of the method, by composition as ``decayify`` does:

* one ``SkipFusion`` per skip source (resdecay's own module: the encoder block's visible tokens get the
  skip's mask token, are put back in image order, concatenated with the decoder stream and added
  through Linear-SiLU-Linear whose last Linear starts at zero, so a new skip starts silent);
* the sources are ``choose_skip_sources`` (every other encoder block ending with the last one; decoder
  layer j takes the j-th deepest);
* ``decoder_start="content_free"`` (the paper's): the decoder stream starts from its positions and a cls
  token only, through a Dd -> Dd ``decoder_embed``, and the image enters through the skips alone, so the
  bottleneck must carry what the decoder needs. ``decoder_start="encoder"`` keeps HF's start (the encoder
  output, mask tokens, positions): with zero fusions and alpha 1 the model is then exactly the original.

Forward hooks on the encoder layers keep their outputs, a pre-hook on the decoder keeps ``ids_restore``, and
a pre-hook on each decoder layer j fuses the j-th skip into its input; what they hand each other is kept per
thread in ``nn/adapters/hooks.thread_state``, the table decayify's own hooks use. New parameters
live under ``model.resdecay_unet.`` (``skip_fusions.{j}.{mask_token,fc1,fc2}``, and for the content-free
start ``decoder_cls_token``, ``decoder_embed``); HF's own keys are unchanged. The settings are recorded in
``model.config.resdecay`` beside any ``decayify`` (one schema, ``resdecay.nn.config_record``; saved in config.json by
``save_pretrained``), and ``restore(model, folder)`` re-does decay and skips, in their order, on the model
transformers' own ``from_pretrained`` loaded, and loads the ``resdecay_unet.`` weights from the folder.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Literal

import torch
import torch.nn as nn

from ..errors import CheckpointError, UserError
from ..models.mae import SkipFusion, choose_skip_sources
from ..nn.adapters.hooks import thread_state
from ..nn.config_record import KEY, parse, read_section, recorder, replaying, write_section
from ..nn.decayify import block_adapters, decayify
from ..nn.spec import unwrap_compiled
from .files import read_json_object

PREFIX = "resdecay_unet."
_REF = "_resdecay_unet_ref"  # on hooked HF modules: the UNetSkips they serve (a plain attribute, not a child)


def _fresh_state() -> dict:
    return {"skips": {}, "ids_restore": None}


class UNetSkips(nn.Module):
    """The long skips of one HF ViTMAE (its new parameters and the hooks' shared state)."""

    def __init__(self, enc_dim: int, dec_dim: int, sources: list[int], decoder_start: str):
        super().__init__()
        self.sources, self.decoder_start = list(sources), decoder_start
        self.skip_fusions = nn.ModuleList(SkipFusion(enc_dim, dec_dim) for _ in self.sources)
        for fusion in self.skip_fusions:  # the last Linear at zero: a new skip starts silent (paper §3)
            nn.init.normal_(fusion.mask_token, std=0.02)
            nn.init.xavier_uniform_(fusion.fc1.weight)
            nn.init.zeros_(fusion.fc1.bias)
            nn.init.zeros_(fusion.fc2.weight)
            nn.init.zeros_(fusion.fc2.bias)
        if decoder_start == "content_free":
            self.decoder_cls_token = nn.Parameter(torch.zeros(1, 1, dec_dim))
            self.decoder_embed = nn.Linear(dec_dim, dec_dim)
            nn.init.normal_(self.decoder_cls_token, std=0.02)
            nn.init.xavier_uniform_(self.decoder_embed.weight)
            nn.init.zeros_(self.decoder_embed.bias)
        self.__dict__["_key"] = object()  # this instance's per-thread state (a deepcopy gets its own)

    def state(self) -> dict:
        """This thread's skips and ``ids_restore`` of the current forward (``nn/adapters/hooks.thread_state``)."""
        return thread_state(self.__dict__["_key"], _fresh_state)

    def content_free_start(self, decoder_pos_embed: torch.Tensor, batch: int) -> torch.Tensor:
        """(B, 1+N, Dd): positions and a cls token only, as resdecay's U-Net MAE starts its decoder."""
        start = decoder_pos_embed.clone()
        start[:, :1] = start[:, :1] + self.decoder_cls_token
        return self.decoder_embed(start).expand(batch, -1, -1)


def _keep_skip(layer: nn.Module, args: tuple, out):
    unet = layer.__dict__[_REF]
    unet.state()["skips"][layer.__dict__["_resdecay_source"]] = out[0] if isinstance(out, tuple) else out


def _keep_ids_restore(decoder: nn.Module, args: tuple, kwargs: dict) -> None:
    unet = decoder.__dict__[_REF]
    unet.state()["ids_restore"] = args[1] if len(args) > 1 else kwargs["ids_restore"]


def _fuse(layer: nn.Module, args: tuple, kwargs: dict):
    unet, j = layer.__dict__[_REF], layer.__dict__["_resdecay_fusion"]
    state = unet.state()
    x = args[0] if args else kwargs.pop("hidden_states")
    if j == 0 and unet.decoder_start == "content_free":
        x = unet.content_free_start(layer.__dict__["_resdecay_pos"]().to(x.dtype), x.shape[0])
    x = unet.skip_fusions[j](x, state["skips"].pop(unet.sources[j]), state["ids_restore"])
    return (x, *args[1:]), kwargs


def _layers(part: nn.Module, names: tuple[str, ...]) -> nn.ModuleList:
    for path in names:
        try:
            return part.get_submodule(path)
        except AttributeError:
            continue
    raise UserError(f"unet_skips: {type(part).__name__} has none of {', '.join(names)}; it needs a transformers "
                    "ViTMAEForPreTraining (4.x or 5.x layout)")


def fill_zero_positions(model: nn.Module) -> bool:
    """Fill a ViTMAE's frozen sin-cos position tables when they are all zero, in transformers' own layout
    (its ``build_2d_sinusoidal_position_embedding`` with the h/w halves swapped, as pretrained checkpoints
    hold them). transformers 5.x leaves both tables of a model built from a config at zero (its
    ``_init_weights`` zeroes the decoder's and skips the encoder's): such a model cannot tell patches apart,
    and a content-free decoder start, built from the positions alone, would be the same for every token.
    Returns whether anything was filled; loaded checkpoints have their tables and are left alone."""
    params = (model.vit.embeddings.position_embeddings, model.decoder.decoder_pos_embed)
    if all(bool(p.any()) for p in params):
        return False
    from transformers.models.vit_mae.modeling_vit_mae import build_2d_sinusoidal_position_embedding

    grid = int(model.vit.embeddings.patch_embeddings.num_patches ** 0.5)
    for param in params:
        pos = build_2d_sinusoidal_position_embedding(grid, grid, embed_dim=param.shape[-1], cls_token=True)
        half = pos.shape[-1] // 2
        with torch.no_grad():
            param.copy_(torch.cat([pos[..., half:], pos[..., :half]], dim=-1).unsqueeze(0))
    return True


def unet_skips(model: nn.Module, alpha_min: float | None = None, schedule: str = "linear",
               skip_sources: list[int] | None = None,
               decoder_start: Literal["content_free", "encoder"] = "content_free", zero_init: bool = False) -> nn.Module:
    """Make an HF ``ViTMAEForPreTraining`` the paper's U-Net MAE (in place): long skips, and with
    ``alpha_min`` the decayed encoder (``decayify(model.vit, alpha_min, schedule)``; the decoder stays
    as it is, plain unless decayified before, as the paper's).

    Args:
        model: a transformers ``ViTMAEForPreTraining``.
        alpha_min: decay the encoder to this factor (None: leave the encoder as it is, decayified or not).
        schedule: the alpha schedule (``resdecay.schedule``).
        skip_sources: encoder layers feeding the decoder (default: ``choose_skip_sources``).
        decoder_start: "content_free" (the paper's wiring) or "encoder" (HF's start; exact at alpha 1).
        zero_init: also zero every encoder / decoder branch's last layer and the pixel head (the paper's
            init, for a model about to be trained from scratch). The fusions' last Linear is always zero.

    Returns:
        ``model``, with ``model.resdecay_unet`` holding the new parameters and ``model.config.resdecay``
        the record of it (``resdecay.nn.config_record``). Sin-cos position tables left all zero (a model built from a
        config in transformers 5.x) are filled, with a warning: with them at zero, masked tokens are
        alike and, zero-initialised, nothing before the pixel head ever gets a gradient. Every refusal
        comes before anything is changed.
    """
    if type(model).__name__ != "ViTMAEForPreTraining" or not hasattr(model, "decoder"):
        raise UserError(f"unet_skips takes a transformers ViTMAEForPreTraining, not {type(model).__name__}")
    if decoder_start not in ("content_free", "encoder"):
        raise UserError(f"unet_skips: decoder_start must be 'content_free' or 'encoder', not {decoder_start!r}")
    if hasattr(model, "resdecay_unet"):
        raise UserError("unet_skips: this model already has its skips (model.resdecay_unet); build a fresh model")
    enc_layers = _layers(model.vit, ("layers", "encoder.layer"))
    dec_layers = model.decoder.decoder_layers
    try:
        sources = choose_skip_sources(len(enc_layers), len(dec_layers), skip_sources)
    except ValueError as e:
        raise UserError(f"unet_skips: {str(e).replace('model.skip_sources', 'skip_sources')}") from None
    record = recorder(model, "unet_skips")  # checks the config's record before anything changes
    if alpha_min is not None:  # refuses a bad alpha_min / schedule before it changes anything
        decayify(model.vit, alpha_min=alpha_min, schedule=schedule)
    if fill_zero_positions(model):
        warnings.warn("unet_skips: this ViTMAE's sin-cos position tables were all zero (transformers 5.x leaves a model "
                      "built from a config so); filled with transformers' own 2-D sin-cos tables", stacklevel=2)
    if zero_init:
        zero_branches(model)
    cfg = model.config
    unet = UNetSkips(cfg.hidden_size, cfg.decoder_hidden_size, sources, decoder_start)
    model.resdecay_unet = unet
    _install_hooks(model, unet, enc_layers, dec_layers)
    if record is not None:
        record({"op": "unet_skips", "skip_sources": sources, "decoder_start": decoder_start})
    return model


def zero_branches(model: nn.Module) -> None:
    """The paper's init of a ViTMAE: the last layer of every encoder and decoder branch and the pixel head
    at zero (the factors, decayed or not, stay as they are)."""
    for _, block, adapter in block_adapters(model.vit) + block_adapters(model.decoder):
        adapter.zero_init(block)
    nn.init.zeros_(model.decoder.decoder_pred.weight)
    nn.init.zeros_(model.decoder.decoder_pred.bias)


def _install_hooks(model, unet, enc_layers, dec_layers) -> None:
    for i in unet.sources:
        layer = enc_layers[i]
        layer.__dict__[_REF], layer.__dict__["_resdecay_source"] = unet, i
        layer.register_forward_hook(_keep_skip)
    model.decoder.__dict__[_REF] = unet
    model.decoder.register_forward_pre_hook(_keep_ids_restore, with_kwargs=True)
    decoder = model.decoder
    for j in range(len(unet.sources)):
        layer = dec_layers[j]
        layer.__dict__[_REF], layer.__dict__["_resdecay_fusion"] = unet, j
        layer.__dict__["_resdecay_pos"] = lambda: decoder.decoder_pos_embed
        layer.register_forward_pre_hook(_fuse, with_kwargs=True)


def restore(model: nn.Module, folder: str | Path | None = None, skip_weights: bool = True) -> nn.Module:
    """Re-do on ``model`` what its config records under ``resdecay`` (``decayify``, ``unet_skips``, in their
    order) and load the skips' weights from ``folder``: the model a library's ``from_pretrained(folder)``
    returns becomes the one that was saved. Returns ``model`` (in place), its record rewritten in this
    schema (an older one is read too).

    Args:
        model: what ``from_pretrained`` returned (transformers or diffusers).
        folder: the folder it was loaded from; needed for skips (their weights), and read for the
            record when the model's config has none.
        skip_weights: load the skips' trained weights from ``folder``; False builds them as ``unet_skips``
            initialises them (the same architecture afresh: ``resdecay eval``'s random-init baseline).

    Raises:
        UserError: one line: no record, a record this version cannot read, a folder that is missing,
            a module the record names that the model does not have, skips whose weights do not fit.
    """
    model = unwrap_compiled(model)
    folder = None if folder is None else Path(folder)
    if folder is not None and not folder.is_dir():
        raise UserError(f"restore: {folder} " + ("is a file; pass the folder save_pretrained wrote" if folder.exists()
                                                  else "does not exist; pass the folder save_pretrained wrote"))
    section, where = read_section(model), f"{type(model).__name__}.config"
    if section is None and folder is not None and (folder / "config.json").is_file():
        config = read_json_object(folder / "config.json", "JSON config", "pass the folder save_pretrained wrote")
        section, where = config.get(KEY), f"{folder / 'config.json'}"
    if section is None:
        own = f"{type(model).__name__}.config"
        places = f"neither {own} nor {folder / 'config.json'} has a" if folder is not None else f"{own} has no"
        raise UserError(f"nothing to restore: {places} 'resdecay' section (this model was saved without resdecay's "
                        "decay or skips, or loaded from another folder)")
    steps, note = parse(section, where)
    targets = [_target(model, s, where) if s["op"] == "decayify" else None for s in steps]
    skips = [s for s in steps if s["op"] == "unet_skips"]
    state = _skip_state(model, folder, where, skips, skip_weights)
    with replaying():
        for step, target in zip(steps, targets, strict=True):
            if step["op"] == "decayify":
                decayify(target, **{k: v for k, v in step.items() if k not in ("op", "on")})
            else:
                unet_skips(model, skip_sources=step["skip_sources"], decoder_start=step["decoder_start"])
    if state is not None:
        model.resdecay_unet.load_state_dict(state, strict=True)  # checked in _skip_state
    write_section(model, steps, note)
    return model


def _target(model: nn.Module, step: dict, where: str) -> nn.Module:
    """The module a decayify step names: ``model`` itself or its one submodule of that class."""
    if type(model).__name__ == step["on"]:
        return model
    found = [m for _, m in model.named_modules() if type(m).__name__ == step["on"]]
    if len(found) != 1:
        raise UserError(f"{where} records a decayify of a {step['on']}, but this {type(model).__name__} holds "
                        f"{len(found) or 'no'} such module(s); load the folder with the class it was saved from")
    return found[0]


def _skip_state(model: nn.Module, folder: Path | None, where: str, skips: list[dict], read: bool = True) -> dict | None:
    """The ``resdecay_unet.`` weights the record's skips need, read and checked against skips built as the
    record says before anything changes (so that a refusal leaves the model as it was)."""
    if not skips:
        return None
    if len(skips) > 1:
        raise UserError(f"{where} records unet_skips {len(skips)} times; a model has its skips once")
    if type(model).__name__ != "ViTMAEForPreTraining":
        raise UserError(f"{where} records encoder->decoder skips, which only a ViTMAEForPreTraining has; load the folder "
                        f"with ViTMAEForPreTraining.from_pretrained, not {type(model).__name__}")
    if hasattr(model, "resdecay_unet"):
        raise UserError(f"restore: this {type(model).__name__} already has its skips (model.resdecay_unet); pass the model "
                        "from_pretrained returned")
    if not read:
        return None
    if folder is None:
        raise UserError(f"{where} records encoder->decoder skips, whose weights from_pretrained drops: pass the folder "
                        "too, restore(model, folder)")
    from safetensors import safe_open  # transformers' own dependency, imported only where skips are restored

    state = {}
    for path in _weight_files(folder):
        with safe_open(str(path), framework="pt") as f:
            state.update({k[len(PREFIX):]: f.get_tensor(k) for k in f.keys() if k.startswith(PREFIX)})
    if not state:
        raise CheckpointError(f"{folder}: its weights hold no {PREFIX} tensors, which the skips {where} records need; "
                              "save the model with its save_pretrained after unet_skips")
    cfg, step = model.config, skips[0]
    try:
        sources = choose_skip_sources(len(_layers(model.vit, ("layers", "encoder.layer"))),
                                      len(model.decoder.decoder_layers), step["skip_sources"])
        UNetSkips(cfg.hidden_size, cfg.decoder_hidden_size, sources, step["decoder_start"]).load_state_dict(state)
    except (ValueError, RuntimeError) as exc:
        first = str(exc).strip().splitlines()[0]
        raise CheckpointError(f"{folder}: its {PREFIX} weights do not fit the skips {where} records ({first})") from None
    return state


def _weight_files(folder: Path) -> list[Path]:
    single, index = folder / "model.safetensors", folder / "model.safetensors.index.json"
    if single.is_file():
        return [single]
    if index.is_file():
        weight_map = read_json_object(index, "safetensors index", "save the model again").get("weight_map")
        if not isinstance(weight_map, dict):
            raise CheckpointError(f"{index} has no weight_map; save the model again")
        return sorted({folder / name for key, name in weight_map.items() if key.startswith(PREFIX)})
    raise CheckpointError(f"{folder}: no model.safetensors (nor model.safetensors.index.json) beside config.json; "
                          "the skip weights are in it")
