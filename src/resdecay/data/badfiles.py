"""Unreadable image files: found all at once before a run, or skipped during one.

``scan_images`` decodes every file fully (``Image.open(...).convert("RGB")``, exactly what
training does; ``verify()`` alone misses truncated JPEG/PNG data) in a thread pool: Pillow releases
the GIL while it decodes, and a thread pool also overlaps the reads of a network file system.

``SkipBadFiles`` is the training-time policy ``data.on_bad_file=skip``: a sample whose file cannot
be read is replaced by the next readable index (index + 1, + 2, ...), which depends only on the index
and the files, so a resumed run still sees exactly the batches an uninterrupted one would. Each
file is listed once in ``<run>/bad_files.txt`` (path, tab, reason), from any DataLoader worker.
"""

from __future__ import annotations

import os
from multiprocessing.pool import ThreadPool
from pathlib import Path

from torch.utils.data import Dataset

try:
    import fcntl
except ImportError:  # Windows: appends are not serialised across workers (rare duplicate lines)
    fcntl = None

from ..errors import DataError
from .datasets import IMG_EXTENSIONS, BadImage, DataConfig, _checked_pil_loader, _need_dir

MAX_CONSECUTIVE_BAD = 64


def image_files(cfg: DataConfig) -> dict[str, list[str]]:
    """The image files an ``imagefolder`` data set would load, per split folder (train/, val/);
    {} for data sets held in memory (they are decoded, and checked, when they are built)."""
    if cfg.name != "imagefolder":
        return {}
    root = _need_dir(cfg.path, "imagefolder", "ImageNet layout: <path>/train/<class>/*.JPEG and <path>/val/...")
    splits = {s: root / s for s in ("train", "val") if (root / s).is_dir()} or {"train": root}
    out = {}
    for split, folder in splits.items():
        classes = sorted(d for d in folder.iterdir() if d.is_dir())
        out[split] = [str(p) for c in classes for p in sorted(c.rglob("*"))
                      if p.suffix.lower() in IMG_EXTENSIONS and p.is_file()]
    return out


def _check(path: str) -> tuple[str, str] | None:
    try:
        _checked_pil_loader(path)
    except BadImage as e:
        return e.path, e.reason
    return None


def scan_images(paths: list[str], workers: int | None = None, progress=None) -> list[tuple[str, str]]:
    """Every unreadable file of ``paths`` as (path, reason), in the order of ``paths``.
    ``progress``: an optional callable given the number of files checked so far."""
    workers = workers or min(64, 2 * (os.cpu_count() or 1))
    bad, done = [], 0
    with ThreadPool(workers) as pool:
        for result in pool.imap(_check, paths, chunksize=32):
            done += 1
            if result is not None:
                bad.append(result)
            if progress is not None and done % 256 == 0:
                progress(done)
    return bad


def record_bad_file(log: Path, path: str, reason: str) -> bool:
    """Append ``path`` to ``log`` unless it is listed already; True when it was added."""
    with open(log, "a+") as f:
        if fcntl is not None:
            fcntl.flock(f, fcntl.LOCK_EX)  # workers are processes: one writer at a time
        f.seek(0)
        if any(line.split("\t", 1)[0] == path for line in f.read().splitlines()):
            return False
        f.write(f"{path}\t{reason}\n")
        return True


def count_bad_files(log: Path | None) -> int:
    try:
        return sum(1 for line in Path(log).read_text().splitlines() if line.strip()) if log else 0
    except OSError:
        return 0


class SkipBadFiles(Dataset):
    """``data.on_bad_file=skip``: replace an unreadable sample by the next readable index."""

    def __init__(self, samples: Dataset, log: Path):
        self.samples, self.log, self.seen = samples, Path(log), set()
        self.dataset = samples  # readers that look through wrappers (.dataset) still find the images

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, key):
        index, epoch = key if isinstance(key, tuple) else (key, None)
        n = len(self.samples)
        for k in range(min(n, MAX_CONSECUTIVE_BAD)):
            j = (index + k) % n
            try:
                return self.samples[(j, epoch) if epoch is not None else j]
            except BadImage as e:
                if e.path is None:
                    raise
                if e.path not in self.seen:
                    self.seen.add(e.path)
                    record_bad_file(self.log, e.path, e.reason)
        raise DataError(f"{MAX_CONSECUTIVE_BAD} images in a row from index {index} are unreadable (listed in {self.log}); "
                        "run `resdecay check-data` and repair the data set")
