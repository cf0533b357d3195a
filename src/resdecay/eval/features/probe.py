"""Linear probes on cached (frozen, un-augmented) features. The recipes are defined in
``eval/protocol.py`` with the other protocol constants.

``IN100_RECIPE`` is the authors' ImageNet-100 protocol (paper A.2, paper-notes §4): one Linear
layer, AdamW lr 1e-2 (torch's default weight decay 0.01), batch 1024, 200 epochs, per-iteration
cosine to 0, no augmentation, no feature normalisation. ``FAST_RECIPE`` (per-layer profiles and
online tracking) takes 30 epochs of batch 256 and standardises features with a non-affine
BatchNorm as MAE's probe does: without it, features dominated by one direction (low effective
rank) leave the short probe far from converged (digits, decayed U-Net MAE: 0.21 without vs
0.48 with BatchNorm after 30 epochs, train accuracy 0.27 vs 0.50). The MAE ImageNet-1K protocol (BatchNorm +
LARS on augmented views through the frozen encoder) cannot run on cached features: it is
``resdecay finetune --recipe linprobe``.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from ...io import progress_bar
from ..protocol import FAST_RECIPE, IN100_RECIPE, ProbeRecipe
from .knn import check_labels, topk_accuracy

__all__ = ["FAST_RECIPE", "IN100_RECIPE", "ProbeRecipe", "linear_probe"]  # the recipes live in eval/protocol.py


def linear_probe(train_feats: torch.Tensor, train_labels: torch.Tensor, test_feats: torch.Tensor,
                 test_labels: torch.Tensor, recipe: ProbeRecipe = IN100_RECIPE, device: str | torch.device = "cpu",
                 num_classes: int | None = None, progress: bool = False) -> dict:
    """Train one linear classifier on ``train_feats`` and report top-1/top-5 on ``test_feats``.

    Features stay on ``device`` for the whole run (one gather per step, no DataLoader)."""
    if train_feats.ndim != 2 or test_feats.ndim != 2 or train_feats.shape[1] != test_feats.shape[1]:
        raise ValueError(f"probe features must be (N, D) with the same D; got {tuple(train_feats.shape)} and {tuple(test_feats.shape)}")
    if len(train_feats) != len(train_labels) or len(test_feats) != len(test_labels):
        raise ValueError("probe features and labels differ in length")
    # class indices or one line: .long() would truncate labels such as y + 0.5 into other classes
    train_labels, test_labels = (check_labels(y, w, "linear_probe") for y, w in ((train_labels, "train_labels"),
                                                                                  (test_labels, "test_labels")))
    device = torch.device(device)
    C = int(num_classes or max(int(train_labels.max()), int(test_labels.max())) + 1)
    g = torch.Generator().manual_seed(recipe.seed)
    x, y = train_feats.to(device).float(), train_labels.to(device).long()
    head = nn.Linear(x.shape[1], C)
    with torch.no_grad():  # deterministic init from the recipe's seed
        head.weight.copy_(torch.empty_like(head.weight).uniform_(-1, 1, generator=g) / math.sqrt(x.shape[1]))
        head.bias.zero_()
    norm = nn.BatchNorm1d(x.shape[1], affine=False) if recipe.feature_norm == "batchnorm" else nn.Identity()
    model = nn.Sequential(norm, head).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    n = len(x)
    bs = min(recipe.batch_size, n)
    steps_per_epoch = math.ceil(n / bs)
    total = recipe.epochs * steps_per_epoch
    step = 0
    model.train()
    for _ in progress_bar(range(recipe.epochs), desc=f"probe ({recipe.name})", disable=not progress, leave=False):
        order = torch.randperm(n, generator=g).to(device)
        for i in range(0, n, bs):
            idx = order[i:i + bs]
            for group in opt.param_groups:  # cosine to 0 per iteration
                group["lr"] = recipe.lr * 0.5 * (1 + math.cos(math.pi * step / total))
            loss = F.cross_entropy(model(x[idx]), y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            step += 1
    model.eval()
    with torch.no_grad():
        train_acc = float((model(x).argmax(1) == y).float().mean())
        scores = model(test_feats.to(device).float())
    return {**topk_accuracy(scores, test_labels, (1, 5)), "train_top1": train_acc, "final_loss": float(loss.detach())}
