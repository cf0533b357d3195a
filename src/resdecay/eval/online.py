"""Online tracking during training, written into the run's log.jsonl (and TensorBoard) as
``online_*`` values that ``resdecay plot`` draws; the training loop gets them as its epoch-end hook.

``OnlineEval`` (encoders, the paper's Figure 4): every N epochs, kNN, a fast linear probe and the
effective rank of the last encoder block on a fixed labelled subset.

``OnlineDiffusionEval``: every N epochs, a proxy FID of freshly drawn samples and the best cell of a
small probe grid. Why: with decayed shortcuts the paper reports *both* better samples (Table 4's FID)
and more abstract features (its probe column); the curves show whether and when the two separate
from a plain model's, without keeping and re-sampling every checkpoint. The samples come from the
EMA weights (what ``resdecay sample`` uses), from the same seeded noise every time, so the curve
measures the model, not the draw; the probe uses the first N train / test images.
"""

from __future__ import annotations

import time

import torch
from torch.utils.data import Subset

from ..data import build_dataset
from ..diffusion.samplers import DEFAULT_SAMPLER, DEFAULT_STEPS, sample, to_uint8
from ..errors import ConfigError
from ..models import is_diffusion
from .diffusion_probe import probe_grid
from .features import extract_features
from .fid import PROXY_DATASETS, compute_fid, dataset_reference, default_cache_dir, proxy_extractor
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


ONLINE_LEVELS = (0.0, 0.25)  # clean and lightly noised: where Table 4's best cells lie
ONLINE_STEPS = {"dpm-solver++": 25}  # U-ViT's sampler at the 25 steps RESULTS §10 uses; dopri5 picks its own


class OnlineDiffusionEval:
    def __init__(self, cfg, every: int, size: int, device: torch.device):
        m, d = cfg.model, cfg.data
        if d.name not in PROXY_DATASETS:
            raise ConfigError(f"train.online_eval_every for a diffusion model scores samples with a proxy FID, which needs "
                              f"one of {', '.join(PROXY_DATASETS)} (data.name={d.name}); set train.online_eval_every=0 "
                              "and score checkpoints with `resdecay sample` + `resdecay fid`")
        self.every, self.epochs, self.device, self.size = every, cfg.train.epochs, device, size
        self.extractor = proxy_extractor(d.name, data_path=d.path, in_chans=m.in_chans, device=device)
        ref_out = default_cache_dir() / f"{d.name}-train-{self.extractor.name}.pt"  # next to the extractor, built once
        self.ref, ref_path, _ = dataset_reference(d.name, self.extractor, d.path, device=device, ref_out=ref_out, progress=False)
        dim = len(self.ref["mu"])
        if size <= dim:  # n samples give a covariance of rank <= n - 1
            raise ConfigError(f"train.online_eval_size={size} is too few samples for a proxy FID on {dim}-d features; "
                              f"set train.online_eval_size to at least {dim + 1} (e.g. 1000)")
        self.sampler = DEFAULT_SAMPLER[m.objective]
        self.steps = ONLINE_STEPS.get(self.sampler, DEFAULT_STEPS.get(self.sampler, 50))
        self.shape = (m.in_chans, m.img_size, m.img_size)
        bank, _ = build_dataset(d, "train", m.img_size, augment=False)
        queries, _ = build_dataset(d, "test", m.img_size, augment=False)
        self.bank = Subset(bank, range(min(size, len(bank))))
        self.queries = Subset(queries, range(min(size, len(queries))))
        self.protocol = {"data": d.name, "samples": f"{size} samples, EMA weights when kept, seed 0, no guidance",
                         "sampler": self.sampler, "steps": "adaptive" if self.sampler == "dopri5" else self.steps,
                         "fid": f"{self.extractor.label} vs the train split ({ref_path})",
                         "probe": f"fast linear probe, mean tokens of every block, noise levels {list(ONLINE_LEVELS)}, "
                                  f"first {len(self.bank)} train -> first {len(self.queries)} test images, null label"}

    def __call__(self, model, epoch: int, step: int, log) -> None:
        done = epoch + 1
        if done % self.every and done != self.epochs:
            return
        t0 = time.perf_counter()
        g = torch.Generator().manual_seed(0)
        x = sample(model, self.size, sampler=self.sampler, steps=self.steps, image_shape=self.shape, generator=g,
                   device=self.device, batch_size=500, clip_denoised=True)
        fid = compute_fid(to_uint8(x.cpu()), self.ref, self.extractor, device=self.device)
        grid = probe_grid(model, self.bank, self.queries, levels=ONLINE_LEVELS, device=self.device, progress=False)
        best = grid["best"]
        row = {"step": step, "epoch": float(done), "online_proxy_fid": fid["value"], "online_probe_best_top1": best["top1"],
               "online_probe_best_cell": {"block": best["layer"], "noise": best["level"]},
               "online_eval_s": time.perf_counter() - t0, "online_protocol": self.protocol}
        log.write(row)
        print(f"epoch {done}: online {fid['label']} {fid['value']:.3f}, best probe {best['top1']:.4f} "
              f"(block {best['layer']}, noise {best['level']:g}) [{row['online_eval_s']:.0f} s]")


def online_evaluator(cfg, device: torch.device):
    """The epoch-end hook ``train.online_eval_every`` asks for: proxy FID + probe grid for the
    diffusion families, kNN / probe / effective rank for encoders."""
    cls = OnlineDiffusionEval if is_diffusion(cfg.model.family) else OnlineEval
    return cls(cfg, cfg.train.online_eval_every, cfg.train.online_eval_size, device)
