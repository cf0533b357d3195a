"""Images with per-pixel label maps, for the unsupervised-segmentation evaluation (``eval/segmentation.py``).

Five sources (``--seg-data``; the default is the evaluation's own data set):

    fashion-mnist-m  the test split's composites; the generator knows where it pasted each garment, so
                     the label map is 0 (background) and garment class + 1 (11 classes), at every
                     nuisance level (``data.nuisances``)
    cocostuff27      COCO-Stuff as STEGO / PiCIE curate it: ``images/val2017/<id>.jpg``,
                     ``annotations/val2017/<id>.png`` (the 182 fine labels, 255 unlabelled) and, when
                     present, the id list ``curated/val2017/Coco164kFull_Stuff_Coarse_7.txt``; fine
                     labels are mapped to the 27 coarse categories (``COCO_FINE_TO_27``)
    voc              Pascal VOC: ``JPEGImages/<id>.jpg``, ``SegmentationClass/<id>.png`` (palette
                     indices 0..20, 255 = boundary) and ``ImageSets/Segmentation/val.txt`` when present
    digits,          the demos' data sets, on a black background: the object is its ink, so the label map
    fashion-mnist    is class + 1 where the grey level is >= 0.5 (the rule fashion-mnist-m's compositor
                     uses for its garments' opacity) and 0 elsewhere (11 classes)

Folder images are resized (short side to the model's input, bicubic) and centre-cropped; label maps
the same way with nearest (labels must not be blended). 255 is the ignore label everywhere. Every
problem (no label maps, a label map whose size disagrees with its image, a label outside the class
count) is one line naming the file and the fix, raised before any feature is extracted.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import DataError
from .datasets import _fashion_mnist_m_stats, _load_fashion_mnist, build_dataset
from .fashion_mnist_m import MASK_OPACITY, composite
from .info import IMAGENET_MEAN, IMAGENET_STD
from .subsets import balanced_indices

IGNORE = 255
SEG_DATA = ("fashion-mnist-m", "cocostuff27", "voc", "digits", "fashion-mnist")
COCO_CURATED = "Coco164kFull_Stuff_Coarse_7.txt"  # the val list STEGO and the authors' loader read (subset 7)
# COCO-Stuff's 182 fine ids (0-based; things 0..90, stuff 91..181) -> the 27 coarse categories
# (12 thing + 15 stuff supercategories), the mapping STEGO / PiCIE evaluate COCO-Stuff-27 with
COCO_FINE_TO_27 = np.array([int(v) for v in """
9 11 11 11 11 11 11 11 11 8 8 8 8 8 8 7 7 7 7 7 7 7 7 7 7 6 6 6 6 6 6 6 6 10 10 10 10 10 10 10 10 10 10 5 5 5 5 5
5 5 5 2 2 2 2 2 2 2 2 2 2 3 3 3 3 3 3 3 3 3 3 0 0 0 0 0 0 1 1 1 1 1 1 4 4 4 4 4 4 4 4 17 17 22 20 20 22 15 25 16 13
12 12 17 17 23 15 15 17 15 21 15 25 13 13 13 13 13 22 26 14 14 15 22 21 21 24 20 22 15 17 16 15 22 24 21 17 25 16
21 17 22 16 21 21 25 21 26 21 24 20 17 14 21 26 15 23 20 21 24 15 24 22 25 15 20 17 17 22 14 18 18 18 18 18 18 18
26 26 19 19 24""".split()], dtype=np.uint8)
NUM_CLASSES = {"fashion-mnist-m": 11, "cocostuff27": 27, "voc": 21, "digits": 11, "fashion-mnist": 11}
SEG_FIX = "use --seg-data fashion-mnist-m, or --seg-data cocostuff27|voc --seg-path DIR"


@dataclass
class MaskedImages:
    """Normalised images, their label maps and what they are."""

    images: torch.Tensor  # (N, C, S, S) float, normalised
    labels: torch.Tensor  # (N, S, S) int64, 255 = ignore
    classes: int
    card: dict  # data, split, images, resize, classes
    mean: tuple
    std: tuple


def coco_to_27(fine: np.ndarray) -> np.ndarray:
    """COCO-Stuff fine labels (0..181, 255) -> coarse 27 (0..26, 255)."""
    out = np.full(fine.shape, IGNORE, dtype=np.uint8)
    ok = fine < len(COCO_FINE_TO_27)
    out[ok] = COCO_FINE_TO_27[fine[ok]]
    return out


def _pairs(name: str, root: Path) -> tuple[list[tuple[Path, Path]], str]:
    """(image, label map) files of a folder layout, and which list chose them."""
    if name == "cocostuff27":
        img_dir, lab_dir, ext = root / "images" / "val2017", root / "annotations" / "val2017", ".jpg"
        listed = root / "curated" / "val2017" / COCO_CURATED
        layout = "images/val2017/<id>.jpg + annotations/val2017/<id>.png"
    else:
        img_dir, lab_dir, ext = root / "JPEGImages", root / "SegmentationClass", ".jpg"
        listed = root / "ImageSets" / "Segmentation" / "val.txt"
        layout = "JPEGImages/<id>.jpg + SegmentationClass/<id>.png"
    if not img_dir.is_dir() or not lab_dir.is_dir():
        raise DataError(f"{root} is not a {name} folder: expected {layout}; pass --seg-path to that folder")
    if listed.is_file():
        ids, chosen = [ln.strip() for ln in listed.read_text().splitlines() if ln.strip()], f"ids of {listed.name}"
    else:
        ids, chosen = sorted(p.stem for p in lab_dir.glob("*.png")), "every label map (no id list found)"
    pairs = [(img_dir / f"{i}{ext}", lab_dir / f"{i}.png") for i in ids]
    missing = next((p for pair in pairs for p in pair if not p.is_file()), None)
    if missing is not None:
        raise DataError(f"{name}: {missing} is listed but missing; restore it or remove its id from the list")
    if not pairs:
        raise DataError(f"{root} holds no {name} label maps ({layout})")
    return pairs, chosen


def _resize_crop(x: torch.Tensor, side: int, mode: str) -> torch.Tensor:
    """(C, H, W) -> (C, side, side): short side to ``side``, centre crop."""
    h, w = x.shape[-2:]
    scale = side / min(h, w)
    size = (max(side, round(h * scale)), max(side, round(w * scale)))
    kw = {"mode": mode} if mode == "nearest" else {"mode": mode, "align_corners": False, "antialias": True}
    y = F.interpolate(x[None].float(), size=size, **kw)[0]
    top, left = (size[0] - side) // 2, (size[1] - side) // 2
    return y[:, top:top + side, left:left + side]


def _read(path: Path, convert) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as im:
            return np.asarray(convert(im))
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same problem for the user
        raise DataError(f"cannot read {path} ({type(e).__name__}: {e}); replace or remove it") from None


def _folder(name: str, root: Path, side: int, limit: int) -> MaskedImages:
    pairs, chosen = _pairs(name, root)
    pairs = pairs[:limit]  # the first N of the list, as the authors' loader (which returns 100)
    classes = NUM_CLASSES[name]
    images, labels = [], []
    for img_file, lab_file in pairs:
        img = _read(img_file, lambda im: im.convert("RGB"))
        lab = _read(lab_file, lambda im: im)  # palette indices / fine ids: never converted to RGB
        if lab.ndim != 2 or lab.shape != img.shape[:2]:
            raise DataError(f"{lab_file} is {'x'.join(map(str, lab.shape))} but its image {img_file.name} is "
                            f"{img.shape[0]}x{img.shape[1]}: a label map must be one channel of the image's size")
        lab = coco_to_27(lab) if name == "cocostuff27" else lab
        bad = np.unique(lab[(lab != IGNORE) & (lab >= classes)])
        if bad.size:
            raise DataError(f"{lab_file} holds label {int(bad[0])} but {name} has {classes} classes (0..{classes - 1}, "
                            f"255 ignored): {'is it a colour PNG? ' if name == 'voc' else ''}check --seg-data")
        images.append(_resize_crop(torch.from_numpy(img.copy()).permute(2, 0, 1), side, "bicubic").div(255).clamp(0, 1))
        labels.append(_resize_crop(torch.from_numpy(lab.astype(np.int64))[None], side, "nearest")[0].long())
    mean, std = torch.tensor(IMAGENET_MEAN).view(3, 1, 1), torch.tensor(IMAGENET_STD).view(3, 1, 1)
    x = (torch.stack(images) - mean) / std
    card = {"data": name, "path": str(root), "split": "val", "images": len(pairs), "chosen": chosen, "classes": classes,
            "resize": f"short side to {side} (bicubic; labels nearest), centre crop {side}",
            "norm": "ImageNet mean/std"}
    return MaskedImages(x, torch.stack(labels), classes, card, IMAGENET_MEAN, IMAGENET_STD)


def _fashion_mnist_m(cfg, side: int, limit: int) -> MaskedImages:
    garments, classes = _load_fashion_mnist(cfg.path, False)
    chosen = balanced_indices(classes, limit, cfg.subset_seed) if limit < len(classes) else np.arange(len(classes))
    images, masks = composite(garments[chosen], "test", cfg.canvas, cfg.nuisances, cfg.dataset_seed, indices=chosen,
                              labels=classes[chosen])
    if cfg.canvas != side and not cfg.resize:
        raise DataError(f"fashion-mnist-m images are {cfg.canvas}x{cfg.canvas} but the model reads {side}x{side}; "
                        f"evaluate with data.canvas={side} (--data fashion-mnist-m uses the checkpoint's canvas)")
    mean, std = _fashion_mnist_m_stats(cfg.path, cfg.canvas, tuple(cfg.nuisances), cfg.dataset_seed)
    x = (images.float().div(255) - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1)
    card = {"data": "fashion-mnist-m", "split": "test", "images": len(chosen), "classes": 11,
            "chosen": f"class-balanced, subset_seed {cfg.subset_seed}", "nuisances": list(cfg.nuisances),
            "canvas": cfg.canvas, "resize": "none (native canvas)",
            "labels": "0 background, garment class + 1 where its opacity >= 0.5"}
    return MaskedImages(x, masks.long(), 11, card, mean, std)


def _ink(name: str, cfg, side: int, limit: int) -> MaskedImages:
    """digits / fashion-mnist test images as the evaluation reads them, labelled by their ink."""
    if cfg.name != name:  # --seg-data names another data set than the checkpoint's: read that one
        cfg = replace(cfg, name=name, path=None)
    dataset, info = build_dataset(cfg, "test", side, augment=False)
    classes = np.asarray(dataset.labels)
    chosen = balanced_indices(classes, limit, cfg.subset_seed) if limit < len(classes) else np.arange(len(classes))
    x = torch.stack([dataset[int(i)][0] for i in chosen])  # (N, 1, S, S), normalised
    grey = x * torch.tensor(info.std).view(1, -1, 1, 1) + torch.tensor(info.mean).view(1, -1, 1, 1)
    labels = torch.as_tensor(classes[chosen]).view(-1, 1, 1) + 1
    masks = torch.where(grey[:, 0] >= MASK_OPACITY, labels, torch.zeros_like(labels))
    card = {"data": name, "split": "test", "images": len(chosen), "classes": 11,
            "chosen": f"class-balanced, subset_seed {cfg.subset_seed}", "resize": f"{side}x{side}",
            "labels": f"0 background, class + 1 where the grey level >= {MASK_OPACITY}"}
    return MaskedImages(x, masks.long(), 11, card, tuple(info.mean), tuple(info.std))


def masked_images(name: str, cfg, path: str | None, side: int, limit: int) -> MaskedImages:
    """The evaluation images with label maps.

    Args:
        name: one of ``SEG_DATA`` (anything else has no label maps: refused in one line).
        cfg: the evaluation's ``DataConfig`` (fashion-mnist-m's knobs and path).
        path: the folder of cocostuff27 / voc.
        side: the model's input side; limit: at most this many images.
    """
    if name not in SEG_DATA:
        raise DataError(f"{name} has no label maps, so segmentation cannot be scored on it: {SEG_FIX}")
    if name == "fashion-mnist-m":
        return _fashion_mnist_m(cfg, side, limit)
    if name in ("digits", "fashion-mnist"):
        return _ink(name, cfg, side, limit)
    if not path:
        raise DataError(f"--seg-data {name} reads a folder: pass --seg-path DIR")
    root = Path(path).expanduser()
    if not root.is_dir():
        raise DataError(f"--seg-path {root} is not a folder; pass the {name} folder")
    return _folder(name, root, side, limit)
