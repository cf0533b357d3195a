"""The ``features``, ``layers`` and ``blocks`` sources of ``resdecay eval``.

``features``: frozen pooled features of a labelled train and test split, extracted once per
(checkpoint, data, protocol) and cached on disk (``cache.py``), one ``FeatureSet`` per block measured.
Its baselines: raw pixels (rows cached per data set and protocol, ``baselines.py``) and the run's
randomly initialised encoder. ``layers``: the same test features at every block (a metric over two
blocks, e.g. CKA, reads them). ``blocks``: the per-layer profile's token norms and shortcut-to-branch
ratios ||alpha*x|| / ||f(x)|| of both sub-blocks, profile columns only.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from ...data import check_first_sample
from ...data.subsets import balanced_subset
from ...errors import UserError
from ...io import run_dir_of
from ...stream.norms import block_norms as stream_block_norms
from ..inputs import (
    bad_files_list,
    check_writable,
    eval_split,
    replaced_count,
    replaced_list,
    restore_replaced,
    split_card,
)
from ..protocol import STATS_IMAGES
from ..sets import BLOCKS, FEATURES, LAYERS, BlockStats, FeatureSet, LayerSet
from ..sources import Evaluation, Prepared, Source
from . import baselines as bl
from .cache import FeatureCache
from .extract import extract_block_features

FEATURE_FORMAT = 1  # bump when extraction changes, so old caches are not reused


def bad_files_folder(ev: Evaluation) -> Path | None:
    """Under the run's ``data.on_bad_file=skip``: the report folder, where the replaced files are listed
    (fresh lists for this evaluation); None under ``stop``, or without a report folder (pixels alone)."""
    if ev.data.on_bad_file != "skip" or ev.report_dir is None:
        return None
    if "bad_files" not in ev.shared:
        check_writable(ev.report_dir, "pass --out DIR")
        if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
            for split in ("train", "test"):
                bad_files_list(ev.report_dir, split).unlink(missing_ok=True)
        if torch.distributed.is_initialized():  # no rank lists a file before rank 0 cleared the old lists
            torch.distributed.barrier()
        ev.shared["bad_files"] = ev.report_dir
    return ev.shared["bad_files"]


def _split(ev: Evaluation, split: str):
    """(images, card) of one split as the evaluation reads it, a class-balanced subset, built once."""
    memo = ev.shared.setdefault("splits", {})
    if split not in memo:
        img, limit = ev.cfg.model.img_size, ev.settings.max_train if split == "train" else ev.settings.max_test
        dataset = eval_split(ev.data, split, img, bad_files_folder(ev))
        check_first_sample(dataset, ev.cfg.model.in_chans, img, ev.data.name)
        chosen = balanced_subset(dataset, limit, ev.data.subset_seed)  # an ImageFolder's first N are a class or two
        memo[split] = chosen, {**split_card(ev.data, split, len(chosen), len(dataset), img), **ev.inputs_card}  # in the key
    return memo[split]


def cached_features(ev: Evaluation, model, identity: str, split: str, layers: list[int], cache: FeatureCache) -> tuple:
    """Features of one split, from the cache when the same encoder, data and protocol were extracted
    before. Returns (``{(layer, pool): (N, D)}``, labels (N,), data card, cache hit).

    Args:
        ev: the evaluation; model, identity: the encoder and its identity in the cache key (the checkpoint's
        SHA-256); split: "train" or "test"; layers: the blocks; cache: the feature cache.
    """
    s, bad_files = ev.settings, bad_files_folder(ev)
    dataset, card = _split(ev, split)
    card, pools = dict(card), tuple(sorted(s.pools()))
    key = {"format": FEATURE_FORMAT, "checkpoint_sha256": identity, **card, "layers": layers, "pools": list(pools)}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    file = cache.dir / f"{split}-{digest}.pt"
    cached = cache.load(file, [(l, p) for l in layers for p in pools], len(dataset))
    skip = bad_files is not None
    if cached is not None:
        feats, labels, blob = cached
        if skip:  # extracted under the same policy: the files it replaced are kept with the features
            card["unreadable_replaced"] = restore_replaced(bad_files, split, blob.get("unreadable_list", ""))
        return feats, labels, card, True
    feats, labels = extract_block_features(model, dataset, layers, pools, s.batch_size, ev.device, s.num_workers,
                                           s.progress, desc=f"features ({split})")
    if skip:  # in the card: these numbers are of a data set where some images stand in for unreadable ones
        card["unreadable_replaced"] = replaced_count(bad_files, split)
    if not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0:
        cache.save({"feats": {f"{l}:{p}": v for (l, p), v in feats.items()}, "labels": labels, "key": json.dumps(key),
                    "unreadable_list": replaced_list(bad_files, split) if skip else ""}, file)
    return feats, labels, card, False


def _cache(ev: Evaluation) -> FeatureCache:
    if "cache" not in ev.shared:
        folder = ev.settings.cache_dir or ev.cache_dir or run_dir_of(ev.checkpoint) / "eval" / "cache"
        ev.shared["cache"] = FeatureCache.open(Path(folder))
    return ev.shared["cache"]


def _features(ev: Evaluation) -> dict:
    """The model's train and test features, extracted (or read from the cache) once for both sources:
    the test split at every block when a ``layers`` metric reads them all."""
    if "features" not in ev.shared:
        cache, sha = _cache(ev), ev.sha
        blocks = list(range(len(ev.model.blocks))) if ev.settings.metrics(LAYERS) else ev.layers
        train, train_y, train_card, hit_tr = cached_features(ev, ev.model, sha, "train", ev.layers, cache)
        test, test_y, test_card, hit_te = cached_features(ev, ev.model, sha, "test", blocks, cache)
        ev.notes["cache"] = {"dir": str(cache.dir), "train_hit": hit_tr, "test_hit": hit_te, "written": cache.writable}
        if bad_files_folder(ev) is not None:
            ev.notes["bad_files"] = {
                "policy": "data.on_bad_file=skip (the run's): an unreadable image is replaced by the next readable one",
                **{split: str(bad_files_list(ev.report_dir, split)) for split in ("train", "test")}}
        card = {"train": train_card, "test": test_card, "norm": "none", "checkpoint_sha256": sha}
        ev.shared["features"] = dict(train=train, train_y=train_y, test=test, test_y=test_y, blocks=blocks, card=card)
    return ev.shared["features"]


def feature_set(train: dict, train_y, test: dict, test_y, layer: int, pools: list[str], feature: str) -> FeatureSet:
    """One layer's features as the metrics read them, poolings in the order given (rank rows follow it)."""
    return FeatureSet({p: train[(layer, p)] for p in pools}, train_y, {p: test[(layer, p)] for p in pools}, test_y, feature)


def _check_bank(ev: Evaluation, metrics: list) -> None:
    """Settings that cannot work with this bank (k larger than it) are refused before extracting, not after."""
    n = len(_split(ev, "train")[0])
    for m in metrics:
        if m.check is not None:
            m.check(n, ev.settings.metric_settings())


def _labelled(f: dict, data_name: str) -> None:
    if f["train_y"].unique().numel() < 2:
        raise UserError(f"{data_name}: the training split has labels of fewer than 2 classes; kNN and probes need "
                        "labelled data")


def prepare_features(ev: Evaluation, metrics: list):
    f = _features(ev)
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return  # it helped extract; rank 0 measures
    _labelled(f, ev.data.name)
    pools = sorted(ev.settings.pools())
    for layer in ev.layers:
        yield Prepared(layer, feature_set(f["train"], f["train_y"], f["test"], f["test_y"], layer, pools,
                                          ev.settings.feature), f["card"])


def baseline_features(ev: Evaluation, metrics: list, name: str):
    """Raw pixels (rows cached per data set and protocol) and the run's randomly initialised encoder
    (features cached beside the model's, in random-init/), under the model's protocol."""
    s, img = ev.settings, ev.img_size
    if name == "pixels":
        yield bl.pixel_input(ev.data, img, metrics, s.metric_settings(ev.device), s.max_train, s.max_test,
                             bad_files_folder(ev), s.pixel_cache)
        return
    model = bl.random_init_model(ev.cfg).to(ev.device)
    identity, cache = bl.random_init_key(ev.cfg), _cache(ev).sub("random-init")
    train, train_y, _, _ = cached_features(ev, model, identity, "train", ev.layers, cache)
    test, test_y, _, _ = cached_features(ev, model, identity, "test", ev.layers, cache)
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return
    card = {**{k: v for k, v in _features(ev)["card"].items() if k != "checkpoint_sha256"}, "init_seed": ev.cfg.train.seed}
    pools = [s.feature, *sorted(s.pools() - {s.feature})]  # the feature first, as the baseline rows always listed it
    for layer in ev.layers:
        yield Prepared(layer, feature_set(train, train_y, test, test_y, layer, pools, s.feature), card)


def prepare_layers(ev: Evaluation, metrics: list):
    """Every block's test features, evaluating each measured block in turn."""
    f = _features(ev)
    if torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
        return
    _labelled(f, ev.data.name)
    for layer in ev.layers:
        yield Prepared(layer, LayerSet(layer, {b: f["test"][(b, ev.settings.feature)] for b in f["blocks"]}, f["test_y"],
                                       ev.settings.feature), f["card"])


@torch.no_grad()
def block_norms(model, dataset, n: int, device) -> list[dict]:
    """Per-block mean token norms on the first ``n`` images (``stream.norms.block_norms``): of the
    output, and of the scaled shortcut and the branch of the attention and MLP sub-blocks."""
    images = torch.stack([dataset[i][0] for i in range(min(n, len(dataset)))]).to(device)
    return stream_block_norms(model, images)


def prepare_blocks(ev: Evaluation, metrics: list):
    """The profile's norm statistics of each block, on the first ``STATS_IMAGES`` test images."""
    test = eval_split(ev.data, "test", ev.cfg.model.img_size, bad_files_folder(ev))
    card = _features(ev)["card"] if "features" in ev.shared else {}
    for layer, norms in zip(ev.layers, block_norms(ev.model, test, STATS_IMAGES, ev.device), strict=False):
        yield Prepared(layer, BlockStats(layer, norms), card)


SOURCES = (Source(FEATURES, prepare=prepare_features, baseline=baseline_features, check=_check_bank),
           Source(LAYERS, prepare=prepare_layers, check=_check_bank),
           Source(BLOCKS, prepare=prepare_blocks, rows=False, every_rank=False, profile_only=True),)  # registered by eval/__init__.py
