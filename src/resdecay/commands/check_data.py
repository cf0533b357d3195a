"""``resdecay check-data``: decode every image of a data set once, in parallel, and list every
unreadable file at once (also ``resdecay pretrain --check-data`` before training starts)."""

from __future__ import annotations

import sys
import time

from ..data import DataConfig, build_dataset
from ..data.badfiles import image_files, scan_images
from ..errors import DataError


def check_data(data: DataConfig, img_size: int = 224, workers: int | None = None, progress: bool = True,
               stop: bool = True) -> list[tuple[str, str]]:
    """Scan ``data``; print a table of the unreadable files and return them as (path, reason).

    stop: raise one DataError when any file is bad (the data set cannot be trained on as it is).
    """
    files = image_files(data)
    if not files:  # held in memory: building the splits reads (and checks) every image
        sizes = {split: len(build_dataset(data, split, img_size, augment=False)[0]) for split in ("train", "test")}
        print(f"check-data: {data.name}: {sizes['train']} train + {sizes['test']} test images, all readable "
              "(an in-memory data set, decoded when it is loaded)")
        return []
    total, t0, bad = sum(map(len, files.values())), time.perf_counter(), []
    for split, paths in files.items():
        def show(done, split=split, n=len(paths)):
            if progress:
                print(f"\rcheck-data: {split}: {done}/{n} decoded", end="", file=sys.stderr, flush=True)
        found = scan_images(paths, workers, show)
        if progress:
            print(file=sys.stderr)
        bad += found
        print(f"check-data: {split}: {len(paths)} images, {len(found)} unreadable")
    print(f"check-data: {total} images decoded in {time.perf_counter() - t0:.1f}s (full decode to RGB, as training does)")
    if bad:
        width = min(100, max(len(p) for p, _ in bad))
        print(f"{'unreadable file':<{width}}  reason")
        for path, reason in bad:
            print(f"{path:<{width}}  {reason}")
        if stop:
            raise DataError(f"{len(bad)} of {total} images in {data.path} are unreadable (listed above); remove or replace "
                            "them, or train with data.on_bad_file=skip")
    return bad
