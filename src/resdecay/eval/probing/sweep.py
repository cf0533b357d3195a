"""Swept linear heads in one pass (DINOv2's ``eval/linear.py`` way), the kNN sweep, and few-shot.

``linear_sweep``: a grid of learning rates x weight decays x features (cls, mean of patches, both, the cls tokens of
the last 4 blocks) trained together on the same cached features. Heads of one feature share its batches and sit in
one ``Linear`` of H x C outputs (one matmul for all), updated by one AdamW step in which each head's rows have
their own rate and decay. Each feature's batches are drawn as today's single probe (``features/probe.py``) draws
them for that feature, from a generator that first draws the head's initial weights, so one head of the grid alone
*is* that probe, bit for bit, and the grid's heads equal as many separate probes (to round-off). The head chosen on
the validation split (carved from the training data) is the one reported on test.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ...io import progress_bar
from ..features.knn import knn_log_scores, topk_accuracy
from ..protocol import ProbeRecipe


@dataclass(frozen=True)
class Head:
    """One cell of the grid: the feature it reads, its learning rate and weight decay."""

    feature: str
    lr: float
    weight_decay: float


class _Group:
    """The heads reading one feature: one (H x C, D) weight, the AdamW state, the feature's own batch order."""

    def __init__(self, x: torch.Tensor, heads: list[Head], C: int, recipe: ProbeRecipe, device):
        D, H = x.shape[1], len(heads)
        self.heads, self.x, self.C = heads, x.to(device).float(), C
        self.g = torch.Generator().manual_seed(recipe.seed)  # as linear_probe: the init draw, then the batch orders
        w0 = torch.empty(C, D).uniform_(-1, 1, generator=self.g) / math.sqrt(D)
        self.weight = w0.repeat(H, 1).to(device).requires_grad_(True)  # every head starts where a lone probe would
        self.bias = torch.zeros(H * C, device=device, requires_grad=True)
        self.norm = nn.BatchNorm1d(D, affine=False).to(device) if recipe.feature_norm == "batchnorm" else nn.Identity()
        rows = lambda v: torch.tensor([v(h) for h in heads for _ in range(C)], dtype=torch.float64, device=device)  # noqa: E731
        self.lr, self.decay = rows(lambda h: h.lr), rows(lambda h: h.weight_decay)
        self.moments = [(torch.zeros_like(p), torch.zeros_like(p)) for p in (self.weight, self.bias)]

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, H, C)."""
        return F.linear(self.norm(x), self.weight, self.bias).reshape(len(x), len(self.heads), self.C)

    @torch.no_grad()
    def adamw_step(self, step: int, factor: float, betas=(0.9, 0.999), eps: float = 1e-8) -> None:
        """torch.optim.AdamW's single-tensor update, written out so that each head's rows take their own lr and
        decay: the per-row scalars in float64 as torch's Python floats, rounded to float32 where torch's kernels
        round them, then the same float32 operations in the same order (a lone head is bit-identical)."""
        lr = self.lr * factor
        c1, c2 = 1 - betas[0] ** step, 1 - betas[1] ** step
        for p, (m, v) in zip((self.weight, self.bias), self.moments, strict=True):
            shape = (-1,) + (1,) * (p.ndim - 1)
            p.mul_((1 - lr * self.decay).to(p.dtype).view(shape))
            m.lerp_(p.grad, 1 - betas[0])
            v.mul_(betas[1]).addcmul_(p.grad, p.grad, value=1 - betas[1])
            denom = (v.sqrt() / c2 ** 0.5).add_(eps)
            p.addcdiv_(m * (-(lr / c1)).to(p.dtype).view(shape), denom)  # torch: p + (-step_size * m) / denom
            p.grad = None


def linear_sweep(train: dict[str, torch.Tensor], train_y: torch.Tensor, val: dict[str, torch.Tensor],
                 val_y: torch.Tensor, test: dict[str, torch.Tensor], test_y: torch.Tensor, grid: list[Head],
                 recipe: ProbeRecipe, device="cpu", progress: bool = False) -> dict:
    """Train every head of ``grid`` in one pass; the head best on ``val`` is reported on ``test``.

    Args:
        train, val, test: feature name -> (N, D) features of each split; *_y: class indices.
        grid: the heads; recipe: epochs, batch size, schedule and feature norm (lr and decay are the grid's).
    """
    C = _classes(train_y, val_y, test_y)
    scores = train_linear_heads(train, train_y, {"val": val, "test": test}, grid, C, recipe, device, progress)
    val_acc = {h: topk_accuracy(scores[(h, "val")], val_y, (1,))["top1"] for h in grid}
    chosen = max(grid, key=lambda h: (val_acc[h], -grid.index(h)))  # ties: the earlier cell
    return {**topk_accuracy(scores[(chosen, "test")], test_y, (1, 5)), "val_top1": val_acc[chosen],
            "chosen": {"feature": chosen.feature, "lr": chosen.lr, "weight_decay": chosen.weight_decay},
            "sweep": [{"feature": h.feature, "lr": h.lr, "weight_decay": h.weight_decay, "val_top1": val_acc[h]}
                      for h in grid]}


def train_linear_heads(train: dict[str, torch.Tensor], train_y: torch.Tensor, scored: dict[str, dict[str, torch.Tensor]],
                       grid: list[Head], C: int, recipe: ProbeRecipe, device="cpu", progress: bool = False) -> dict:
    """Every head of ``grid`` trained in one pass over ``train``; returns ``{(head, split): (N, C) scores}`` of each
    split of ``scored`` (split name -> feature name -> features)."""
    features = list(dict.fromkeys(h.feature for h in grid))
    groups = [_Group(train[f], [h for h in grid if h.feature == f], C, recipe, device) for f in features]
    y = train_y.to(device).long()
    n = len(y)
    bs = min(recipe.batch_size, n)
    total, step = recipe.epochs * math.ceil(n / bs), 0
    for _ in progress_bar(range(recipe.epochs), desc=f"linear sweep ({len(grid)} heads)", disable=not progress, leave=False):
        orders = [torch.randperm(n, generator=g.g).to(device) for g in groups]
        # each group's features and labels in its epoch order, gathered once: its batches are then slices (the
        # same rows as gathering each batch, so the same numbers, without a gather per step)
        shuffled = [(g.x[order], y[order].repeat_interleave(len(g.heads))) for g, order in zip(groups, orders, strict=True)]
        for i in range(0, n, bs):
            factor = 0.5 * (1 + math.cos(math.pi * step / total))  # per-iteration cosine to 0, as linear_probe
            loss = 0
            for g, (x, labels) in zip(groups, shuffled, strict=True):
                logits = g.logits(x[i:i + bs])  # (B, H, C): the sum of each head's mean cross-entropy, as one call
                H = len(g.heads)
                loss = loss + F.cross_entropy(logits.reshape(-1, g.C), labels[i * H:(i + bs) * H]) * H
            loss.backward()
            step += 1
            for g in groups:
                g.adamw_step(step, factor)
    scores = {}
    with torch.no_grad():
        for g, f in zip(groups, features, strict=True):
            g.norm.eval()
            for split, feats in scored.items():
                out = g.logits(feats[f].to(device).float()).cpu()
                for h, head in enumerate(g.heads):
                    scores[(head, split)] = out[:, h]
    return scores


def knn_sweep(train: torch.Tensor, train_y: torch.Tensor, val: torch.Tensor, val_y: torch.Tensor,
              test: torch.Tensor, test_y: torch.Tensor, ks: tuple[int, ...], temperatures: tuple[float, ...]) -> dict:
    """The (k, T) best on ``val`` (bank: the training split without it), then reported on ``test`` with the whole
    training split as the bank (``bank`` holds train and val: what every kNN row of the suite reads)."""
    cells = [(k, t) for k in ks for t in temperatures if k <= len(train)]
    val_acc = {}
    for k in sorted({k for k, _ in cells}):
        for t in temperatures:
            if (k, t) in cells:
                val_acc[(k, t)] = topk_accuracy(knn_log_scores(train, train_y, val, k, t, _classes(train_y, val_y)), val_y, (1,))["top1"]
    k, t = max(cells, key=lambda c: (val_acc[c], -cells.index(c)))
    bank, bank_y = torch.cat([train, val]), torch.cat([train_y, val_y])
    scores = knn_log_scores(bank, bank_y, test, k, t, _classes(bank_y, test_y))
    return {**topk_accuracy(scores, test_y, (1, 5)), "val_top1": val_acc[(k, t)], "chosen": {"k": k, "temperature": t},
            "sweep": [{"k": k_, "temperature": t_, "val_top1": val_acc[(k_, t_)]} for k_, t_ in cells]}


def _classes(*labels: torch.Tensor) -> int:
    return int(max(int(y.max()) for y in labels)) + 1


def few_shot_indices(labels: torch.Tensor, shots: int, seed: int) -> np.ndarray:
    """``shots`` images of every class, drawn with ``seed`` (sorted indices); every class must hold that many."""
    rng = np.random.default_rng(seed)
    y = labels.numpy()
    return np.sort(np.concatenate([rng.choice(np.flatnonzero(y == c), shots, replace=False) for c in np.unique(y)]))
