"""The proxy extractor: a small CNN classifier trained once on the data set's training split and cached;
its penultimate features give "proxy FID (<name>)", comparable only with the same extractor. Its trainer
is seeded and leaves the caller's random stream untouched."""

from __future__ import annotations

import math
import os
import time
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...data import DataConfig, build_dataset
from ...errors import UserError
from ...io import atomic_save
from .extractors import ExtractorCard, FeatureExtractor, _weights_digest

PROXY_VERSION = "v1"  # bump when the proxy's architecture or recipe changes: old caches are then ignored
PROXY_DATASETS = {"digits": (1, 8), "fashion-mnist": (1, 28), "cifar10": (3, 32), "cifar100": (3, 32)}


def default_cache_dir() -> Path:
    """Where trained proxy extractors are kept: $XDG_CACHE_HOME/resdecay/fid (~/.cache/resdecay/fid)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "resdecay" / "fid"



class ProxyCNN(FeatureExtractor):
    """[0, 1] images -> three conv stages -> global average pool: (B, 4 * width) features; ``head``
    classifies them in training. Once trained it is the proxy extractor, for its training resolution
    (``proxy_extractor`` names it in its card and keeps its training record in ``meta``)."""

    def __init__(self, in_chans: int, num_classes: int, width: int = 32):
        super().__init__()
        self.card = ExtractorCard(name=type(self).__name__, label=f"proxy FID ({type(self).__name__})", kind="proxy",
                                  resize_filter="none (the proxy runs at its training resolution)")
        self.meta: dict = {}

        def stage(cin, cout, pool):
            return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU(inplace=True),
                    *([nn.MaxPool2d(2)] if pool else [])]

        self.body = nn.Sequential(*stage(in_chans, width, True), *stage(width, 2 * width, True),
                                  *stage(2 * width, 4 * width, False), nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(4 * width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body((x - 0.5) / 0.5)


def _load_split(name: str, split: str, data_path, img_size: int | None):
    """uint8 images (N, C, H, W), labels, number of classes; resized (bicubic, antialiased) if asked."""
    native = PROXY_DATASETS[name][1]
    ds, info = build_dataset(DataConfig(name=name, path=data_path), split, native, augment=False)
    images = ds.images  # raw uint8: the dataset's own items are mean/std-normalised, not [0, 1]
    if img_size and img_size != images.shape[-1]:
        images = F.interpolate(images.float(), size=(img_size, img_size), mode="bicubic", antialias=True)
        images = images.round_().clamp_(0, 255).to(torch.uint8)
    return images, ds.labels, info.num_classes


def reference_images(dataset_name: str, split: str = "test", data_path=None, img_size: int | None = None):
    """The real images of a dataset split as uint8 (N, C, H, W), to build reference stats from."""
    if dataset_name not in PROXY_DATASETS:
        raise UserError(f"no built-in images for {dataset_name!r}; choose one of {', '.join(PROXY_DATASETS)}")
    return _load_split(dataset_name, split, data_path, img_size)[0]


def _train_proxy(images, labels, num_classes, epochs, device, batch_size=32, seed=0) -> ProxyCNN:
    net = ProxyCNN(images.shape[1], num_classes).to(device)
    with torch.random.fork_rng(devices=[]):  # seeded, and the caller's RNG stream is left untouched
        torch.manual_seed(seed)
        opt = torch.optim.AdamW(net.parameters(), lr=3e-3, weight_decay=1e-4)
        sched = torch.optim.lr_scheduler.OneCycleLR(opt, 3e-3, total_steps=epochs * math.ceil(len(images) / batch_size))
        net.train()
        for _ in range(epochs):
            for idx in torch.randperm(len(images)).split(batch_size):
                loss = F.cross_entropy(net.head(net(images[idx].to(device).float() / 255)), labels[idx].to(device))
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                sched.step()
    return net.eval().cpu()


@torch.inference_mode()
def _accuracy(net: ProxyCNN, images, labels) -> float:
    preds = torch.cat([net.head(net(x.float() / 255)).argmax(1) for x in images.split(500)])
    return float((preds == labels).float().mean())


def proxy_extractor(dataset_name: str, data_path=None, cache_dir=None, img_size: int | None = None,
                    in_chans: int | None = None, device: str | torch.device = "cpu") -> ProxyCNN:
    """The dataset's proxy feature extractor: trained on its training split once, then loaded from
    ``cache_dir`` (default ``default_cache_dir()``). ``.card`` and ``.meta`` describe it."""
    if dataset_name not in PROXY_DATASETS:
        raise UserError(f"proxy FID needs a labelled fixed-size dataset ({', '.join(PROXY_DATASETS)}), got "
                        f"{dataset_name!r}: for other images use Inception FID with --inception-weights PATH")
    chans, size = PROXY_DATASETS[dataset_name][0], img_size or PROXY_DATASETS[dataset_name][1]
    if in_chans is not None and in_chans != chans:
        raise UserError(f"{dataset_name} images have {chans} channel(s), not {in_chans}: proxy FID compares "
                        f"samples with the dataset itself, so generate {chans}-channel images")
    name = f"proxy-cnn-{dataset_name}-{size}px"
    path = Path(cache_dir or default_cache_dir()).expanduser() / f"{name}-{PROXY_VERSION}.pt"
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True) if path.is_file() else None
    except Exception:
        saved = None  # a damaged cache is only a cache: train again and overwrite it
    if saved is None:
        images, labels, num_classes = _load_split(dataset_name, "train", data_path, size)
        t0 = time.perf_counter()
        epochs = min(30, max(2, math.ceil(30_000 / len(images))))  # >= 30k images seen, at least 2 epochs
        net = _train_proxy(images, labels, num_classes, epochs, device)
        meta = {"name": name, "version": PROXY_VERSION, "dataset": dataset_name, "img_size": size, "in_chans": chans,
                "num_classes": num_classes, "epochs": epochs, "train_seconds": round(time.perf_counter() - t0, 1),
                "test_acc": round(_accuracy(net, *_load_split(dataset_name, "test", data_path, size)[:2]), 4)}
        saved = {"meta": meta, "state_dict": net.state_dict()}
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_save(saved, path)
    net = ProxyCNN(chans, saved["meta"]["num_classes"])
    net.load_state_dict(saved["state_dict"])
    net.card = replace(net.card, name=name, label=f"proxy FID ({name})", fingerprint=_weights_digest(saved["state_dict"]),
                       resolution=(chans, size, size))
    net.meta = saved["meta"]
    return net.eval()


