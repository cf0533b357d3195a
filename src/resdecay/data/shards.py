"""``data.name=wds``: WebDataset tar shards read as a map-style data set, so that a
large data set is a few big files rather than many small ones.

A shard is a plain (uncompressed) tar whose members are grouped into samples by key, as WebDataset
does: ``<key>.jpg`` (or .png, .webp, ...) and ``<key>.cls`` (the class index as text). Each shard's
member list is read once (headers only, plus the tiny ``.cls`` members) and kept as (offset, size)
of every image, so sample ``i`` is one seek and one read, decoded exactly like an ImageFolder file
(fast_images.py, or PIL for ``data.decoder=pil``) and transformed by the same ``create_transform``.

Why map-style rather than streaming: ``ResumableSampler``, the rank split, exact mid-epoch resume,
seeded per-sample augmentation, class-balanced subsets and ``data.on_bad_file=skip`` then work
unchanged, and the order (shards in pattern order, members in tar order) is the ImageFolder's when
the shards were written by ``resdecay shard``: the same run gives the same numbers from either.

Where the shards are (``data.path``, and ``data.val_path`` for the test split):
    a brace pattern  ``/data/shards/train-{000000..000127}.tar`` (every name must exist)
    a glob           ``/data/shards/train-*.tar``
    a folder         ``train-*.tar`` (test split: ``val-*.tar``, else ``test-*.tar``), as ``resdecay shard`` writes
"""

from __future__ import annotations

import glob
import io
import os
import re
import tarfile
from dataclasses import replace
from functools import lru_cache
from multiprocessing.pool import ThreadPool
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from ..errors import DataError
from .fast_images import BadImage, bad_image_reason, decode_raw_uint8
from .info import DataInfo, folder_stats
from .subsets import balanced_subset
from .transforms import choose_decoder, create_transform

IMAGE_EXTS = ("jpg", "jpeg", "png", "webp", "ppm", "bmp", "pgm", "tif", "tiff")
_RANGE = re.compile(r"\{(\d+)\.\.(\d+)\}")
class NoSplit(DataError):
    """The split asked for is not there (no val shards, a single-split data set): ``check-data``
    then checks the splits that are."""


HINT = "write shards with `resdecay shard --data-path FOLDER --out DIR`"


# ----------------------------------------------------------------------------- locating shards
def expand_braces(pattern: str) -> list[str]:
    """Every name of a brace pattern, in order: ``{000..012}`` ranges (zero-padded to the width of
    the first bound, as WebDataset's braceexpand) and ``{a,b}`` lists, nested or several."""
    m = re.search(r"\{([^{}]*)\}", pattern)
    if m is None:
        return [pattern]
    head, body, tail = pattern[:m.start()], m.group(1), pattern[m.end():]
    rng = _RANGE.fullmatch(m.group(0))
    if rng:
        lo, hi = int(rng.group(1)), int(rng.group(2))
        step = 1 if hi >= lo else -1
        parts = [str(i).zfill(len(rng.group(1))) for i in range(lo, hi + step, step)]
    else:
        parts = body.split(",")
    return [name for p in parts for name in expand_braces(head + p + tail)]


def _folder_shards(root: Path, train: bool) -> list[Path]:
    prefixes = ("train",) if train else ("val", "test")
    for prefix in prefixes:
        found = sorted(root.glob(f"{prefix}-*.tar"))
        if found:
            return found
    raise (DataError if train else NoSplit)(f"{root} holds no {' or '.join(p + '-*.tar' for p in prefixes)} shards; pass "
                    f"data.{'path' if train else 'val_path'}=<brace pattern of .tar shards>, or {HINT}")


def shard_paths(pattern: str | None, train: bool) -> list[Path]:
    """The shards of one split, in order; one-line DataError when a name is missing or none match.

    Args:
        pattern: ``data.path`` (train) or ``data.val_path`` / ``data.path`` (test): module docstring.
        train: the training split (a folder then means its ``train-*.tar``).
    """
    key = "data.path" if train else "data.val_path"
    if not pattern:
        raise DataError(f"{key} is required for data.name=wds: a brace pattern such as "
                        f"/data/shards/{'train' if train else 'val'}-{{000000..000127}}.tar, or a folder of shards")
    root = Path(pattern).expanduser()
    if root.is_dir():
        return _folder_shards(root, train)
    names = expand_braces(str(root))
    found: list[Path] = []
    for name in names:
        hits = sorted(glob.glob(name)) if glob.has_magic(name) else ([name] if os.path.isfile(name) else [])
        found += map(Path, hits)
    if not found:
        raise DataError(f"{key}={pattern} matches no shard ({len(names)} name(s), first {names[0]}); "
                        f"check the folder and the {{first..last}} range, or {HINT}")
    missing = [n for n in names if not glob.has_magic(n) and not os.path.isfile(n)]
    if missing:  # a silently smaller data set would change every number
        raise DataError(f"{key}={pattern}: {len(missing)} of {len(names)} shards are missing (first {missing[0]}); "
                        "fix the range or copy the missing shards")
    return found


# ----------------------------------------------------------------------------- the index
def _split_name(name: str) -> tuple[str, str]:
    """(key, extension) as WebDataset splits a member name: at the first dot of its base name."""
    folder, _, base = name.rpartition("/")
    stem, dot, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext.lower() if dot else ""


def _parse_label(raw: bytes, where: str) -> int:
    try:
        return int(raw.decode("utf-8").strip())
    except (UnicodeDecodeError, ValueError):
        raise DataError(f"{where} does not hold a class index (got {raw[:20]!r}); .cls members are the label "
                        "as text, e.g. b'3'") from None


def index_shard(path: Path) -> list[tuple[int, int, str, int]]:
    """Every sample of one shard as (offset, size, member name, label) of its image, in tar order.

    Reads the tar headers and the ``.cls`` members only; refuses, in one line, a compressed or
    unreadable tar and a sample without an image or without a ``.cls``.
    """
    groups: dict[str, dict] = {}
    try:
        with tarfile.open(path, "r:") as tf:  # "r:" = no compression: offsets must be offsets in the file
            for m in tf:
                if not m.isfile():
                    continue
                key, ext = _split_name(m.name)
                g = groups.setdefault(key, {})
                if ext == "cls":
                    g["cls"] = _parse_label(tf.extractfile(m).read(), f"{path}:{m.name}")
                elif ext in IMAGE_EXTS and "img" not in g:
                    g["img"] = (m.offset_data, m.size, m.name)
    except (tarfile.TarError, OSError, EOFError) as e:
        raise DataError(f"cannot read shard {path} as a plain tar ({type(e).__name__}: {e}); shards must be "
                        f"uncompressed .tar files (a .tar.gz cannot be read by offset); {HINT}") from None
    out = []
    for key, g in groups.items():
        if "img" not in g:
            raise DataError(f"shard {path}: sample {key!r} has no image member ({', '.join(IMAGE_EXTS[:3])}, ...); "
                            f"every sample needs <key>.jpg|png and <key>.cls; {HINT}")
        if "cls" not in g:
            raise DataError(f"shard {path}: sample {key!r} ({g['img'][2]}) has no .cls member (its class index); "
                            f"every sample needs <key>.jpg|png and <key>.cls; {HINT}")
        out.append((*g["img"][:2], g["img"][2], g["cls"]))
    return out


@lru_cache(maxsize=8)
def _index(paths: tuple[str, ...], stamps: tuple) -> tuple[list, np.ndarray]:
    """(samples, labels) of a list of shards, cached per process by (paths, sizes and mtimes)."""
    with ThreadPool(min(16, len(paths))) as pool:  # header reads overlap on network file systems
        per_shard = pool.map(index_shard, [Path(p) for p in paths])
    samples = [(s, off, size, name) for s, rows in enumerate(per_shard) for off, size, name, _ in rows]
    labels = np.asarray([lab for rows in per_shard for *_, lab in rows], dtype=np.int64)
    return samples, labels


def read_index(paths: list[Path]) -> tuple[list, np.ndarray]:
    """The samples ((shard number, offset, size, member name)) and labels of ``paths``, in order."""
    stamps = tuple((p.stat().st_size, p.stat().st_mtime_ns) for p in paths)
    samples, labels = _index(tuple(map(str, paths)), stamps)
    if not samples:
        raise DataError(f"the shards {paths[0]}{' ...' if len(paths) > 1 else ''} hold no samples; {HINT}")
    if labels.min() < 0:
        raise DataError(f"the shards {paths[0]} ... hold a negative class index {labels.min()}; .cls must be 0..C-1")
    return samples, labels


# ----------------------------------------------------------------------------- decoding
def decode_bytes(raw: bytes, name: str, pipeline: str):
    """An image file's bytes decoded as the ImageFolder path decodes the file: (3, H, W) uint8
    (``decode_uint8``'s rules: TorchCodec for JPEG / 8-bit PNG when installed, else PIL) or, for
    ``pipeline="pil"``, a PIL RGB image. ``name`` (shard:member) names the file in errors."""
    if pipeline == "pil":
        from PIL import Image

        try:
            with io.BytesIO(raw) as f:
                return Image.open(f).convert("RGB")
        except Exception as e:
            raise BadImage(name, bad_image_reason(e)) from None
    return decode_raw_uint8(raw, name)


class ShardImages(Dataset):
    """The samples of tar shards, decoded and transformed like ``ImageFolder`` items.

    ``targets`` holds every label (read from the ``.cls`` members), so class-balanced subsets and
    ``dataset_labels`` never decode an image. Files are opened per read: nothing to leak or to share
    across DataLoader worker processes.
    """

    def __init__(self, paths: list[Path], transform, pipeline: str):
        self.paths, self.transform, self.pipeline = [str(p) for p in paths], transform, pipeline
        self.samples, labels = read_index(paths)
        self.targets = labels.tolist()

    def __len__(self) -> int:
        return len(self.samples)

    def member(self, i: int) -> str:
        """``shard:member`` of sample ``i`` (how errors and bad-file lists name it)."""
        shard, _, _, name = self.samples[i]
        return f"{self.paths[shard]}:{name}"

    def raw(self, i: int) -> bytes:
        shard, offset, size, _ = self.samples[i]
        with open(self.paths[shard], "rb") as f:
            f.seek(offset)
            data = f.read(size)
        if len(data) != size:
            raise BadImage(self.member(i), f"the shard ends {size - len(data)} bytes early (truncated copy)")
        return data

    def __getitem__(self, i: int):
        img = decode_bytes(self.raw(i), self.member(i), self.pipeline)
        return (self.transform(img) if self.transform is not None else img), self.targets[i]


def view_pipeline(cfg, aug: str) -> str:
    """The decode path of a sharded view, chosen by the ImageFolder rules (uint8 unless
    ``data.decoder=pil`` or RandAugment): the same pixels and crops as the folder the shards hold."""
    return choose_decoder(replace(cfg, name="imagefolder"), aug)


def wds_dataset(cfg, train: bool, img_size: int, aug: str):
    """(ShardImages, DataInfo) of one split of ``data.name=wds`` (``datasets.build_dataset``)."""
    paths = shard_paths(cfg.path if train else (cfg.val_path or _val_from(cfg.path)), train)
    pipeline = view_pipeline(cfg, aug)
    mean, std = folder_stats(cfg)
    ds = ShardImages(paths, create_transform(aug, img_size, pipeline, mean=mean, std=std), pipeline)
    info = DataInfo("wds", _num_classes(cfg, ds.targets), 3, None, mean, std)
    if cfg.train_subset and train:
        ds = balanced_subset(ds, cfg.train_subset, cfg.subset_seed)
    return ds, info


def _num_classes(cfg, labels) -> int:
    """1 + the largest class index of both splits (where both are found): a fine-tuning head sized
    from the test split must still fit every training label, as an ImageFolder's class folders do."""
    top = int(max(labels))
    for pattern, train in ((cfg.path, True), (cfg.val_path or cfg.path, False)):
        try:
            paths = shard_paths(pattern, train)
        except DataError:  # that split is not there (e.g. no val shards): this one decides
            continue
        top = max(top, int(read_index(paths)[1].max()))
    return top + 1


def _val_from(path: str | None) -> str | None:
    """The test split when only ``data.path`` is given: the same folder's val shards (a pattern has none)."""
    if path and Path(path).expanduser().is_dir():
        return path
    raise NoSplit("data.val_path is required for the test split of data.name=wds when data.path is a pattern: "
                    "pass data.val_path=/data/shards/val-{000000..000009}.tar (or give data.path as the shard folder)")


def _scan_one(item) -> tuple[str, str] | None:
    ds, i = item
    try:
        decode_bytes(ds.raw(i), ds.member(i), "pil")  # a full decode to RGB, as check-data does for folders
    except BadImage as e:
        return e.path, e.reason
    return None


def scan_members(ds, workers: int, progress=None) -> list[tuple[str, str]]:
    """Every undecodable sample of ``ds`` (``ShardImages`` or ``HFImages``) as (member, reason), in
    order; decoded in a thread pool (PIL releases the GIL). ``progress``: called with the count done."""
    bad = []
    with ThreadPool(workers) as pool:
        for done, result in enumerate(pool.imap(_scan_one, ((ds, i) for i in range(len(ds))), chunksize=32), 1):
            if result is not None:
                bad.append(result)
            if progress is not None and done % 256 == 0:
                progress(done)
    return bad
