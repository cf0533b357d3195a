"""Labels that are not class indices are refused in one line (issue 30.5), as scikit-learn refuses a
continuous target: ``.long()`` used to truncate ``y + 0.5`` to ``y``, so it scored exactly as ``y``."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import resdecay
from resdecay.errors import UserError
from resdecay.eval.features.knn import LabelError, knn_topk
from resdecay.eval.protocol import FAST_RECIPE


@pytest.fixture
def data():
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(4, 8, generator=g) * 3
    y = torch.randint(0, 4, (240,), generator=g)
    x = centres[y] + torch.randn(240, 8, generator=g)  # four separable clusters: accuracy well above chance
    return x[:180], y[:180], x[180:], y[180:]


def _one_line(info, *fragments):
    text = str(info.value)
    assert "\n" not in text and isinstance(info.value, UserError) and isinstance(info.value, ValueError), text
    for f in fragments:
        assert f in text, text


def test_half_integer_labels_are_refused_not_truncated(data):
    bank, bank_y, queries, query_y = data
    assert resdecay.knn_accuracy(bank, bank_y, queries, query_y) > 0.9
    with pytest.raises(LabelError) as info:
        resdecay.knn_accuracy(bank, bank_y + 0.5, queries, query_y + 0.5)
    _one_line(info, "knn_accuracy: train_labels", "class indices", "180 of 180", f"e.g. {float(bank_y[0]) + 0.5:g})")
    with pytest.raises(LabelError) as info:  # only the queries' labels wrong: named as such
        resdecay.knn_accuracy(bank, bank_y, queries, query_y + 0.25)
    _one_line(info, "test_labels", f"e.g. {float(query_y[0]) + 0.25:g})")
    with pytest.raises(LabelError) as info:  # numpy arrays enter through the same check
        resdecay.knn_accuracy(bank.numpy(), bank_y.numpy() * 0.5, queries.numpy(), query_y.numpy())
    odd = int(bank_y[bank_y % 2 == 1][0])  # the first label that halves to a non-integer
    _one_line(info, "train_labels", f"{int((bank_y % 2 == 1).sum())} of 180", f"e.g. {odd * 0.5:g})")


def test_whole_number_float_labels_score_as_their_integers(data):
    bank, bank_y, queries, query_y = data
    want = knn_topk(bank, bank_y, queries, query_y)
    assert knn_topk(bank, bank_y.double(), queries, query_y.float()) == want
    assert resdecay.knn_accuracy(bank.numpy(), np.asarray(bank_y, dtype=np.float32), queries, query_y) == want["top1"]


@pytest.mark.parametrize("bad, fragment", [
    (lambda y: y - 1, "one is -1"),
    (lambda y: torch.where(y == 0, torch.nan, y.double()), "e.g. nan"),
    (lambda y: y.unsqueeze(1), "shape (N,); got shape (180, 1)"),
])
def test_negative_nan_and_column_labels_are_one_line(data, bad, fragment):
    bank, bank_y, queries, query_y = data
    with pytest.raises(LabelError) as info:
        resdecay.knn_accuracy(bank, bad(bank_y), queries, query_y)
    _one_line(info, "train_labels", fragment)


def test_the_linear_probe_refuses_them_too(data):
    bank, bank_y, queries, query_y = data
    recipe = FAST_RECIPE.__class__(**{**vars(FAST_RECIPE), "epochs": 1})
    result = resdecay.linear_probe(bank, bank_y.float(), queries, query_y, recipe=recipe)  # whole numbers: fine
    assert 0 <= result["top1"] <= 1
    with pytest.raises(LabelError) as info:
        resdecay.linear_probe(bank, bank_y + 0.5, queries, query_y, recipe=recipe)
    _one_line(info, "linear_probe: train_labels", "180 of 180")
