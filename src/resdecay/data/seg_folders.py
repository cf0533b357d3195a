"""Label maps read from folders: COCO-Stuff-27 (STEGO / PiCIE's layout), Pascal VOC and a user's own
folder of images and label maps (``--seg-data folder:DIR``), for the segmentation metric.

The three layouts (``--seg-path DIR``, or ``--seg-data NAME:DIR``):

    cocostuff27  ``images/val2017/<id>.jpg``, ``annotations/val2017/<id>.png`` (the 182 fine labels, 255
                 unlabelled) and, when present, ``curated/val2017/Coco164kFull_Stuff_Coarse_7.txt``; fine
                 labels are mapped to the 27 coarse categories (``COCO_FINE_TO_27``)
    voc          ``JPEGImages/<id>.jpg``, ``SegmentationClass/<id>.png`` (palette indices, 255 = boundary)
                 and ``ImageSets/Segmentation/val.txt`` when present
    folder       ``images/<name>.png|.jpg|.jpeg`` beside ``labels/<name>.png`` (or ``masks/`` or
                 ``annotations/``), one class index per pixel; ``classes.txt`` when present

An image may be PNG or JPEG in every layout; it is read as RGB, or as grey (PIL's ``L``) for a model of one
input channel. Classes (voc and folder): ``classes.txt`` when present (line i
names label value i, one name a line), else every label value up to the largest any label map holds
(VOC's 21 names when that gives 21). ``ignore_index`` (default 255) is the value of unlabelled pixels; a
value inside the class range (e.g. 0) is not a class, and the labels above it move down by one. A class that
no scored label map shows (a name of ``classes.txt``, a gap in the label values, a category the drawn images
lack) is taken out: the classes are those the scored maps show, in order, and the card names the others
(``absent_classes``), so mIoU is not pulled down by an IoU of 0 for a class there was nothing of. Label maps
with no scored pixel at all (every pixel ``ignore_index``) are refused, with ``classes.txt`` or without.

Which label maps: all of them when ``--seg-images`` is at least their number, else a seeded class-balanced
draw (``subsets.label_map_order``) over every label map (or every listed id), never the first N of a
listing: every label map is read once for the classes it shows before the drawn images are read.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from ..errors import DataError
from .info import IMAGENET_MEAN, IMAGENET_STD
from .subsets import label_map_order

IGNORE = 255  # the ignore label of every label map handed to the metric
GREY_MEAN, GREY_STD = (sum(IMAGENET_MEAN) / 3,), (sum(IMAGENET_STD) / 3,)  # a one-channel model's normalisation
IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png")
LABEL_DIRS = ("labels", "masks", "annotations")  # the folder layout's label-map folder: the first present
COCO_CURATED = "Coco164kFull_Stuff_Coarse_7.txt"  # the val list STEGO and the authors' loader read (subset 7)
# COCO-Stuff's 182 fine ids (0-based; things 0..90, stuff 91..181) -> the 27 coarse categories
# (12 thing + 15 stuff supercategories), the mapping STEGO / PiCIE evaluate COCO-Stuff-27 with
COCO_FINE_TO_27 = np.array([int(v) for v in """
9 11 11 11 11 11 11 11 11 8 8 8 8 8 8 7 7 7 7 7 7 7 7 7 7 6 6 6 6 6 6 6 6 10 10 10 10 10 10 10 10 10 10 5 5 5 5 5
5 5 5 2 2 2 2 2 2 2 2 2 2 3 3 3 3 3 3 3 3 3 3 0 0 0 0 0 0 1 1 1 1 1 1 4 4 4 4 4 4 4 4 17 17 22 20 20 22 15 25 16 13
12 12 17 17 23 15 15 17 15 21 15 25 13 13 13 13 13 22 26 14 14 15 22 21 21 24 20 22 15 17 16 15 22 24 21 17 25 16
21 17 22 16 21 21 25 21 26 21 24 20 17 14 21 26 15 23 20 21 24 15 24 22 25 15 20 17 17 22 14 18 18 18 18 18 18 18
26 26 19 19 24""".split()], dtype=np.uint8)
COCO27_NAMES = ("electronic", "appliance", "food", "furniture", "indoor", "kitchen", "accessory", "animal", "outdoor",
                "person", "sports", "vehicle", "ceiling", "floor", "food-stuff", "furniture-stuff", "rawmaterial",
                "textile", "wall", "window", "building", "ground", "plant", "sky", "solid", "structural", "water")
VOC_NAMES = ("background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
             "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train", "tvmonitor")


@dataclass
class MaskedImages:
    """Normalised images, their label maps and what they are."""

    images: torch.Tensor  # (N, C, S, S) float, normalised
    labels: torch.Tensor  # (N, S, S) int64, 255 = ignore
    classes: int
    card: dict  # data, split, images, chosen, resize, classes
    mean: tuple
    std: tuple
    names: tuple[str, ...] = ()  # class names (label i is names[i]); () where unknown


@dataclass
class Layout:
    """The (image, label map) pairs of one folder and where they came from."""

    name: str
    root: Path
    pairs: list[tuple[Path, Path]]
    source: str  # "the N ids of val.txt", "every label map" ...
    notes: dict  # more for the card (the folder layout: which label folder, images without a label map)


def coco_to_27(fine: np.ndarray) -> np.ndarray:
    """COCO-Stuff fine labels (0..181, 255) -> coarse 27 (0..26, 255)."""
    out = np.full(fine.shape, IGNORE, dtype=np.uint8)
    ok = fine < len(COCO_FINE_TO_27)
    out[ok] = COCO_FINE_TO_27[fine[ok]]
    return out


def _images_by_stem(img_dir: Path) -> dict[str, list[Path]]:
    """``{stem: [its PNG / JPEG files]}`` of one folder, listed once (suffixes in any case)."""
    found: dict[str, list[Path]] = {}
    for p in sorted(img_dir.iterdir()):
        if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file():
            found.setdefault(p.stem, []).append(p)
    return found


def _image_of(images: dict[str, list[Path]], img_dir: Path, stem: str, why: str) -> Path:
    files = images.get(stem, [])
    if len(files) > 1:
        raise DataError(f"{img_dir} holds {len(files)} images named {stem} ({', '.join(p.name for p in files)}): "
                        "keep one, so the label map has one image")
    if not files:
        raise DataError(f"{img_dir / stem}.jpg|.jpeg|.png {why}")
    return files[0]


def _listed_pairs(name: str, root: Path) -> Layout:
    """cocostuff27 / voc: the ids of the list file when present, else every label map."""
    if name == "cocostuff27":
        img_dir, lab_dir = root / "images" / "val2017", root / "annotations" / "val2017"
        listed, layout = root / "curated" / "val2017" / COCO_CURATED, "images/val2017/<id>.jpg + annotations/val2017/<id>.png"
    else:
        img_dir, lab_dir = root / "JPEGImages", root / "SegmentationClass"
        listed, layout = root / "ImageSets" / "Segmentation" / "val.txt", "JPEGImages/<id>.jpg + SegmentationClass/<id>.png"
    if not img_dir.is_dir() or not lab_dir.is_dir():
        raise DataError(f"{root} is not a {name} folder: expected {layout}; pass --seg-path to that folder")
    if listed.is_file():
        ids, source = [ln.strip() for ln in listed.read_text().splitlines() if ln.strip()], f"ids of {listed.name}"
    else:
        ids, source = sorted(p.stem for p in lab_dir.glob("*.png")), "every label map (no id list found)"
    images = _images_by_stem(img_dir)
    pairs = []
    for i in ids:
        lab = lab_dir / f"{i}.png"
        if not lab.is_file():
            raise DataError(f"{name}: {lab} is listed but missing; restore it or remove its id from the list")
        pairs.append((_image_of(images, img_dir, i, "is listed but missing; restore it or remove its id from the list"),
                      lab))
    if not pairs:
        raise DataError(f"{root} holds no {name} label maps ({layout})")
    return Layout(name, root, pairs, source, {})


def _folder_pairs(root: Path) -> Layout:
    """The folder layout: ``images/`` beside ``labels/`` (or ``masks/``, ``annotations/``), paired by name."""
    lab_dir = next((root / d for d in LABEL_DIRS if (root / d).is_dir()), None)
    if not (root / "images").is_dir() or lab_dir is None:
        raise DataError(f"{root} is not a segmentation folder: expected images/<name>.png|.jpg|.jpeg beside "
                        f"labels/<name>.png (one class index per pixel); pass --seg-data folder:DIR with that folder")
    images = _images_by_stem(root / "images")
    labels = sorted(lab_dir.glob("*.png"))
    if not labels:
        raise DataError(f"{lab_dir} holds no .png label maps; a label map is a one-channel PNG of class indices "
                        "named as its image (images/a.jpg -> labels/a.png)")
    pairs = [(_image_of(images, root / "images", p.stem, f"is missing: {p} has no image; add it or remove the label map"),
              p) for p in labels]
    unlabelled = len(set(images) - {p.stem for p in labels})
    return Layout("folder", root, pairs, "every label map",
                  {"label_folder": lab_dir.name, "images_without_label_map": unlabelled})


def _read(path: Path, convert) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as im:
            return np.asarray(convert(im))
    except Exception as e:  # noqa: BLE001 - any unreadable file is the same problem for the user
        raise DataError(f"cannot read {path} ({type(e).__name__}: {e}); replace or remove it") from None


def _label_map(path: Path) -> np.ndarray:
    """A label map's values as they are stored: palette indices / grey levels, never converted to RGB."""
    lab = _read(path, lambda im: im)
    if lab.dtype == bool:  # a 1-bit PNG: 0 and 1
        lab = lab.astype(np.uint8)
    if lab.ndim != 2 or lab.dtype.kind not in "ui" or (lab.size and lab.min() < 0):
        shape = "x".join(map(str, lab.shape))
        raise DataError(f"{path} is a {shape} {lab.dtype} image, not a label map: save one class index per pixel as a "
                        "one-channel (palette, greyscale or 16-bit) PNG")
    return lab


def class_names_file(root: Path) -> list[str] | None:
    """``classes.txt``'s names (line i names label value i), or None without the file."""
    file = root / "classes.txt"
    if not file.is_file():
        return None
    try:
        text = file.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise DataError(f"cannot read {file} ({type(e).__name__}: {e}); save it as UTF-8 text, one class name a "
                        "line") from None
    names = [ln.strip() for ln in text.splitlines()]
    while names and not names[-1]:
        names.pop()
    if not names:
        raise DataError(f"{file} is empty: write one class name a line (line 1 names label 0, line 2 label 1, ...)")
    empty = next((i for i, n in enumerate(names) if not n), None)
    if empty is not None:
        raise DataError(f"{file}: line {empty + 1} is empty; write one class name a line (line i names label i - 1), "
                        "the ignored label's line included when it is inside the class range")
    twice = next((n for i, n in enumerate(names) if n in names[:i]), None)
    if twice is not None:
        raise DataError(f"{file} names {twice!r} twice: every class needs its own name (they key the per-class IoU)")
    return names


def _nothing_to_score(layout: Layout, ignore: int) -> str:
    if layout.name == "cocostuff27":
        return (f"{layout.root}: every pixel of every label map is unlabelled (255, or a fine label 182..254 that "
                "COCO-Stuff-27 does not map), so there is nothing to score: check annotations/val2017")
    return (f"{layout.root}: every pixel of every label map is {ignore} (--seg-ignore-index), so there is nothing to "
            "score: check the label maps, or set --seg-ignore-index to the label of unlabelled pixels")


def without_absent_classes(m: MaskedImages, where: str) -> MaskedImages:
    """``m`` with the classes that none of its label maps shows taken out: the classes left keep their order and
    are numbered 0.. again, the card's ``classes`` / ``class_names`` are theirs and ``absent_classes`` names the
    others (so mIoU is the mean over the classes there is something of). ``m`` itself when every class occurs.
    Label maps without one scored pixel, or showing one class only, are refused (``where`` names them)."""
    shown = torch.unique(m.labels[m.labels != IGNORE])
    names = list(m.names) if len(m.names) == m.classes else [str(c) for c in range(m.classes)]
    if len(shown) == 0:
        raise DataError(f"{where}: no pixel of the {len(m.labels)} scored label maps is labelled (after resizing to "
                        "the model's input), so there is nothing to score: check the label maps and --seg-ignore-index")
    if len(shown) == 1:
        raise DataError(f"{where}: the {len(m.labels)} scored label maps show one class only "
                        f"({names[int(shown[0])]!r}), and mIoU needs 2: add label maps with other classes, or raise "
                        "--seg-images")
    if len(shown) == m.classes:
        return m
    renumber = torch.full((IGNORE + 1,), IGNORE, dtype=torch.long)
    renumber[shown] = torch.arange(len(shown))
    kept = [names[int(c)] for c in shown]
    absent = [n for c, n in enumerate(names) if c not in set(shown.tolist())]
    card = {**m.card, "classes": len(kept), "class_names": kept, "absent_classes": absent}
    return replace(m, labels=renumber[m.labels], classes=len(kept), card=card,
                   names=tuple(kept) if m.names else ())


def _classes(layout: Layout, values: list[np.ndarray], ignore: int) -> tuple[np.ndarray, tuple[str, ...], str]:
    """(raw label value -> class index or IGNORE, the class names, where the classes came from)."""
    top = max((int(v.max()) for v in values if v.size), default=0)
    if layout.name == "cocostuff27":
        lut = np.full(max(top + 1, len(COCO_FINE_TO_27)), IGNORE, dtype=np.int64)
        lut[:len(COCO_FINE_TO_27)] = COCO_FINE_TO_27
        return lut, COCO27_NAMES, "COCO-Stuff's 27 coarse categories (fine labels mapped, 182..254 and 255 ignored)"
    listed = class_names_file(layout.root)
    if listed is not None:
        raw, source = len(listed), "classes.txt"
        for (_, lab), v in zip(layout.pairs, values, strict=True):
            bad = v[(v >= raw) & (v != ignore)]
            if bad.size:
                raise DataError(f"{lab} holds label {int(bad[0])} but {layout.name} has {raw} classes (classes.txt: "
                                f"labels 0..{raw - 1}, {ignore} ignored): add its name to classes.txt, or set "
                                "--seg-ignore-index to the label of unlabelled pixels")
    else:
        raw = max((int(v[v != ignore].max()) + 1 for v in values if (v != ignore).any()), default=0)
        if not raw:
            raise DataError(_nothing_to_score(layout, ignore))
        source = f"the label maps (every value up to the largest, {raw - 1}; {ignore} ignored)"
        standard = layout.name == "voc" and raw == len(VOC_NAMES) and ignore >= raw
        listed = list(VOC_NAMES) if standard else [str(i) for i in range(raw)]
    keep = [v for v in range(raw) if v != ignore]  # an ignore_index inside the range is not a class
    if len(keep) < 2 or len(keep) > IGNORE:
        raise DataError(f"{layout.root}: the label maps give {len(keep)} classes ({source}); the metric needs 2 to "
                        f"{IGNORE}: check --seg-ignore-index ({ignore}) and classes.txt (one name per label value)")
    lut = np.full(max(top + 1, raw), IGNORE, dtype=np.int64)
    lut[keep] = np.arange(len(keep))
    return lut, tuple(listed[v] for v in keep), source


def _load(layout: Layout, lut: np.ndarray, chosen: np.ndarray, side: int, mode: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The chosen images (resized, ``mode`` RGB or L, in [0, 1]) and label maps (class indices, nearest)."""
    images, labels = [], []
    for i in chosen:
        img_file, lab_file = layout.pairs[int(i)]
        img = _read(img_file, lambda im: im.convert(mode))
        img = img[..., None] if img.ndim == 2 else img
        lab = _label_map(lab_file)
        if lab.shape != img.shape[:2]:
            raise DataError(f"{lab_file} is {'x'.join(map(str, lab.shape))} but its image {img_file.name} is "
                            f"{img.shape[0]}x{img.shape[1]}: a label map must be one channel of the image's size")
        images.append(resize_crop(torch.from_numpy(img.copy()).permute(2, 0, 1), side, "bicubic").div(255).clamp(0, 1))
        labels.append(resize_crop(torch.from_numpy(lut[lab])[None], side, "nearest")[0].long())
    return torch.stack(images), torch.stack(labels)


def resize_crop(x: torch.Tensor, side: int, mode: str) -> torch.Tensor:
    """(C, H, W) -> (C, side, side): short side to ``side``, centre crop."""
    h, w = x.shape[-2:]
    scale = side / min(h, w)
    size = (max(side, round(h * scale)), max(side, round(w * scale)))
    kw = {"mode": mode} if mode == "nearest" else {"mode": mode, "align_corners": False, "antialias": True}
    y = F.interpolate(x[None].float(), size=size, **kw)[0]
    top, left = (size[0] - side) // 2, (size[1] - side) // 2
    return y[:, top:top + side, left:left + side]


def read_folder(name: str, root: Path, side: int, limit: int, seed: int, ignore: int = IGNORE,
                channels: int = 3) -> MaskedImages:
    """A folder's images and label maps, ``limit`` of them drawn class-balanced (all when they are fewer).

    Args:
        name: cocostuff27, voc or folder; root: the folder; side: the model's input side;
        limit: at most this many images; seed: the draw's seed (``--seg-seed``);
        ignore: the label value of unlabelled pixels in the files (voc and folder; ``--seg-ignore-index``);
        channels: the model's input channels: 3 (RGB, ImageNet mean/std) or 1 (grey, their means).
    """
    layout = _folder_pairs(root) if name == "folder" else _listed_pairs(name, root)
    values = [np.unique(_label_map(lab)) for _, lab in layout.pairs]  # each label map once, for its classes
    lut, names, classes_from = _classes(layout, values, ignore)
    if not any((lut[v] != IGNORE).any() for v in values):  # with classes.txt too (then they scored mIoU 0)
        raise DataError(_nothing_to_score(layout, ignore))
    total = len(layout.pairs)
    if limit >= total:
        chosen, how = np.arange(total), layout.source
    else:
        present = [np.setdiff1d(lut[v], [IGNORE]) for v in values]
        chosen = np.sort(label_map_order(present, seed)[:limit])
        how = f"class-balanced draw of {limit} of {total} ({layout.source}), seed {seed}"
    grey = channels == 1
    mean, std = (GREY_MEAN, GREY_STD) if grey else (IMAGENET_MEAN, IMAGENET_STD)
    x, labels = _load(layout, lut, chosen, side, "L" if grey else "RGB")
    x = (x - torch.tensor(mean).view(-1, 1, 1)) / torch.tensor(std).view(-1, 1, 1)
    card = {"data": name, "path": str(root), "split": "val", "images": len(chosen), "chosen": how,
            "classes": len(names), "class_names": list(names), "classes_from": classes_from,
            "ignore_index": IGNORE if name == "cocostuff27" else ignore, **layout.notes,
            "files": [layout.pairs[int(i)][1].stem for i in chosen],
            "resize": f"short side to {side} (bicubic; labels nearest), centre crop {side}",
            "norm": "grey (PIL L), ImageNet mean/std averaged over RGB" if grey else "ImageNet mean/std"}
    return without_absent_classes(MaskedImages(x, labels, len(names), card, mean, std, names), str(root))
