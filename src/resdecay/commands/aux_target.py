"""REPA's frozen target encoder (``train.aux=repa``), loaded from what ``resdecay eval`` can load, before a run
writes anything: ``timm:NAME`` / ``torchvision:NAME`` with ``train.aux_target_weights=FILE`` (``random``: its
random initialisation on purpose, seed 0; without either it is refused, as REPA to an untrained encoder), a transformers
folder (``interop/foreign_model.load_foreign`` builds it, ``stream/foreign.ForeignEncoder`` reads its last
block's tokens), or a resdecay MAE checkpoint (its encoder's last block). The training loop cannot import
these layers; it receives the result, an ``AuxTarget``.

The tokens read are the last residual block's output before any final norm, the tokens ``eval`` measures
(REPA reads DINOv2's normed ``x_norm_patchtokens``; a cosine loss ignores a common scale but not a norm's
centring). The input side is chosen as REPA chooses 224 px for DINOv2-B/14 under SiT's 16x16 tokens: the
side at which the encoder's token grid equals the diffusion model's. An encoder that refuses that side (a
ViT with a fixed position table) keeps its own side and its finer token map is resampled (area-weighted) to
the grid. A target without a square grid of patch tokens, one whose grid is coarser than the model's and
cannot be made finer (resampling up would invent the targets), or whose channels the data cannot give, is
refused in one line.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ..data import build_dataset
from ..data.info import IMAGENET_MEAN, IMAGENET_STD
from ..errors import CheckpointError, ConfigError, UserError, one_line
from ..interop.foreign_model import load_foreign
from ..stream.foreign import ForeignEncoder
from ..train.aux_objective import RANDOM_WEIGHTS, AuxTarget
from ..train.checkpoint import FORMAT, load_model
from ..train.config import RunConfig


def load_aux_target(cfg: RunConfig) -> AuxTarget | None:
    """``train.aux_target`` built, frozen and checked against the diffusion model's token grid and the data's
    channels (None unless ``train.aux=repa``); every refusal is one line naming the setting."""
    tc = cfg.train
    if tc.aux != "repa":
        return None
    spec, weights = tc.aux_target, tc.aux_target_weights
    if _is_checkpoint(spec):
        if weights or tc.aux_target_args:
            raise ConfigError(f"train.aux_target={spec} is a resdecay checkpoint: its weights and sizes are in it; drop "
                              "train.aux_target_weights and train.aux_target_args")
        encoder, tokens, side, chans, (mean, std) = _resdecay_encoder(spec)
        resizable = None
    else:
        encoder, tokens, side, chans, (mean, std) = _foreign_encoder(spec, weights, tc.aux_target_args)
        resizable = getattr(encoder.model, "set_input_size", None)  # timm ViTs: resample the position table
    data_chans, grid = cfg.model.in_chans, cfg.model.img_size // cfg.model.patch_size
    if chans != data_chans and not (data_chans == 1 and chans == 3):
        raise ConfigError(f"train.aux_target={spec} takes {chans}-channel images but the diffusion model trains on "
                          f"{data_chans}-channel ones; choose an encoder of {data_chans} (or 3, for grey data) channels")
    encoder.eval().requires_grad_(False)
    if len(mean) != chans:  # e.g. ImageNet's statistics for a grey encoder that records none: their channel mean
        mean, std = (sum(mean) / len(mean),) * chans, (sum(std) / len(std),) * chans
    side, target_grid, dim = _matching_side(spec, tokens, chans, side, grid, resizable)
    return AuxTarget(spec, weights, encoder, tokens, side, chans, target_grid, dim, tuple(mean), tuple(std))


def _is_checkpoint(spec: str) -> bool:
    """A file (not a folder, not a ``timm:`` spec) is read as a resdecay checkpoint."""
    return Path(spec).is_file() or spec.endswith(".pt")


def _resdecay_encoder(spec: str):
    """A resdecay MAE checkpoint's encoder: its cls token dropped, its data's normalisation."""
    try:
        model, run = load_model(spec)
    except CheckpointError as e:
        raise CheckpointError(f"train.aux_target: {e}") from None
    if run.model.family != "mae":
        raise ConfigError(f"train.aux_target={spec} is a resdecay {run.model.family!r} checkpoint; REPA's target is an "
                          f"image encoder: a resdecay MAE checkpoint ({FORMAT}), timm:NAME, torchvision:NAME or a "
                          "transformers folder")
    _, info = build_dataset(run.data, "train", run.model.img_size)  # the normalisation it was trained under

    def tokens(x: torch.Tensor) -> torch.Tensor:
        return model.forward_features(x)[:, 1:]  # MAE: [cls, patches]

    return model, tokens, run.model.img_size, run.model.in_chans, (info.mean, info.std)


def _foreign_encoder(spec: str, weights: str | None, args: dict):
    """A model ``resdecay eval --model`` reads (``args``: its ``--model-arg`` values), behind ``ForeignEncoder``:
    its prefix tokens dropped."""
    try:
        built = load_foreign(spec, None if weights == RANDOM_WEIGHTS else weights, dict(args))
        _check_target_weights(built, weights)
        encoder = ForeignEncoder(built.model, spec, built.weights, built.inputs.get("img_size"),
                                 built.inputs.get("in_chans"), built.conditioning)
    except (UserError, CheckpointError) as e:
        raise UserError(f"train.aux_target={spec}: {one_line(e)}") from None
    prefix = encoder.cfg.prefix_tokens

    def tokens(x: torch.Tensor) -> torch.Tensor:
        return encoder.forward_features(x)[:, prefix:]

    return encoder, tokens, encoder.cfg.img_size, encoder.cfg.in_chans, _input_stats(built.model, spec)


def _check_target_weights(built, weights: str | None) -> None:
    """A by-name encoder (timm / torchvision) without a weights file is built with random weights: REPA's gain
    comes from aligning to a *trained* encoder, so a forgotten file would make a run that looks like REPA and aligns
    to noise. It is refused unless ``random`` asks for that on purpose."""
    if built.random_weights and weights != RANDOM_WEIGHTS:
        raise ConfigError(f"no weights, and REPA would align to a randomly initialised encoder: give "
                          f"train.aux_target_weights=FILE (or train.aux_target_weights={RANDOM_WEIGHTS} to align to "
                          "one on purpose)")
    if weights == RANDOM_WEIGHTS and not built.random_weights:
        raise ConfigError(f"train.aux_target_weights={RANDOM_WEIGHTS} applies to timm:NAME / torchvision:NAME, which "
                          "are built by name; this one holds its own weights: drop train.aux_target_weights")


def _input_stats(model: torch.nn.Module, spec: str) -> tuple[tuple, tuple]:
    """The encoder's input normalisation of [0, 1] pixels: timm's ``pretrained_cfg``, a transformers folder's
    ``preprocessor_config.json``, else ImageNet's (torchvision's weights, REPA's DINOv2)."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    if cfg.get("mean") and cfg.get("std"):
        return tuple(cfg["mean"]), tuple(cfg["std"])
    pre = Path(spec) / "preprocessor_config.json"
    if pre.is_file():
        try:
            stats = json.loads(pre.read_text())
            return tuple(stats["image_mean"]), tuple(stats["image_std"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
    return tuple(IMAGENET_MEAN), tuple(IMAGENET_STD)


@torch.no_grad()
def _grid_at(tokens, chans: int, side: int) -> tuple[int, int]:
    """(token grid side, token width) of the encoder at ``side`` px; -1 for a token count that is no square."""
    z = tokens(torch.zeros(1, chans, side, side))
    if z.dim() != 3:
        return -1, 0
    n = z.shape[1]
    g = math.isqrt(n)
    return (g if g * g == n and n > 0 else -1), int(z.shape[-1])


def _matching_side(spec: str, tokens, chans: int, side: int, grid: int, resizable=None) -> tuple[int, int, int]:
    """(input side, its token grid, token width): the side whose grid equals ``grid`` where the encoder takes
    it, else its own side (its tokens are then resampled to ``grid``). ``resizable``: timm's
    ``set_input_size``, which resamples a ViT's position table to the new grid as REPA resamples DINOv2's
    (``timm.layers.resample_abs_pos_embed`` to 16x16)."""
    native, dim = _grid_at(tokens, chans, side)
    if native < 1:
        raise ConfigError(f"train.aux_target={spec} gives no square grid of patch tokens at {side} px (a pooled output "
                          f"or a token count that is no square), so its tokens cannot be matched to the diffusion "
                          f"model's {grid}x{grid}; choose a ViT-style encoder")
    if native == grid or (side % native and native > grid):
        return side, native, dim
    wanted = grid * (side // native)  # the same stride (patch size) at the side that gives the model's grid
    for resize in (None, resizable):
        try:
            if resize is not None:
                resize(img_size=(wanted, wanted))
            got, _ = _grid_at(tokens, chans, wanted)
        except Exception:  # noqa: BLE001, S112  (a fixed position table refuses another side: try the next way)
            continue
        if got == grid:
            return wanted, got, dim
    if resizable is not None:  # back to the side it was built for
        resizable(img_size=(side, side))
    if native < grid:  # resampling up would invent the targets between its tokens
        raise ConfigError(f"train.aux_target={spec} gives {native}x{native} tokens at its {side} px and takes no other "
                          f"side, coarser than the diffusion model's {grid}x{grid} token grid, so they cannot be matched; "
                          f"choose an encoder with at least {grid}x{grid} patch tokens (or one built for "
                          f"{grid * (side // native)} px)")
    return side, native, dim
