"""Reference points for every evaluation: the same registered metrics (kNN, probe, rank, ...; the
suite runs them through ``metrics.measure``) on raw pixels and on a randomly initialised encoder of
the same architecture. This module makes those two feature sources.

A pretrained model's kNN of 0.45 means little alone: on Fashion-MNIST raw pixels already reach
0.833 (20k bank, 10k queries), on Fashion-MNIST-M 0.238. These two rows say how much the pretraining added. The
random encoder is the run's own initialisation (``torch.manual_seed(train.seed)`` then the model
constructor, as ``train()`` does), so for a U-Net MAE with zero-initialised branches it is exactly
the network before its first step: every branch outputs 0 and each block's output is α_eff times a
linear embedding of the pixels (kNN on cosine similarity is scale-free, so the decay itself does
not change its kNN).
"""

from __future__ import annotations

import hashlib
import json

import torch
from torch.utils.data import DataLoader, Subset

from ..models import build_model

SOURCES = ("pixels", "random-init")


@torch.no_grad()
def pixel_features(dataset, limit: int | None = None, batch_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """Flattened, normalised pixels (as the model sees them, no augmentation): (N, C·H·W), labels."""
    if limit:
        dataset = Subset(dataset, range(min(limit, len(dataset))))
    xs, ys = [], []
    for x, y in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        xs.append(x.flatten(1).float())
        ys.append(torch.as_tensor(y))
    return torch.cat(xs), torch.cat(ys)


def random_init_model(cfg):
    """The run's encoder before its first step: seeded exactly as ``train()`` seeds it."""
    torch.manual_seed(cfg.train.seed)
    return build_model(cfg.model).eval()


def random_init_key(cfg) -> str:
    """A stand-in for a checkpoint hash in feature-cache keys: the architecture and the seed."""
    blob = json.dumps({"random-init": cfg.to_dict()["model"], "seed": cfg.train.seed}, sort_keys=True, default=str)
    return "random-init-" + hashlib.sha256(blob.encode()).hexdigest()


def baseline_value(report: dict, source: str, metric: str, feature: str, value: str, layer: int | None = None):
    """One number from a report's baselines (None when absent)."""
    for r in report.get("baselines", []):
        if (r["source"] == source and r["metric"] == metric and r["feature"] == feature and value in r["values"]
                and (layer is None or r["layer"] in (layer, None))):
            return r["values"][value]
    return None
