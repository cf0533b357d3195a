"""Model families by name: ``model.family`` in a preset picks the config class, the
constructor and the training objective.

The diffusion families (U-ViT, SiT) register here too; the trainer, CLI and checkpoints only talk to this
table and to the model contract (``models.common``): ``forward_intermediates(x, indices)``
(diffusion: ``(x, t, y, indices)``), ``flops_per_sample()`` and ``alphas`` (the shortcut factors in use).

``TINY`` holds each family's smallest named size, the one the contract tests build.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn as nn

from ..diffusion.objectives import diffusion_loss
from .classifier import ClassifierConfig, EncoderClassifier, classifier_objective, classifier_param_groups
from .mae import MAEConfig, MaskedAutoencoder
from .resnet import ResNetConfig, SupervisedResNet, resnet_objective
from .sit import SiT, SiTConfig
from .uvit import UViT, UViTConfig


def mae_objective(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """MAE pretraining loss: norm-pix MSE on the removed patches (labels unused)."""
    return model(images)[0]


def diffusion_objective(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Denoising loss of the model's own objective (``model.cfg.objective``: DDPM eps or SiT velocity);
    the noise and the time live in ``resdecay.diffusion``, not in the backbone (DiT's split)."""
    return diffusion_loss(model, images, labels)


@dataclass(frozen=True)
class Family:
    config: type
    build: Callable[[Any], nn.Module]
    objective: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
    # (model, weight_decay) -> optimizer groups, each may carry an "lr_scale"; None = the default
    # split (no weight decay on biases and 1-D parameters)
    param_groups: Callable[[nn.Module, float], list[dict]] | None = None


FAMILIES: dict[str, Family] = {
    "mae": Family(MAEConfig, MaskedAutoencoder, mae_objective),
    "classifier": Family(ClassifierConfig, EncoderClassifier, classifier_objective, classifier_param_groups),
    "resnet": Family(ResNetConfig, SupervisedResNet, resnet_objective),
    "uvit": Family(UViTConfig, UViT, diffusion_objective),
    "sit": Family(SiTConfig, SiT, diffusion_objective),
}


# The smallest size of each family: what the contract tests build (``build_model(tiny_config(name))``).
_TINY_MAE = dict(img_size=16, in_chans=3, patch_size=4, embed_dim=32, depth=4, num_heads=2, decoder_embed_dim=32,
                 decoder_depth=2, decoder_num_heads=2)
TINY: dict[str, dict] = {
    "mae": _TINY_MAE,
    "classifier": dict(encoder=_TINY_MAE, num_classes=10),
    "resnet": dict(img_size=16, width=8, layers=[1, 1, 1, 1], alpha_min=0.7),
    "uvit": dict(img_size=8, patch_size=2, embed_dim=32, depth=5, num_heads=2, num_classes=10, alpha_min=0.7),
    "sit": dict(img_size=8, in_chans=4, patch_size=2, embed_dim=32, depth=4, num_heads=2, num_classes=10, alpha_min=0.8),
}


def tiny_config(family: str):
    """A fresh config of ``family`` at its tiny size."""
    return get_family(family).config(**copy.deepcopy(TINY[family]))


def is_diffusion(family: str) -> bool:
    """Whether a family trains with the diffusion objective (U-ViT, SiT): it samples, and is scored by FID."""
    return family in FAMILIES and FAMILIES[family].objective is diffusion_objective


def get_family(name: str) -> Family:
    if name not in FAMILIES:
        raise KeyError(f"unknown model family {name!r}; known: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[name]


def model_config_class(family: str) -> type:
    return get_family(family).config


def build_model(cfg: Any) -> nn.Module:
    """Build the model a model config describes (``cfg.family`` picks the constructor)."""
    return get_family(cfg.family).build(cfg)


__all__ = ["FAMILIES", "ClassifierConfig", "EncoderClassifier", "Family", "MAEConfig", "MaskedAutoencoder", "ResNetConfig",
           "SiT", "SiTConfig", "SupervisedResNet", "UViT", "UViTConfig", "TINY", "build_model", "get_family", "is_diffusion",
           "model_config_class", "tiny_config"]
