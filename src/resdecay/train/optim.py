"""The optimizer side of a run: parameter groups (which parameters get weight decay), the optimizer
itself and the autocast dtype of the forward pass."""

from __future__ import annotations

import torch


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only: biases and 1-D parameters (norms) get none."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name.endswith(".bias") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    """The forward's autocast dtype for ``train.precision`` (None: fp32, no autocast)."""
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]


def make_optimizer(groups: list[dict], name: str, lr: float, betas: tuple[float, float]) -> torch.optim.Optimizer:
    """``train.optimizer``: AdamW (fused on GPU and, where this torch has the kernel, on CPU) with
    ``betas`` (train.beta1, train.beta2); timm's LARS with MAE's rule (trust-ratio adaptation for
    weight matrices only, momentum 0.9); or SGD with Nesterov momentum 0.9 (supervised ResNets)."""
    if name == "lars":
        from timm.optim import Lars

        for g in groups:
            g["always_adapt"] = any(p.ndim > 1 for p in g["params"])
        return Lars(groups, lr=lr, momentum=0.9)
    if name == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9, nesterov=True)
    try:  # fused AdamW on CPU: about 5x faster than foreach on mae-tiny-digits (docs/speed-notes.md)
        return torch.optim.AdamW(groups, lr=lr, betas=betas, fused=True)
    except (RuntimeError, ValueError):  # a device or dtype without the fused kernel: the foreach one
        return torch.optim.AdamW(groups, lr=lr, betas=betas)
