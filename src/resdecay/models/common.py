"""What more than one model family shares: the block-index rule of ``forward_intermediates``, the
config checks, the diffusion stem and the diffusion families' objective and example batch.

The model contract itself (``ResidualModel``, ``ModelConfig``) is written down in ``contract.py``;
``resolve_blocks`` is how every family refuses a block index outside the network.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn as nn

from ..diffusion.objectives import cached_objective, diffusion_loss, model_config, objective_for
from ..errors import ConfigError, check_fields
from ..nn import noise
from ..nn.blocks import PatchEmbed
from ..nn.checkpointing import set_grad_checkpointing
from ..nn.conditioning import LabelEmbedder, TimestepEmbedder
from ..schedule import check_alpha_min
from .registry import ExampleBatch, image_batch


class BlockIndexError(IndexError, ValueError):
    """A block index outside the network; both an IndexError (timm's) and a ValueError."""


def resolve_blocks(indices: list[int] | None, depth: int) -> list[int]:
    """0-indexed block indices (negative counts from the end; None = the last) -> non-negative,
    or one BlockIndexError naming the valid range."""
    if indices is None:
        return [depth - 1]
    bad = [i for i in indices if not -depth <= int(i) < depth]
    if bad:
        raise BlockIndexError(f"block indices {bad} out of range: valid are 0..{depth - 1} (or -{depth}..-1)")
    return [int(i) % depth for i in indices]


def check_patch_size(img_size: int, patch_size: int, hint: str = "") -> None:
    if img_size % patch_size:
        good = [p for p in range(1, img_size + 1) if img_size % p == 0]
        raise ConfigError(f"image size {img_size} is not divisible by patch size {patch_size}; "
                          f"use model.patch_size in {good}{hint}")


def check_diffusion_config(cfg, family: str) -> None:
    """The checks U-ViT and SiT configs share (the depth rule stays with each family)."""
    if cfg.family != family:
        raise ConfigError(f"model.family must be {family!r} for this config, got {cfg.family!r}")
    check_fields(cfg, "model", positive=("img_size", "in_chans", "patch_size", "embed_dim", "depth", "num_heads"))
    check_alpha_min(cfg.alpha_min)
    check_patch_size(cfg.img_size, cfg.patch_size)
    if cfg.embed_dim % cfg.num_heads:
        raise ConfigError(f"model.embed_dim {cfg.embed_dim} must be divisible by model.num_heads {cfg.num_heads}")
    if cfg.num_classes < 0:
        raise ConfigError(f"model.num_classes must be >= 0 (0 = unconditional), got {cfg.num_classes}")
    if not 0.0 <= cfg.class_dropout < 1.0:
        raise ConfigError(f"model.class_dropout must lie in [0, 1), got {cfg.class_dropout}")


def diffusion_stem(model: nn.Module, cfg) -> None:
    """The checked config and the stem SiT and U-ViT share, built in DiT's order: patch embedding,
    timestep embedder, label embedder (None for an unconditional model)."""
    cfg.validate()
    model.cfg = cfg
    model.patch_embed = PatchEmbed(cfg.img_size, cfg.patch_size, cfg.in_chans, cfg.embed_dim)
    model.t_embedder = TimestepEmbedder(cfg.embed_dim)
    model.y_embedder = LabelEmbedder(cfg.num_classes, cfg.embed_dim, cfg.class_dropout) if cfg.num_classes > 0 else None


def diffusion_objective(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Denoising loss of the model's own objective (``model.cfg.objective``: DDPM eps or SiT velocity);
    the noise and the time live in ``resdecay.diffusion``, not in the backbone (DiT's split). Under
    ``train.noise_scope=global`` the time and the noise are the effective batch's rows (``nn/noise.py``)."""
    if not noise.active():
        return diffusion_loss(model, images, labels)
    objective, B = cached_objective(model_config(model), images.device), images.shape[0]
    t = noise.draw(lambda n: objective.sample_t(n, images.device), B)
    eps = noise.draw(lambda n: torch.randn((n, *images.shape[1:]), device=images.device, dtype=images.dtype), B)
    return diffusion_loss(model, images, labels, t=t, noise=eps)


def diffusion_batch(model: nn.Module, batch: int) -> ExampleBatch:
    """Images, times drawn as the model's objective draws them, and labels: ``(t, y)`` is what a
    diffusion backbone's ``forward_intermediates(x, t, y)`` takes after the images."""
    images = image_batch(model, batch)
    t = objective_for(model.cfg).sample_t(batch, images.images.device)
    return ExampleBatch(images.images, (t, images.labels), images.labels)


def count_parameters(cfg, build, big: int = 32) -> int | None:
    """Parameters of ``build(cfg)`` without allocating them: the model is built on the meta device.
    Block counts (``depth``, ``decoder_depth``) above ``big`` are extrapolated linearly from two
    builds of about ``big`` blocks (a block's parameters do not depend on how many there are), so
    a config asking for 100000 blocks is counted in a fraction of a second. None when a small stand-in cannot be built
    (e.g. explicit ``skip_sources`` that only fit the large depth).

    Args:
        cfg: a model config dataclass (``MAEConfig``, ``UViTConfig``, ...).
        build: ``models.build_model``.
        big: block counts up to this are built as they are.
    """
    def count(c) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in build(c).parameters())

    large = {k: v for k, v in vars(cfg).items() if k in ("depth", "decoder_depth") and isinstance(v, int) and v > big}
    try:
        if not large:
            return count(cfg)
        # stand-ins of `big` blocks (same parity: U-ViT wants odd, SiT with skips even): deep enough
        # that the U-Net MAE's skip count has saturated, so one more block adds just a block
        small = {k: big + (v - big) % 2 for k, v in large.items()}
        base = dataclasses.replace(cfg, **small)
        n0 = total = count(base)
        for k, v in large.items():
            per_block = (count(dataclasses.replace(base, **{k: small[k] + 2})) - n0) // 2
            total += per_block * (v - small[k])
        return total
    except (ValueError, TypeError, IndexError):  # a config the small stand-in cannot mirror
        return None


class GradCheckpointing:
    """timm's model method for activation checkpointing (``model.grad_checkpointing=true`` in a config)."""

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute every transformer block's activations in the backward pass (``nn.blocks.set_grad_checkpointing``)."""
        set_grad_checkpointing(self, enable)
