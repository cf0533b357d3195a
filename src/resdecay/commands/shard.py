"""``resdecay shard --data-path FOLDER --out DIR --shard-size N``: an ImageFolder written as
WebDataset tar shards (``data.name=wds``, data/shards.py).

Each split folder (``train/``, ``val/``; or the class folders directly, as one training split) is
listed exactly as training lists it (torchvision's ImageFolder: classes sorted, files sorted) and
written in that order, N samples a shard: ``<DIR>/train-000000.tar`` ... with members
``<index>.<ext>`` (the file's own bytes, not re-encoded) and ``<index>.cls`` (the class index as
text). Sample i of the shards is therefore image i of the folder, with the same pixels: a run reads
the same images in the same order from either. ``<DIR>/classes.txt`` lists the class names.
The command's parser is ``cli/shard.py``.
"""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path

from ..data.datasets import _image_folder, _need_dir
from ..errors import DataError, UserError
from ..io import atomic_write_text

SPLITS = (("train", "train"), ("val", "val"))  # (folder, shard prefix)


def _member(tf: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o444, 0  # mtime 0: the same folder gives the same bytes
    tf.addfile(info, io.BytesIO(data))


def write_split(samples: list[tuple[str, int]], out: Path, prefix: str, shard_size: int, progress: bool) -> list[Path]:
    """``samples`` ((path, label), in order) as ``<out>/<prefix>-NNNNNN.tar`` shards of ``shard_size``."""
    shards = []
    for start in range(0, len(samples), shard_size):
        path = out / f"{prefix}-{start // shard_size:06d}.tar"
        tmp = path.with_suffix(".tar.tmp")
        with tarfile.open(tmp, "w", format=tarfile.USTAR_FORMAT) as tf:
            for i, (src, label) in enumerate(samples[start:start + shard_size], start):
                try:
                    data = Path(src).read_bytes()
                except OSError as e:
                    raise DataError(f"cannot read {src} ({e.strerror}); fix the folder and run `resdecay shard` again") from None
                _member(tf, f"{i:08d}{Path(src).suffix.lower()}", data)
                _member(tf, f"{i:08d}.cls", str(label).encode())
        tmp.replace(path)  # a shard is either whole or absent
        shards.append(path)
        if progress:
            print(f"\rshard: {prefix}: {min(start + shard_size, len(samples))}/{len(samples)} images", end="",
                  file=sys.stderr, flush=True)
    if progress and shards:
        print(file=sys.stderr)
    return shards


def pattern_of(shards: list[Path]) -> str:
    """The brace pattern naming ``shards`` (``data.path`` / ``data.val_path``)."""
    first, last = shards[0].name, shards[-1].name
    prefix = first.rsplit("-", 1)[0]
    if len(shards) == 1:
        return str(shards[0])
    return str(shards[0].parent / f"{prefix}-{{{first[-10:-4]}..{last[-10:-4]}}}.tar")


def run_shard(data_path: str | None, out: str | None, shard_size: int = 1000, progress: bool = True) -> dict:
    """Write the ImageFolder at ``data_path`` as tar shards in ``out``; returns {split: [shards]}."""
    if shard_size < 1:
        raise UserError(f"--shard-size must be a positive number of images, got {shard_size}")
    if not out:
        raise UserError("shard needs --out DIR (the folder the shards are written to)")
    root = _need_dir(data_path, "shard", "an ImageFolder: <path>/train/<class>/*.jpg and <path>/val/<class>/*")
    dest = Path(out).expanduser()
    if dest.is_dir() and any(dest.glob("*-[0-9]*.tar")):
        raise UserError(f"{dest} holds shards already; choose another --out, or delete them first")
    dest.mkdir(parents=True, exist_ok=True)
    splits = [(root / folder, prefix) for folder, prefix in SPLITS if (root / folder).is_dir()] or [(root, "train")]
    written, classes = {}, None
    for folder, prefix in splits:
        ds = _image_folder(folder, None)  # the listing training uses: sorted classes, sorted files
        classes = classes or ds.classes
        written[prefix] = write_split(ds.samples, dest, prefix, shard_size, progress)
        key = "data.path" if prefix == "train" else "data.val_path"
        print(f"shard: {prefix}: {len(ds.samples)} images in {len(written[prefix])} shard(s): {key}={pattern_of(written[prefix])}")
    atomic_write_text(dest / "classes.txt", "".join(f"{c}\n" for c in classes))
    held = " and ".join(f"{prefix}-*.tar" for prefix in written)
    print(f"shard: train with data.name=wds data.path={dest} (the folder: its {held})")
    return written
