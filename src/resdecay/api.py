"""The notebook API: build or load a model, extract its features, measure them, in a few lines.

    import resdecay
    model = resdecay.create_model("mae-tiny-digits", alpha_min=0.7)     # a preset + overrides
    model, cfg = resdecay.load_model("runs/x/checkpoints/step_00000100.pt")
    feats = resdecay.extract_features(model, images, layer=[5, -1])      # {5: (N, D), 11: (N, D)}
    resdecay.knn_accuracy(train_feats, train_labels, test_feats, test_labels)
    resdecay.linear_probe(train_feats, train_labels, test_feats, test_labels)["top1"]
    resdecay.effective_rank(feats[11])
    resdecay.attentive_probe(train_tokens, train_labels, test_tokens, test_labels, head="ep")["top1"]  # (N, T, D)
    resdecay.linear_sweep({"cls": tr_cls, "mean": tr_mean}, train_labels, {"cls": te_cls, "mean": te_mean}, test_labels)
    resdecay.knn_sweep(train_feats, train_labels, test_feats, test_labels)["chosen"]    # k, T chosen on validation
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

from dataclasses import replace
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
from .eval.metrics import get_metric
from .eval.options import check_option
from .eval.probing.source import ProbingSet, carve_validation
from .eval.probing.sweep import Head
from .eval.probing.sweep import knn_sweep as _knn_sweep
from .eval.probing.sweep import linear_sweep as _linear_sweep
from .eval.probing.tokens import TokenStore
from .eval.probing.train import Split
from .eval.protocol import (
    KNN_K,
    KNN_SWEEP_K,
    KNN_SWEEP_T,
    KNN_TEMPERATURE,
    SWEEP_LRS,
    SWEEP_WEIGHT_DECAYS,
    VAL_FRACTION,
    MetricSettings,
)
from .interop.pretrained import attach_hub_methods
from .models import build_model
from .models.common import BlockIndexError, resolve_blocks
from .train.checkpoint import load_model as _load_model
from .train.config import RunConfig, load_config

__all__ = ["create_model", "load_model", "extract_features", "knn_accuracy", "linear_probe", "effective_rank", "diagnose",
           "attentive_probe", "linear_sweep", "knn_sweep"]


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


def _carved(fn: str, train_labels: torch.Tensor, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, str]:
    fraction = check_option("linear_sweep", "val_fraction", val_fraction, f"{fn}(val_fraction={val_fraction!r})")
    return carve_validation(train_labels, fraction, seed, f"{fn}(val_fraction=...)")


def attentive_probe(train_tokens: Array, train_labels: Array, test_tokens: Array, test_labels: Array, head: str = "ep",
                    prefix_tokens: int = 0, val_fraction: float = VAL_FRACTION, seed: int = 0, device: str | torch.device = "cpu",
                    progress: bool = False, **options: Any) -> dict:
    """An attentive probe on frozen tokens, as ``resdecay eval --evals ep`` / ``attentive`` trains it: one head per
    base rate of the recipe, trained together; the best epoch and rate chosen on a validation split carved from the
    training tokens (class-balanced, seeded), then scored on test once. Returns top1, top5, val_top1 and ``card``
    (the head, recipe, validation split and chosen cell).

    Args:
        train_tokens, test_tokens: (N, T, D) tokens of one block (tensor or numpy array); train_labels, test_labels.
        head: "ep" (efficient-probing's EP head) or "attentive" (V-JEPA's attentive pooler).
        prefix_tokens: tokens before the patch tokens (a cls token: 1), left out unless ``tokens="all"``.
        val_fraction, seed: the validation split carved from the training tokens.
        **options: the metric's own options, as ``--metric-option``: ``queries``, ``d_out`` (ep), ``depth``,
            ``heads`` (attentive), ``recipe`` ("small" | "efficient-probing"), ``epochs``, ``tokens``.
    """
    if head not in ("ep", "attentive"):
        raise UserError(f"attentive_probe(head={head!r}): choose 'ep' or 'attentive'")
    x_tr, y_tr, x_te, y_te = _pairs("attentive_probe", train_tokens, train_labels, test_tokens, test_labels)
    if x_tr.ndim != 3 or x_te.ndim != 3:
        raise UserError(f"attentive_probe reads tokens (N, T, D), got {tuple(x_tr.shape)} and {tuple(x_te.shape)}: "
                        "pooled vectors go to linear_probe / linear_sweep")
    settings = MetricSettings(device=device, progress=progress, options={head: options})  # typed and in range, or one line
    rest, val, how = _carved("attentive_probe", y_tr, val_fraction, seed)
    stores = [TokenStore(None, 0, x.detach().float().cpu().contiguous()) for x in (x_tr, x_te)]
    splits = {"train": Split(stores[0], rest, y_tr[rest], prefix_tokens), "val": Split(stores[0], val, y_tr[val], prefix_tokens),
              "test": Split(stores[1], np.arange(len(y_te)), y_te, prefix_tokens)}
    probing = ProbingSet(-1, {}, {"bank": y_tr, "test": y_te}, splits, "tokens",
                         {"validation": how, "prefix_tokens": prefix_tokens, "tokens": {"dtype": "float32", "access": "in memory",
                                                                                        "shape": list(x_tr.shape)}})
    (result,) = get_metric(head).compute(probing, settings)
    return {**result.values, "card": result.card}


def linear_sweep(train_feats: Array | dict[str, Array], train_labels: Array, test_feats: Array | dict[str, Array],
                 test_labels: Array, lrs: tuple[float, ...] = SWEEP_LRS, weight_decays: tuple[float, ...] = SWEEP_WEIGHT_DECAYS,
                 epochs: int = 100, val_fraction: float = VAL_FRACTION, seed: int = 0, device: str | torch.device = "cpu",
                 progress: bool = False) -> dict:
    """DINOv2's swept linear heads, as ``resdecay eval --evals linear_sweep``: one head per feature x lr x weight decay,
    all trained in one pass, the best chosen on a validation split carved from the training features, scored on test.
    Returns top1, top5, val_top1, ``chosen`` and ``sweep`` (every cell's validation top-1).

    Args:
        train_feats, test_feats: (N, D) features, or {name: (N, D)} for several features to choose among (e.g. cls,
            mean of patches); train_labels, test_labels: class indices.
        lrs, weight_decays: the grid (AdamW, the IN-100 schedule at batch 256); epochs: its length.
        val_fraction, seed: the validation split carved from the training features.
    """
    named = lambda f: f if isinstance(f, dict) else {"features": f}  # noqa: E731
    tr = {k: _tensor(v, f"train_feats[{k!r}]", "linear_sweep").float() for k, v in named(train_feats).items()}
    te = {k: _tensor(v, f"test_feats[{k!r}]", "linear_sweep").float() for k, v in named(test_feats).items()}
    if set(tr) != set(te):
        raise UserError(f"linear_sweep: train_feats has {sorted(tr)} but test_feats has {sorted(te)}; give both the same features")
    y_tr, y_te = _tensor(train_labels, "train_labels", "linear_sweep"), _tensor(test_labels, "test_labels", "linear_sweep")
    rest, val, how = _carved("linear_sweep", y_tr, val_fraction, seed)
    grid = [Head(f, lr, wd) for f in tr for lr in lrs for wd in weight_decays]
    if not grid:
        raise UserError("linear_sweep: the grid has no cell; give at least one lr and one weight decay")
    recipe = replace(IN100_RECIPE, name="sweep", epochs=check_option("linear_sweep", "epochs", epochs, "linear_sweep(epochs=...)"),
                     batch_size=256)
    rows = torch.as_tensor(rest), torch.as_tensor(val)
    out = _linear_sweep({k: v[rows[0]] for k, v in tr.items()}, y_tr[rows[0]], {k: v[rows[1]] for k, v in tr.items()},
                        y_tr[rows[1]], te, y_te, grid, recipe, device, progress)
    return {**out, "validation": how}


def knn_sweep(train_feats: Array, train_labels: Array, test_feats: Array, test_labels: Array,
              ks: tuple[int, ...] = KNN_SWEEP_K, temperatures: tuple[float, ...] = KNN_SWEEP_T,
              val_fraction: float = VAL_FRACTION, seed: int = 0) -> dict:
    """kNN with k and T chosen on a validation split carved from the bank, then scored on test with the whole bank,
    as ``resdecay eval --evals knn_sweep``. Returns top1, top5, val_top1, ``chosen`` and ``sweep``."""
    x_tr, y_tr, x_te, y_te = _pairs("knn_sweep", train_feats, train_labels, test_feats, test_labels)
    rest, val, how = _carved("knn_sweep", y_tr, val_fraction, seed)
    if not ks or not temperatures:
        raise UserError("knn_sweep: the grid has no cell; give at least one k and one temperature")
    rest, val = torch.as_tensor(rest), torch.as_tensor(val)
    return {**_knn_sweep(x_tr[rest], y_tr[rest], x_tr[val], y_tr[val], x_te, y_te, tuple(ks), tuple(temperatures)),
            "validation": how}
