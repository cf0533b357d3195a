"""Images with per-pixel label maps, for the unsupervised-segmentation evaluation (``eval/segmentation/``).

Six sources (``--seg-data NAME``, or ``NAME:DIR`` for a folder; the default is the evaluation's own data set):

    fashion-mnist-m  the test split's composites; the generator knows where it pasted each garment, so
                     the label map is 0 (background) and garment class + 1 (11 classes), at every
                     nuisance level (``data.nuisances``)
    cocostuff27      COCO-Stuff as STEGO / PiCIE curate it (``seg_folders.py``): fine labels mapped to
                     the 27 coarse categories
    voc              Pascal VOC's layout (``seg_folders.py``): palette indices, 255 = boundary
    folder           a user's own images and label maps (``seg_folders.py``): ``images/<name>.png|.jpg``
                     beside ``labels/<name>.png``, the classes from ``classes.txt`` or the maps
    digits,          the demos' data sets, on a black background: the object is its ink, so the label map
    fashion-mnist    is class + 1 where the grey level is >= 0.5 (the rule fashion-mnist-m's compositor
                     uses for its garments' opacity) and 0 elsewhere (11 classes)

N images (``--seg-images``) are a seeded class-balanced draw (``--seg-seed``), all of them when there are
fewer. Folder images are resized (short side to the model's input, bicubic) and centre-cropped; label maps
the same way with nearest (labels must not be blended). 255 is the ignore label of every label map handed
to the metric. Every problem (no label maps, a label map whose size disagrees with its image, a label
outside the class count) is one line naming the file and the fix, raised before any feature is extracted.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError
from .datasets import _fashion_mnist_m_stats, _load_fashion_mnist, build_dataset
from .fashion_mnist_m import MASK_OPACITY, composite
from .seg_folders import (
    COCO27_NAMES,
    COCO_CURATED,
    COCO_FINE_TO_27,
    IGNORE,
    VOC_NAMES,
    MaskedImages,
    coco_to_27,
    read_folder,
)
from .subsets import balanced_indices

SEG_DATA = ("fashion-mnist-m", "cocostuff27", "voc", "folder", "digits", "fashion-mnist")
FOLDERS = ("cocostuff27", "voc", "folder")  # read from --seg-path (or NAME:DIR)
BUILT_IN = {"fashion-mnist-m": 11, "digits": 11, "fashion-mnist": 11}  # their classes
FASHION_NAMES = ("t-shirt/top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag",
                 "ankle boot")
NAMES = {"fashion-mnist-m": ("background", *FASHION_NAMES), "fashion-mnist": ("background", *FASHION_NAMES),
         "digits": ("background", *map(str, range(10)))}
SEG_FIX = "use --seg-data fashion-mnist-m, or --seg-data cocostuff27|voc|folder:DIR (your own images and label maps)"


def seg_source(name: str, path: str | None) -> tuple[str, str | None]:
    """``--seg-data NAME`` / ``NAME:DIR`` and ``--seg-path`` -> (name, folder or None); one line when they disagree."""
    base, colon, inline = name.partition(":")
    if not colon or base not in FOLDERS:
        return name, path
    if not inline:
        raise DataError(f"--seg-data {name}: name the folder after the colon, e.g. --seg-data {base}:path/to/folder")
    if path and Path(path).expanduser() != Path(inline).expanduser():
        raise DataError(f"--seg-data {name} and --seg-path {path} name two folders; pass one of them")
    return base, inline


def _draw(labels, limit: int, seed: int) -> tuple[np.ndarray, str]:
    """The class-balanced seeded draw of ``limit`` of these images (all of them when they are fewer)."""
    if limit >= len(labels):
        return np.arange(len(labels)), "all of the test split"
    return balanced_indices(labels, limit, seed), f"class-balanced draw of {limit} of {len(labels)}, seed {seed}"


def _fashion_mnist_m(cfg, side: int, limit: int, seed: int) -> MaskedImages:
    garments, classes = _load_fashion_mnist(cfg.path, False)
    chosen, how = _draw(classes, limit, seed)
    images, masks = composite(garments[chosen], "test", cfg.canvas, cfg.nuisances, cfg.dataset_seed, indices=chosen,
                              labels=classes[chosen], composition=cfg.composition)
    if cfg.canvas != side and not cfg.resize:
        raise DataError(f"fashion-mnist-m images are {cfg.canvas}x{cfg.canvas} but the model reads {side}x{side}; "
                        f"evaluate with data.canvas={side} (--data fashion-mnist-m uses the checkpoint's canvas)")
    mean, std = _fashion_mnist_m_stats(cfg.path, cfg.canvas, tuple(cfg.nuisances), cfg.dataset_seed, cfg.composition)
    x = (images.float().div(255) - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    card = {"data": "fashion-mnist-m", "split": "test", "images": len(chosen), "classes": 11,
            "class_names": list(NAMES["fashion-mnist-m"]), "chosen": how, "nuisances": list(cfg.nuisances),
            **({"composition": cfg.composition} if cfg.composition != "photos" else {}), "canvas": cfg.canvas, "resize": "none (native canvas)",
            "labels": "0 background, garment class + 1 where its opacity >= 0.5"}
    return MaskedImages(x, masks.long(), 11, card, mean, std, NAMES["fashion-mnist-m"])


def _ink(name: str, cfg, side: int, limit: int, seed: int) -> MaskedImages:
    """digits / fashion-mnist test images as the evaluation reads them, labelled by their ink."""
    if cfg.name != name:  # --seg-data names another data set than the checkpoint's: read that one
        cfg = replace(cfg, name=name, path=None)
    dataset, info = build_dataset(cfg, "test", side, augment=False)
    classes = np.asarray(dataset.labels)
    chosen, how = _draw(classes, limit, seed)
    x = torch.stack([dataset[int(i)][0] for i in chosen])  # (N, 1, S, S), normalised
    grey = x * torch.tensor(info.std).view(1, -1, 1, 1) + torch.tensor(info.mean).view(1, -1, 1, 1)
    labels = torch.as_tensor(classes[chosen]).view(-1, 1, 1) + 1
    masks = torch.where(grey[:, 0] >= MASK_OPACITY, labels, torch.zeros_like(labels))
    card = {"data": name, "split": "test", "images": len(chosen), "classes": 11, "class_names": list(NAMES[name]),
            "chosen": how, "resize": f"{side}x{side}",
            "labels": f"0 background, class + 1 where the grey level >= {MASK_OPACITY}"}
    return MaskedImages(x, masks.long(), 11, card, tuple(info.mean), tuple(info.std), NAMES[name])


def masked_images(name: str, cfg, path: str | None, side: int, limit: int, seed: int = 0,
                  ignore_index: int = IGNORE, channels: int = 3) -> MaskedImages:
    """The evaluation images with label maps: ``limit`` of them, a seeded class-balanced draw (all when fewer).

    Args:
        name: one of ``SEG_DATA``, or ``NAME:DIR`` for a folder (anything else has no label maps: refused in one line).
        cfg: the evaluation's ``DataConfig`` (fashion-mnist-m's knobs and path).
        path: the folder of cocostuff27 / voc / folder (``--seg-path``).
        side: the model's input side; limit: at most this many images; seed: the draw's seed (``--seg-seed``).
        ignore_index: the label value of unlabelled pixels in voc / folder label maps (``--seg-ignore-index``).
        channels: the model's input channels (a folder's images are read as RGB, or grey for 1).
    """
    given = name
    name, path = seg_source(name, path)
    if name not in SEG_DATA:
        raise DataError(f"{name} has no label maps, so segmentation cannot be scored on it: {SEG_FIX}")
    if ignore_index != IGNORE and name not in ("voc", "folder"):
        raise DataError(f"--seg-ignore-index {ignore_index} applies to label maps you supply (--seg-data folder or voc); "
                        f"{name}'s ignored label is fixed: drop it")
    if name == "fashion-mnist-m":
        return _fashion_mnist_m(cfg, side, limit, seed)
    if name in BUILT_IN:
        return _ink(name, cfg, side, limit, seed)
    if not path:
        raise DataError(f"--seg-data {name} reads a folder: pass --seg-path DIR (or --seg-data {name}:DIR)")
    root = Path(path).expanduser()
    if not root.is_dir():
        flag = f"--seg-data {given}" if ":" in given else f"--seg-path {root}"
        what = "the folder holding your images/ and labels/" if name == "folder" else f"the {name} folder"
        raise DataError(f"{flag} is not a folder ({'missing' if not root.exists() else 'a file'}); pass {what}")
    return read_folder(name, root, side, limit, seed, ignore_index, channels)


__all__ = ["COCO27_NAMES", "COCO_CURATED", "COCO_FINE_TO_27", "FOLDERS", "IGNORE", "NAMES", "SEG_DATA", "SEG_FIX",
           "VOC_NAMES", "MaskedImages", "coco_to_27", "masked_images", "seg_source"]
