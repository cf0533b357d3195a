"""ImageFolder data path throughput: images/s per worker core, the PIL path next to the uint8
path (the default), in one process, interleaved, on a folder of real-size JPEGs made here.

What is measured
    What one DataLoader worker does per batch of ``--batch`` images: read + decode each JPEG,
    MAE's training view (RandomResizedCrop 0.2-1 to 224, bicubic, + horizontal flip; seeded per
    (seed, epoch, index) by ``SeededSamples`` as in training), and collate the batch. One thread
    (``torch.set_num_threads(1)``, as in a DataLoader worker), so img/s here = img/s per core.

    pil (before)        ``data.decoder=pil``: PIL decode, torchvision v1 RandomResizedCrop/flip on
                        PIL images, ToTensor + Normalize: float32 batches.
    tensor, uint8 out   ``data.decoder=tensor`` (the default): TorchCodec's decoder (PIL without it),
                        ``transforms.v2`` on uint8, uint8 batches; training normalises on the
                        device (``data.DeviceLoader``), so this is a worker's whole share.
    tensor, float out   the same, normalised in the worker (what evaluators get).
    dali, <device>      ``data.decoder=dali`` (optional package): the same crop windows drawn on the
                        host, DALI decodes the window, resizes and flips (one host thread); on a
                        GPU with nvJPEG ("mixed"), else with DALI's CPU decoder. Listed as not
                        measured when DALI is not installed.

The images
    ``--images`` JPEGs (quality 90) cut from scikit-learn's two sample photographs (427x640) at
    varied places, scales and aspect ratios and resized to photograph-like sizes around 500x375
    (ImageNet's mean is ~400x350), landscape and portrait, in a temporary ImageFolder.

How
    ``--rounds`` rounds; in each, every path goes once over all images in a fresh epoch (new
    crops), in rotating order, so that load from other processes hits all paths alike. The table
    gives the median img/s over rounds, its ratio to the PIL path, and the cores each path needs
    for 5,000 img/s (one H100's appetite for mae-b16): 5000 / (img/s per core).

    python benchmarks/data_throughput.py
    python benchmarks/data_throughput.py --images 256 --rounds 7
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import default_collate

from _measure import bad_input
from resdecay.data import DataConfig, SeededSamples, build_dataset

SIZES = [(500, 375), (375, 500), (500, 333), (640, 480), (400, 300), (500, 400)]


def make_jpegs(root: Path, n: int, seed: int = 0) -> None:
    from PIL import Image
    from sklearn.datasets import load_sample_images

    photos = [Image.fromarray(a) for a in load_sample_images().images]
    rng = np.random.default_rng(seed)
    for i in range(n):
        photo = photos[i % len(photos)]
        w, h = SIZES[i % len(SIZES)]
        cw = int(rng.integers(photo.width // 3, photo.width))
        ch = min(photo.height, max(16, int(cw * h / w * rng.uniform(0.9, 1.1))))
        x0, y0 = int(rng.integers(0, photo.width - cw + 1)), int(rng.integers(0, photo.height - ch + 1))
        img = photo.crop((x0, y0, x0 + cw, y0 + ch)).resize((w, h), Image.BICUBIC)
        d = root / "train" / f"class{i % 4}"
        d.mkdir(parents=True, exist_ok=True)
        img.save(d / f"img{i:05d}.jpg", quality=90)


def one_pass(samples: SeededSamples, epoch: int, batch: int) -> float:
    """Seconds to produce every batch of one epoch, as one worker would."""
    n = len(samples)
    t0 = time.perf_counter()
    for start in range(0, n - batch + 1, batch):
        default_collate([samples[(i, epoch)] for i in range(start, start + batch)])
    return time.perf_counter() - t0


def dali_pass(samples: SeededSamples, epoch: int, batch: int, size: int, device: torch.device) -> float:
    """Seconds for DALI to produce every batch of one epoch (normalised on ``device``)."""
    from resdecay.data.dali_images import DaliLoader, folder_samples
    from resdecay.data.datasets import IMAGENET_MEAN, IMAGENET_STD
    from resdecay.data.resumable import ResumableSampler
    from resdecay.data.transforms import create_transform

    sampler = ResumableSampler(len(samples), seed=0, shuffle=False)
    sampler.set_epoch(epoch)
    crops = create_transform("mae", size, "dali", mean=IMAGENET_MEAN, std=IMAGENET_STD)  # the uint8 path's crops
    loader = DaliLoader(folder_samples(samples), sampler, batch, crops.size, crops.scale, 0, crops.mean, crops.std, device,
                        threads=1)
    t0 = time.perf_counter()
    for _images, _ in loader:
        pass
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def dali_available() -> bool:
    try:
        import nvidia.dali  # noqa: F401
        return True
    except ImportError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=int, default=192)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--img-size", type=int, default=224)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    for k in ("images", "batch", "rounds", "img_size"):
        if getattr(args, k) < 1:
            bad_input(f"--{k.replace('_', '-')} must be a positive integer, got {getattr(args, k)}")
    if args.images < args.batch:  # else no whole batch is timed and every rate is 0 img/s
        bad_input(f"--images {args.images} is fewer than one batch (--batch {args.batch})")
    torch.set_num_threads(1)  # a DataLoader worker's setting

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        make_jpegs(root, args.images)
        paths = {}
        for name, decoder, uint8 in (("pil (before)", "pil", False), ("tensor, uint8 out", "tensor", True),
                                     ("tensor, float out", "tensor", False)):
            ds, _ = build_dataset(DataConfig("imagefolder", path=str(root), augment="mae", decoder=decoder), "train", args.img_size,
                                  uint8_out=uint8)
            paths[name] = SeededSamples(ds, seed=0)
        used = args.images // args.batch * args.batch
        passes = {k: (lambda s, e, k=k: one_pass(s, e, args.batch)) for k in paths}
        if dali_available():
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
            name = f"dali, {'nvJPEG GPU' if device.type == 'cuda' else 'CPU decoder'}"
            paths[name] = paths["tensor, uint8 out"]
            passes[name] = lambda s, e: dali_pass(s, e, args.batch, args.img_size, device)
        for k, s in paths.items():  # warm-up (imports, first allocations, DALI's pipeline build)
            passes[k](s, 0)
        rates = {k: [] for k in paths}
        names = list(paths)
        for r in range(args.rounds):
            for k in names[r % len(names):] + names[: r % len(names)]:  # rotate the order
                rates[k].append(used / passes[k](paths[k], r + 1))

    base = statistics.median(rates["pil (before)"])
    load = os.getloadavg()
    print(f"# ImageFolder data path, one core, {args.images} JPEGs (~500x375, q90), batch {args.batch}, "
          f"{args.img_size}px MAE crops, {args.rounds} interleaved rounds")
    print(f"# host: {platform.node()} | {os.cpu_count()} CPUs | torch {torch.__version__} | "
          f"load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f} (other processes share the machine; "
          "the interleaving spreads their load over all paths)")
    print(f"{'path':<22}{'img/s/core':>12}{'min..max':>16}{'vs pil':>9}{'cores for 5k img/s':>21}")
    rows = []
    for k in names:
        med = statistics.median(rates[k])
        rows.append({"path": k, "img_per_s_per_core": med, "min": min(rates[k]), "max": max(rates[k]),
                     "ratio_to_pil": med / base, "cores_for_5000": 5000 / med})
        print(f"{k:<22}{med:>12.1f}{f'{min(rates[k]):.0f}..{max(rates[k]):.0f}':>16}{med / base:>8.2f}x{5000 / med:>21.1f}")
    if not any(k.startswith("dali") for k in names):
        print(f"{'dali':<22}{'not measured: DALI not installed (pip install nvidia-dali-cuda130)':>58}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "load_average": load, "args": vars(args) | {"json": str(args.json)}}, indent=1))


if __name__ == "__main__":
    main()
