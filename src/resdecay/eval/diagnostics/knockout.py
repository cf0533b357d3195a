"""Knock-out: which blocks the model uses. One unit at a time, its branch is set to
zero (``f_l := 0``, so its add passes ``alpha_l * x_l`` on) and the last block's output z' is compared
with the intact model's z:

* ``change_tokens``: ``||Z' - Z||_F / ||Z||_F`` over every token of every image;
* ``change_pooled``: the same on the pooled features (``pool``, default the mean of all tokens, the
  feature resdecay's kNN and probe read), one row per image;
* ``knn_top1``: the weighted kNN top-1 (``eval.knn.knn_accuracy``, k = 20, T = 0.07) of the knocked-out
  model's pooled features, train bank and test queries both knocked out, when labels are given.

A unit is by default one *block* (both its sub-blocks, attention and MLP, at once: ``unit="block"``);
``unit="sub_block"`` knocks out one add at a time. z is the stream after the last block, before
any final norm. Blocks before the knocked-out one are replayed from the intact pass, not recomputed.
"""

from __future__ import annotations

import torch

from ...stream.record import Pass, hooked, replayed
from ...stream.sites import Site
from ..features.extract import pool_tokens
from ..features.knn import knn_accuracy
from ..protocol import KNN_K

UNITS = ("block", "sub_block")


def units_of(sites: list[Site], unit: str) -> list[tuple[str, int, frozenset]]:
    """(label, first block affected, (block, sub-block) pairs zeroed) per knock-out."""
    if unit == "block":
        return [(site.name, i, frozenset((i, j) for j in range(len(site.subs)))) for i, site in enumerate(sites)]
    if unit == "sub_block":
        return [(sub.name, i, frozenset({(i, j)})) for i, site in enumerate(sites) for j, sub in enumerate(site.subs)]
    raise ValueError(f"knock-out unit {unit!r} is unknown; choose one of {', '.join(UNITS)}")


class KnockoutStats:
    """The knock-outs of every unit, batch by batch.

    Args:
        sites: the stream's blocks.
        unit: "block" or "sub_block".
        pool: how tokens are pooled into one feature per image (``eval.features.pool_tokens``).
    """

    def __init__(self, sites: list[Site], unit: str = "block", pool: str = "mean"):
        self.sites, self.unit, self.pool = sites, unit, pool
        self.units = units_of(sites, unit)
        n = len(self.units)
        self.diff = torch.zeros(n, 2, dtype=torch.float64)  # squared change: tokens, pooled
        self.base = torch.zeros(2, dtype=torch.float64)  # squared norm of z: tokens, pooled
        self.feats: dict[str, list[list[torch.Tensor]]] = {}  # split -> [intact, unit 0, unit 1, ...] pieces

    def update(self, split: str, run, images: torch.Tensor, rec: Pass, measure: bool) -> None:
        """Knock out every unit on one batch whose intact pass is ``rec``.

        Args:
            split: "train" (kNN bank) or "test".
            run: the model runner (``runner.model_runner``).
            images: the batch.
            rec: its intact pass (the blocks' returns are replayed from it).
            measure: accumulate the relative change (the test images).
        """
        z = rec.outputs[len(self.sites) - 1]
        pooled = pool_tokens(z.float(), self.pool)
        pieces = self.feats.setdefault(split, [[] for _ in range(len(self.units) + 1)])
        pieces[0].append(pooled.cpu())
        if measure:
            self.base += torch.tensor([float(z.double().pow(2).sum()), float(pooled.double().pow(2).sum())])
        for u, (_, first, zero) in enumerate(self.units):
            last: list[torch.Tensor] = []
            with replayed(self.sites, rec, first), hooked(self.sites, zero=zero, last=last):
                run(images)
            z2 = last[-1]
            p2 = pool_tokens(z2.float(), self.pool)
            pieces[u + 1].append(p2.cpu())
            if measure:
                self.diff[u] += torch.tensor([float((z2 - z).double().pow(2).sum()),
                                              float((p2 - pooled).double().pow(2).sum())])

    def summary(self, train_labels: torch.Tensor | None = None, test_labels: torch.Tensor | None = None,
                k: int = KNN_K) -> dict:
        """Per unit: ``change_tokens``, ``change_pooled`` and, with labels and a train split, ``knn_top1``
        (``knn_top1_intact`` is the intact model's; ``knn_queries`` the test images it is measured on)."""
        rel = (self.diff / self.base.clamp_min(1e-300)).sqrt()
        out: dict = {"unit": self.unit, "removed": [label for label, _, _ in self.units], "pool": self.pool,
                     "change_tokens": rel[:, 0].tolist(), "change_pooled": rel[:, 1].tolist()}
        if train_labels is None or test_labels is None or "train" not in self.feats:
            return out
        train = [torch.cat(p) for p in self.feats["train"]]
        test = [torch.cat(p) for p in self.feats["test"]]
        k = min(k, len(train[0]))
        top1 = [knn_accuracy(a, train_labels, b, test_labels, k=k) for a, b in zip(train, test, strict=True)]
        out.update(knn_top1_intact=top1[0], knn_top1=top1[1:], knn_k=k, knn_queries=len(test[0]))
        return out
