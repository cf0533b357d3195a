"""An optional GPU-decode path for ImageFolder training: NVIDIA DALI decodes each JPEG's
crop window on the GPU (nvJPEG, ``device="mixed"``), resizes it and flips it there, for machines
with many GPUs and few CPU cores. ``data.decoder=dali``; DALI is an optional dependency
(``pip install nvidia-dali-cuda130``) and its absence is refused in one line.

Determinism: the crop window and flip of every sample are drawn here, on the host, from the same
seeded generator and with the same draws as the uint8 path (``SeededSamples`` seeds the CPU
generator per (seed, epoch, index); ``RandomResizedCrop`` then ``RandomHorizontalFlip`` draw from
it), and handed to DALI as explicit windows. A resumed run therefore sees the same crops, and the
crop geometry equals ``data.decoder=tensor``'s; only the resampling filter is DALI's (cubic with
antialiasing), so pixels agree closely, not bit for bit.

The host's work per image: read the file, parse its header for the size, draw the window. The host
feeds one batch at a time (prefetch depth 1): simple and exact; feeding ahead so the host work overlaps
the GPU decode is the next step if it shows up in a profile (not measured: no GPU so far). Without a
GPU (``device_id=None``) the same pipeline decodes on the CPU, which is how the tests run it.
"""

from __future__ import annotations

import functools
import io

import numpy as np
import torch

from ..errors import ConfigError, DataError
from .fast_images import BadImage, bad_image_reason, decode_uint8, normalize
from .resumable import SeededSamples, sample_seed

INSTALL = "data.decoder=dali needs NVIDIA DALI: pip install nvidia-dali-cuda130 (or use data.decoder=tensor)"


def require_dali():
    """The ``nvidia.dali`` module, or one ConfigError naming the package."""
    try:
        import nvidia.dali as dali  # noqa: F401
        import nvidia.dali.fn  # noqa: F401
    except ImportError:
        raise ConfigError(INSTALL) from None
    return dali


def image_size(raw: bytes, path: str) -> tuple[int, int]:
    """(height, width) from the file's header (no decode)."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(raw)) as img:
            return img.height, img.width
    except Exception as e:
        raise BadImage(path, bad_image_reason(e)) from None


@functools.lru_cache(maxsize=4)
def _crop(scale: tuple[float, float]):
    """The uint8 path's RandomResizedCrop (only its parameter draw is used; the size does not matter)."""
    import torchvision.transforms.v2 as T

    return T.RandomResizedCrop(1, scale=scale)


def crop_window(key: tuple[int, int], seed: int, height: int, width: int, scale: tuple[float, float]) -> tuple[int, int, int, int, bool]:
    """(top, left, h, w, flip) of sample ``key = (index, epoch)``: the draws the uint8 path makes
    under ``SeededSamples``' seed (RandomResizedCrop, then RandomHorizontalFlip)."""
    index, epoch = key
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(sample_seed(seed, epoch, index))
        p = _crop(tuple(scale)).make_params([torch.empty(3, 1, 1, dtype=torch.uint8).expand(3, height, width)])
        flip = bool(torch.rand(1) < 0.5)  # RandomHorizontalFlip(p=0.5) flips when rand < p
    return p["top"], p["left"], p["height"], p["width"], flip


def folder_samples(dataset) -> list[tuple[str, int]]:
    """The (path, label) list of an ImageFolder or a ``Subset`` of one (optionally in ``SeededSamples``),
    in dataset index order. Reads the list only; the dataset is left as it is."""
    if isinstance(dataset, SeededSamples):
        dataset = dataset.dataset
    if isinstance(dataset, torch.utils.data.Subset):
        return [dataset.dataset.samples[i] for i in dataset.indices]
    return list(dataset.samples)


class DaliLoader:
    """Iterates (images, labels) batches like ``DeviceLoader``: float32 normalised images on
    ``device``, decoded by DALI from the files of an ImageFolder.

    Args:
        samples: ``(path, label)`` pairs (an ImageFolder's ``samples``), in dataset index order.
        sampler: yields ``(index, epoch)`` keys (``ResumableSampler``); its ``set_epoch`` start is honoured.
        batch_size: images per batch (the last partial batch is dropped, as in training).
        size: output side in pixels. ``scale``: RandomResizedCrop's area range.
        seed: the run's seed (``train.seed``). mean, std: normalisation (on the device).
        device: torch device; CUDA decodes with nvJPEG ("mixed"), CPU with DALI's host decoder.
        threads: DALI host threads.
    """

    def __init__(self, samples, sampler, batch_size: int, size: int, scale, seed: int, mean, std,
                 device: torch.device, threads: int = 4):
        require_dali()
        self.samples, self.sampler, self.batch_size, self.size = list(samples), sampler, batch_size, size
        self.scale, self.seed, self.mean, self.std = tuple(scale), seed, mean, std
        self.device = torch.device(device)
        self.threads = max(1, threads)
        self._pipe = None

    def __len__(self) -> int:
        return len(self.sampler) // self.batch_size

    def _pipeline(self):
        import nvidia.dali.fn as fn
        import nvidia.dali.types as types
        from nvidia.dali import pipeline_def

        cuda = self.device.type == "cuda"

        @pipeline_def(batch_size=self.batch_size, num_threads=self.threads,
                      device_id=(self.device.index or 0) if cuda else None, prefetch_queue_depth=1)
        def crops():
            jpegs = fn.external_source(name="jpegs", dtype=types.UINT8, ndim=1)
            anchor = fn.external_source(name="anchor", dtype=types.FLOAT, ndim=1)  # (x, y) of the window
            shape = fn.external_source(name="shape", dtype=types.FLOAT, ndim=1)  # (w, h)
            mirror = fn.external_source(name="mirror", dtype=types.INT32, ndim=0)
            # decode only the window (nvJPEG ROI decode on the GPU); no EXIF rotation, as decode_image
            images = fn.decoders.image_slice(jpegs, anchor, shape, device="mixed" if cuda else "cpu",
                                             output_type=types.RGB, axis_names="WH", normalized_anchor=False,
                                             normalized_shape=False, adjust_orientation=False)
            images = fn.resize(images, resize_x=self.size, resize_y=self.size, interp_type=types.INTERP_CUBIC,
                               antialias=True)
            return fn.crop_mirror_normalize(images, dtype=types.UINT8, output_layout="CHW", mirror=mirror)

        pipe = crops()
        pipe.build()
        return pipe

    def _feed(self, keys) -> torch.Tensor:
        raws, anchors, shapes, mirrors, labels = [], [], [], [], []
        for key in keys:
            path, label = self.samples[key[0]]
            try:
                with open(path, "rb") as f:
                    raw = f.read()
            except OSError as e:
                raise BadImage(str(path), f"{type(e).__name__}: {e.strerror or e}") from None
            top, left, h, w, flip = crop_window(key, self.seed, *image_size(raw, str(path)), self.scale)
            raws.append(np.frombuffer(raw, dtype=np.uint8))
            anchors.append(np.array([left, top], dtype=np.float32))
            shapes.append(np.array([w, h], dtype=np.float32))
            mirrors.append(np.array(int(flip), dtype=np.int32))
            labels.append(label)
        for name, data in (("jpegs", raws), ("anchor", anchors), ("shape", shapes), ("mirror", mirrors)):
            self._pipe.feed_input(name, data)
        return torch.tensor(labels)

    def _run(self, keys) -> torch.Tensor:
        try:
            (out,) = self._pipe.run()
        except RuntimeError:
            for key in keys:  # name the file the way the other decoders do
                decode_uint8(self.samples[key[0]][0])
            raise DataError(f"DALI could not decode a batch of {len(keys)} images; the files decode on the CPU, "
                            "so try data.decoder=tensor") from None
        from nvidia.dali.backend import TensorListCPU
        from nvidia.dali.plugin.pytorch import feed_ndarray

        if isinstance(out, TensorListCPU):
            return torch.from_numpy(np.array(out.as_tensor()))

        tensor = out.as_tensor()
        images = torch.empty(tensor.shape(), dtype=torch.uint8, device=self.device)
        feed_ndarray(tensor, images, cuda_stream=torch.cuda.current_stream(self.device))
        return images

    def __iter__(self):
        if self._pipe is None:
            self._pipe = self._pipeline()
        keys = list(iter(self.sampler))
        for b in range(len(keys) // self.batch_size):
            batch = keys[b * self.batch_size:(b + 1) * self.batch_size]
            labels = self._feed(batch)
            images = self._run(batch).to(self.device)
            yield normalize(images, self.mean, self.std), labels.to(self.device)
