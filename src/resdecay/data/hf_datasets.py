"""``data.name=hf``: a Hugging Face ``datasets`` data set on disk, read as a map-style data set.

``data.path`` is a folder written by ``save_to_disk`` (a ``DatasetDict`` with a ``train`` and a
``test`` / ``validation`` split, or a single ``Dataset``), or parquet files: one file, a glob / brace
pattern, or a folder of ``train-*.parquet`` / ``test-*.parquet`` (the hub's layout). ``data.val_path``
names the test split where ``data.path`` holds one split only. ``data.image_column`` /
``data.label_column`` name the columns (default ``image`` / ``label``).

Images are read as their encoded bytes (the ``Image`` feature with ``decode=False``, or a binary
column) and decoded exactly as ImageFolder files are (``shards.decode_bytes``), then given the same
transforms. Nothing is downloaded: parquet files are converted once into the ``datasets`` cache
(``HF_DATASETS_CACHE``) and memory-mapped from there, as ``load_dataset("parquet")`` always does.
"""

from __future__ import annotations

import glob
from pathlib import Path

import numpy as np
from torch.utils.data import Dataset

from ..errors import DataError
from .info import DataInfo, folder_stats
from .shards import NoSplit, decode_bytes, expand_braces, view_pipeline
from .subsets import balanced_subset
from .transforms import create_transform

EXTRA = "pip install 'resdecay[shards]'"
TEST_SPLITS = ("test", "validation", "val")


def require_datasets():
    """The ``datasets`` module, or one line naming the extra that installs it."""
    try:
        import datasets
    except ImportError:
        raise DataError(f"data.name=hf needs the `datasets` package: {EXTRA}") from None
    return datasets


def _parquet_files(path: str, split: str | None) -> list[str] | None:
    """The parquet files at ``path`` of ``split`` ("train" / "test"; None: all of them), or None
    when ``path`` holds no parquet (a ``save_to_disk`` folder)."""
    root = Path(path).expanduser()
    if root.is_dir():
        if (root / "dataset_dict.json").is_file() or (root / "state.json").is_file():
            return None  # save_to_disk's layout
        files = sorted(str(p) for p in root.rglob("*.parquet"))
        if not files or split is None:
            return files or None
        prefixes = ("train",) if split == "train" else TEST_SPLITS
        chosen = [f for f in files if Path(f).name.startswith(prefixes)]
        if not any(Path(f).name.startswith(("train", *TEST_SPLITS)) for f in files) and split == "train":
            return files  # no split names: one split, the training one
        if not chosen:
            raise (DataError if split == "train" else NoSplit)(f"{path} holds no {prefixes[0]}-*.parquet files; "
                            f"pass data.{'path' if split == 'train' else 'val_path'}=<parquet files of that split>")
        return chosen
    names = [n for pat in expand_braces(str(root)) for n in (sorted(glob.glob(pat)) if glob.has_magic(pat) else [pat])]
    if not names or not all(n.endswith(".parquet") for n in names):
        return None
    missing = [n for n in names if not Path(n).is_file()]
    if missing:
        raise DataError(f"{path}: parquet file {missing[0]} does not exist; check data.path / data.val_path")
    return names


def _load(cfg, train: bool):
    """One split as a ``datasets.Dataset``: the train split of ``data.path``; the test split of
    ``data.val_path`` (all of it) or else of ``data.path`` (its test / validation split)."""
    datasets = require_datasets()
    key = "data.val_path" if not train and cfg.val_path else "data.path"
    path = cfg.path if key == "data.path" else cfg.val_path
    if not path:
        raise DataError(f"{key} is required for data.name=hf: a `save_to_disk` folder or parquet files")
    files = _parquet_files(path, None if key == "data.val_path" else "train" if train else "test")
    if files is not None:
        return datasets.load_dataset("parquet", data_files={"split": files}, split="split")
    root = Path(path).expanduser()
    if not root.is_dir():
        raise DataError(f"{key}={path} is neither a `save_to_disk` folder nor parquet files; pass one of them")
    try:
        found = datasets.load_from_disk(str(root))
    except (FileNotFoundError, ValueError, OSError) as e:
        raise DataError(f"{key}={path} is not a `datasets` folder written by save_to_disk, nor holds parquet files "
                        f"({type(e).__name__}: {' '.join(str(e).split())[:120]})") from None
    if not isinstance(found, datasets.DatasetDict):
        if train or key == "data.val_path":
            return found
        raise NoSplit(f"data.path={path} holds a single split; pass data.val_path=<folder or parquet files of the "
                        "test split> for evaluation")
    # data.val_path's DatasetDict: its test split, else its first
    names = (("train",) if train else TEST_SPLITS) if key == "data.path" else (*TEST_SPLITS, *found)
    split = next((n for n in names if n in found), None)
    if split is None:
        raise (DataError if train else NoSplit)(f"{key}={path} has splits {', '.join(found)} but no {' / '.join(names)} split"
                        f"{'' if train else '; pass data.val_path=<folder or parquet files of the test split>'}")
    return found[split]


def _columns(ds, cfg, where: str):
    """The image column cast to encoded bytes, and the labels; one line naming a missing column."""
    datasets = require_datasets()
    for key, col in (("image_column", cfg.image_column), ("label_column", cfg.label_column)):
        if col not in ds.column_names:
            raise DataError(f"{where} has no column {col!r} (columns: {', '.join(ds.column_names)}); "
                            f"set data.{key}=<name>")
    feature = ds.features[cfg.image_column]
    if isinstance(feature, datasets.Image):
        ds = ds.cast_column(cfg.image_column, datasets.Image(decode=False))  # bytes: decoded as folder files are
    elif getattr(feature, "dtype", None) != "binary":
        raise DataError(f"{where}: column {cfg.image_column!r} holds {feature}, not images (an Image feature or "
                        "encoded bytes); set data.image_column=<the image column>")
    labels = np.asarray(ds[cfg.label_column])
    if labels.dtype.kind not in "iu":
        raise DataError(f"{where}: column {cfg.label_column!r} holds {labels.dtype} values, not class indices; "
                        "set data.label_column=<the integer label column>")
    classes = getattr(ds.features[cfg.label_column], "num_classes", None) or int(labels.max()) + 1
    return ds, labels.astype(np.int64), int(classes)


class HFImages(Dataset):
    """Rows of a ``datasets.Dataset``, decoded and transformed like ``ImageFolder`` items."""

    def __init__(self, ds, column: str, labels: np.ndarray, transform, pipeline: str, where: str):
        self.ds, self.column, self.transform, self.pipeline, self.where = ds, column, transform, pipeline, where
        self.targets = labels.tolist()

    def __len__(self) -> int:
        return len(self.targets)

    def member(self, i: int) -> str:
        """How errors and bad-file lists name row ``i``."""
        return f"{self.where}[{i}]"

    def raw(self, i: int) -> bytes:
        value = self.ds[i][self.column]
        if isinstance(value, dict):  # the Image feature undecoded: bytes, or a path beside the data
            if value.get("bytes") is not None:
                return value["bytes"]
            with open(value["path"], "rb") as f:
                return f.read()
        return value

    def __getitem__(self, i: int):
        img = decode_bytes(self.raw(i), self.member(i), self.pipeline)
        return (self.transform(img) if self.transform is not None else img), self.targets[i]


def hf_dataset(cfg, train: bool, img_size: int, aug: str):
    """(HFImages, DataInfo) of one split of ``data.name=hf`` (``datasets.build_dataset``)."""
    where = f"{cfg.path if train or not cfg.val_path else cfg.val_path} ({'train' if train else 'test'})"
    ds, labels, classes = _columns(_load(cfg, train), cfg, where)
    pipeline = view_pipeline(cfg, aug)
    mean, std = folder_stats(cfg)
    out = HFImages(ds, cfg.image_column, labels, create_transform(aug, img_size, pipeline, mean=mean, std=std),
                   pipeline, where)
    info = DataInfo("hf", classes, 3, None, mean, std)
    if cfg.train_subset and train:
        out = balanced_subset(out, cfg.train_subset, cfg.subset_seed)
    return out, info
