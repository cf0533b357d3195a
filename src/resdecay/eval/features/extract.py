"""Frozen-feature extraction: one pass of a model's encoder over a dataset, no augmentation,
keeping the pooled tokens of chosen blocks (``extract_block_features``)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, Subset

from ...io import progress_bar

POOLINGS = ("mean", "cls", "patch_mean")


def pool_tokens(tokens: torch.Tensor, pool: str) -> torch.Tensor:
    """(B, 1+N, D) block output -> (B, D).

    mean: all tokens including cls (the authors' linear-probe feature); cls: token 0;
    patch_mean: patch tokens only.
    """
    if pool == "mean":
        return tokens.mean(1)
    if pool == "cls":
        return tokens[:, 0].clone()  # a copy: a view would keep the whole (B, 1+N, D) batch alive
    if pool == "patch_mean":
        return tokens[:, 1:].mean(1)
    raise ValueError(f"unknown pooling {pool!r}; choose one of {', '.join(POOLINGS)}")


@torch.no_grad()
def extract_block_features(model: torch.nn.Module, dataset: Dataset, layers: list[int] | None = None,
                     pools: tuple[str, ...] = ("mean",), batch_size: int = 256, device: str | torch.device = "cpu",
                     num_workers: int = 0, progress: bool = True, desc: str = "features") -> tuple[dict, torch.Tensor]:
    """Pooled token features of the given encoder blocks for every image of ``dataset``:
    ``({(layer, pool): (N, D) tensor}, labels (N,))``, in dataset order. (The notebook API's
    ``resdecay.extract_features`` wraps this for tensors and numpy arrays.)

    ``layers`` are encoder block indices (default: the last block, -1). Under torchrun each rank
    takes every world_size-th image and the pieces are gathered back into dataset order on every
    rank: each image is extracted exactly once, none is dropped or repeated."""
    layers = layers if layers is not None else [-1]
    rank, world = (dist.get_rank(), dist.get_world_size()) if dist.is_available() and dist.is_initialized() else (0, 1)
    indices = list(range(rank, len(dataset), world))
    was_training = model.training
    model.eval()
    loader = DataLoader(Subset(dataset, indices), batch_size=batch_size, shuffle=False, num_workers=num_workers)
    out: dict = {(l, p): [] for l in layers for p in pools}
    labels = []
    device = torch.device(device)
    for images, y in progress_bar(loader, desc=desc, disable=not progress or rank != 0, leave=False):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            blocks = model.forward_intermediates(images.to(device), layers)
        for l, tokens in zip(layers, blocks, strict=True):
            for p in pools:
                out[(l, p)].append(pool_tokens(tokens.float(), p).cpu())
        labels.append(torch.as_tensor(y))
    model.train(was_training)
    feats = {key: torch.cat(v) for key, v in out.items()}
    labels = torch.cat(labels)
    if world == 1:
        return feats, labels
    pieces = [None] * world
    dist.all_gather_object(pieces, (indices, feats, labels))
    order = torch.tensor([i for idx, _, _ in pieces for i in idx]).argsort()
    merged = {key: torch.cat([f[key] for _, f, _ in pieces])[order] for key in feats}
    return merged, torch.cat([lab for _, _, lab in pieces])[order]
