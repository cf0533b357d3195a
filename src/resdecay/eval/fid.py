"""Fréchet distances between image sets, fully offline.

Two feature extractors, never mixed:
  * Inception-v3, the standard FID: torchmetrics' NoTrainInceptionV3 with torch-fidelity's FID
    weights read from a local file (``--inception-weights``); nothing is ever downloaded.
  * a proxy: a small CNN classifier trained once on the dataset's training split and cached; its
    penultimate features give "proxy FID (<name>)", comparable only with the same extractor.

Statistics (mean, covariance) are accumulated in float64 with a fixed extraction batch size and
saved once per image set; the Fréchet distance itself is torchmetrics' ``_compute_fid``.
Images: float tensors in [0, 1] (B, C, H, W), uint8 NHWC arrays (ADM's .npz ``arr_0``) or such a file
(read into fixed batches by ``image_sets.image_chunks`` / ``rebatch``). An extractor is any module; resdecay's
own are ``FeatureExtractor`` subclasses whose ``ExtractorCard`` says what the statistics record.
"""

from __future__ import annotations

import hashlib
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader

from ..data import DataConfig, build_dataset
from ..errors import UserError
from ..io import atomic_save, file_sha256, progress_bar, safe_load
from .fid_published import (  # noqa: F401
    EXTERNAL_STATS,
    INCEPTION_LABEL,
    INCEPTION_RESIZE,
    PUBLISHED_INCEPTION,
    STATS_FORMAT,
    inception_label,
    is_published,
    load_npz_stats,
    npz_has_stats,
)
from .image_sets import image_chunks, rebatch, unit_float
from .knn import tf32_matmuls

BATCH_SIZE = 100  # fixed: features (and so FID) must not depend on how the caller chunked the images
PROXY_VERSION = "v1"  # bump when the proxy's architecture or recipe changes: old caches are then ignored
PROXY_DATASETS = {"digits": (1, 8), "fashion-mnist": (1, 28), "cifar10": (3, 32), "cifar100": (3, 32)}
WEIGHTS_FIX = ("pass --inception-weights PATH (the FID Inception file: pytorch-fid's "
               "pt_inception-2015-12-05-6726825d.pth or torch-fidelity's weights-inception-2015-12-05-6726825d.pth)")


def default_cache_dir() -> Path:
    """Where trained proxy extractors are kept: $XDG_CACHE_HOME/resdecay/fid (~/.cache/resdecay/fid)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "resdecay" / "fid"


def _digest(path: Path) -> str:
    """Short hash of a weights file: stats record it, so a retrained proxy cannot be mixed with old stats."""
    return file_sha256(path)[:12]


def _weights_digest(state_dict: dict) -> str:
    """Short hash of the weights alone: the cache file also holds its training's wall-clock time, so
    hashing the file gave two identical trainings different ids, depending on how busy the machine was."""
    h = hashlib.sha256()
    for key in sorted(state_dict):
        h.update(key.encode())
        h.update(state_dict[key].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:12]


# ----------------------------------------------------------------------------- extractors
@dataclass(frozen=True)
class ExtractorCard:
    """What FID statistics record about the network that made them: two statistics files are
    comparable only when their cards' ``id`` and resolution agree.

    Args:
        name: e.g. ``inception-v3-compat``, ``proxy-cnn-digits-8px``.
        label: the metric's name in reports, e.g. "proxy FID (proxy-cnn-digits-8px)".
        kind: ``inception`` | ``proxy`` | ``custom`` (names the online log's column: ``proxy_fid``).
        resolution: the (C, H, W) images it was trained on; None: any size.
        resize_filter: how images reach its input size.
        needs_rgb: grayscale images are repeated to three channels.
        fingerprint: short hash of its weights file; None: unknown.
    """

    name: str
    label: str
    kind: str = "custom"
    resolution: tuple[int, int, int] | None = None
    resize_filter: str = "none"
    needs_rgb: bool = False
    fingerprint: str | None = None

    @property
    def id(self) -> str:
        """The identity ``feature_stats`` records: the name plus the weights' hash."""
        return f"{self.name}@{self.fingerprint}" if self.fingerprint else self.name


class FeatureExtractor(nn.Module):
    """Base of resdecay's FID extractors: [0, 1] images (B, C, H, W) -> (B, D) features, described by
    ``card``. Any other ``nn.Module`` works too, as an anonymous extractor (``extractor_card``)."""

    card: ExtractorCard

    @property
    def name(self) -> str:
        return self.card.name

    @property
    def label(self) -> str:
        return self.card.label

    @property
    def fingerprint(self) -> str | None:
        return self.card.fingerprint


def extractor_card(extractor: nn.Module) -> ExtractorCard:
    """The card of an extractor; a plain module is named after its class, with no fingerprint."""
    if isinstance(extractor, FeatureExtractor):
        return extractor.card
    name = type(extractor).__name__
    return ExtractorCard(name=name, label=f"proxy FID ({name})")


class InceptionFeatures(FeatureExtractor):
    """[0, 1] images (B, C, H, W) -> (B, 2048) pool features of the FID Inception network."""

    def __init__(self, net: nn.Module, fingerprint: str):
        super().__init__()
        self.net = net
        self.card = ExtractorCard(name="inception-v3-compat", label=inception_label(fingerprint), kind="inception",
                                  resize_filter=INCEPTION_RESIZE, needs_rgb=True, fingerprint=fingerprint)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[1] == 1:  # the network is RGB-only: grayscale is repeated (the stats record it)
            x = x.expand(-1, 3, -1, -1)
        # round, not truncate (torchmetrics' normalize=True truncates): uint8 inputs survive [0, 1] exactly
        return self.net((x * 255).round_().clamp_(0, 255).to(torch.uint8))


def inception_extractor(weights_path: str | os.PathLike | None) -> InceptionFeatures:
    """torchmetrics' NoTrainInceptionV3 (2048 pool features) with weights from a local file only."""
    if not weights_path:
        raise UserError(f"Inception FID needs local weights (nothing is downloaded): {WEIGHTS_FIX}")
    path = Path(weights_path).expanduser()
    if not path.is_file():
        raise UserError(f"Inception weights not found at {path}: {WEIGHTS_FIX}")
    # safe check first: torch-fidelity unpickles freely
    safe_load(path, UserError, f"cannot load Inception weights {path} (not a readable weights file): {WEIGHTS_FIX}")
    from torchmetrics.image.fid import NoTrainInceptionV3

    try:  # antialias=False: torch-fidelity's TF1-compatible bilinear resize, the one published FIDs use
        net = NoTrainInceptionV3("inception-v3-compat", ["2048"], feature_extractor_weights_path=str(path),
                                 antialias=False)
    except ModuleNotFoundError:
        raise UserError("Inception FID needs torch-fidelity: pip install torch-fidelity") from None
    except Exception:
        raise UserError(f"cannot load Inception weights {path} (its keys or shapes are not the FID Inception-v3's): "
                        f"{WEIGHTS_FIX}") from None
    return InceptionFeatures(net, _digest(path))


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


# ----------------------------------------------------------------------------- statistics
def _res(r) -> str:
    return f"{r[1]}x{r[2]}x{r[0]}"


def _check_pair(ref: dict, ext_id: str, resolution) -> None:
    if ref.get("source") == EXTERNAL_STATS:  # made with the published Inception; their image size is not recorded
        if not ext_id.startswith(f"inception-v3-compat@{PUBLISHED_INCEPTION}"):
            raise UserError(f"the reference is {EXTERNAL_STATS}, made with the published FID Inception weights, but the "
                            f"samples' extractor is {ext_id} (the published file's sha256 starts {PUBLISHED_INCEPTION}): pass "
                            f"--inception-weights pt_inception-2015-12-05-{PUBLISHED_INCEPTION}.pth as published")
        return
    if ext_id != ref["extractor_id"]:
        raise UserError(f"reference stats were built with extractor {ref['extractor_id']}, the samples with {ext_id}: "
                        f"rebuild the reference with the samples' extractor")
    if tuple(resolution) != tuple(ref["resolution"]):
        raise UserError(f"reference stats are for {_res(ref['resolution'])} images, samples are {_res(resolution)}: "
                        f"rebuild the reference at {_res(resolution)} (or generate {_res(ref['resolution'])} samples)")


@torch.inference_mode()
def feature_stats(images, extractor: nn.Module, batch_size: int = BATCH_SIZE, device: str | torch.device = "cpu",
                  reference: dict | None = None, progress: bool = False) -> dict:
    """Mean and covariance (float64) of the extractor's features over all images, with their protocol.

    ``reference``: stats these images will be compared with; a mismatch stops at the first batch."""

    card = extractor_card(extractor)
    extractor = extractor.eval().to(device)
    shift = total = cross = resolution = None
    n = 0
    for raw in progress_bar(rebatch(image_chunks(images), batch_size), desc="FID features", disable=not progress, leave=False):
        x = unit_float(raw)
        if resolution is None:
            resolution, expected = tuple(x.shape[1:]), card.resolution
            if expected is not None and tuple(expected) != resolution:
                raise UserError(f"{card.name} was trained on {_res(expected)} images, these are {_res(resolution)}: "
                                f"use the proxy built for {_res(resolution)} or images of {_res(expected)}")
            if reference is not None:
                _check_pair(reference, card.id, resolution)
        elif tuple(x.shape[1:]) != resolution:
            raise UserError(f"images change size from {_res(resolution)} to {_res(x.shape[1:])}: FID needs one size")
        with tf32_matmuls(device):  # CUDA only; the statistics below stay float64
            f = extractor(x.to(device))
        f = f.cpu().double() if f.device.type == "mps" else f.double()  # MPS has no float64
        if shift is None:  # shifted sums: the float64 covariance loses nothing to a large feature mean
            shift = f.mean(0)
            total, cross = torch.zeros_like(shift), f.new_zeros(len(shift), len(shift))
        d = f - shift
        total += d.sum(0)
        cross += d.T @ d
        n += len(f)
    if n < 2:
        raise UserError(f"FID needs at least 2 images, got {n}")
    return {"format": STATS_FORMAT, "mu": (shift + total / n).cpu(),
            "sigma": ((cross - torch.outer(total, total) / n) / (n - 1)).cpu(), "n": n,
            "extractor": card.name, "extractor_id": card.id, "label": card.label,
            "resolution": resolution, "resize_filter": card.resize_filter,
            "grayscale_to_rgb": bool(card.needs_rgb and resolution[0] == 1),
            "batch_size": batch_size, "dtype": "float64"}


def _checked_stats(st, what: str) -> dict:
    ok = isinstance(st, dict) and st.get("format") == STATS_FORMAT and isinstance(st.get("mu"), torch.Tensor)
    if not ok or st["mu"].ndim != 1 or tuple(st["sigma"].shape) != (len(st["mu"]),) * 2:
        raise UserError(f"{what} is not a FID stats file of this version: rebuild it from the real images")
    return st


def save_stats(path, stats: dict) -> None:
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_save(_checked_stats(stats, "stats"), path)


def load_stats(path) -> dict:
    path = Path(path).expanduser()
    if not path.is_file():
        raise UserError(f"FID reference stats not found at {path}: build them from the real images first")
    if npz_has_stats(path):
        return load_npz_stats(path)
    st = safe_load(path, UserError, f"cannot read FID reference stats {path} (not a readable PyTorch file): rebuild them")
    return _checked_stats(st, str(path))


def check_count(n: int, dim: int, label: str, what: str, allow_few: bool = False) -> None:
    """Refuse too few images for ``dim``-dimensional features: n images give a covariance of rank <= n - 1.

    Args:
        n: the number of images; dim: the feature dimension; label: the metric's label;
        what: "samples" or "reference"; allow_few: accept n <= dim (but never n < 2).
    """
    if n < 2 or (n <= dim and not allow_few):
        raise UserError(f"{label}: the {what} have {n} images but {dim}-dimensional features need at least {dim + 1} "
                        "(else the covariance is rank-deficient): use more images"
                        + (" or pass --allow-few (allow_few=True)" if n >= 2 else ""))


def fid(sample_stats: dict, ref_stats: dict, allow_few: bool = False) -> float:
    """Fréchet distance between two stats dicts (torchmetrics' ``_compute_fid``, in float64)."""
    from torchmetrics.image.fid import _compute_fid

    _check_pair(ref_stats, sample_stats["extractor_id"], sample_stats["resolution"])
    for st, what in ((sample_stats, "samples"), (ref_stats, "reference")):
        if st["n"] is not None:  # pytorch-fid's statistics do not record their count
            check_count(st["n"], len(ref_stats["mu"]), sample_stats["label"], what, allow_few)
    value = float(_compute_fid(sample_stats["mu"].double(), sample_stats["sigma"].double(),
                               ref_stats["mu"].double(), ref_stats["sigma"].double()))
    if not math.isfinite(value):
        raise UserError(f"{sample_stats['label']} is not finite: the feature covariance is degenerate; use more images")
    return value


def compute_fid(samples, ref, extractor: nn.Module, batch_size: int = BATCH_SIZE,
                device: str | torch.device = "cpu", allow_few: bool = False, progress: bool = False) -> dict:
    """FID of ``samples`` against ``ref`` (a stats file or dict): value, label, protocol card, summary line."""
    ref = load_stats(ref) if isinstance(ref, (str, os.PathLike)) else _checked_stats(ref, "reference stats")
    st = feature_stats(samples, extractor, batch_size, device, reference=ref, progress=progress)
    value = fid(st, ref, allow_few=allow_few)
    protocol = {"n_samples": st["n"], "n_ref": ref["n"], "extractor": st["extractor_id"],
                "feature_dim": len(st["mu"]), "resolution": _res(st["resolution"]),
                "resize_filter": st["resize_filter"], "grayscale_to_rgb": st["grayscale_to_rgb"],
                "batch_size": st["batch_size"], "ref_batch_size": ref["batch_size"], "stats_dtype": "float64",
                "published_fid_weights": is_published(extractor_card(extractor).fingerprint)}
    ref_n = f"{ref['n']} reference" if ref["n"] is not None else ref.get("source", "reference")
    summary = (f"{st['label']} = {value:.4f} ({st['n']} samples vs {ref_n}, {protocol['resolution']}, "
               f"resize {st['resize_filter']}{', gray->RGB' if st['grayscale_to_rgb'] else ''}, "
               f"batch {st['batch_size']}, float64 stats)")
    return {"value": value, "label": st["label"], "protocol": protocol, "summary": summary}


def dataset_reference(dataset: str, extractor, data_path=None, batch_size: int = 200, device="cpu",
                      ref_out: str | None = None, img_size: int = 256, progress: bool = True) -> tuple[dict, Path, bool]:
    """Reference statistics of ``dataset``'s training split under ``extractor``: loaded from ``ref_out``
    (default ``runs/fid_refs/<data>-train-<extractor>.pt``) when they were built with this very
    extractor, else built now and saved there. Returns (stats, path, built_now)."""
    ref_path = Path(ref_out or f"runs/fid_refs/{dataset}-train-{extractor_card(extractor).name}.pt")
    stats = load_stats(ref_path) if ref_path.is_file() else None
    built = stats is None or stats.get("extractor_id") != feature_stats_id(extractor)
    if built:
        images = (imagefolder_images(data_path, img_size, batch_size) if dataset == "imagefolder"
                  else reference_images(dataset, split="train", data_path=data_path))
        stats = feature_stats(images, extractor, batch_size, device, progress=progress)
        stats["dataset"] = dataset
        save_stats(ref_path, stats)
    return stats, ref_path, built


def feature_stats_id(extractor) -> str:
    """The identity string ``feature_stats`` records for an extractor (its name plus a hash of its weights)."""
    return extractor_card(extractor).id


def imagefolder_images(data_path: str | None, img_size: int, batch_size: int):
    """[0, 1] float batches of an ImageFolder's train split, resized and centre-cropped to ``img_size``."""
    ds, _ = build_dataset(DataConfig(name="imagefolder", path=data_path, normalize="symmetric"), "train", img_size, augment=False)
    return ((x + 1) / 2 for x, _ in DataLoader(ds, batch_size=batch_size, num_workers=4))
