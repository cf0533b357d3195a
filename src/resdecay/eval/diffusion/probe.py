"""The diffusion probe grid (paper Table 4's linear-probe column): frozen features of every block of a
diffusion transformer at several noise levels, one linear probe per (layer, noise level) cell, a
heat map, and the best cell reported as the paper does.

Each image is noised once per level with a fixed, seeded noise draw (the same draw for every
layer, so cells in one column see the same inputs); class-conditional models get the null label, so
the label never leaks into the features. Features are the mean over all tokens of a block's output.
Extraction goes through ``extract_block_features`` (chunked, tqdm, split across ranks under torchrun).
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ...errors import UserError
from ..features.extract import extract_block_features
from ..features.probe import linear_probe
from ..protocol import FAST_RECIPE, NOISE_LEVELS
from .encoder import NoisedEncoder

__all__ = ["FAST_RECIPE", "NOISE_LEVELS", "NoisedFeatures", "check_levels", "probe_grid"]


class NoisedFeatures(NoisedEncoder):
    """The probe grid's view of a diffusion model: ``NoisedEncoder`` with the grid's own noise, one seeded draw per
    batch in order (its numbers since it was written; ``eval --noise-level`` draws per image instead)."""

    def __init__(self, model: nn.Module, level: float, seed: int = 0):
        super().__init__(model, level, seed)
        self.calls = 0

    def noise(self, images: torch.Tensor) -> torch.Tensor:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.calls)  # batch order is fixed: same draw every layer
        self.calls += 1
        return torch.randn(images.shape, generator=g).to(images.device, images.dtype)


def check_levels(levels: tuple[float, ...]) -> None:
    """Noise levels are fractions of the diffusion time: each in [0, 1], at least one.

    Args:
        levels: the levels asked for.
    """
    if not levels or any(not 0.0 <= lv <= 1.0 for lv in levels):
        raise UserError(f"noise levels must lie in [0, 1] (0 = clean, 1 = pure noise), got {list(levels)}")


def probe_grid(model: nn.Module, train_set, test_set, layers: list[int] | None = None,
               levels: tuple[float, ...] = NOISE_LEVELS, device: str | torch.device = "cpu", batch_size: int = 256,
               progress: bool = True, seed: int = 0) -> dict:
    """Top-1 of a fast linear probe (30 epochs, BatchNorm) for every (layer, noise level) cell."""
    depth = model.num_blocks
    layers = list(range(depth)) if layers is None else layers
    bad = [l for l in layers if not -depth <= l < depth]
    if bad:
        raise UserError(f"layer {bad[0]} is out of range: the model has blocks 0..{depth - 1}")
    check_levels(levels)
    grid = torch.zeros(len(layers), len(levels))
    for j, level in enumerate(levels):
        view = NoisedFeatures(model, level, seed)
        tr, ytr = extract_block_features(view, train_set, layers, batch_size=batch_size, device=device, progress=progress,
                                         desc=f"train features, noise {level:g}")
        view.calls = 0
        te, yte = extract_block_features(view, test_set, layers, batch_size=batch_size, device=device, progress=progress,
                                         desc=f"test features, noise {level:g}")
        for i, l in enumerate(layers):
            res = linear_probe(tr[(l, "mean")], ytr, te[(l, "mean")], yte, FAST_RECIPE, device=device)
            grid[i, j] = res["top1"]
    i, j = divmod(int(grid.argmax()), len(levels))
    return {"layers": layers, "levels": list(levels), "top1": grid.tolist(),
            "best": {"layer": layers[i], "level": levels[j], "top1": float(grid[i, j])}}
