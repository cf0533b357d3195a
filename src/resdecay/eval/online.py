"""Online tracking during training, written into the run's log.jsonl (and TensorBoard) as
``online_*`` values that ``resdecay plot`` draws; the training loop gets them as its epoch-end hook.

Both iterate the metric registry (``eval/metrics.py``): every metric registered for ``online`` runs,
and its columns are logged as ``online_<column>`` (``online_knn_top1``, ``online_rank_cls``, ...).

``OnlineEval`` (encoders, the paper's Figure 4): every N epochs, the ``features`` metrics (kNN, the
fast linear probe, effective rank) of the last encoder block on a fixed labelled subset.

``OnlineDiffusionEval``: every N epochs, the ``samples`` metrics (a proxy FID of freshly drawn samples)
and the ``diffusion`` metrics (the best cell of a small probe grid). Why: with decayed shortcuts the paper reports *both* better samples (Table 4's FID)
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
from .features import extract_block_features
from .fid import PROXY_DATASETS, dataset_reference, default_cache_dir, proxy_extractor
from .metrics import DIFFUSION, FEATURES, SAMPLES, DiffusionSet, FeatureSet, SampleSet, measure, registered
from .protocol import FAST_RECIPE, KNN_K, ONLINE_LEVELS, MetricSettings

FEATURE = "mean"  # the pooling online kNN / probe use: all tokens of the last block


def _log_columns(columns: dict) -> dict:
    """Metric columns as log.jsonl keys: knn_top1 -> online_knn_top1 (what ``resdecay plot`` reads)."""
    return {f"online_{k}": v for k, v in columns.items()}


class OnlineEval:
    def __init__(self, cfg, every: int, size: int, device: torch.device):
        self.every, self.epochs, self.device = every, cfg.train.epochs, device
        img = cfg.model.img_size
        bank, _ = build_dataset(cfg.data, "train", img, augment=False)
        queries, _ = build_dataset(cfg.data, "test", img, augment=False)
        # the same first images every time, so that the curves measure the model, not the sample
        self.bank = Subset(bank, range(min(size, len(bank))))
        self.queries = Subset(queries, range(min(size, len(queries))))
        self.metrics = registered(FEATURES, "online")
        self.settings = MetricSettings(knn_k=min(KNN_K, len(self.bank)), probe=FAST_RECIPE, device=device)
        self.test_pools = tuple(sorted({FEATURE, *(p for m in self.metrics for p in m.extra_pools)}))
        self.protocol = {"data": cfg.data.name, "bank": f"first {len(self.bank)} train images",
                         "queries": f"first {len(self.queries)} test images", "layer": "last block", "augmentation": "none",
                         "feature": f"{FEATURE}-pooled", **{m.name: m.protocol(self.settings) for m in self.metrics}}

    def __call__(self, model, epoch: int, step: int, log) -> None:
        done = epoch + 1
        if done % self.every and done != self.epochs:
            return
        tr, tr_y = extract_block_features(model, self.bank, pools=(FEATURE,), device=self.device, progress=False)
        te, te_y = extract_block_features(model, self.queries, pools=self.test_pools, device=self.device, progress=False)
        feats = FeatureSet({FEATURE: tr[(-1, FEATURE)]}, tr_y, {p: te[(-1, p)] for p in self.test_pools}, te_y, FEATURE)
        _, columns = measure(self.metrics, feats, self.settings, {}, -1)
        row = {"step": step, "epoch": float(done), **_log_columns(columns), "online_protocol": self.protocol}
        log.write(row)
        print(f"epoch {done}: online " + ", ".join(f"{k} {v:.4f}" for k, v in columns.items()))


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
        settings = MetricSettings(probe=FAST_RECIPE, device=self.device)
        columns = {}  # sample metrics first (FID), then the model's probe grid: the order the RNG has always seen
        for kind, inputs in ((SAMPLES, SampleSet(to_uint8(x.cpu()), self.ref, self.extractor)),
                             (DIFFUSION, DiffusionSet(model, self.bank, self.queries, ONLINE_LEVELS))):
            columns.update(measure(registered(kind, "online"), inputs, settings, {}, None)[1])
        row = {"step": step, "epoch": float(done), **_log_columns(columns),
               "online_eval_s": time.perf_counter() - t0, "online_protocol": self.protocol}
        log.write(row)
        shown = ", ".join(f"{k} {v:.4f}" for k, v in columns.items() if isinstance(v, (int, float)))
        print(f"epoch {done}: online {shown} ({self.extractor.label}) [{row['online_eval_s']:.0f} s]")


def online_evaluator(cfg, device: torch.device):
    """The epoch-end hook ``train.online_eval_every`` asks for: proxy FID + probe grid for the
    diffusion families, kNN / probe / effective rank for encoders."""
    cls = OnlineDiffusionEval if is_diffusion(cfg.model.family) else OnlineEval
    return cls(cfg, cfg.train.online_eval_every, cfg.train.online_eval_size, device)
