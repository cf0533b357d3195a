"""Image sets as ``resdecay fid`` reads them: an ADM-format ``.npz`` (uint8 NHWC under ``arr_0``), a
``.npy`` of the same array, or a folder of image files (PNG, JPEG, ...), which is what pytorch-fid's
``fid dirA dirB`` and torch-fidelity's ``--input1 --input2`` compare.

``describe_set`` reads only headers (the array header inside the zip, each image file's header), so
the number of images and their size are known, and refused when unusable, before any network is
trained or any feature extracted (issue 23.8). ``ImageSet.source()`` then streams the images as
uint8 (N, C, H, W) chunks: a folder of 50k images is never held in memory at once.

A folder is read like pytorch-fid reads one: the files with an image suffix directly inside it,
in sorted order. Its images are 1-channel when every file is grayscale (mode L or 1; what
``resdecay sample`` writes for 1-channel models) and RGB otherwise (``convert("RGB")``, as pytorch-fid).
"""

from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..data.datasets import IMG_EXTENSIONS
from ..errors import UserError, one_line
from ..io import first_sentence

ARRAY_SUFFIXES = (".npz", ".npy")
GRAY_MODES = ("L", "1")
CHUNK = 100  # images decoded at a time from a folder
SET_FIX = "pass an ADM .npz (arr_0: uint8 NHWC), e.g. from `resdecay sample`, or a folder of PNG/JPEG images"


@dataclass
class ImageSet:
    """An image set known by its headers.

    Args:
        path: the .npz / .npy file or the folder.
        n: the number of images.
        resolution: (C, H, W) of every image.
        files: a folder's image files, in reading order; None for an array file.
    """

    path: Path
    n: int
    resolution: tuple[int, int, int]
    files: list[Path] | None = None

    def source(self):
        """What ``feature_stats`` reads: the array file's path, or the folder's images in chunks."""
        return str(self.path) if self.files is None else self._chunks()

    def _chunks(self):
        mode = "L" if self.resolution[0] == 1 else "RGB"
        for start in range(0, len(self.files), CHUNK):
            arrays = [_decode(f, mode) for f in self.files[start:start + CHUNK]]
            x = torch.from_numpy(np.stack(arrays))
            yield x.unsqueeze(1) if x.ndim == 3 else x.permute(0, 3, 1, 2)


def is_image_set(path: str) -> bool:
    """Whether ``path`` names an image set (a folder or an array file) rather than a stats file or a data set.

    Args:
        path: what the user passed.
    """
    p = Path(path).expanduser()
    return p.is_dir() or p.suffix.lower() in ARRAY_SUFFIXES


def describe_set(path: str) -> ImageSet:
    """The image set at ``path``, from headers only; a one-line UserError when it cannot be used.

    Args:
        path: an ``.npz`` / ``.npy`` file or a folder of image files.
    """
    p = Path(path).expanduser()
    if p.is_dir():
        return _describe_folder(p)
    if not p.is_file():
        raise UserError(f"no samples file or folder at {p}: {SET_FIX}")
    try:
        shape, dtype = _array_header(p)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"cannot read samples file {p} ({type(e).__name__}: {first_sentence(one_line(e), 100)}): "
                        f"{SET_FIX}") from None
    if dtype != np.uint8 or len(shape) not in (3, 4) or (len(shape) == 4 and shape[-1] not in (1, 3)):
        raise UserError(f"{p} holds a {dtype} array of shape {shape}, not uint8 NHWC images with 1 or 3 channels: "
                        "convert with (x * 255).round().astype(np.uint8)")
    n, h, w = shape[:3]
    return ImageSet(p, int(n), (int(shape[3]) if len(shape) == 4 else 1, int(h), int(w)))


def _array_header(path: Path) -> tuple[tuple, np.dtype]:
    """Shape and dtype of a .npy file or of an .npz's ``arr_0``, without reading the data."""
    if path.suffix.lower() == ".npz":
        with zipfile.ZipFile(path) as z:
            if "arr_0.npy" not in z.namelist():
                raise UserError(f"{path} has no 'arr_0' array (it holds {', '.join(n[:-4] for n in z.namelist())}): "
                                f"{SET_FIX}")
            with z.open("arr_0.npy") as f:
                return _npy_header(f)
    with open(path, "rb") as f:
        return _npy_header(f)


def _npy_header(f) -> tuple[tuple, np.dtype]:
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    shape, _, dtype = read(f)
    return tuple(shape), dtype


def _describe_folder(folder: Path) -> ImageSet:
    from PIL import Image

    files = sorted(f for f in folder.iterdir() if f.suffix.lower() in IMG_EXTENSIONS and f.is_file())
    if not files:
        raise UserError(f"folder {folder} holds no image files ({', '.join(IMG_EXTENSIONS)}) directly inside it: {SET_FIX}")
    size, gray = None, True
    for f in files:
        try:
            with Image.open(f) as im:  # reads the header only
                this, mode = im.size, im.mode
        except Exception as e:
            raise UserError(f"cannot read image {f} ({type(e).__name__}: {first_sentence(one_line(e), 100)}): "
                            "remove or replace it") from None
        if size is not None and this != size:
            raise UserError(f"images in {folder} differ in size: {files[0].name} is {size[0]}x{size[1]}, {f.name} is "
                            f"{this[0]}x{this[1]}; FID needs one size")
        size, gray = this, gray and mode in GRAY_MODES
    return ImageSet(folder, len(files), (1 if gray else 3, size[1], size[0]), files)


def _decode(path: Path, mode: str) -> np.ndarray:
    from PIL import Image

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert(mode))
    except Exception as e:
        raise UserError(f"cannot read image {path} ({type(e).__name__}: {first_sentence(one_line(e), 100)}): "
                        "remove or replace it") from None
