"""scikit-learn's embedded 8x8 digits, read without importing scikit-learn.

The data are the file ``load_digits`` reads (``sklearn/datasets/data/digits.csv.gz``, 1,797 rows of 64
pixels 0..16 and a label); the split is the stratified 80/20 one of
``train_test_split(range(1797), test_size=0.2, random_state=0, stratify=labels)``, stored here as a
bitmask of the 360 test rows (tests/data/test_digits.py checks both against scikit-learn's own calls).
Why not call scikit-learn: importing it (with SciPy) takes ~2.5 s on a 2-core CPU, longer than a whole
digits training run of the demo's size, and every process of a run (each torchrun rank) paid it.
"""

from __future__ import annotations

import gzip
import importlib.util
from functools import lru_cache
from pathlib import Path

import numpy as np
import torch

from ..errors import DataError

N_IMAGES = 1797
# Bit i (most significant first) is set where row i of digits.csv.gz is a test image.
TEST_ROWS_HEX = (
    "000004883524104000064100934205001a00080100240028062c12001000940a009019120420f8a0028110a000080a8820441524494240a00a"
    "0000004004d80000818020004805c400104008a0100005404800301000020ec409000224840083a8013c20a6980a0000000b08400804a018"
    "4802024041c1008004404684376a810216004480004042a0a4180a5000840b8561c608108008004c80c02004068e00010882008100380803"
    "c008190000100e01008410a0210033282904c044c080680e0102830082008822a6402c24042108a860809081a00c02820242120138a41500"
)


def digits_csv() -> Path:
    """The CSV file inside the installed scikit-learn (found, not imported)."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise DataError("the digits data set is scikit-learn's embedded copy: pip install scikit-learn")
    path = Path(next(iter(spec.submodule_search_locations))) / "datasets" / "data" / "digits.csv.gz"
    if not path.is_file():
        raise DataError(f"{path} is missing: reinstall scikit-learn (pip install --force-reinstall scikit-learn)")
    return path


def held_out_rows() -> np.ndarray:
    """A boolean mask over the 1,797 rows: True where the row is in the test split."""
    bits = np.unpackbits(np.frombuffer(bytes.fromhex(TEST_ROWS_HEX), dtype=np.uint8))
    return bits[:N_IMAGES].astype(bool)


@lru_cache(maxsize=1)
def _read() -> tuple[np.ndarray, np.ndarray]:
    path = digits_csv()
    try:
        with gzip.open(path, "rt") as f:
            data = np.loadtxt(f, delimiter=",", ndmin=2)
    except (OSError, EOFError, ValueError) as e:  # not gzip, truncated, or not numbers
        raise DataError(f"cannot read {path} ({e}); reinstall scikit-learn (pip install --force-reinstall scikit-learn)") from None
    if data.shape != (N_IMAGES, 65):
        raise DataError(f"{path} holds {data.shape} values, not the 1,797 rows of 64 pixels and a label; reinstall "
                        "scikit-learn (pip install --force-reinstall scikit-learn)")
    images = np.round(data[:, :-1].reshape(-1, 8, 8) * (255.0 / 16.0)).astype(np.uint8)  # 0..16 -> 0..255
    return images, data[:, -1].astype(np.int64)


def load_digits_split(train: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(uint8 images (N, 1, 8, 8), int64 labels) of the train (1,437) or test (360) split, in row order."""
    images, labels = _read()
    sel = ~held_out_rows() if train else held_out_rows()
    return torch.from_numpy(images[sel]).unsqueeze(1), torch.from_numpy(labels[sel].copy())
