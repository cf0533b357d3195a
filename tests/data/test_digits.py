"""The digits data set is read without importing scikit-learn (data/digits.py): the same images, labels and split
as scikit-learn's ``load_digits`` and ``train_test_split(..., test_size=0.2, random_state=0, stratify=labels)``.
That reading them imports no scikit-learn is checked in a fresh interpreter by tests/test_layers.py."""

import numpy as np
import pytest
import torch

from helpers import assert_one_line_error, run
from resdecay.data import digits
from resdecay.errors import DataError


@pytest.mark.parametrize("train", [True, False], ids=["train", "test"])
def test_the_split_is_scikit_learns(train):
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    tr, te = train_test_split(np.arange(len(d.images)), test_size=0.2, random_state=0, stratify=d.target)
    sel = np.sort(tr if train else te)
    images, labels = digits.load_digits_split(train)
    expected = np.round(d.images[sel] * (255.0 / 16.0)).astype(np.uint8)
    assert images.dtype == torch.uint8 and labels.dtype == torch.int64 and images.shape == (len(sel), 1, 8, 8)
    assert np.array_equal(images[:, 0].numpy(), expected) and np.array_equal(labels.numpy(), d.target[sel])
    assert len(sel) == (1437 if train else 360)


def test_a_missing_or_damaged_file_is_one_line(tmp_path, monkeypatch, capsys):
    import gzip

    bad = tmp_path / "digits.csv.gz"
    with gzip.open(bad, "wt") as f:
        f.write("1,2,3\n4,5,6\n")
    find_csv = digits.digits_csv
    monkeypatch.setattr(digits, "digits_csv", lambda: bad)
    digits._read.cache_clear()
    try:
        with pytest.raises(DataError, match="not the 1,797 rows"):
            digits.load_digits_split(True)
        for content, needle in ((b"not gzip at all", "cannot read"), (gzip.compress(b"1,2,x\n"), "cannot read")):
            bad.write_bytes(content)
            digits._read.cache_clear()
            with pytest.raises(DataError, match=f"{needle}.*force-reinstall scikit-learn"):
                digits.load_digits_split(False)
        digits._read.cache_clear()  # as the command line shows it: one line, exit 2
        assert_one_line_error(*run(capsys, "check-data", "--data", "digits", "--no-progress")[::2], "cannot read",
                              "force-reinstall scikit-learn")
    finally:
        digits._read.cache_clear()
    monkeypatch.setattr(digits.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DataError, match="pip install scikit-learn"):
        find_csv()
