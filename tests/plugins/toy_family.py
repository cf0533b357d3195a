"""A model family defined outside the package, registered by importing this file (``resdecay
--plugin tests/plugins/toy_family.py ...`` or ``RESDECAY_PLUGINS=...``): a residual MLP over patch
tokens whose shortcuts decay with depth, trained to reconstruct its own patches. The tests use it to
show that the contract test, the trainer and the CLI take a new family unchanged."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from resdecay.models import ModelConfig, register_family
from resdecay.models.common import resolve_blocks
from resdecay.nn.blocks import patchify
from resdecay.schedule import alpha_schedule


@dataclass
class ToyMLPConfig(ModelConfig):
    family: str = "toy-mlp"
    img_size: int = 8
    in_chans: int = 1
    patch_size: int = 2
    width: int = 16
    depth: int = 3
    alpha_min: float = 0.7
    schedule: str = "linear"

    def validate(self) -> None:
        if self.img_size % self.patch_size:
            raise ValueError(f"model.img_size {self.img_size} must be divisible by model.patch_size {self.patch_size}")


class ToyBlock(nn.Module):
    """x -> alpha * x + MLP(LN(x)): one decayed residual add."""

    def __init__(self, width: int, alpha: float):
        super().__init__()
        self.alpha = alpha
        self.mlp = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, 2 * width), nn.GELU(), nn.Linear(2 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * x + self.mlp(x)


def toy_objective(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return model(images)  # the forward returns the reconstruction loss


@register_family("toy-mlp", config=ToyMLPConfig, objective=toy_objective, tiny=dict(depth=3, width=16))
class ToyMLP(nn.Module):
    def __init__(self, cfg: ToyMLPConfig):
        super().__init__()
        cfg.validate()
        self.cfg = cfg
        patch = cfg.patch_size**2 * cfg.in_chans
        self.alphas = alpha_schedule(cfg.depth, cfg.alpha_min, cfg.schedule)[:, 1:]  # (depth, 1): one add per block
        self.embed = nn.Linear(patch, cfg.width)
        self.blocks = nn.ModuleList(ToyBlock(cfg.width, float(a)) for a in self.alphas[:, 0])
        self.head = nn.Linear(cfg.width, patch)

    @property
    def decoder_blocks(self) -> nn.ModuleList:
        return nn.ModuleList()

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def forward_intermediates(self, imgs: torch.Tensor, indices: list[int] | None = None) -> list[torch.Tensor]:
        wanted = resolve_blocks(indices, self.num_blocks)
        x, out = self.embed(patchify(imgs, self.cfg.patch_size)), {}
        for i, blk in enumerate(self.blocks[: max(wanted) + 1]):
            x = out[i] = blk(x)
        return [out[i] for i in wanted]

    def forward_features(self, imgs: torch.Tensor) -> torch.Tensor:
        return self.forward_intermediates(imgs)[0]

    def forward(self, imgs: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(self.head(self.forward_features(imgs)), patchify(imgs, self.cfg.patch_size))

    def flops_per_sample(self) -> float:
        n, w, patch = (self.cfg.img_size // self.cfg.patch_size) ** 2, self.cfg.width, self.cfg.patch_size**2 * self.cfg.in_chans
        return float(2 * n * (2 * patch * w + self.cfg.depth * 4 * w * w))
