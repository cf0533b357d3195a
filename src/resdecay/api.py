"""The notebook API: build or load a model, extract its features, measure them, in a few lines.

    import resdecay
    model = resdecay.create_model("mae-tiny-digits", alpha_min=0.7)     # a preset + overrides
    model, cfg = resdecay.load_model("runs/x/checkpoints/step_00000100.pt")
    feats = resdecay.extract_features(model, images, layer=[5, -1])      # {5: (N, D), 11: (N, D)}
    resdecay.knn_accuracy(train_feats, train_labels, test_feats, test_labels)
    resdecay.linear_probe(train_feats, train_labels, test_feats, test_labels)["top1"]
    resdecay.effective_rank(feats[11])
    resdecay.diagnose(model, test_images, train_images=train_images)   # what the identity path carries, per layer
    model.save_pretrained("mae-digits", run_dir="runs/x")                # config.json, model.safetensors, README.md card
    model = resdecay.from_pretrained("mae-digits")                       # a folder, or a hub id user/name
    model.resdecay_config["alpha"]["alpha_eff"]                          # its config.json
    model.push_to_hub("me/mae-digits")                                   # huggingface_hub's method names

(``save_pretrained`` / ``from_pretrained`` / ``push_to_hub`` live in ``interop/pretrained.py``; every
model from ``create_model``, ``load_model`` and ``from_pretrained`` has the first and the last as
methods, ``interop/hub_model.py``. ``from_pretrained`` returned ``(model, config)`` before: that
unpacking still works until resdecay 0.2, with a DeprecationWarning.)
Everything here is a thin, documented front to the same functions the CLI uses, so numbers from a
notebook equal numbers from ``resdecay eval`` with the same protocol. Features, labels and images may be
torch tensors or numpy arrays (converted with ``torch.from_numpy``: same dtype, no copy when contiguous).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, TensorDataset

from .errors import UserError
from .eval.diagnostics import diagnose
from .eval.features.extract import POOLINGS
from .eval.features.extract import extract_block_features as _extract
from .eval.features.knn import knn_accuracy as _knn_accuracy
from .eval.features.probe import IN100_RECIPE, ProbeRecipe
from .eval.features.probe import linear_probe as _linear_probe
from .eval.features.rank import effective_rank as _effective_rank
from .eval.options import check_option
from .eval.protocol import KNN_K, KNN_TEMPERATURE
from .interop.pretrained import attach_hub_methods
from .models import build_model
from .models.common import BlockIndexError, resolve_blocks
from .train.checkpoint import load_model as _load_model
from .train.config import RunConfig, load_config

__all__ = ["create_model", "load_model", "extract_features", "knn_accuracy", "linear_probe", "effective_rank", "diagnose"]


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
        return attach_hub_methods(build_model(preset.model))
    pairs = [f"{k.replace('__', '.')}={_yaml(v)}" for k, v in overrides.items()]
    return attach_hub_methods(build_model(load_config(preset, pairs).model))


def load_model(path: str, device: str | torch.device = "cpu", ema: bool = False) -> tuple[torch.nn.Module, RunConfig]:
    """(model in eval mode, its RunConfig) of a resdecay checkpoint; the model has
    ``save_pretrained`` / ``push_to_hub`` methods (pass ``run_dir=`` for the card's training and eval).

    Args:
        path: a checkpoint (``<run>/checkpoints/step_*.pt`` or ``import-weights`` output).
        device: where the model goes.
        ema: the EMA weights where the run kept them.
    """

    model, cfg = _load_model(path, device=device, ema=ema)
    return attach_hub_methods(model), cfg


def _yaml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_yaml(v) for v in value) + "]"
    return "null" if value is None else str(value)


def extract_features(model: torch.nn.Module, data: Dataset | torch.Tensor | np.ndarray,
                     labels: torch.Tensor | np.ndarray | None = None,
                     layer: int | list[int] = -1, pooling: str = "mean", batch_size: int = 256,
                     device: str | torch.device = "cpu", progress: bool = False) -> dict[int, torch.Tensor]:
    """Frozen features of every image, keyed by the resolved (non-negative) block index.

    Args:
        model: any resdecay encoder-bearing model (MAE, classifier, U-ViT, SiT, ResNet).
        data: a dataset of (image, label) pairs, or normalised float images (N, C, H, W), tensor or numpy.
        labels: labels for a tensor input (optional; only the features are returned).
        layer: a block index or a list of them (negative counts from the end).
        pooling: ``mean`` (all tokens incl. cls, the authors' choice) | ``cls`` | ``patch_mean``.
        batch_size: images per forward pass.
        device: where the model runs.
        progress: show a progress bar.
    """
    if pooling not in POOLINGS:
        raise UserError(f"pooling {pooling!r} is unknown; choose one of {', '.join(POOLINGS)}")
    depth = len(model.blocks) if hasattr(model, "blocks") else None
    layers = [layer] if isinstance(layer, int) else list(layer)
    try:
        resolved = resolve_blocks(layers, depth) if depth is not None else layers
    except BlockIndexError as e:
        raise UserError(str(e)) from None
    if isinstance(data, np.ndarray):
        data = _tensor(data, "images", "extract_features")
    if isinstance(data, torch.Tensor):
        if data.ndim != 4:
            raise UserError(f"extract_features takes images (N, C, H, W) or a dataset; got a tensor of shape {tuple(data.shape)}")
        if not data.is_floating_point():  # a uint8 batch would reach the model unnormalised
            raise UserError(f"extract_features takes normalised float images; got {data.dtype}: normalise them as the "
                            "model's dataset does (e.g. (x / 255 - mean) / std)")
        labels = torch.zeros(len(data), dtype=torch.long) if labels is None else _tensor(labels, "labels", "extract_features")
        data = TensorDataset(data.float(), labels)
    feats, _ = _extract(model, data, resolved, (pooling,), batch_size, device, progress=progress)
    return {idx: feats[(idx, pooling)] for idx in resolved}


Array = torch.Tensor | np.ndarray


def _tensor(x: Any, what: str, fn: str) -> torch.Tensor:
    """A tensor as it is; a numpy array as ``torch.from_numpy`` makes it; anything else refused in one line
    (the eval functions would fail deep inside with an AttributeError)."""
    if isinstance(x, torch.Tensor):
        return x
    if isinstance(x, np.ndarray) and (np.issubdtype(x.dtype, np.number) or x.dtype == np.bool_):
        return torch.from_numpy(np.ascontiguousarray(x))
    kind = f"a numpy array of {x.dtype}" if isinstance(x, np.ndarray) else type(x).__name__
    raise UserError(f"{fn}: {what} must be a torch.Tensor or a numeric numpy array, got {kind}")


def _pairs(fn: str, train_feats: Array, train_labels: Array, test_feats: Array, test_labels: Array) -> tuple:
    return (_tensor(train_feats, "train_feats", fn), _tensor(train_labels, "train_labels", fn),
            _tensor(test_feats, "test_feats", fn), _tensor(test_labels, "test_labels", fn))


def knn_accuracy(train_feats: Array, train_labels: Array, test_feats: Array, test_labels: Array, k: int = KNN_K,
                 temperature: float = KNN_TEMPERATURE, chunk_size: int = 1024) -> float:
    """Top-1 accuracy (0..1) of the weighted cosine kNN vote (DINO / solo-learn) of the test features on the bank.

    Args:
        train_feats: the bank, (N, D) features (tensor or numpy array).
        train_labels: (N,) integer labels of the bank.
        test_feats: the queries, (M, D) features.
        test_labels: (M,) integer labels of the queries.
        k: neighbours that vote.
        temperature: votes are weighted exp(cos / temperature).
        chunk_size: queries per similarity block (memory, not results).
    """
    args = _pairs("knn_accuracy", train_feats, train_labels, test_feats, test_labels)
    k = check_option("knn", "k", k, f"knn_accuracy(k={k!r})")  # kNN's declared ranges (eval/features/metrics.py)
    temperature = check_option("knn", "temperature", temperature, f"knn_accuracy(temperature={temperature!r})")
    return _knn_accuracy(*args, k=k, temperature=temperature, chunk_size=chunk_size)


def linear_probe(train_feats: Array, train_labels: Array, test_feats: Array, test_labels: Array,
                 recipe: ProbeRecipe = IN100_RECIPE, device: str | torch.device = "cpu", num_classes: int | None = None,
                 progress: bool = False) -> dict:
    """Train one linear classifier on frozen features: test top-1 / top-5, train top-1 and the final loss.

    Args:
        train_feats: (N, D) training features (tensor or numpy array).
        train_labels: (N,) integer labels.
        test_feats: (M, D) test features.
        test_labels: (M,) integer labels.
        recipe: the probe recipe (default: the authors' ImageNet-100 one, 200 epochs of AdamW).
        device: where the probe trains.
        num_classes: classes of the head (default: the largest label + 1).
        progress: show a progress bar.
    """
    args = _pairs("linear_probe", train_feats, train_labels, test_feats, test_labels)
    return _linear_probe(*args, recipe=recipe, device=device, num_classes=num_classes, progress=progress)


def effective_rank(feats: Array, exp: bool = False) -> float:
    """Effective rank of (N, D) features, paper eq. 6 (see ``resdecay.eval.features.rank.effective_rank``).

    Args:
        feats: (N, D) features, N >= 2 (tensor or numpy array).
        exp: return exp(rho) (Roy & Vetterli, between 1 and D) instead of the entropy rho (between 0 and log D).
    """
    return _effective_rank(_tensor(feats, "feats", "effective_rank"), exp=exp)
