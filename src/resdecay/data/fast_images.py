"""The uint8 image path for ImageFolder data, so that decoding keeps up with the step: decode with torchvision's libjpeg-turbo /
libpng bindings straight into uint8 tensors, crop/resize/flip with ``transforms.v2`` on uint8,
and leave the float conversion and normalisation to the device.

* ``decode_uint8(path)``: JPEG and 8-bit PNG files (by their first bytes, not their names) through
  TorchCodec's ``decode_image`` in RGB mode when TorchCodec (>= 0.16) is installed, everything
  else (and everything when it is not) through PIL's ``convert("RGB")``. torchvision's own image
  decoders (``torchvision.io.decode_image`` and friends) are deprecated since torchvision 0.29
  (they emit a DeprecationWarning on every call) and are not used; both decoders
  here give the same pixels as PIL on JPEG and PNG (libjpeg-turbo / libpng underneath). A file
  neither reads raises the same ``DataError`` as the PIL path: ``cannot read image <path>:
  <PIL's reason>; remove or replace the file``.
* The transform on these uint8 tensors (``Uint8View``) is built by ``transforms.create_transform``;
  it returns normalised float images (the dataset contract every evaluator relies on), or uint8
  images when the training dataset is built with ``uint8_out`` (``build_dataset``).
* ``DeviceLoader``: wraps the training DataLoader of uint8 batches; on CUDA it copies the next
  batch on a side stream while the current one computes (as timm's ``PrefetchLoader``), then
  converts and normalises on the device with the same operations as ``ToTensor``+``Normalize``
  (x / 255, - mean, / std in float32).

Random draws come from the global torch RNG inside the transform, which ``SeededSamples`` seeds
per (seed, epoch, index): a resumed run sees the same crops, whatever the number of workers.
"""

from __future__ import annotations

import io
import re
from functools import lru_cache

import torch

from ..errors import DataError

_JPEG, _PNG = b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n"


class BadImage(DataError):
    """An image file that cannot be opened or fully decoded (``path``, ``reason``)."""

    def __init__(self, path: str, reason: str | None = None):
        if reason is None:  # re-raised by a DataLoader worker with the whole message: keep it
            super().__init__(path)
            self.path = self.reason = None
            return
        super().__init__(f"cannot read image {path}: {reason}; remove or replace the file, run `resdecay check-data` "
                         "to list every unreadable file, or train with data.on_bad_file=skip")
        self.path, self.reason = path, reason

    def __reduce__(self):  # picklable with its fields (DataLoader workers re-raise it)
        return (BadImage, (self.path, self.reason))


def bad_image_reason(e: Exception) -> str:
    """PIL's reason, without the file object's repr (the path is already in the message; a
    BytesIO's repr carries an address that would make the same file's reason differ per run)."""
    return re.sub(r"\s*<_io\.\w+[^>]*>", "", " ".join(f"{type(e).__name__}: {e}".split()))[:200]


def _pil_rgb(path: str, raw: bytes | None = None) -> torch.Tensor:
    """(3, H, W) uint8 RGB by PIL, from ``raw`` (the file's bytes, already read) or the file."""
    from PIL import Image

    try:
        with (io.BytesIO(raw) if raw is not None else open(path, "rb")) as f:
            img = Image.open(f).convert("RGB")
    except Exception as e:
        raise BadImage(str(path), bad_image_reason(e)) from None
    return torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(img.height, img.width, 3).permute(2, 0, 1)


@lru_cache(maxsize=1)
def _torchcodec_decoder():
    """TorchCodec's ``decode_image`` (the supported successor of torchvision's), or None when
    TorchCodec is not installed or cannot load its image library."""
    try:
        from torchcodec.decoders import decode_image
    except Exception:  # not installed, or its native library does not load on this machine
        return None
    return decode_image


def _is_8bit_png(raw: bytes) -> bool:
    """PNG whose IHDR bit depth (byte 24) is at most 8: 16-bit PNGs go to PIL, whose RGB
    conversion the ``pil`` decoder and ``check-data`` use too."""
    return raw.startswith(_PNG) and len(raw) > 24 and raw[24] <= 8


def decode_uint8(path: str) -> torch.Tensor:
    """(3, H, W) uint8 RGB of an image file (module docstring).

    Args:
        path: the image file.

    Returns:
        The decoded image, uint8, channels first.
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError:
        return _pil_rgb(path)  # the PIL path words the error as before
    return decode_raw_uint8(raw, path)


def decode_raw_uint8(raw: bytes, name: str) -> torch.Tensor:
    """(3, H, W) uint8 RGB of an image file's bytes: TorchCodec for JPEG / 8-bit PNG when installed, else
    PIL; ``name`` (a path, or a shard member) names the file in errors."""
    decode = _torchcodec_decoder() if raw.startswith(_JPEG) or _is_8bit_png(raw) else None
    if decode is not None:
        try:
            img = decode(raw, mode="RGB")
            if img.dtype == torch.uint8 and img.dim() == 3:
                return img
        except (RuntimeError, ValueError):
            pass  # CMYK / corrupt / unusual: PIL decides, and words the error
    return _pil_rgb(name, raw)


def normalize(images: torch.Tensor, mean, std) -> torch.Tensor:
    """uint8 (..., C, H, W) -> float32 (x / 255 - mean) / std, as ToTensor + Normalize."""
    shape = (-1, 1, 1)
    m = torch.as_tensor(mean, dtype=torch.float32, device=images.device).view(shape)
    s = torch.as_tensor(std, dtype=torch.float32, device=images.device).view(shape)
    return images.float().div_(255.0).sub_(m).div_(s)


class DeviceLoader:
    """Iterates a DataLoader of uint8 image batches as normalised float32 batches on ``device``;
    on CUDA the copy of batch i+1 (a side stream, from pinned memory) overlaps the compute on
    batch i."""

    def __init__(self, loader, device: torch.device, mean, std):
        self.loader, self.device, self.mean, self.std = loader, torch.device(device), mean, std

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self):
        if self.device.type != "cuda":
            for images, labels in self.loader:
                yield normalize(images.to(self.device), self.mean, self.std), labels.to(self.device)
            return
        stream = torch.cuda.Stream(self.device)
        pending = None
        for images, labels in self.loader:
            with torch.cuda.stream(stream):
                images = images.to(self.device, non_blocking=True)
                labels = labels.to(self.device, non_blocking=True)
                images = normalize(images, self.mean, self.std)
            if pending is not None:
                yield pending
            torch.cuda.current_stream(self.device).wait_stream(stream)
            images.record_stream(torch.cuda.current_stream(self.device))
            labels.record_stream(torch.cuda.current_stream(self.device))
            pending = images, labels
        if pending is not None:
            yield pending
