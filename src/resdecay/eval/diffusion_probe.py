"""The diffusion probe grid (paper Table 4's linear-probe column): frozen features of every block of a
diffusion transformer at several noise levels, one linear probe per (layer, noise level) cell, a
heat map, and the best cell reported as the paper does.

Each image is noised once per level with a fixed, seeded noise draw (the same draw for every
layer, so cells in one column see the same inputs); class-conditional models get the null label, so
the label never leaks into the features. Features are the mean over all tokens of a block's output.
Extraction goes through ``extract_features`` (chunked, tqdm, split across ranks under torchrun).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn as nn

from ..errors import UserError
from .features import extract_features
from .probe import FAST_RECIPE, linear_probe

NOISE_LEVELS = (0.0, 0.1, 0.25, 0.5, 0.75)


class NoisedFeatures(nn.Module):
    """Presents a diffusion model as an encoder: ``forward_intermediates(images, layers)`` noises the
    images to one level of the model's own objective and returns the blocks' token outputs."""

    def __init__(self, model: nn.Module, level: float, seed: int = 0):
        super().__init__()
        from ..diffusion import objective_for

        self.model, self.level, self.seed = model, level, seed
        self.objective = objective_for(model.cfg)
        self.calls = 0

    @torch.no_grad()
    def forward_intermediates(self, images: torch.Tensor, layers: list[int]) -> list[torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.calls)  # batch order is fixed: same draw every layer
        self.calls += 1
        noise = torch.randn(images.shape, generator=g).to(images.device, images.dtype)
        x_t, t = self.objective.noised_at_level(images, noise, self.level)
        return self.model.forward_intermediates(x_t, t, None, layers)


def probe_grid(model: nn.Module, train_set, test_set, layers: list[int] | None = None,
               levels: tuple[float, ...] = NOISE_LEVELS, device: str | torch.device = "cpu", batch_size: int = 256,
               progress: bool = True, seed: int = 0) -> dict:
    """Top-1 of a fast linear probe (30 epochs, BatchNorm) for every (layer, noise level) cell."""
    depth = model.num_blocks
    layers = list(range(depth)) if layers is None else layers
    bad = [l for l in layers if not -depth <= l < depth]
    if bad:
        raise UserError(f"layer {bad[0]} is out of range: the model has blocks 0..{depth - 1}")
    if any(not 0.0 <= lv <= 1.0 for lv in levels):
        raise UserError(f"noise levels must lie in [0, 1] (0 = clean, 1 = pure noise), got {list(levels)}")
    grid = torch.zeros(len(layers), len(levels))
    for j, level in enumerate(levels):
        view = NoisedFeatures(model, level, seed)
        tr, ytr = extract_features(view, train_set, layers, batch_size=batch_size, device=device, progress=progress,
                                   desc=f"train features, noise {level:g}")
        view.calls = 0
        te, yte = extract_features(view, test_set, layers, batch_size=batch_size, device=device, progress=progress,
                                   desc=f"test features, noise {level:g}")
        for i, l in enumerate(layers):
            res = linear_probe(tr[(l, "mean")], ytr, te[(l, "mean")], yte, FAST_RECIPE, device=device)
            grid[i, j] = res["top1"]
    i, j = divmod(int(grid.argmax()), len(levels))
    return {"layers": layers, "levels": list(levels), "top1": grid.tolist(),
            "best": {"layer": layers[i], "level": levels[j], "top1": float(grid[i, j])}}


def plot_grid(result: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = torch.tensor(result["top1"])
    fig, ax = plt.subplots(figsize=(1.2 + 0.9 * grid.shape[1], 1.0 + 0.4 * grid.shape[0]))
    im = ax.imshow(grid.numpy(), aspect="auto", cmap="viridis", origin="lower")
    for (i, j), v in zip(((i, j) for i in range(grid.shape[0]) for j in range(grid.shape[1])), grid.flatten().tolist()):
        ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=7, color="white" if v < grid.mean() else "black")
    ax.set_xticks(range(grid.shape[1]), [f"{lv:g}" for lv in result["levels"]])
    ax.set_yticks(range(grid.shape[0]), [str(l) for l in result["layers"]])
    ax.set_xlabel("noise level (0 = clean, 1 = pure noise)")
    ax.set_ylabel("block")
    b = result["best"]
    ax.set_title(f"{title}\nbest: block {b['layer']}, noise {b['level']:g}, top-1 {b['top1']:.3f}", fontsize=9)
    fig.colorbar(im, ax=ax, label="linear probe top-1 (fast recipe)")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)


def run_eval_diffusion(checkpoint: str, data=None, out: str | None = None, layers: list[int] | None = None,
                       levels: tuple[float, ...] = NOISE_LEVELS, max_train: int | None = None,
                       max_test: int | None = None, device: str = "auto", batch_size: int = 256,
                       progress: bool = True) -> dict:
    """``resdecay eval-diffusion``: the probe grid of one checkpoint (EMA weights where kept)."""
    from dataclasses import replace

    from torch.utils.data import Subset

    from ..checkpoint import load_checkpoint, load_model
    from ..data import build_dataset
    from ..distributed import resolve_device
    from ..models import is_diffusion
    from .suite import run_dir_of

    dev = resolve_device(device, "--device")
    model, cfg = load_model(checkpoint, dev, ema=True)
    if not is_diffusion(cfg.model.family):
        raise UserError(f"{checkpoint} is a {cfg.model.family} model; eval-diffusion probes diffusion models "
                        "(uvit, sit); use `resdecay eval` for encoders")
    data_cfg = replace(data or cfg.data, train_subset=None)
    train_set, _ = build_dataset(data_cfg, "train", cfg.model.img_size, augment=False)
    test_set, _ = build_dataset(data_cfg, "test", cfg.model.img_size, augment=False)
    if max_train:
        train_set = Subset(train_set, range(min(max_train, len(train_set))))
    if max_test:
        test_set = Subset(test_set, range(min(max_test, len(test_set))))
    result = probe_grid(model, train_set, test_set, layers, levels, dev, batch_size, progress)
    step = int(load_checkpoint(checkpoint)["train_state"]["step"])
    result["protocol"] = {"checkpoint": str(checkpoint), "step": step, "weights": "EMA" if cfg.train.ema_decay > 0 else "raw",
                          "data": data_cfg.name, "train_images": len(train_set), "test_images": len(test_set),
                          "feature": "mean of all tokens of the block output", "probe": FAST_RECIPE.card(),
                          "noise": f"{cfg.model.objective}: level = fraction of the diffusion time (0 clean, 1 pure noise), "
                                   "one seeded noise draw per image", "labels": "null label (no class leak)"}
    out_dir = Path(out) if out else run_dir_of(Path(checkpoint)) / "eval_diffusion"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "probe_grid.json").write_text(json.dumps(result, indent=2))
    plot_grid(result, out_dir / "probe_grid.png", f"{cfg.preset} (alpha_min {cfg.model.alpha_min:g}), step {step}")
    result["paths"] = {"json": str(out_dir / "probe_grid.json"), "png": str(out_dir / "probe_grid.png")}
    return result
