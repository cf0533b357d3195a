"""What the features pipeline's metrics read: ``FeatureSet`` (``features``), ``LayerSet`` (``layers``) and
``BlockStats`` (``blocks``); ``source.py`` makes them from a checkpoint, ``baselines.py`` from raw pixels
and the random initial encoder, ``online.py`` during training."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sources import BLOCKS, FEATURES, LAYERS

__all__ = ["BLOCKS", "FEATURES", "LAYERS", "BlockStats", "FeatureSet", "LayerSet"]


@dataclass
class FeatureSet:
    """What a ``features`` metric reads: one source's pooled features of a labelled train and test split.

    Args:
        train, test: pooling -> (N, D) features. ``train`` holds at least ``feature`` (online tracking extracts
            only that); ``test`` also every pooling a selected metric's ``extra_pools`` asks for, in the order a
            metric reporting every pooling (rank) follows.
        train_labels, test_labels: (N,) class indices.
        feature: the pooling single-feature metrics (kNN, probe) use (``pixels`` for the raw-pixel baseline).
    """

    train: dict[str, torch.Tensor]
    train_labels: torch.Tensor
    test: dict[str, torch.Tensor]
    test_labels: torch.Tensor
    feature: str


@dataclass
class LayerSet:
    """What a ``layers`` metric reads: the same test images' pooled features at every encoder block,
    so that a metric over two blocks (CKA between the first and the last) is one function.

    Args:
        layer: the block being evaluated (``--layer``; each block in turn for the profile).
        blocks: block index -> (N, D) test features of the evaluation's pooling, every block of the encoder.
        labels: (N,) class indices of the test images.
        feature: the pooling (``--feature``).
    """

    layer: int
    blocks: dict[int, torch.Tensor]
    labels: torch.Tensor
    feature: str


@dataclass
class BlockStats:
    """What a ``blocks`` metric reads: mean per-token L2 norms of one encoder block (``output``,
    ``shortcut_attn``, ``branch_attn``, ``shortcut_mlp``, ``branch_mlp``; ``nn.blocks.block_statistics``)."""

    layer: int
    norms: dict[str, float]
