"""Reference points for every evaluation: the same registered metrics (kNN, probe, rank, ...; the
suite runs them through ``metrics.measure``) on raw pixels and on a randomly initialised encoder of
the same architecture. This module makes those two feature sources.

A pretrained model's kNN of 0.45 means little alone: on Fashion-MNIST raw pixels already reach
0.833 (20k bank, 10k queries), on Fashion-MNIST-M 0.238. These two rows say how much the pretraining added. The
random encoder is the run's own initialisation (``torch.manual_seed(train.seed)`` then the model
constructor, as ``train()`` does), so for a U-Net MAE with zero-initialised branches it is exactly
the network before its first step: every branch outputs 0 and each block's output is α_eff times a
linear embedding of the pixels (kNN on cosine similarity is scale-free, so the decay itself does
not change its kNN).

The pixel rows depend on the data and the protocol only, not on a model: ``pixel_rows`` keeps them
in a small JSON per (data set, images, protocol) in a cache folder (``default_baseline_cache()``
for ``resdecay eval --baseline pixels`` and ``ablate``), so a grid of ten variants measures the
pixels once, and a pixel-only evaluation computed before is reused by both.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from ...data import DataConfig
from ...data.subsets import balanced_subset, dataset_labels
from ...models import build_model
from ..inputs import eval_split, replaced_count, split_card
from ..metrics import Metric, cached_rows, measure_prepared
from ..protocol import MetricSettings
from ..sets import FeatureSet
from ..sources import Prepared

BASELINE_FORMAT = 2  # bump when the pixel features or a metric's arithmetic change, so old cached rows are not reused (2: kNN votes in the log domain)


def default_baseline_cache() -> Path:
    """Where pixel-baseline rows are kept: $XDG_CACHE_HOME/resdecay/baselines (~/.cache/resdecay/baselines)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "resdecay" / "baselines"


@torch.no_grad()
def pixel_features(dataset, limit: int | None = None, batch_size: int = 1024, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Flattened, normalised pixels (as the model sees them, no augmentation): (N, C·H·W), labels;
    of ``limit`` images drawn class-balanced with ``seed`` (``data/subsets.py``), as the model's features are."""
    dataset = balanced_subset(dataset, limit, seed)
    xs, ys = [], []
    for x, y in DataLoader(dataset, batch_size=batch_size, shuffle=False):
        xs.append(x.flatten(1).float())
        ys.append(torch.as_tensor(y))
    return torch.cat(xs), torch.cat(ys)


def random_init_model(cfg):
    """The run's encoder before its first step: seeded exactly as ``train()`` seeds it."""
    torch.manual_seed(cfg.train.seed)
    if hasattr(cfg, "random_init"):  # a model trained elsewhere (its own library builds it), a diffusion model read
        return cfg.random_init().eval()  # at a noise level: the same architecture, presented as the model was
    return build_model(cfg.model).eval()


def random_init_key(cfg) -> str:
    """A stand-in for a checkpoint hash in feature-cache keys: the architecture and the seed."""
    blob = json.dumps({"random-init": cfg.to_dict()["model"], "seed": cfg.train.seed}, sort_keys=True, default=str)
    return "random-init-" + hashlib.sha256(blob.encode()).hexdigest()


def baseline_value(report: dict, source: str, metric: str, feature: str, value: str, layer: int | None = None):
    """One number from a report's baselines (None when absent)."""
    for r in report.get("baselines", []):
        if (r["source"] == source and r["metric"] == metric and r["feature"] == feature and value in r["values"]
                and (layer is None or r["layer"] in (layer, None))):
            return r["values"][value]
    return None


def _digest(x) -> str:
    return hashlib.sha256(x.encode() if isinstance(x, str) else x).hexdigest()[:20]


def pixel_input(data: DataConfig, img_size: int, metrics: list[Metric], ms: MetricSettings, max_train: int | None,
                max_test: int | None, bad_files: Path | None = None, cache_dir: str | Path | None = None) -> Prepared:
    """The raw-pixel baseline as a ``Prepared`` input: the pixel features are made only if its rows are not
    in ``cache_dir`` already (the same images measured under the same protocol before).

    The key holds the split cards (data set, folder, image counts, subset draw, side), every
    metric's protocol card, a digest of the chosen labels and of the first chosen image as the
    model sees it (so a changed normalisation or folder content is not served stale rows).

    Args:
        data: the data config; img_size: the side images are read at; metrics, ms: what to measure
        and how; max_train, max_test: the subset sizes (None: whole splits); bad_files: the folder
        listing images replaced under ``data.on_bad_file=skip`` (such rows are not cached);
        cache_dir: the cache folder, or None to compute without one.
    """
    splits, card = {}, {"norm": "none"}
    for split, limit in (("train", max_train), ("test", max_test)):
        whole = eval_split(data, split, img_size, bad_files)
        splits[split] = balanced_subset(whole, limit, data.subset_seed)
        card[split] = split_card(data, split, len(splits[split]), len(whole), img_size)
    for m in metrics:  # settings that cannot work on this bank are refused before any pixel is read
        if m.check is not None:
            m.check(len(splits["train"]), ms)
    skip = data.on_bad_file == "skip" and bad_files is not None
    file = key = None
    if cache_dir is not None and not skip:
        key = {"format": BASELINE_FORMAT, "card": card, "metrics": [[m.name, m.protocol(ms)] for m in metrics],
               **{f"{split}_labels": _digest(dataset_labels(ds).astype("int64").tobytes()) for split, ds in splits.items()},
               **{f"{split}_first": _digest(ds[0][0].float().numpy().tobytes()) for split, ds in splits.items()}}
        file = Path(cache_dir) / f"pixels-{_digest(json.dumps(key, sort_keys=True, default=str))}.json"

    def features() -> FeatureSet:
        (tr, tr_y), (te, te_y) = (pixel_features(splits[split]) for split in ("train", "test"))
        if skip:
            for split in ("train", "test"):
                card[split]["unreadable_replaced"] = replaced_count(bad_files, split)
        return FeatureSet({"pixels": tr}, tr_y, {"pixels": te}, te_y, "pixels")

    return Prepared(None, features, card, rows_cache=file, cache_key=key)


def pixel_rows(data: DataConfig, img_size: int, metrics: list[Metric], ms: MetricSettings, max_train: int | None,
               max_test: int | None, bad_files: Path | None = None, cache_dir: str | Path | None = None) -> tuple[list, dict]:
    """The raw-pixel baseline's ``eval.json`` rows (``pixel_input``'s arguments), from ``cache_dir`` when
    measured before. Returns (rows, {"file", "hit"})."""
    prepared = pixel_input(data, img_size, metrics, ms, max_train, max_test, bad_files, cache_dir)
    hit = cached_rows(prepared.rows_cache) is not None
    rows = measure_prepared(metrics, prepared, ms, "pixels")[0]
    return rows, {"file": str(prepared.rows_cache) if prepared.rows_cache else None, "hit": hit}
