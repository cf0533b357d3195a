"""The weighted kNN vote is exact at every temperature (issue 49 item 2): each neighbour weighs exp(sim / T), and in
float32 exp(sim / T) is inf once sim / T > 88.7 (sim 0.95 at T 0.01), so tied inf votes picked a class by its index
(`resdecay eval --baseline pixels --data digits --evals knn --temperature 0.005`: top-1 0.78 where T 0.07 gives
0.98). Checked against a float64 reference computed here from the features alone."""

from __future__ import annotations

import json
import math

import pytest
import torch
import torch.nn.functional as F

from helpers import run
from resdecay.eval.features.knn import knn_log_scores, knn_scores, knn_topk

K, CLASSES = 20, 8
TEMPERATURES = (1e-3, 0.01, 0.07, 1.0)


@pytest.fixture(scope="module")
def clustered():
    """Eight overlapping clusters around one direction: every cosine similarity lies in 0.94..0.96, so sim / T is
    ~950 at T 1e-3 and ~95 at T 0.01 (both past float32's exp), and a query's 20 neighbours hold 4..8 classes."""
    g = torch.Generator().manual_seed(0)
    base = torch.randn(16, generator=g) * 4
    centres = base + 0.4 * torch.randn(CLASSES, 16, generator=g)
    y = torch.randint(0, CLASSES, (550,), generator=g)
    x = centres[y] + 0.9 * torch.randn(550, 16, generator=g)
    return x[:400], y[:400], x[400:], y[400:]


def reference_votes(bank, bank_y, queries, temperature):
    """float64 votes, each row scaled by exp(-rowmax / T) (which changes no ranking): sum over a class's neighbours of
    exp((sim - rowmax) / T); 0 for a class with no neighbour among the k. Also the k-th / (k+1)-th similarity gap."""
    sim = F.normalize(queries.double(), dim=1) @ F.normalize(bank.double(), dim=1).T
    top, idx = sim.topk(K + 1, dim=1)
    weights = ((top[:, :K] - top[:, :1]) / temperature).exp()
    votes = torch.zeros(len(queries), CLASSES, dtype=torch.float64).scatter_add_(1, bank_y[idx[:, :K]], weights)
    return votes, top[:, K - 1] - top[:, K]


def reference_accuracy(votes, labels, t):
    """Share of queries whose label is among the t classes of largest vote, counting only classes that got a vote."""
    hits = 0
    for row, y in zip(votes.tolist(), labels.tolist(), strict=True):
        voted = sorted((v for v in row if v > 0), reverse=True)
        hits += row[y] > 0 and row[y] >= voted[min(t, len(voted)) - 1]
    return hits / len(labels)


def test_knn_matches_a_float64_reference_at_every_temperature(clustered):
    bank, bank_y, queries, query_y = clustered
    for T in TEMPERATURES:
        votes, kth_gap = reference_votes(bank, bank_y, queries, T)
        # the data leave no near-ties for float32 cosines (good to ~1e-7, so log votes to ~1e-7 / T) to flip: the
        # k-th neighbour is apart from the (k+1)-th, the first class from the second, and the fifth from the sixth
        # where the label is one of them; no label lacks a vote where fewer than five classes have one (there top-5
        # would depend on how zero votes tie)
        assert kth_gap.min() > 4e-7
        logs = votes.log().sort(1, descending=True).values
        assert (logs[:, 0] - logs[:, 1]).min() > 1e-6 / T
        label_rank = (votes > votes.gather(1, query_y[:, None])).sum(1)
        edge = (label_rank == 4) | (label_rank == 5)
        assert (logs[edge, 4] - logs[edge, 5]).min() > 1e-6 / T
        voted = (votes > 0).sum(1)
        assert not bool(((votes.gather(1, query_y[:, None])[:, 0] == 0) & (voted < 5)).any())

        scores = knn_scores(bank, bank_y, queries, k=K, temperature=T, num_classes=CLASSES)
        assert torch.isfinite(scores).all(), f"T={T}: inf or nan votes"
        assert torch.equal(scores.argmax(1), votes.argmax(1)), f"T={T}: predicted classes differ"
        got = knn_topk(bank, bank_y, queries, query_y, k=K, temperature=T)
        want = {f"top{t}": reference_accuracy(votes, query_y, t) for t in (1, 5)}
        assert got == pytest.approx(want, abs=1e-6), f"T={T}"  # a share of 150 queries, averaged in float32
    # the temperatures differ in what they predict: T 1e-3 is nearly 1-NN, T 1 nearly a plain majority of the 20
    tiny, _ = reference_votes(bank, bank_y, queries, 1e-3)
    flat, _ = reference_votes(bank, bank_y, queries, 1.0)
    assert (tiny.argmax(1) != flat.argmax(1)).sum() >= 20


def test_scores_are_votes_scaled_so_each_rows_best_class_is_1(clustered):
    """``knn_scores`` is exp(log vote - the row's largest): finite at any T, the best class 1, the ranking and the
    ratios of the votes those of exp(sim / T) summed per class; no vote is 0."""
    bank, bank_y, queries, _ = clustered
    for T in TEMPERATURES:
        votes, _ = reference_votes(bank, bank_y, queries, T)
        scores = knn_scores(bank, bank_y, queries, k=K, temperature=T, num_classes=CLASSES)
        assert torch.isfinite(scores).all() and torch.equal(scores.max(1).values, torch.ones(len(queries)))
        want = votes / votes.max(1, keepdim=True).values
        # float32 cosines are good to ~1e-7, so a ratio exp(difference / T) to ~1e-7 / T
        assert torch.allclose(scores.double(), want, rtol=1e-6 / T, atol=0), f"T={T}"
        assert torch.equal(scores > 0, votes > 0)


def test_log_scores_are_the_log_of_the_summed_votes_without_overflow():
    """Three neighbours at cosines 1, 0.6 and 0.8 (hand-checked): at T 1e-3 exp(1 / T) = e^1000 overflows even
    float64, the log vote log(e^1000 + e^600) and 800 do not; a class with no neighbour is -inf."""
    bank = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.8, 0.6]])
    labels = torch.tensor([0, 0, 1])
    query = torch.tensor([[1.0, 0.0]])
    for T in (1e-3, 0.5):
        got = knn_log_scores(bank, labels, query, k=3, temperature=T, num_classes=3)
        class0 = 1 / T + math.log1p(math.exp((0.6 - 1) / T))  # log(e^(1/T) + e^(0.6/T))
        assert got.dtype == torch.float64 and got.shape == (1, 3)
        assert got[0, 0].item() == pytest.approx(class0, rel=1e-6)
        assert got[0, 1].item() == pytest.approx(0.8 / T, rel=1e-6)
        assert got[0, 2].item() == -math.inf


def test_cli_pixel_knn_at_a_small_temperature_is_near_its_value_at_the_default(tmp_path, capsys, monkeypatch):
    """Through the command line, the raw-pixel kNN of digits: top-1 0.9806 at T 0.07 and 0.7778 at T 0.005 before
    (pixel cosines near 1: sim / 0.005 > 88.7); at T 0.005 the vote is nearly 1-NN, a few points from T 0.07's."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    top1 = {}
    for T in ("0.07", "0.005"):
        code, out, err = run(capsys, "eval", "--baseline", "pixels", "--data", "digits", "--evals", "knn",
                             "--temperature", T, "--no-progress", "--out", str(tmp_path / T))
        assert code in (0, None), err
        (row,) = json.loads((tmp_path / T / "pixels.json").read_text())["baselines"]
        assert row["protocol"]["temperature"] == float(T)
        top1[T] = row["values"]["top1"]
    assert top1["0.07"] > 0.95 and abs(top1["0.005"] - top1["0.07"]) < 0.03, top1
