"""Weighted k-nearest-neighbour classification on frozen features (the kNN of DINO/solo-learn).

Protocol: L2-normalise bank and queries, take the k most cosine-similar bank entries, weight
each neighbour's vote by exp(similarity / T), predict the class with the largest summed vote.
Defaults k = 20 (the paper's K), T = 0.07 (``eval/protocol.py``). Queries go in chunks so memory stays at
chunk x bank, whatever the number of queries.

The votes are summed in the log domain (``knn_log_scores``): per query and class, the logsumexp of sim / T
over that class's neighbours in float64 (-inf for a class with no neighbour among the k). That ranks the
classes exactly as the sum of exp(sim / T) does, for every T > 0: exp(sim / T) itself is inf in float32 once
sim / T > 88.7 (a cosine of 0.9 at T 0.01), and inf votes tie, so the class was picked by its index.
``knn_scores`` is those votes divided by the row's largest (the best class 1; the ranking unchanged).
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from ...errors import UserError
from ..protocol import KNN_K, KNN_TEMPERATURE


class LabelError(UserError, ValueError):
    """Labels that are not class indices (a ValueError too, as scikit-learn's classifiers raise)."""


def check_labels(labels: torch.Tensor, what: str = "labels", fn: str = "knn_accuracy") -> torch.Tensor:
    """``labels`` as int64 class indices, or one line saying why they are not.

    ``.long()`` would truncate: labels ``y + 0.5`` would score exactly as ``y`` and a regression
    target would be read as classes. As scikit-learn does (``Unknown label type: continuous``),
    float labels are taken only when every one is a whole number; negative, NaN and multi-column
    labels are refused too (a class index is a row of the vote table).
    """
    if not isinstance(labels, torch.Tensor):
        raise LabelError(f"{fn}: {what} must be a tensor of class indices, got {type(labels).__name__}")
    if labels.ndim != 1:
        raise LabelError(f"{fn}: {what} must hold one class index per row, shape (N,); got shape {tuple(labels.shape)}")
    if labels.is_complex():
        raise LabelError(f"{fn}: {what} are complex numbers, not class indices; pass integer labels 0..C-1")
    if labels.is_floating_point():
        bad = ~torch.isfinite(labels) | (labels != labels.round())
        if bool(bad.any()):
            example = float(labels[bad][0])
            raise LabelError(f"{fn}: {what} must be class indices (whole numbers 0..C-1), but {int(bad.sum())} of "
                             f"{len(labels)} are not (e.g. {example:g}): continuous values are not classes; map each "
                             "class to an integer (e.g. torch.unique(y, return_inverse=True)[1])")
    if len(labels) and float(labels.min()) < 0:
        raise LabelError(f"{fn}: {what} must be class indices 0..C-1, but one is {float(labels.min()):g}; map each "
                         "class to an integer >= 0 (e.g. torch.unique(y, return_inverse=True)[1])")
    return labels.long()


@contextlib.contextmanager
def tf32_matmuls(device: torch.device | str):
    """fp32 matmuls (and cuDNN convolutions) in TF32 on CUDA for the duration (the
    1.28M-bank kNN went from 2.88 s to 1.48 s on an H100); restores the previous setting. A no-op
    elsewhere. TF32 keeps fp32's range with a 10-bit mantissa: cosine similarities move by ~1e-3,
    which can swap neighbours on near-ties only."""
    if torch.device(device).type != "cuda":
        yield
        return
    old = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    try:
        yield
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old


def _check(bank: torch.Tensor, bank_labels: torch.Tensor, queries: torch.Tensor, k: int) -> None:
    if bank.ndim != 2 or queries.ndim != 2 or bank.shape[1] != queries.shape[1]:
        raise ValueError(f"features must be (N, D) with the same D; got bank {tuple(bank.shape)} and queries {tuple(queries.shape)}")
    if len(bank_labels) != len(bank):
        raise ValueError(f"{len(bank)} bank features but {len(bank_labels)} labels")
    if not 1 <= k <= len(bank):
        raise ValueError(f"k={k} must lie between 1 and the bank size {len(bank)}")


def class_logsumexp(logits: torch.Tensor, classes: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Per row, the logsumexp of ``logits`` over the entries of each class: (n, num_classes), -inf for a class
    that has no entry in the row. Each class's maximum is taken out before ``exp``, so nothing overflows and a
    class's largest term is exp(0) = 1: no class underflows to a zero vote either.

    Args:
        logits: (n, k) values; classes: (n, k) the class index of each; num_classes: the columns of the result.
    """
    logits = logits.double()
    top = torch.full((len(logits), num_classes), -torch.inf, dtype=torch.float64, device=logits.device)
    top.scatter_reduce_(1, classes, logits, reduce="amax")
    summed = torch.zeros_like(top).scatter_add_(1, classes, (logits - top.gather(1, classes)).exp())
    return top + summed.log()  # a class without an entry: -inf + log(0) = -inf


@torch.no_grad()
def knn_log_scores(bank: torch.Tensor, bank_labels: torch.Tensor, queries: torch.Tensor, k: int = KNN_K,
                   temperature: float = KNN_TEMPERATURE, num_classes: int | None = None,
                   chunk_size: int = 1024) -> torch.Tensor:
    """log of the summed neighbour votes per class, float64, shape (num_queries, num_classes): per query and class
    the logsumexp of cosine / T over that class's neighbours among the k, -inf for a class none of them has.
    Exact for every T > 0 (no exp of sim / T is ever formed); the class ranking of the weighted kNN vote."""
    _check(bank, bank_labels, queries, k)
    bank_labels = check_labels(bank_labels, "train_labels").to(bank.device)
    C = int(num_classes or int(bank_labels.max()) + 1)
    bank_n = F.normalize(bank.float(), dim=1)
    out = []
    for start in range(0, len(queries), chunk_size):
        q = F.normalize(queries[start:start + chunk_size].to(bank.device).float(), dim=1)
        with tf32_matmuls(bank.device):
            sim, idx = (q @ bank_n.T).topk(k, dim=1)  # (q, k)
        out.append(class_logsumexp(sim.double() / temperature, bank_labels[idx], C))
    return torch.cat(out).cpu()


@torch.no_grad()
def knn_scores(bank: torch.Tensor, bank_labels: torch.Tensor, queries: torch.Tensor, k: int = KNN_K,
               temperature: float = KNN_TEMPERATURE, num_classes: int | None = None, chunk_size: int = 1024) -> torch.Tensor:
    """Summed neighbour votes per class, each row divided by its largest, shape (num_queries, num_classes), float32.

    The vote of a class is the sum of exp(cosine / T) over its neighbours among the k; dividing a row by its
    largest vote (exp(log vote - row max) of ``knn_log_scores``) keeps every ratio and the ranking and keeps the
    numbers finite at any T: the predicted class has 1, a class without a neighbour 0. (exp(cosine / T) itself
    overflows float32 once cosine / T > 88.7.) Rank by ``knn_log_scores`` where a vote may be below ~1e-38 of
    the best (only far neighbours at a very small T): it holds them apart, float32 rounds them to 0.
    """
    logs = knn_log_scores(bank, bank_labels, queries, k, temperature, num_classes, chunk_size)
    return (logs - logs.max(1, keepdim=True).values).exp().float()


def knn_topk(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor, test_labels: torch.Tensor,
             k: int = KNN_K, temperature: float = KNN_TEMPERATURE, topk: tuple[int, ...] = (1, 5), chunk_size: int = 1024) -> dict:
    """Top-k accuracies of the weighted kNN vote, e.g. ``{"top1": 0.71, "top5": 0.93}``, ranked by
    ``knn_log_scores`` (exact at any T; a top-k larger than the number of classes counts every class)."""
    if len(test_labels) != len(test_feats):
        raise ValueError(f"{len(test_feats)} query features but {len(test_labels)} labels")
    train_labels, test_labels = check_labels(train_labels, "train_labels"), check_labels(test_labels, "test_labels")
    num_classes = int(max(int(train_labels.max()), int(test_labels.max()))) + 1
    scores = knn_log_scores(train_feats, train_labels, test_feats, k, temperature, num_classes, chunk_size)
    return topk_accuracy(scores, test_labels, topk)


def topk_accuracy(scores: torch.Tensor, labels: torch.Tensor, topk: tuple[int, ...] = (1, 5)) -> dict:
    """Fraction of rows whose label is among the ``t`` highest scores, for each t in ``topk``."""
    ranked = scores.topk(min(max(topk), scores.shape[1]), dim=1).indices.cpu()
    hit = ranked == check_labels(labels, "test_labels", "topk_accuracy").cpu().unsqueeze(1)
    return {f"top{t}": float(hit[:, :t].any(1).float().mean()) for t in topk}


def knn_accuracy(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                 test_labels: torch.Tensor, k: int = KNN_K, temperature: float = KNN_TEMPERATURE, chunk_size: int = 1024) -> float:
    """Top-1 accuracy (0..1) of the weighted cosine kNN vote of ``test_feats`` on the bank."""
    return knn_topk(train_feats, train_labels, test_feats, test_labels, k, temperature, (1,), chunk_size)["top1"]
