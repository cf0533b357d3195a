"""A user's own segmentation folder (``--seg-data folder:DIR``), written at test time: images (PNG and JPEG)
beside one-channel PNG label maps, 3 classes, a row of ignored pixels, ``classes.txt``."""

from __future__ import annotations

import numpy as np
from PIL import Image

IGNORE = 255


def write_seg_folder(root, n: int = 12, rare: int = 3, side: int = 32, names=("ground", "square", "disc"),
                     ignore: int = IGNORE, jpeg_every: int = 2):
    """``images/`` (PNG, every ``jpeg_every``-th JPEG) beside ``labels/``: class 0 everywhere, class 1 a square in the
    first n - rare images (sorted by name), class 2 a square in the last ``rare``, row 0 ignored; ``classes.txt``
    unless names is None. Returns the label maps as written."""
    rng = np.random.default_rng(0)
    (root / "images").mkdir(parents=True)
    (root / "labels").mkdir()
    maps = {}
    for i in range(n):
        lab = np.zeros((side, side), np.uint8)
        lab[8:24, 8:24] = 1 if i < n - rare else 2
        lab[0] = ignore
        img = (rng.integers(0, 40, (side, side, 3)) + 90 * (lab[..., None] % 3)).clip(0, 255).astype(np.uint8)
        ext = "jpg" if jpeg_every and i % jpeg_every else "png"
        Image.fromarray(img).save(root / "images" / f"img{i:02d}.{ext}")
        Image.fromarray(lab).save(root / "labels" / f"img{i:02d}.png")
        maps[f"img{i:02d}"] = lab
    if names is not None:
        (root / "classes.txt").write_text("\n".join(names) + "\n")
    return maps
