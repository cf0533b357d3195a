"""Plain reference implementations the eval_speed benchmark measures resdecay against: the
textbook unchunked kNN, a DataLoader + nn.Linear + AdamW probe loop, and effective rank from the
D x D covariance or the N x N Gram matrix (paper eq. 6 as written)."""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from resdecay.eval.features.probe import IN100_RECIPE

KNN_K, KNN_T = 20, 0.07


@torch.no_grad()
def knn_reference(bank, bank_labels, queries, query_labels, k=KNN_K, temperature=KNN_T, num_classes=None):
    """Unchunked weighted cosine kNN, written out: one (Q, N) similarity matrix."""
    C = int(num_classes or max(int(bank_labels.max()), int(query_labels.max())) + 1)
    b = F.normalize(bank.float(), dim=1)
    q = F.normalize(queries.float(), dim=1)
    sim = q @ b.T  # (Q, N): the whole similarity matrix at once
    top_sim, top_idx = sim.topk(k, dim=1)
    del sim
    one_hot = F.one_hot(bank_labels.long()[top_idx], C).float()  # (Q, k, C)
    votes = (one_hot * (top_sim / temperature).exp().unsqueeze(-1)).sum(1)  # (Q, C)
    ranked = votes.topk(min(5, C), dim=1).indices
    hit = ranked == query_labels.long().unsqueeze(1)
    return {"top1": float(hit[:, :1].any(1).float().mean()), "top5": float(hit.any(1).float().mean())}


def probe_reference(train_x, train_y, test_x, test_y, epochs, device, num_classes, recipe=IN100_RECIPE):
    """The IN100 recipe as a textbook loop: DataLoader(TensorDataset), nn.Linear, AdamW, cosine."""
    torch.manual_seed(recipe.seed)
    loader = DataLoader(TensorDataset(train_x, train_y), batch_size=recipe.batch_size, shuffle=True)
    model = nn.Linear(train_x.shape[1], num_classes).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    total = epochs * len(loader)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.5 * (1 + math.cos(math.pi * step / total)))
    model.train()
    for _ in range(epochs):
        for xb, yb in loader:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            loss = F.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
    model.eval()
    with torch.no_grad():
        top5 = model(test_x.to(device)).topk(5, dim=1).indices.cpu()
    hit = top5 == test_y.cpu().unsqueeze(1)
    return {"top1": float(hit[:, 0].float().mean()), "top5": float(hit.any(1).float().mean())}


def entropy_rank(eigs: torch.Tensor) -> float:
    """Paper eq. 6 on a covariance spectrum: -sum p log p, p = sigma / sum sigma (rounding
    negatives of a PSD spectrum clamped to 0, zeros dropped as in effective_rank)."""
    s = eigs.double().clamp_min(0)
    p = s / s.sum()
    p = p[p > 0]
    return float(-(p * p.log()).sum())


@torch.no_grad()
def rank_covariance(feats: torch.Tensor) -> float:
    x = feats.double()
    x = x - x.mean(0, keepdim=True)
    return entropy_rank(torch.linalg.eigvalsh(x.T @ x / (len(x) - 1)))  # (D, D)


@torch.no_grad()
def rank_gram(feats: torch.Tensor) -> float:
    x = feats.double()
    x = x - x.mean(0, keepdim=True)
    return entropy_rank(torch.linalg.eigvalsh(x @ x.T / (len(x) - 1)))  # (N, N): small inputs only
