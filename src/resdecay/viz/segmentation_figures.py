"""The segmentation protocol's two figures: the spectral RGB picture (the paper's Figure 3 reading of
Zhang et al.: the top 3 components of the embedding as RGB) and the segmentation itself (image,
ground truth, clusters after Hungarian matching), several checkpoints side by side on the same images."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from .backend import plt
from .plots import _save as save_png


def spectral_rgb(embedding: np.ndarray, solver: str, n: int, grid: tuple[int, int]) -> np.ndarray:
    """(N*T, d) embedding -> (N, h, w, 3) in [0, 1]: three components over all tokens of all images,
    each min-max normalised globally (not per image), so a colour means the same in every image.

    ``exact``: eigenvectors 1..3 of P (0 is the constant one); ``learned`` (the authors' render) and
    ``kmeans``: the first 3 left singular vectors of the per-token L2-normalised embedding, uncentred.
    """
    if solver == "exact":
        comp = embedding[:, 1:4]
    else:
        z = embedding / np.maximum(np.linalg.norm(embedding, axis=1, keepdims=True), 1e-12)
        comp = np.linalg.svd(z, full_matrices=False)[0][:, :3]
    if comp.shape[1] < 3:
        comp = np.pad(comp, ((0, 0), (0, 3 - comp.shape[1])))
    lo, hi = comp.min(0), comp.max(0)
    comp = (comp - lo) / np.where(hi > lo, hi - lo, 1.0)
    return comp.reshape(n, *grid, 3)


def _pixels(images: torch.Tensor, mean, std) -> np.ndarray:
    m, s = torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)
    return (images * s + m).clamp(0, 1).permute(0, 2, 3, 1).numpy()


def _grid(rows: int, cols: int):
    fig, axes = plt.subplots(rows, cols, figsize=(1.15 * cols + 2.2, 1.2 * rows + 0.6), squeeze=False)
    for ax in axes.flat:
        ax.set_xticks([])
        ax.set_yticks([])
    return fig, axes


def _save(fig, path: Path, note: str) -> None:
    fig.text(0.5, 0.01, note, ha="center", fontsize=6.5, wrap=True)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    save_png(fig, path)


def plot_spectral_rgb(images: torch.Tensor, mean, std, maps: dict[str, np.ndarray], path: Path, note: str) -> None:
    """Row 0 the images, then one row per model: its spectral RGB on the token grid (bilinear for display)."""
    pix, n = _pixels(images, mean, std), len(images)
    fig, axes = _grid(1 + len(maps), n)
    for c in range(n):
        axes[0][c].imshow(pix[c])
    axes[0][0].set_ylabel("image", fontsize=8, rotation=0, ha="right", va="center")
    for r, (label, rgb) in enumerate(maps.items(), start=1):
        for c in range(n):
            axes[r][c].imshow(rgb[c], interpolation="bilinear")
        axes[r][0].set_ylabel(label, fontsize=7, rotation=0, ha="right", va="center")
    _save(fig, path, note)


def _colour(labels: np.ndarray, classes: int) -> np.ndarray:
    """Class indices -> RGB, the ignore label (255) and unmatched clusters (-1) black."""
    cmap = plt.get_cmap("tab20" if classes <= 20 else "gist_ncar", max(classes, 2))
    rgb = cmap(np.clip(labels, 0, classes - 1) % max(classes, 2))[..., :3]
    rgb[(labels < 0) | (labels >= classes)] = 0
    return rgb


def plot_segmentation(images: torch.Tensor, mean, std, truth: torch.Tensor, preds: dict[str, torch.Tensor],
                      classes: int, path: Path, note: str) -> None:
    """Rows: the images, the ground truth, then each model's clusters mapped to classes (Hungarian)."""
    pix, n = _pixels(images, mean, std), len(images)
    fig, axes = _grid(2 + len(preds), n)
    rows = {"image": None, "ground truth": truth.numpy(), **{k: v.numpy() for k, v in preds.items()}}
    for r, (label, maps) in enumerate(rows.items()):
        for c in range(n):
            axes[r][c].imshow(pix[c] if maps is None else _colour(maps[c], classes), interpolation="nearest")
        axes[r][0].set_ylabel(label, fontsize=7, rotation=0, ha="right", va="center")
    _save(fig, path, note)
