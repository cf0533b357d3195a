"""Fréchet distances between image sets, fully offline.

Statistics and distances; the two feature extractors (``extractors.py``, ``proxy.py``), never mixed:
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

import math
import os
from pathlib import Path

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from ...data import DataConfig, build_dataset
from ...errors import UserError
from ...io import atomic_save, progress_bar, safe_load
from ..features.knn import tf32_matmuls
from .extractors import extractor_card
from .image_sets import image_chunks, rebatch, unit_float
from .proxy import reference_images
from .published import EXTERNAL_STATS, PUBLISHED_INCEPTION, STATS_FORMAT, is_published, load_npz_stats, npz_has_stats

BATCH_SIZE = 100  # fixed: features (and so FID) must not depend on how the caller chunked the images


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
