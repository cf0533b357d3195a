"""Image sets as ``resdecay fid`` reads them: an ADM-format ``.npz`` (uint8 NHWC under ``arr_0``), a
``.npy`` of the same array, or a folder of image files (PNG, JPEG, ...), which is what pytorch-fid's
``fid dirA dirB`` and torch-fidelity's ``--input1 --input2`` compare.

``describe_set`` reads only headers (the array header inside the zip, each image file's header), so
the number of images and their size are known, and refused when unusable, before any network is
trained or any feature extracted, so bad input costs a second. ``ImageSet.source()`` then streams the images as
uint8 (N, C, H, W) chunks: a folder of 50k images is never held in memory at once.

A folder is read like pytorch-fid reads one: the files with an image suffix directly inside it,
in sorted order. Its images are 1-channel when every file is grayscale (mode L or 1; what
``resdecay sample`` writes for 1-channel models) and RGB otherwise (``convert("RGB")``, as pytorch-fid).

``image_chunks`` / ``rebatch`` / ``unit_float`` turn any of these inputs (and tensors, arrays or loaders)
into the fixed-size [0, 1] float batches FID features are computed on.
"""

from __future__ import annotations

import os
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ...data.datasets import IMG_EXTENSIONS
from ...errors import UserError, one_line
from ...io import first_sentence

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


def array_fix(dtype, shape) -> str:
    """The fix for an array that is not uint8 NHWC images: the dtype conversion only when the dtype is
    what is wrong; a wrong shape needs (N, H, W, C) with C 1 or 3, or (N, H, W), and a dtype fix
    alone would not help it."""
    if len(shape) not in (3, 4) or (len(shape) == 4 and shape[-1] not in (1, 3)):
        return "save the images as one (N, H, W, C) array with C = 1 or 3 (or (N, H, W) for grayscale)"
    return "convert with (x * 255).round().astype(np.uint8)"


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
                        + array_fix(dtype, shape))
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


# ----------------------------------------------------------------------------- any images -> fixed batches (FID)
def image_chunks(images):
    """Raw chunks as uint8 or float tensors (N, C, H, W); converted to float only batch by batch."""
    if isinstance(images, (str, os.PathLike)):
        path = Path(images).expanduser()
        try:
            z = np.load(path, allow_pickle=False)
            if isinstance(z, np.lib.npyio.NpzFile):  # ADM's .npz; a plain .npy holds the array itself
                with z:
                    z = z["arr_0"]
        except Exception as e:
            raise UserError(f"cannot read samples file {path} ({type(e).__name__}: {first_sentence(one_line(e), 100)}): pass an "
                            f".npz holding uint8 NHWC images in 'arr_0' (ADM format)") from None
        images = z
    if isinstance(images, np.ndarray):
        if images.dtype != np.uint8 or images.ndim not in (3, 4):
            raise UserError(f"numpy samples must be uint8 NHWC images (ADM .npz 'arr_0'), got {images.dtype} "
                            f"{images.shape}: " + array_fix(images.dtype, images.shape))
        t = torch.from_numpy(images)
        yield t.unsqueeze(1) if t.ndim == 3 else t.permute(0, 3, 1, 2)
    elif isinstance(images, torch.Tensor):
        yield images
    elif hasattr(images, "__iter__") and not isinstance(images, (dict, bytes)):  # DataLoader, list of batches
        for item in images:
            yield from image_chunks(item[0] if isinstance(item, (tuple, list)) else item)  # (images, labels) pairs
    else:
        raise UserError(f"samples of type {type(images).__name__} are not images: pass a float tensor in [0, 1] "
                        f"(B, C, H, W), a uint8 NHWC array, an .npz path (ADM 'arr_0') or a loader of such tensors")


def unit_float(x: torch.Tensor) -> torch.Tensor:
    """One batch as float32 in [0, 1] (uint8 divided by 255); anything else outside [0, 1] is refused."""
    if x.ndim != 4 or x.shape[1] not in (1, 3):
        raise UserError(f"images must be (B, C, H, W) with 1 or 3 channels (numpy: uint8 NHWC), got {tuple(x.shape)}")
    if x.dtype != torch.uint8 and not x.is_floating_point():
        raise UserError(f"image tensors must be float in [0, 1] or uint8, got {x.dtype}")
    # a fresh copy with standard strides: batches cut from NHWC arrays (even 1-channel ones) would
    # otherwise run channels-last conv kernels and give features that differ in the last bits
    y = torch.empty(x.shape, dtype=torch.float32, device=x.device).copy_(x)
    if x.dtype == torch.uint8:
        return y.div_(255)
    lo, hi = float(y.min()), float(y.max())
    if lo < -1e-3 or hi > 1 + 1e-3:  # e.g. mean/std-normalised dataset items, or [-1, 1] model outputs
        raise UserError(f"images must be floats in [0, 1], got values in [{lo:.3g}, {hi:.3g}]: map [-1, 1] "
                        f"outputs with (x + 1) / 2 and undo any mean/std normalisation")
    return y.clamp_(0, 1)


def rebatch(chunks, batch_size: int):
    """Exactly batch_size images per batch (the last may be short), however the input was chunked."""
    buf, n = [], 0
    for piece in (p for c in chunks for p in c.split(batch_size)):
        buf.append(piece)
        n += len(piece)
        if n >= batch_size:
            cat = torch.cat(buf)
            yield cat[:batch_size]
            buf, n = [cat[batch_size:]], n - batch_size
    if n:
        yield torch.cat(buf)
