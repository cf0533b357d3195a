"""``resdecay check-data``: decode every image of a data set once, in parallel, and list every
unreadable file at once (also ``resdecay pretrain --check-data`` before training starts)."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from ..data import DataConfig, build_dataset
from ..data.badfiles import image_files, scan_images
from ..data.datasets import SHARDED
from ..data.shards import NoSplit, scan_members
from ..errors import DataError, UserError
from ..train.config import load_config


def check_data(data: DataConfig, img_size: int | None = None, workers: int | None = None, progress: bool = True,
               stop: bool = True) -> list[tuple[str, str]]:
    """Scan ``data``; print a table of the unreadable files and return them as (path, reason).

    Args:
        data: the data set to check.
        img_size: the model's input side (a preset's ``model.img_size``); None when there is no model
            (``check-data --data NAME``): in-memory data sets are then read at their own size.
        workers: decoding threads for image folders (default 2 x CPU cores, at most 64).
        progress: print a progress line on stderr.
        stop: raise one DataError when any file is bad (the data set cannot be trained on as it is).

    Returns:
        The unreadable files as (path, reason), in folder order.
    """
    if data.name in SHARDED:
        return _check_sharded(data, workers, progress, stop)
    files = image_files(data)
    if not files:  # held in memory: building the splits reads (and checks) every image
        # no model to fit: read at the native size; img_size only shapes transforms, not applied here
        cfg, size = (data, img_size) if img_size is not None else (replace(data, resize=True), 32)
        sizes = {split: len(build_dataset(cfg, split, size, augment=False)[0]) for split in ("train", "test")}
        print(f"check-data: {data.name}: {sizes['train']} train + {sizes['test']} test images, all readable "
              "(an in-memory data set, decoded when it is loaded)")
        return []
    empty = [split for split, paths in files.items() if not paths]
    if empty:  # nothing to decode is not a pass: training would fail on the same folder
        root = Path(data.path).expanduser()
        folder = root / empty[0] if (root / empty[0]).is_dir() else root
        raise DataError(f"{folder} holds no images in class folders; expected {root}/train/<class>/<image>.jpg "
                        f"(and val/<class>/...), or <class>/<image>.jpg directly under {root}")
    total, t0, bad = sum(map(len, files.values())), time.perf_counter(), []
    for split, paths in files.items():
        n = len(paths)

        def show(done, split=split, n=n):
            if progress:
                print(f"\rcheck-data: {split}: {done}/{n} decoded", end="", file=sys.stderr, flush=True)
        found = scan_images(paths, workers, show)
        if progress:
            print(file=sys.stderr)
        bad += found
        print(f"check-data: {split}: {len(paths)} images, {len(found)} unreadable")
    _report(bad, total, t0, data.path, stop)
    return bad


def _report(bad: list[tuple[str, str]], total: int, t0: float, where, stop: bool) -> None:
    """The closing lines: the time, the table of unreadable files, and the one-line refusal under ``stop``."""
    print(f"check-data: {total} images decoded in {time.perf_counter() - t0:.1f}s (full decode to RGB, as training does)")
    if bad:
        width = min(100, max(len(p) for p, _ in bad))
        print(f"{'unreadable file':<{width}}  reason")
        for path, reason in bad:
            print(f"{path:<{width}}  {reason}")
        if stop:
            raise DataError(f"{len(bad)} of {total} images in {where} are unreadable (listed above); remove or replace "
                            "them, or train with data.on_bad_file=skip")


def _check_sharded(data: DataConfig, workers: int | None, progress: bool, stop: bool) -> list[tuple[str, str]]:
    """check-data of tar shards / a datasets folder: every member decoded from its bytes (data/shards.py);
    the test split too where there is one."""
    cfg, t0, bad, total = replace(data, train_subset=None), time.perf_counter(), [], 0
    for split in ("train", "test"):
        try:
            ds, _ = build_dataset(cfg, split, 32, augment=False)  # reads the index; the scan decodes the bytes
        except NoSplit:
            continue  # no val shards / a single split: the training split is checked alone
        n = len(ds)

        def show(done, split=split, n=n):
            if progress:
                print(f"\rcheck-data: {split}: {done}/{n} decoded", end="", file=sys.stderr, flush=True)
        found = scan_members(ds, workers or min(64, 2 * (os.cpu_count() or 1)), show)
        if progress:
            print(file=sys.stderr)
        bad, total = bad + found, total + len(ds)
        print(f"check-data: {split}: {len(ds)} images, {len(found)} unreadable")
    _report(bad, total, t0, data.val_path and f"{data.path} and {data.val_path}" or data.path, stop)
    return bad


def run_check_data(preset: str | None, overrides: list[str], data_name: str | None, data_path: str | None,
                   workers: int | None = None, progress: bool = True) -> None:
    """``resdecay check-data``: the data set of a preset (with key=value overrides) or of ``--data`` /
    ``--data-path``, checked; the options refused in one line first."""
    if workers is not None and workers < 1:
        raise UserError(f"--workers must be a positive integer, got {workers}")
    if preset:
        cfg = load_config(preset, overrides)
        data, img = cfg.data, cfg.model.img_size
    elif data_name or data_path:
        if overrides:
            raise UserError(f"key=value overrides ({overrides[0]}) need --preset; with --data give the folder as --data-path")
        # no model: in-memory data sets are read at their own size, image folders need none
        data, img = DataConfig(name=data_name or "imagefolder", path=data_path), None
    else:
        raise UserError("check-data needs a data set: --data-path DIR (an ImageFolder), --data NAME --data-path DIR, "
                        "or --preset NAME [data.path=DIR]")
    check_data(data, img, workers=workers, progress=progress)
