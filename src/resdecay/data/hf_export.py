"""Built-in data sets written as a Hugging Face ``datasets`` folder (``save_to_disk``), for tests, examples
and users who want the ``data.name=hf`` path on small data."""

from __future__ import annotations

import io
from pathlib import Path

from PIL import Image

from .datasets import _load_fashion_mnist
from .digits import load_digits_split
from .hf_datasets import require_datasets


def save_hf_dataset(name: str, out: str | Path, limit: int | None = None, path: str | None = None) -> Path:
    """A built-in data set (``digits`` or ``fashion-mnist``) saved as a ``datasets`` folder
    (``save_to_disk``): a DatasetDict of ``train`` and ``test``, PNG images in an ``image`` column,
    a ClassLabel ``label`` column. For tests and examples.

    Args:
        name: "digits" or "fashion-mnist".
        out: the folder to write.
        limit: keep the first N images of each split (None: all).
        path: the Fashion-MNIST IDX folder (default: Debian's).
    """
    datasets = require_datasets()
    splits = {}
    for split in ("train", "test"):
        images, labels = load_digits_split(split == "train") if name == "digits" else _load_fashion_mnist(path, split == "train")
        images, labels = images[:limit], labels[:limit]
        encoded = []
        for img in images:
            buf = io.BytesIO()
            Image.fromarray(img[0].numpy()).save(buf, format="PNG")
            encoded.append({"bytes": buf.getvalue(), "path": None})
        features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(num_classes=10)})
        splits[split] = datasets.Dataset.from_dict({"image": encoded, "label": labels.tolist()}, features=features)
    shown = datasets.is_progress_bar_enabled()
    datasets.disable_progress_bars()  # a test fixture, not a long job: no bars on stderr
    try:
        datasets.DatasetDict(splits).save_to_disk(str(out))
    finally:
        if shown:
            datasets.enable_progress_bars()
    return Path(out)
