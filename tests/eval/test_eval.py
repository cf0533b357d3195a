import math

import pytest
import torch

from resdecay.eval import effective_rank, knn_accuracy, knn_scores, pool_tokens
from resdecay.eval.features.knn import knn_log_scores


def test_knn_hand_computed_toy():
    # bank: two points of class 0 near +x, one of class 1 near +y
    bank = torch.tensor([[1.0, 0.0], [1.0, 0.1], [0.0, 1.0]])
    labels = torch.tensor([0, 0, 1])
    q = torch.tensor([[0.6, 0.8]])  # cos: 0.6, 0.6*1/sqrt(1.01)+0.08/sqrt(1.01), 0.8
    T = 0.5
    c1, c2, c3 = 0.6, (0.6 + 0.08) / math.sqrt(1.01), 0.8
    scores = knn_scores(bank, labels, q, k=3, temperature=T)  # each row divided by its largest vote
    vote0, vote1 = math.exp(c1 / T) + math.exp(c2 / T), math.exp(c3 / T)
    assert scores[0, 0].item() == pytest.approx(vote0 / max(vote0, vote1), rel=1e-5)
    assert scores[0, 1].item() == pytest.approx(vote1 / max(vote0, vote1), rel=1e-5)
    logs = knn_log_scores(bank, labels, q, k=3, temperature=T)  # the votes themselves, as logs
    assert logs[0].tolist() == pytest.approx([math.log(vote0), math.log(vote1)], rel=1e-6)
    # with k=3 class 0 wins by two votes; with k=1 the single nearest (class 1) wins
    assert knn_accuracy(bank, labels, q, torch.tensor([0]), k=3, temperature=T) == 1.0
    assert knn_accuracy(bank, labels, q, torch.tensor([1]), k=1, temperature=T) == 1.0


def test_knn_chunking_does_not_change_result():
    torch.manual_seed(0)
    bank, q = torch.randn(500, 16), torch.randn(300, 16)
    y, qy = torch.randint(0, 5, (500,)), torch.randint(0, 5, (300,))
    a = knn_scores(bank, y, q, k=20, chunk_size=7)
    b = knn_scores(bank, y, q, k=20, chunk_size=10_000)
    assert torch.allclose(a, b)
    assert knn_accuracy(bank, y, q, qy, chunk_size=7) == knn_accuracy(bank, y, q, qy)


def test_knn_bad_input():
    bank, y = torch.randn(10, 4), torch.zeros(10, dtype=torch.long)
    with pytest.raises(ValueError, match="k=20 must lie between 1 and the bank size 10"):
        knn_accuracy(bank, y, torch.randn(3, 4), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="labels"):
        knn_accuracy(bank, y[:5], torch.randn(3, 4), torch.zeros(3, dtype=torch.long), k=3)
    with pytest.raises(ValueError, match="same D"):
        knn_accuracy(bank, y, torch.randn(3, 5), torch.zeros(3, dtype=torch.long), k=3)


def test_effective_rank_isotropic_gaussian_is_log_d():
    torch.manual_seed(0)
    d = 32
    x = torch.randn(20_000, d)
    assert effective_rank(x) == pytest.approx(math.log(d), abs=0.01)
    assert effective_rank(x, exp=True) == pytest.approx(d, rel=0.01)


def test_effective_rank_rank_one_is_zero():
    torch.manual_seed(0)
    x = torch.randn(500, 1) * torch.randn(1, 64)
    assert effective_rank(x) == pytest.approx(0.0, abs=1e-6)
    assert effective_rank(x, exp=True) == pytest.approx(1.0, abs=1e-5)


def test_effective_rank_equals_covariance_form():
    torch.manual_seed(0)
    x = torch.randn(50, 8) @ torch.randn(8, 8)
    cov = torch.cov(x.double().T)
    s = torch.linalg.svdvals(cov)
    p = s / s.sum()
    assert effective_rank(x) == pytest.approx(float(-(p * p.log()).sum()), rel=1e-9)
    # the N x N form (Gram of the centred features) has the same non-zero spectrum
    xc = x.double() - x.double().mean(0)
    g = torch.linalg.svdvals(xc @ xc.T / 49)
    g = g[g > 1e-9 * g.max()]
    pg = g / g.sum()
    assert effective_rank(x) == pytest.approx(float(-(pg * pg.log()).sum()), rel=1e-6)


def test_effective_rank_bad_input():
    with pytest.raises(ValueError, match="N >= 2"):
        effective_rank(torch.randn(1, 4))


def test_pooling():
    t = torch.arange(24.0).reshape(1, 3, 8)
    assert torch.equal(pool_tokens(t, "cls"), t[:, 0])
    assert torch.equal(pool_tokens(t, "mean"), t.mean(1))
    assert torch.equal(pool_tokens(t, "patch_mean"), t[:, 1:].mean(1))
    with pytest.raises(ValueError):
        pool_tokens(t, "max")


def test_linear_probe_separates_linearly_separable_data():
    from dataclasses import replace

    from resdecay.eval.features.probe import FAST_RECIPE, IN100_RECIPE, linear_probe

    g = torch.Generator().manual_seed(0)
    means = torch.randn(10, 32, generator=g) * 3
    y = torch.randint(0, 10, (3000,), generator=g)
    x = means[y] + torch.randn(3000, 32, generator=g)
    res = linear_probe(x[:2000], y[:2000], x[2000:], y[2000:], replace(IN100_RECIPE, epochs=50))
    assert res["top1"] > 0.95 and res["top5"] >= res["top1"]
    assert linear_probe(x[:2000], y[:2000], x[2000:], y[2000:], FAST_RECIPE)["top1"] > 0.95
    # deterministic for a given recipe seed
    again = linear_probe(x[:2000], y[:2000], x[2000:], y[2000:], replace(IN100_RECIPE, epochs=50))
    assert again == res


def test_cls_pooling_does_not_keep_the_token_tensor_alive():
    t = torch.randn(4, 50, 8)
    cls = pool_tokens(t, "cls")
    assert cls.untyped_storage().nbytes() == 4 * 8 * 4  # its own storage, not the (4, 50, 8) batch
