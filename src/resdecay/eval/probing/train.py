"""Training attentive probes on frozen tokens: one head per base learning rate, trained together.

Every head sees the same micro-batches (one pass over the tokens serves them all); their losses are summed, one
backward, one optimizer step (each head its own parameter group and learning rate). After every epoch each head
is scored on the validation split (carved from the training data) and its best epoch's weights kept; the head
whose best validation accuracy is highest is the one reported on test. Test labels never choose anything.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ...io import progress_bar
from ..features.knn import topk_accuracy
from ..protocol import AttentiveRecipe
from .tokens import TokenStore


@dataclass
class Split:
    """Images of one token store (``index`` into it) and their labels."""

    store: TokenStore
    index: np.ndarray
    labels: torch.Tensor
    prefix: int  # tokens before the patch tokens (cls, registers)
    patches_only: bool = True  # the probes read the patch tokens (efficient-probing's "ep"), not the prefix too

    def tokens(self, rows: np.ndarray) -> torch.Tensor:
        t = self.store.rows(self.index[rows])
        return t[:, self.prefix:] if self.patches_only else t


def _optimizer(heads: list[nn.Module], lrs: list[float], recipe: AttentiveRecipe) -> torch.optim.Optimizer:
    """One optimizer over every head, a parameter group per head (LARS: two, MAE's rule adapting the trust ratio
    of weight matrices and queries only, ndim > 1, and never of biases); each group's ``base_lr`` is its head's."""
    if recipe.optimizer == "lars":
        from timm.optim import Lars  # noqa: PLC0415  (MAE's LARS, as resdecay's linprobe uses it)

        groups = [{"params": [p for p in h.parameters() if (p.ndim > 1) == adapt], "base_lr": lr, "lr": lr,
                   "always_adapt": adapt} for h, lr in zip(heads, lrs, strict=True) for adapt in (True, False)]
        return Lars([g for g in groups if g["params"]], lr=lrs[0], momentum=0.9, weight_decay=recipe.weight_decay)
    groups = [{"params": list(h.parameters()), "base_lr": lr, "lr": lr} for h, lr in zip(heads, lrs, strict=True)]
    return torch.optim.AdamW(groups, lr=lrs[0], weight_decay=recipe.weight_decay)


def lr_factor(step: float, steps_per_epoch: int, recipe: AttentiveRecipe) -> float:
    """MAE's per-iteration schedule (``util/lr_sched.py``): linear warmup, then a half-cycle cosine to 0."""
    epoch = step / steps_per_epoch
    if epoch < recipe.warmup_epochs:
        return epoch / recipe.warmup_epochs
    return 0.5 * (1 + math.cos(math.pi * (epoch - recipe.warmup_epochs) / max(recipe.epochs - recipe.warmup_epochs, 1e-9)))


@torch.no_grad()
def predict(head: nn.Module, split: Split, batch: int, device) -> torch.Tensor:
    head.eval()
    scores = [head(split.tokens(rows).to(device)).float().cpu()
              for rows in split.store.batches(np.arange(len(split.labels)), batch, None)]
    head.train()
    return torch.cat(scores)


def train_heads(make_head: Callable[[], nn.Module], train: Split, val: Split, test: Split, recipe: AttentiveRecipe,
                device="cpu", progress: bool = False, desc: str = "probe") -> dict:
    """Train one head per ``recipe.blrs`` on ``train``; returns the chosen head's test top-1 / top-5 and, per base
    rate, its best validation accuracy and epoch (the card of the sweep)."""
    n = len(train.labels)
    eff = min(recipe.batch_size, n)
    micro = min(recipe.micro_batch, eff)
    steps_per_epoch = max(1, n // eff)  # MAE drops the last incomplete batch
    torch.manual_seed(recipe.seed)
    heads = [make_head().to(device) for _ in recipe.blrs]  # the same seed draws each head afresh
    lrs = [blr * eff / 256 for blr in recipe.blrs]
    opt = _optimizer(heads, lrs, recipe)
    g = torch.Generator().manual_seed(recipe.seed)
    best = [(-1.0, -1, None)] * len(heads)  # (val top-1, epoch, weights)
    y_val, step = val.labels, 0
    for epoch in progress_bar(range(recipe.epochs), desc=desc, disable=not progress, leave=False):
        batches = list(train.store.batches(np.arange(n), micro, g))[: steps_per_epoch * math.ceil(eff / micro)]
        for i, rows in enumerate(batches):
            if i % math.ceil(eff / micro) == 0:
                f = lr_factor(step, steps_per_epoch, recipe)
                for group in opt.param_groups:
                    group["lr"] = group["base_lr"] * f
            x, y = train.tokens(rows).to(device), train.labels[torch.as_tensor(rows)].to(device)
            loss = sum(F.cross_entropy(h(x), y) for h in heads) * (len(rows) / eff)
            loss.backward()
            if (i + 1) % math.ceil(eff / micro) == 0 or i + 1 == len(batches):
                opt.step()
                opt.zero_grad(set_to_none=True)
                step += 1
        for j, h in enumerate(heads):
            acc = float((predict(h, val, micro, device).argmax(1) == y_val).float().mean())
            if acc > best[j][0]:
                best[j] = (acc, epoch, copy.deepcopy(h.state_dict()))
    chosen = max(range(len(heads)), key=lambda j: (best[j][0], -j))  # ties: the smaller rate
    heads[chosen].load_state_dict(best[chosen][2])
    test_scores = predict(heads[chosen], test, micro, device)
    return {**topk_accuracy(test_scores, test.labels, (1, 5)), "val_top1": best[chosen][0],
            "chosen": {"blr": recipe.blrs[chosen], "lr": lrs[chosen], "epoch": best[chosen][1] + 1},
            "sweep": [{"blr": b, "val_top1": v, "best_epoch": e + 1} for b, (v, e, _) in zip(recipe.blrs, best, strict=True)],
            "effective_batch": eff}
