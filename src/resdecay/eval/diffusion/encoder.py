"""A diffusion checkpoint measured as an encoder at one noise level (``resdecay eval CKPT --noise-level L``).

The diffusion probe grid (``probe.py``) reads the mean of a block's tokens at several noise levels; ``eval``'s
metrics -- kNN, the probes, the swept heads, EP and the attentive pooler -- read the same blocks' tokens at one
level through ``NoisedEncoder``, the model contract's ``forward_intermediates(images, indices)``. As in the grid,
class-conditional models get the null label (the label never leaks into the features) and the EMA weights are
measured where the run kept them. Each image's noise is drawn from a generator seeded by the image itself, so an
image gets the same draw whatever its batch, the split's order, or which split the feature cache held already.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn as nn

from ...diffusion.objectives import objective_for
from ...models import build_model

NOISE_SEED = 0  # one fixed draw per image: the level is the protocol, the draw is not a knob


def image_noise(images: torch.Tensor, seed: int = NOISE_SEED) -> torch.Tensor:
    """N(0, I) noise shaped like ``images`` (B, C, H, W): image i's from a generator seeded by its bytes and ``seed``."""
    out = torch.empty(images.shape, dtype=torch.float32)
    for i, image in enumerate(images.detach().float().cpu()):
        digest = hashlib.blake2b(image.numpy().tobytes(), digest_size=8, salt=seed.to_bytes(16, "little")).digest()
        out[i] = torch.randn(image.shape, generator=torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1))
    return out.to(images.device, images.dtype)


class NoisedEncoder(nn.Module):
    """A diffusion model presented as an encoder: its blocks' token outputs (B, N, D) for images noised to ``level``
    of its own objective (a fraction of the diffusion time: 0 clean, 1 pure noise), null label."""

    def __init__(self, model: nn.Module, level: float, seed: int = NOISE_SEED):
        super().__init__()
        self.model, self.level, self.seed = model, float(level), seed
        self.objective = objective_for(model.cfg)

    @property
    def blocks(self) -> nn.ModuleList:
        return self.model.blocks

    @property
    def cfg(self):
        return self.model.cfg

    def noise(self, images: torch.Tensor) -> torch.Tensor:
        """The noise of this batch: each image's own seeded draw."""
        return image_noise(images, self.seed)

    def forward_intermediates(self, images: torch.Tensor, indices: list[int] | None = None) -> list[torch.Tensor]:
        x_t, t = self.objective.noised_at_level(images, self.noise(images), self.level)
        return self.model.forward_intermediates(x_t, t, None, indices)

    def forward_features(self, images: torch.Tensor) -> torch.Tensor:
        return self.forward_intermediates(images, [-1])[0]

    def card(self, weights: str) -> dict:
        """How the images were read, for every result's card and the feature caches' keys."""
        return {"noise": {"level": self.level, "objective": self.cfg.objective, "seed": self.seed,
                          "draw": "one per image, seeded by the image", "labels": "null label (no class leak)",
                          "weights": weights}}


@dataclass
class NoisedRun:
    """The checkpoint's ``RunConfig`` as the evaluation reads it: every field its own, and a random-init baseline
    that is the same diffusion architecture read at the same noise level."""

    run: Any
    level: float

    def __getattr__(self, name: str):
        if name in ("run", "level"):  # not yet set (copy, pickle): no recursion
            raise AttributeError(name)
        return getattr(self.run, name)

    def random_init(self) -> NoisedEncoder:
        """The same architecture freshly initialised (seeded by the caller), at the same level."""
        return NoisedEncoder(build_model(self.run.model), self.level)

