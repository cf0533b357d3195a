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
measures the model, not the draw; the probe uses N train / test images.

Both draw their N train and N test images once, class-balanced and seeded by ``data.subset_seed``
(``data/subsets.py``; an ImageFolder's first N would be one or two classes), and say so in their
protocol card. Under torchrun rank 0 alone measures, logs and prints (every rank computing the
same numbers only printed them twice); see ``online_evaluator``.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from ..data import build_dataset
from ..data.datasets import normalization_card
from ..data.subsets import balanced_subset, describe_subset
from ..diffusion.samplers import DEFAULT_SAMPLER, DEFAULT_STEPS, sample, to_uint8
from ..errors import ConfigError
from ..models import is_diffusion
from .features import extract_block_features
from .fid import PROXY_DATASETS, dataset_reference, default_cache_dir, proxy_extractor
from .metrics import DIFFUSION, FEATURES, SAMPLES, DiffusionSet, FeatureSet, SampleSet, measure, registered
from .protocol import FAST_RECIPE, KNN_K, ONLINE_LEVELS, MetricSettings

FEATURE = "mean"  # the pooling online kNN / probe use: all tokens of the last block


def _fixed_subsets(data, img_size: int, size: int):
    """(bank, queries, card): ``size`` train and ``size`` test images, class-balanced and seeded,
    the same at every evaluation of the run, and the card saying how they were drawn."""
    bank, info = build_dataset(data, "train", img_size, augment=False)
    queries, _ = build_dataset(data, "test", img_size, augment=False)
    chosen = [balanced_subset(ds, size, data.subset_seed) for ds in (bank, queries)]
    card = {"bank": describe_subset(len(chosen[0]), len(bank), "train", data.subset_seed),
            "queries": describe_subset(len(chosen[1]), len(queries), "test", data.subset_seed),
            "subset": f"each class's images shuffled with data.subset_seed={data.subset_seed}, classes dealt in turn "
                      "(an even share per class), the same images at every evaluation",
            "normalize": normalization_card(data, info)}
    return chosen[0], chosen[1], card


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _log_columns(columns: dict) -> dict:
    """Metric columns as log.jsonl keys: knn_top1 -> online_knn_top1 (what ``resdecay plot`` reads)."""
    return {f"online_{k}": v for k, v in columns.items()}


class OnlineEval:
    def __init__(self, cfg, every: int, size: int, device: torch.device):
        self.every, self.epochs, self.device = every, cfg.train.epochs, device
        # the same images every time, so that the curves measure the model, not the sample
        self.bank, self.queries, subset_card = _fixed_subsets(cfg.data, cfg.model.img_size, size)
        self.metrics = registered(FEATURES, "online")
        self.settings = MetricSettings(knn_k=min(KNN_K, len(self.bank)), probe=FAST_RECIPE, device=device)
        self.test_pools = tuple(sorted({FEATURE, *(p for m in self.metrics for p in m.extra_pools)}))
        self.protocol = {"data": cfg.data.name, **subset_card, "layer": "last block", "augmentation": "none",
                         "feature": f"{FEATURE}-pooled", **{m.name: m.protocol(self.settings) for m in self.metrics}}

    def __call__(self, model, epoch: int, step: int, log) -> None:
        done = epoch + 1
        if done % self.every and done != self.epochs:
            return
        tr, tr_y = extract_block_features(model, self.bank, pools=(FEATURE,), device=self.device, progress=False)
        te, te_y = extract_block_features(model, self.queries, pools=self.test_pools, device=self.device, progress=False)
        if _distributed() and dist.get_rank() != 0:  # it helped extract (split and gathered); rank 0 alone measures
            dist.barrier()  # and it trains on only once rank 0 has measured, logged and printed
            return
        feats = FeatureSet({FEATURE: tr[(-1, FEATURE)]}, tr_y, {p: te[(-1, p)] for p in self.test_pools}, te_y, FEATURE)
        _, columns = measure(self.metrics, feats, self.settings, {}, -1)
        row = {"step": step, "epoch": float(done), **_log_columns(columns), "online_protocol": self.protocol}
        log.write(row)
        print(f"epoch {done}: online " + ", ".join(f"{k} {v:.4f}" for k, v in columns.items()), flush=True)
        if _distributed():
            dist.barrier()


ONLINE_STEPS = {"dpm-solver++": 25}  # U-ViT's sampler at the 25 steps RESULTS §10 uses; dopri5 picks its own


class OnlineDiffusionEval:
    def __init__(self, cfg, every: int, size: int, device: torch.device):
        m, d = cfg.model, cfg.data
        _check_proxy_data(d)
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
        self.bank, self.queries, subset_card = _fixed_subsets(d, m.img_size, size)
        self.protocol = {"data": d.name, "samples": f"{size} samples, EMA weights when kept, seed 0, no guidance",
                         "sampler": self.sampler, "steps": "adaptive" if self.sampler == "dopri5" else self.steps,
                         "fid": f"{self.extractor.label} vs the train split ({ref_path})",
                         "probe": f"fast linear probe, mean tokens of every block, noise levels {list(ONLINE_LEVELS)}, "
                                  f"{subset_card['bank']} -> {subset_card['queries']}, null label",
                         "subset": subset_card["subset"]}

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
        if _distributed() and dist.get_rank() != 0:  # the same numbers as rank 0's (see online_evaluator): one line
            return
        row = {"step": step, "epoch": float(done), **_log_columns(columns),
               "online_eval_s": time.perf_counter() - t0, "online_protocol": self.protocol}
        log.write(row)
        shown = ", ".join(f"{k} {v:.4f}" for k, v in columns.items() if isinstance(v, (int, float)))
        print(f"epoch {done}: online {shown} ({self.extractor.label}) [{row['online_eval_s']:.0f} s]")


def _check_proxy_data(d) -> None:
    """The diffusion evaluator's proxy FID needs a data set with a proxy network (every rank checks)."""
    if d.name not in PROXY_DATASETS:
        raise ConfigError(f"train.online_eval_every for a diffusion model scores samples with a proxy FID, which needs "
                          f"one of {', '.join(PROXY_DATASETS)} (data.name={d.name}); set train.online_eval_every=0 "
                          "and score checkpoints with `resdecay sample` + `resdecay fid`")


def online_evaluator(cfg, device: torch.device):
    """The epoch-end hook ``train.online_eval_every`` asks for: proxy FID + probe grid for the
    diffusion families, kNN / probe / effective rank for encoders.

    Under torchrun the hook gets the unwrapped model, the same on every rank. Encoders: every rank
    extracts a share of the features (gathered on every rank), rank 0 alone measures, logs and
    prints while the others wait at a barrier. Diffusion: the samples come from one seeded noise
    stream, so every rank draws the same ones (in parallel, as long as one rank would take) and
    the probe grid's extraction is split; rank 0 alone logs and prints."""
    cls = OnlineDiffusionEval if is_diffusion(cfg.model.family) else OnlineEval
    return cls(cfg, cfg.train.online_eval_every, cfg.train.online_eval_size, device)
