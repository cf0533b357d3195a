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
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..diffusion.samplers import DEFAULT_SAMPLER, DEFAULT_STEPS
from ..models import is_diffusion
from .features.extract import extract_block_features
from .inputs import fixed_subsets
from .metrics import DIFFUSION, FEATURES, SAMPLES, measure, measure_prepared, registered
from .protocol import FAST_RECIPE, KNN_K, ONLINE_LEVELS, MetricSettings
from .sets import FeatureSet
from .sources import Evaluation, get_source

FEATURE = "mean"  # the pooling online kNN / probe use: all tokens of the last block


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _log_columns(columns: dict) -> dict:
    """Metric columns as log.jsonl keys: knn_top1 -> online_knn_top1 (what ``resdecay plot`` reads)."""
    return {f"online_{k}": v for k, v in columns.items()}


class OnlineEval:
    def __init__(self, cfg, every: int, size: int, device: torch.device):
        self.every, self.epochs, self.device = every, cfg.train.epochs, device
        # the same images every time, so that the curves measure the model, not the sample
        self.bank, self.queries, subset_card = fixed_subsets(cfg.data, cfg.model.img_size, size)
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


@dataclass(frozen=True)
class OnlineSampling:
    """The samples source's settings during training: how many samples, drawn with which sampler and steps."""

    size: int
    sampler: str
    steps: int


ONLINE_STEPS = {"dpm-solver++": 25}  # U-ViT's sampler at the 25 steps RESULTS §10 uses; dopri5 picks its own


class OnlineDiffusionEval:
    """Every N epochs the ``samples`` and ``diffusion`` sources' inputs (``fid/source.py``,
    ``diffusion/source.py``): fresh EMA samples against the train split's proxy statistics, and the probe
    grid on fixed subsets; their ``check`` builds the extractor, the reference and the subsets once, here."""

    def __init__(self, cfg, every: int, size: int, device: torch.device):
        m = cfg.model
        self.every, self.epochs = every, cfg.train.epochs
        sampler = DEFAULT_SAMPLER[m.objective]
        steps = ONLINE_STEPS.get(sampler, DEFAULT_STEPS.get(sampler, 50))
        self.ev = Evaluation(None, None, {}, cfg, None, cfg.data, OnlineSampling(size, sampler, steps), [-1], device, None)
        self.plan = [(get_source(kind), registered(kind, "online")) for kind in (SAMPLES, DIFFUSION)]
        for source, metrics in self.plan:
            source.check(self.ev, metrics)
        _, _, subset_card = self.ev.shared["subsets"]
        extractor = self.ev.shared["extractor"]
        self.label = extractor.label
        self.protocol = {"data": cfg.data.name, "samples": f"{size} samples, EMA weights when kept, seed 0, no guidance",
                         "sampler": sampler, "steps": "adaptive" if sampler == "dopri5" else steps,
                         "fid": f"{extractor.label} vs the train split ({self.ev.shared['reference_path']})",
                         "probe": f"fast linear probe, mean tokens of every block, noise levels {list(ONLINE_LEVELS)}, "
                                  f"{subset_card['bank']} -> {subset_card['queries']}, null label",
                         "subset": subset_card["subset"]}

    def __call__(self, model, epoch: int, step: int, log) -> None:
        done = epoch + 1
        if done % self.every and done != self.epochs:
            return
        t0 = time.perf_counter()
        self.ev.model = model
        settings = MetricSettings(probe=FAST_RECIPE, device=self.ev.device)
        columns = {}  # sample metrics first (FID), then the model's probe grid: the order the RNG has always seen
        for source, metrics in self.plan:
            for prepared in source.prepare(self.ev, metrics):
                columns.update(measure_prepared(metrics, prepared, settings)[1])
        if _distributed() and dist.get_rank() != 0:  # the same numbers as rank 0's (see online_evaluator): one line
            return
        row = {"step": step, "epoch": float(done), **_log_columns(columns),
               "online_eval_s": time.perf_counter() - t0, "online_protocol": self.protocol}
        log.write(row)
        shown = ", ".join(f"{k} {v:.4f}" for k, v in columns.items() if isinstance(v, (int, float)))
        print(f"epoch {done}: online {shown} ({self.label}) [{row['online_eval_s']:.0f} s]")


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
