"""What a data split is, for the model and the protocol cards (``DataInfo``), and the statistics a
folder of images is normalised with: the bottom of ``data/``, imported by every source."""

from __future__ import annotations

from dataclasses import dataclass

IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@dataclass
class DataInfo:
    name: str
    num_classes: int
    in_chans: int
    native_size: int | None  # side of fixed-size datasets; None for ImageFolder
    mean: tuple
    std: tuple


def folder_stats(cfg) -> tuple[tuple, tuple]:
    """The (mean, std) an ImageFolder is normalised with: ImageNet's for ``normalize=dataset``."""
    return ((0.5,) * 3, (0.5,) * 3) if cfg.normalize == "symmetric" else (IMAGENET_MEAN, IMAGENET_STD)
