"""Online tracking during pretraining (the paper's Figure 4): every N epochs, kNN, a fast linear
probe and the effective rank of the last encoder block on a fixed labelled subset, written into
the run's log.jsonl (and TensorBoard) as ``online_*`` values. ``resdecay plot`` draws them."""

from __future__ import annotations

import torch
from torch.utils.data import Subset

from ..data import build_dataset
from .features import extract_features
from .knn import knn_topk
from .probe import FAST_RECIPE, linear_probe
from .rank import effective_rank


class OnlineEval:
    def __init__(self, cfg, every: int, size: int, device: torch.device):
        self.every, self.epochs, self.device = every, cfg.train.epochs, device
        img = cfg.model.img_size
        bank, _ = build_dataset(cfg.data, "train", img, augment=False)
        queries, _ = build_dataset(cfg.data, "test", img, augment=False)
        # the same first images every time, so that the curves measure the model, not the sample
        self.bank = Subset(bank, range(min(size, len(bank))))
        self.queries = Subset(queries, range(min(size, len(queries))))
        self.k = min(20, len(self.bank))
        self.protocol = {"data": cfg.data.name, "bank": f"first {len(self.bank)} train images",
                         "queries": f"first {len(self.queries)} test images", "layer": "last block", "augmentation": "none",
                         "knn": f"mean-pooled, k={self.k}, T=0.07", "probe": f"fast recipe ({FAST_RECIPE.epochs} epochs, mean-pooled)",
                         "rank": "paper eq. 6 on test features (cls / mean)"}

    def __call__(self, model, epoch: int, step: int, log) -> None:
        done = epoch + 1
        if done % self.every and done != self.epochs:
            return
        tr, tr_y = extract_features(model, self.bank, pools=("mean",), device=self.device, progress=False)
        te, te_y = extract_features(model, self.queries, pools=("mean", "cls"), device=self.device, progress=False)
        row = {"step": step, "epoch": float(done),
               "online_knn_top1": knn_topk(tr[(-1, "mean")], tr_y, te[(-1, "mean")], te_y, self.k, 0.07, (1,))["top1"],
               "online_probe_top1": linear_probe(tr[(-1, "mean")], tr_y, te[(-1, "mean")], te_y, FAST_RECIPE, self.device)["top1"],
               "online_rank_cls": effective_rank(te[(-1, "cls")]), "online_rank_mean": effective_rank(te[(-1, "mean")]),
               "online_protocol": self.protocol}
        log.write(row)
        print(f"epoch {done}: online kNN {row['online_knn_top1']:.4f}, probe {row['online_probe_top1']:.4f}, "
              f"rank cls {row['online_rank_cls']:.3f} (eq. 6)")
