"""``resdecay fid SAMPLES [OTHER] [--ref STATS|DATA|IMAGES]``: the command around ``eval.fid``.

The reference is a statistics file (built earlier, reused as is), a dataset name (the statistics
of its *training* split are built once with the chosen extractor, saved to ``--ref-out``, default
``runs/fid_refs/<data>-train-<extractor>.pt``, and reused next time with the same extractor) or a
second image set (an ``.npz`` or a folder of PNG/JPEG images, given as ``--ref`` or as a second
argument: ``fid A.npz B.npz``, ``fid dirA dirB``, what pytorch-fid and torch-fidelity users do first).
An ``.npz`` holding ``mu`` and ``sigma`` (pytorch-fid's ``--save-stats``, ADM's reference batches) is
read as published Inception statistics; only the published Inception weights are compared with them.
The number is called "FID" only when the weights are the published file (``eval/fid/published.py``).
The extractor is Inception-v3 from ``--inception-weights`` (real FID) or, with ``--proxy``, a small
CNN resdecay trains once on a dataset ("proxy FID"; ``--data`` names it when neither side is one).

Every input is checked from headers and flags before the proxy network is trained or a feature is
extracted: a sample count too small for the features is a one-second error.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import UserError
from ..eval.fid import (
    INCEPTION_LABEL,
    PROXY_DATASETS,
    WEIGHTS_FIX,
    ProxyCNN,
    check_count,
    compute_fid,
    dataset_reference,
    feature_stats,
    inception_extractor,
    load_stats,
    proxy_extractor,
    save_stats,
)
from ..eval.fid.image_sets import ImageSet, describe_set, is_image_set
from ..eval.fid.published import npz_has_stats
from ..eval.fid.stats import _res
from ..eval.inputs import check_data_path, check_writable
from ..train.distributed import resolve_device

INCEPTION_DIM = 2048
IMAGEFOLDER_SIZE = 256  # --ref imagefolder's default resolution (resize + centre crop)


@dataclass
class _Reference:
    """What the reference is, known before any feature is extracted."""
    kind: str  # "stats" | "dataset" | "images"
    source: str
    resolution: tuple | None
    n: int | None  # None for a data set (counted when it is read)
    dataset: str | None = None  # names the proxy extractor
    stats: dict | None = None
    images: ImageSet | None = None


def _reference(ref: str | None, data: str | None, data_path: str | None, img_size: int | None) -> _Reference:
    if ref is None:
        raise UserError("FID needs a reference: a second image set (fid A.npz B.npz, fid dirA dirB) or --ref "
                        f"STATS.pt | DATASET ({', '.join(PROXY_DATASETS)}, imagefolder)")
    if img_size is not None and img_size < 1:
        raise UserError(f"--img-size must be a positive number of pixels, got {img_size}")
    if img_size is not None and ref != "imagefolder":
        raise UserError(f"--img-size sets the resolution of --ref imagefolder only, not of --ref {ref}: drop it")
    if npz_has_stats(ref):  # pytorch-fid's statistics, ADM's reference batch: their mu and sigma, not images
        stats = load_stats(ref)
        return _Reference("stats", ref, None, None, data, stats)
    if is_image_set(ref):
        s = describe_set(ref)
        return _Reference("images", ref, s.resolution, s.n, data, images=s)
    if Path(ref).is_file():
        stats = load_stats(ref)
        if data and stats.get("dataset") and data != stats["dataset"]:
            raise UserError(f"--data {data} contradicts the reference stats {ref}, built from {stats['dataset']}: drop --data")
        return _Reference("stats", ref, tuple(stats["resolution"]), stats["n"], data or stats.get("dataset"), stats)
    if ref in PROXY_DATASETS or ref == "imagefolder":
        if data and data != ref:
            raise UserError(f"--data {data} contradicts --ref {ref}: drop --data (--ref names the data set)")
        check_data_path(ref, data_path)
        if ref == "imagefolder" and not data_path:
            raise UserError("--ref imagefolder needs --data-path DIR (the ImageFolder whose train/ images are the reference)")
        chans, side = PROXY_DATASETS.get(ref, (3, img_size or IMAGEFOLDER_SIZE))
        return _Reference("dataset", ref, (chans, side, side), None, ref)
    raise UserError(f"--ref {ref!r} is neither a statistics file, a dataset nor an image set; pass a .pt file from an "
                    f"earlier run, one of {', '.join(PROXY_DATASETS)}, imagefolder, an .npz or a folder of images")


def _feature_space(proxy: bool, inception_weights: str | None, ref: _Reference) -> tuple[str, int, tuple | None]:
    """(label, feature dimension, resolution the extractor needs or None) of the extractor asked for."""
    if inception_weights and proxy:
        raise UserError("pass either --inception-weights PATH (FID) or --proxy (proxy FID), not both")
    if inception_weights:
        if not Path(inception_weights).expanduser().is_file():  # before counting images: the first thing to fix
            raise UserError(f"Inception weights not found at {inception_weights}: {WEIGHTS_FIX}")
        return INCEPTION_LABEL, INCEPTION_DIM, None
    if not proxy:
        raise UserError("FID needs Inception weights: pass --inception-weights PATH (pt_inception-2015-12-05-*.pth), "
                        f"or --proxy for a proxy FID on {' / '.join(PROXY_DATASETS)}")
    if ref.dataset is None:
        what = "the reference stats file names no dataset" if ref.kind == "stats" else "two image sets name none"
        raise UserError(f"--proxy needs the dataset its network is trained on and {what}: pass --data "
                        f"({', '.join(PROXY_DATASETS)})")
    if ref.dataset not in PROXY_DATASETS:
        raise UserError(f"proxy FID needs a labelled fixed-size dataset ({', '.join(PROXY_DATASETS)}), got "
                        f"{ref.dataset!r}: for other images use Inception FID with --inception-weights PATH")
    chans, side = PROXY_DATASETS[ref.dataset]
    name = f"proxy-cnn-{ref.dataset}-{side}px"
    if ref.kind == "stats" and ref.stats["extractor"] != name:
        raise UserError(f"reference stats {ref.source} were built with {ref.stats['extractor']}, not {name}: "
                        f"rebuild them with --ref {ref.dataset} --proxy, or use their extractor")
    return f"proxy FID ({name})", ProxyCNN(chans, 2).head.in_features, (chans, side, side)


def _check_inputs(samples: ImageSet, ref: _Reference, proxy: bool, inception_weights: str | None, allow_few: bool,
                  data_path: str | None, ref_out: str | None) -> None:
    """Everything about the inputs that headers and flags tell, before any network runs."""
    label, dim, needs = _feature_space(proxy, inception_weights, ref)
    if ref.kind == "stats" and not proxy and not ref.stats["extractor"].startswith("inception"):
        raise UserError(f"reference stats {ref.source} were built with {ref.stats['extractor']}, not Inception: "
                        "pass --proxy, or rebuild them with --inception-weights")
    if ref.resolution is not None and tuple(ref.resolution) != samples.resolution:
        raise UserError(f"the reference ({ref.source}) is {_res(ref.resolution)} images, the samples ({samples.path}) "
                        f"are {_res(samples.resolution)}: compare images of one size (or rebuild the reference at "
                        f"{_res(samples.resolution)})")
    if needs is not None and needs != samples.resolution:
        raise UserError(f"{label} runs on {_res(needs)} images ({ref.dataset}'s), the samples are "
                        f"{_res(samples.resolution)}: generate {_res(needs)} images, or use --inception-weights")
    check_count(samples.n, dim, label, "samples", allow_few)
    if ref.n is not None:
        check_count(ref.n, dim, label, "reference", allow_few)
    if proxy is False and ref.kind == "images" and ref.dataset:
        raise UserError("--data names the dataset of the proxy extractor (--proxy); Inception FID needs none: drop --data")
    if data_path and ref.kind != "dataset" and not proxy:
        raise UserError("--data-path is read only to build a dataset reference (--ref DATASET) or to train the proxy "
                        "(--proxy): drop it")
    if ref_out and ref.kind == "stats":
        raise UserError(f"--ref-out says where statistics built now are saved, but --ref {ref.source} is a statistics "
                        "file already: drop --ref-out")
    if ref.kind == "dataset" or ref_out:
        target = Path(ref_out or "runs/fid_refs/x").expanduser()
        check_writable(target.parent, "pass --ref-out PATH in a folder you can write")


def run_fid(samples: str, ref: str | None = None, data_path: str | None = None, inception_weights: str | None = None,
            proxy: bool = False, batch_size: int = 200, device: str = "auto", ref_out: str | None = None,
            allow_few: bool = False, progress: bool = True, img_size: int | None = None, data: str | None = None) -> dict:
    """FID of an image set against a reference (see the module docstring). Returns value, label and
    protocol card, which names both sources.

    Args:
        samples: an ``.npz`` / ``.npy`` (uint8 NHWC) or a folder of images.
        ref: a stats file, a dataset name or a second image set.
        data: the proxy's dataset when neither side names one (two image sets).
        data_path, inception_weights, proxy, batch_size, device, ref_out, allow_few, progress, img_size:
            the CLI options of the same names.
    """
    if batch_size < 1:
        raise UserError(f"--batch-size must be a positive integer, got {batch_size}")
    if data is not None and data not in PROXY_DATASETS:
        raise UserError(f"--data names the proxy extractor's dataset: one of {', '.join(PROXY_DATASETS)}, got {data!r}")
    dev = resolve_device(device, "--device")
    sample_set = describe_set(samples)
    reference = _reference(ref, data, data_path, img_size)
    _check_inputs(sample_set, reference, proxy, inception_weights, allow_few, data_path, ref_out)
    # only now the expensive part: the proxy network (trained once), the reference statistics, the samples' features
    extractor = (inception_extractor(inception_weights) if inception_weights
                 else proxy_extractor(reference.dataset, data_path=data_path, device=dev))
    built, ref_path = False, Path(reference.source)
    if reference.kind == "stats":
        stats = reference.stats
    elif reference.kind == "dataset":
        stats, ref_path, built = dataset_reference(reference.source, extractor, data_path, batch_size, dev, ref_out,
                                                   img_size or IMAGEFOLDER_SIZE, progress)
    else:
        stats, built = feature_stats(reference.images.source(), extractor, batch_size, dev, progress=progress), True
        if ref_out:
            save_stats(ref_out, stats)
    result = compute_fid(sample_set.source(), stats, extractor, batch_size, dev, allow_few=allow_few, progress=progress)
    split = {"stats": "train" if stats.get("dataset") else "as built", "dataset": "train", "images": "all images"}
    result["protocol"].update({"samples": str(samples), "reference": str(ref_path), "reference_kind": reference.kind,
                               "reference_split": split[reference.kind], "reference_built_now": built})
    return result


def fid_command(samples: list[str], ref: str | None = None, **options) -> None:
    """``resdecay fid A [B]``: one image set against ``--ref``, or two against each other; the value
    and its protocol card printed. ``options``: the rest of ``run_fid``'s."""
    if len(samples) > 2:
        raise UserError(f"fid compares two image sets at most, got {len(samples)}: fid A B, or fid A --ref STATS|DATASET")
    if len(samples) == 2 and ref:
        raise UserError(f"two image sets are compared with each other, so --ref {ref} would be a third: "
                        "drop --ref or the second set")
    r = run_fid(samples[0], ref=samples[1] if len(samples) == 2 else ref, **options)
    print(f"{r['label']}: {r['value']:.4f}")
    print(json.dumps(r["protocol"], indent=1))
