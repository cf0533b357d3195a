"""Frozen-feature extraction: one pass of a model's encoder over a dataset, no augmentation."""

from __future__ import annotations

import torch
from torch.utils.data import DataLoader, Dataset
from tqdm.auto import tqdm

POOLINGS = ("mean", "cls", "patch_mean")


def pool_tokens(tokens: torch.Tensor, pool: str) -> torch.Tensor:
    """(B, 1+N, D) block output -> (B, D).

    mean: all tokens including cls (the authors' linear-probe feature); cls: token 0;
    patch_mean: patch tokens only.
    """
    if pool == "mean":
        return tokens.mean(1)
    if pool == "cls":
        return tokens[:, 0]
    if pool == "patch_mean":
        return tokens[:, 1:].mean(1)
    raise ValueError(f"unknown pooling {pool!r}; choose one of {', '.join(POOLINGS)}")


@torch.no_grad()
def extract_features(model: torch.nn.Module, dataset: Dataset, layers: list[int] | None = None,
                     pools: tuple[str, ...] = ("mean",), batch_size: int = 256, device: str | torch.device = "cpu",
                     num_workers: int = 0, progress: bool = True, desc: str = "features") -> tuple[dict, torch.Tensor]:
    """Features of every image: ``({(layer, pool): (N, D) tensor}, labels (N,))``.

    ``layers`` are encoder block indices (default: the last block, -1)."""
    layers = layers if layers is not None else [-1]
    was_training = model.training
    model.eval()
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers)
    out: dict = {(l, p): [] for l in layers for p in pools}
    labels = []
    device = torch.device(device)
    for images, y in tqdm(loader, desc=desc, disable=not progress, leave=False):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            blocks = model.forward_intermediates(images.to(device), layers)
        for l, tokens in zip(layers, blocks):
            for p in pools:
                out[(l, p)].append(pool_tokens(tokens.float(), p).cpu())
        labels.append(torch.as_tensor(y))
    model.train(was_training)
    return {key: torch.cat(v) for key, v in out.items()}, torch.cat(labels)
