"""The notebook API: build or load a model, extract its features, measure them, in a few lines.

    import resdecay
    model = resdecay.create_model("mae-tiny-digits", alpha_min=0.7)     # a preset + overrides
    model, cfg = resdecay.load_model("runs/x/checkpoints/step_00000100.pt")
    feats = resdecay.extract_features(model, images, layer=[5, -1])      # {5: (N, D), 11: (N, D)}
    resdecay.knn_accuracy(train_feats, train_labels, test_feats, test_labels)
    resdecay.linear_probe(train_feats, train_labels, test_feats, test_labels)["top1"]
    resdecay.effective_rank(feats[11])

Everything here is a thin, documented front to the same functions the CLI uses, so numbers from a
notebook equal numbers from ``resdecay eval`` with the same protocol.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import Dataset, TensorDataset

from .errors import UserError
from .eval.features import POOLINGS
from .eval.features import extract_features as _extract
from .eval.knn import knn_accuracy
from .eval.probe import linear_probe
from .eval.rank import effective_rank
from .models import build_model
from .models.common import BlockIndexError, resolve_blocks
from .train.checkpoint import load_model
from .train.config import RunConfig, load_config

__all__ = ["create_model", "load_model", "extract_features", "knn_accuracy", "linear_probe", "effective_rank"]


def create_model(preset: str | RunConfig = "mae-tiny-digits", **overrides: Any) -> torch.nn.Module:
    """A freshly initialised model from a preset name / YAML path (or a resolved RunConfig).

    Args:
        preset: a shipped preset (``resdecay presets``), a YAML file, or a ``RunConfig``.
        **overrides: settings as keyword arguments, ``alpha_min=0.7`` or ``model__depth=6``
            (double underscore for ``section.key``); values as Python objects.
    """
    if isinstance(preset, RunConfig):
        if overrides:
            raise UserError("create_model: pass overrides with a preset name, not with a resolved RunConfig")
        return build_model(preset.model)
    pairs = [f"{k.replace('__', '.')}={_yaml(v)}" for k, v in overrides.items()]
    return build_model(load_config(preset, pairs).model)


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return "null" if value is None else str(value)


def extract_features(model: torch.nn.Module, data: Dataset | torch.Tensor, labels: torch.Tensor | None = None,
                     layer: int | list[int] = -1, pooling: str = "mean", batch_size: int = 256,
                     device: str | torch.device = "cpu", progress: bool = False) -> dict[int, torch.Tensor]:
    """Frozen features of every image, keyed by the resolved (non-negative) block index.

    Args:
        model: any resdecay encoder-bearing model (MAE, classifier, U-ViT, SiT, ResNet).
        data: a dataset of (image, label) pairs, or an image tensor (N, C, H, W) already normalised.
        labels: labels for a tensor input (optional; only the features are returned).
        layer: a block index or a list of them (negative counts from the end).
        pooling: ``mean`` (all tokens incl. cls, the authors' choice) | ``cls`` | ``patch_mean``.
    """
    if pooling not in POOLINGS:
        raise UserError(f"pooling {pooling!r} is unknown; choose one of {', '.join(POOLINGS)}")
    depth = len(model.blocks) if hasattr(model, "blocks") else None
    layers = [layer] if isinstance(layer, int) else list(layer)
    try:
        resolved = resolve_blocks(layers, depth) if depth is not None else layers
    except BlockIndexError as e:
        raise UserError(str(e)) from None
    if isinstance(data, torch.Tensor):
        if data.ndim != 4:
            raise UserError(f"extract_features takes images (N, C, H, W) or a dataset; got a tensor of shape {tuple(data.shape)}")
        data = TensorDataset(data, labels if labels is not None else torch.zeros(len(data), dtype=torch.long))
    feats, _ = _extract(model, data, resolved, (pooling,), batch_size, device, progress=progress)
    return {idx: feats[(idx, pooling)] for idx in resolved}
