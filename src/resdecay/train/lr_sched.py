"""The learning rate: MAE's scaling rule for the peak, and the per-iteration schedule (as
facebookresearch/mae's ``util/lr_sched.py``: linear warmup, then a half-cycle cosine to the floor,
or a constant peak as DiT / SiT / U-ViT train)."""

from __future__ import annotations

import math

import torch

LR_REFERENCE_BATCH = 256  # MAE's rule: lr = base_lr * effective batch / 256


def scaled_lr(base_lr: float, eff_batch: int) -> float:
    """MAE's linear scaling rule: the lr for an effective batch of ``eff_batch`` images."""
    return base_lr * eff_batch / LR_REFERENCE_BATCH


def peak_lr(base_lr: float, eff_batch: int, lr: float | None = None) -> float:
    """The run's peak lr: ``train.lr`` when set, else ``train.base_lr`` scaled by the effective batch
    (``eff_batch``: batch_size x accum_steps x processes)."""
    return lr if lr is not None else scaled_lr(base_lr, eff_batch)


def lr_at(step: int, total: int, warmup: int, peak: float, floor: float, schedule: str = "cosine") -> float:
    """Per-iteration linear warmup, then half-cycle cosine from ``peak`` to ``floor`` (MAE) or a
    constant ``peak`` (DiT / SiT / U-ViT)."""
    if step < warmup:
        return peak * step / warmup
    if schedule == "constant":
        return peak
    progress = (step - warmup) / max(1, total - warmup)
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set every group's lr, scaled by the group's ``lr_scale`` (layer-wise lr decay when fine-tuning)."""
    for group in optimizer.param_groups:
        group["lr"] = lr * group.get("lr_scale", 1.0)
