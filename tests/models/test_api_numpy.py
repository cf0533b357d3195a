"""The notebook API on numpy inputs (issue 23.10): ``resdecay.knn_accuracy``, ``linear_probe``,
``effective_rank`` and ``extract_features`` gave ``AttributeError`` ('numpy.ndarray' object has no attribute
'long' / 'to' / 'double'); they now take numpy features, labels and images and give the numbers the same data
as tensors gives, and refuse what is neither in one line."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import resdecay
from resdecay.errors import UserError
from resdecay.eval.features.probe import FAST_RECIPE


@pytest.fixture
def feats():
    rng = np.random.default_rng(0)
    means = rng.normal(size=(4, 16))
    y_tr, y_te = np.arange(120) % 4, np.arange(40) % 4
    x_tr = means[y_tr] + 0.8 * rng.normal(size=(120, 16))
    x_te = means[y_te] + 0.8 * rng.normal(size=(40, 16))
    return x_tr.astype(np.float32), y_tr, x_te.astype(np.float32), y_te


def test_measurements_take_numpy_features_and_labels(feats):
    as_torch = [torch.from_numpy(a) for a in feats]
    knn = resdecay.knn_accuracy(*feats, k=5)
    assert knn == resdecay.knn_accuracy(*as_torch, k=5) and knn > 0.5  # four separated classes, chance 0.25
    recipe = dataclasses.replace(FAST_RECIPE, epochs=3)
    probe = resdecay.linear_probe(*feats, recipe=recipe)
    assert probe == resdecay.linear_probe(*as_torch, recipe=recipe)
    rank = resdecay.effective_rank(feats[0])
    assert rank == resdecay.effective_rank(as_torch[0]) and 0 < rank <= np.log(16)
    assert resdecay.effective_rank(feats[0].astype(np.float64), exp=True) == pytest.approx(np.exp(rank))
    # numpy labels of another integer width and a mix of numpy and torch arguments
    assert resdecay.knn_accuracy(feats[0], feats[1].astype(np.int32), as_torch[2], feats[3], k=5) == knn


def test_extract_features_takes_numpy_images_and_labels():
    model = resdecay.create_model("mae-tiny-digits", model__depth=2, model__decoder_depth=1)
    images = np.random.default_rng(0).normal(size=(6, 1, 8, 8))  # float64, as numpy makes them
    got = resdecay.extract_features(model, images, labels=np.arange(6), layer=[0, -1])
    want = resdecay.extract_features(model, torch.from_numpy(images).float(), layer=[0, -1])
    assert sorted(got) == [0, 1] and all(torch.equal(got[i], want[i]) for i in got)
    with pytest.raises(UserError, match="normalised float images; got torch.uint8"):
        resdecay.extract_features(model, np.zeros((2, 1, 8, 8), np.uint8))


@pytest.mark.parametrize("call, needle", [
    (lambda x: resdecay.knn_accuracy(x[0].tolist(), *x[1:]), "knn_accuracy: train_feats must be a torch.Tensor or a "
                                                            "numeric numpy array, got list"),
    (lambda x: resdecay.linear_probe(x[0], x[1].astype(str), x[2], x[3]), "linear_probe: train_labels must be"),
    (lambda x: resdecay.effective_rank(np.array(["a", "b"])), "effective_rank: feats must be"),
])
def test_what_is_neither_tensor_nor_numeric_array_is_refused_in_one_line(feats, call, needle):
    with pytest.raises(UserError) as e:
        call(feats)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_every_notebook_function_documents_its_arguments():
    """Issue 23.10: ``effective_rank`` had no docstring; the API's measuring functions name their arguments."""
    from resdecay.eval.features.rank import effective_rank

    for name in ("create_model", "extract_features", "knn_accuracy", "linear_probe", "effective_rank"):
        doc = getattr(resdecay, name).__doc__ or ""
        assert "Args:" in doc, name
    for doc in (resdecay.effective_rank.__doc__, effective_rank.__doc__):
        assert "eq. 6" in doc and "exp:" in doc
