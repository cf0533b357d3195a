"""The ``probing`` source of ``resdecay eval --evals ep,attentive,linear_sweep,knn_sweep,fewshot``.

One pass of the frozen encoder over the training and test images (no augmentation) keeps, for each measured
block: its pooled features (cls, mean of patches, both, and the cls tokens of the last four blocks up to it,
concatenated: the swept heads' features; and the evaluation's ``--feature`` pooling for the kNN sweep and few-shot)
and, when an attentive probe is selected, its tokens in a ``TokenStore`` (float16 by default, in memory or streamed
under the budget). The validation split every selection uses is carved from the training images, seeded and
class-balanced (``data/subsets.balanced_indices``), and recorded in every card; test labels choose nothing.
Everything is cached beside the feature cache, keyed by the checkpoint, the data and the protocol.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from ...data.subsets import balanced_indices, dataset_labels
from ...errors import UserError
from ...io import progress_bar, safe_load
from ..features import baselines as bl
from ..features.extract import pool_tokens
from ..features.source import _cache, _split
from ..protocol import SWEEP_FEATURES
from ..sources import Evaluation, Prepared, Source
from .tokens import TokenWriter, check_budget, reuse
from .train import Split

PROBING = "probing"
READS_TOKENS = ("ep", "attentive")  # the metrics that need the tokens kept, not only the pooled features
SPLIT_OPTIONS = ("val_fraction", "token_dtype", "token_budget_mb")
FORMAT = 1
PIXELS = "raw pixels: patch tokens, the whole image pooled"  # the pixel baseline's identity in its cache keys


@dataclass
class ProbingSet:
    """What a ``probing`` metric reads, for one block.

    Args:
        layer: the block; pooled: split ("train" without the validation images, "val", "test", "bank": all the
            training images) -> feature -> (N, D); labels: split -> (N,); tokens: split -> ``Split`` of the token
            store (None without an attentive probe); feature: the evaluation's pooling; card: the validation split
            and the token store, for every result's card; pixels: the raw-pixel baseline's patches, not a model's.
    """

    layer: int
    pooled: dict[str, dict[str, torch.Tensor]]
    labels: dict[str, torch.Tensor]
    tokens: dict[str, Split] | None
    feature: str
    card: dict
    pixels: bool = False


def split_settings(ev: Evaluation, metrics: list) -> dict:
    """The validation fraction and token storage of the selected probing metrics: one set on any of them (``--metric-
    option ep.val_fraction=0.2``) holds for all (they share one validation split and one token store); two metrics
    set to different values are refused in one line."""
    ms, out = ev.settings.metric_settings(), {}
    for k in SPLIT_OPTIONS:
        given = {m.name: getattr(ms.options_of(m.name), k) for m in metrics
                 if getattr(ms.options_of(m.name), k) != getattr(m.options, k)}
        if len(set(given.values())) > 1:
            (a, va), (b, vb) = list(given.items())[:2]
            raise UserError(f"--metric-option {a}.{k}={va} differs from {b}.{k}={vb}: the probing metrics share one "
                            "validation split and token store; set it once")
        out[k] = next(iter(given.values()), getattr(metrics[0].options, k))
    return out


def carve_validation(labels: torch.Tensor, fraction: float, seed: int, option: str = "ep.val_fraction"
                     ) -> tuple[np.ndarray, np.ndarray, str]:
    """(train rows, validation rows, how): ``fraction`` of the training images, class-balanced and seeded; a split
    that leaves a class without an image on either side is refused in one line."""
    n_val = int(round(fraction * len(labels)))
    val = balanced_indices(labels, n_val, seed)
    train = np.setdiff1d(np.arange(len(labels)), val)
    classes = set(labels.unique().tolist())
    empty = sorted(classes - set(labels[val].tolist())) or sorted(classes - set(labels[train].tolist()))
    if n_val < 1 or empty:
        raise UserError(f"--metric-option {option}={fraction:g} of {len(labels)} training images leaves class "
                        f"{empty[0] if empty else '?'} without a validation or training image; raise it (or "
                        "--max-train) so that every class has both")
    return train, val, f"{len(val)} of {len(labels)} training images, class-balanced, seed {seed}"


def _pooled(tokens: list[torch.Tensor], prefix: int, feature: str) -> dict[str, torch.Tensor]:
    """The swept heads' features of one block (``tokens[-1]``) and the 3 before it, and the evaluation's pooling."""
    last = tokens[-1]
    cls = last[:, 0] if prefix else last.mean(1)  # a model without a cls token: its mean stands in
    patches = last[:, prefix:].mean(1)
    return {"cls": cls, "patch_mean": patches, "cls+patch_mean": torch.cat([cls, patches], 1),
            "cls@last4": torch.cat([t[:, 0] if prefix else t.mean(1) for t in tokens], 1), feature: pool_tokens(last, feature)}


class PixelPatches(nn.Module):
    """The raw-pixel baseline as tokens: each image's non-overlapping ``patch`` x ``patch`` squares, flattened
    (B, T, C * patch * patch), the model's own token grid; one "block", no prefix token."""

    def __init__(self, patch: int):
        super().__init__()
        self.patch = patch

    def forward_intermediates(self, images: torch.Tensor, indices: list[int]) -> list[torch.Tensor]:
        p, (B, C) = self.patch, images.shape[:2]
        tiles = images.unfold(2, p, p).unfold(3, p, p)  # (B, C, H/p, W/p, p, p)
        return [tiles.permute(0, 2, 3, 1, 4, 5).reshape(B, -1, C * p * p)] * len(indices)


@dataclass
class Reader:
    """What a probing input reads: the model itself, the run's random-init encoder or the pixel patches.

    Args:
        model: ``forward_intermediates(images, blocks)``; identity: its name in every cache key (the checkpoint's
            SHA-256, the random-init key, "pixels"); cache: the cache's sub-folder (None: the model's own);
        depth: its blocks; prefix: its tokens before the patch tokens, when known without a forward (pixels: 0).
    """

    model: nn.Module
    identity: str
    cache: str | None
    depth: int
    prefix: int | None = None


@torch.no_grad()
def _extract(ev: Evaluation, split: str, layer: int, writer: TokenWriter | None, prefix: int, reader: Reader) -> tuple:
    dataset, _ = _split(ev, split)
    s = ev.settings
    blocks = [b for b in range(layer - 3, layer + 1) if b >= 0]
    loader = DataLoader(dataset, batch_size=s.batch_size, shuffle=False, num_workers=s.num_workers)
    pooled, labels = {}, []
    for images, y in progress_bar(loader, desc=f"tokens ({split}, block {layer})", disable=not s.progress, leave=False):
        outs = [t.float() for t in reader.model.forward_intermediates(images.to(ev.device), [b % reader.depth for b in blocks])]
        if writer is not None:
            writer.add(outs[-1])
        feats = {"pixels": outs[-1].flatten(1)} if reader.identity == PIXELS else _pooled(outs, prefix, s.feature)
        for k, v in feats.items():
            pooled.setdefault(k, []).append(v.cpu())
        labels.append(torch.as_tensor(y))
    pooled = {k: torch.cat(v) for k, v in pooled.items()}
    if "pixels" in pooled:  # raw pixels: every pooled feature is the whole image, flattened (the pixel kNN's vector)
        pooled = dict.fromkeys([*SWEEP_FEATURES, s.feature], pooled["pixels"])
    return pooled, torch.cat(labels)


def _block(ev: Evaluation, layer: int, split: str, with_tokens: bool, opts: dict, prefix: int, reader: Reader):
    """(pooled, labels, token store or None) of one split at one block, from the cache when it holds them."""
    cache = _cache(ev).sub("probing") if reader.cache is None else _cache(ev).sub(reader.cache).sub("probing")
    _, card = _split(ev, split)
    key = {"format": FORMAT, "checkpoint_sha256": reader.identity, **card, "layer": layer, "feature": ev.settings.feature}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:20]
    pooled_file, token_file = cache.dir / f"{split}-{digest}.pt", cache.dir / f"{split}-{digest}-{opts['token_dtype']}.npy"
    budget = int(opts["token_budget_mb"] * 2**20)
    store = reuse(token_file, {**key, "dtype": opts["token_dtype"]}, budget) if with_tokens else None
    try:
        blob = safe_load(pooled_file, UserError, "damaged") if pooled_file.is_file() else None
    except UserError:  # a damaged cache file is extracted again
        blob = None
    if blob is not None and blob.get("key") == json.dumps(key, sort_keys=True) and (store is not None or not with_tokens):
        return blob["pooled"], blob["labels"], store
    n = len(_split(ev, split)[0])
    writer = TokenWriter(token_file, n, opts["token_dtype"], {**key, "dtype": opts["token_dtype"]}, budget) if with_tokens else None
    pooled, labels = _extract(ev, split, layer, writer, prefix, reader)
    cache.save({"key": json.dumps(key, sort_keys=True), "pooled": pooled, "labels": labels}, pooled_file)  # mkdir too
    return pooled, labels, writer.close() if writer is not None else None


def _geometry(ev: Evaluation, layer: int, reader: Reader | None = None) -> tuple[int, int, int]:
    """(tokens, width, prefix tokens) of one block's output, from the first test image; a model whose block gives a
    pooled vector rather than tokens is refused in one line."""
    reader = reader or _own(ev)
    image = _split(ev, "test")[0][0][0]
    with torch.no_grad():
        out = reader.model.forward_intermediates(image[None].to(ev.device), [layer])[0]
    if out.dim() != 3:
        raise UserError(f"block {layer} of {ev.cfg.model.family} gives a pooled vector {tuple(out.shape)}, not tokens: "
                        "the probing metrics read tokens (B, T, D); measure it with knn / probe instead")
    if reader.prefix is not None:
        return out.shape[1], out.shape[2], reader.prefix
    grid = ev.model.cfg.token_grid
    return out.shape[1], out.shape[2], out.shape[1] - (grid[0] * grid[1] if grid else out.shape[1])


def _own(ev: Evaluation) -> Reader:
    return Reader(ev.model, ev.sha, None, len(ev.model.blocks))


def _inputs(ev: Evaluation, metrics: list, reader: Reader, layers: list, extra: dict):
    """One ``Prepared`` per block of ``layers`` (``(block, shown layer)``), read through ``reader``."""
    opts = split_settings(ev, metrics)
    with_tokens = any(m.name in READS_TOKENS for m in metrics)
    for layer, shown in layers:
        def made(layer=layer) -> ProbingSet:  # lazy: extracted when measured, one block at a time
            prefix = _geometry(ev, layer, reader)[2]
            train, train_y, train_store = _block(ev, layer, "train", with_tokens, opts, prefix, reader)
            test, test_y, test_store = _block(ev, layer, "test", with_tokens, opts, prefix, reader)
            rest, val, how = carve_validation(train_y, opts["val_fraction"], ev.data.subset_seed,
                                              f"{metrics[0].name}.val_fraction")
            pick = lambda feats, rows: {k: v[torch.as_tensor(rows)] for k, v in feats.items()}  # noqa: E731
            pooled = {"train": pick(train, rest), "val": pick(train, val), "test": test, "bank": train}
            labels = {"train": train_y[rest], "val": train_y[val], "test": test_y, "bank": train_y}
            tokens = None
            if with_tokens:
                tokens = {"train": Split(train_store, rest, labels["train"], prefix),
                          "val": Split(train_store, val, labels["val"], prefix),
                          "test": Split(test_store, np.arange(len(test_y)), test_y, prefix)}
            card = {"validation": how, "prefix_tokens": prefix,
                    **({"tokens": {"dtype": opts["token_dtype"], "access": train_store.access,
                                   "shape": list(train_store.shape)}} if with_tokens else {})}
            return ProbingSet(layer, pooled, labels, tokens, ev.settings.feature, card, pixels=reader.identity == PIXELS)

        card = {"train": _split(ev, "train")[1], "test": _split(ev, "test")[1], "norm": "none", **extra}
        yield Prepared(shown, made, card)


def prepare_probing(ev: Evaluation, metrics: list):
    yield from _inputs(ev, metrics, _own(ev), [(layer, layer) for layer in ev.layers], {"checkpoint_sha256": ev.sha})


def baseline_probing(ev: Evaluation, metrics: list, name: str):
    """The same probes on the run's random-init encoder (its blocks) and on the raw pixels as tokens (the model's
    patches, flattened: what an attentive probe reads without any encoder); no pixel tokens for a model without a
    token grid."""
    if name == "random-init":
        model = bl.random_init_model(ev.cfg).to(ev.device)
        reader = Reader(model, bl.random_init_key(ev.cfg), "random-init", len(ev.model.blocks))
        yield from _inputs(ev, metrics, reader, [(layer, layer) for layer in ev.layers], {"init_seed": ev.cfg.train.seed})
        return
    grid = ev.model.cfg.token_grid
    if not grid or ev.img_size % grid[0]:
        return
    patch = ev.img_size // grid[0]
    yield from _inputs(ev, metrics, Reader(PixelPatches(patch), PIXELS, "pixels", 1, prefix=0), [(0, None)],
                       {"pixel_tokens": f"{patch}x{patch} patches of the normalised image, flattened; pooled: the whole image"})


def check_probing(ev: Evaluation, metrics: list) -> None:
    """Before anything is extracted: the shared settings agree, the training split can give a validation split, the
    blocks give tokens, the budget holds one image's, and each metric's own geometry fits the token width."""
    opts = split_settings(ev, metrics)
    dataset, _ = _split(ev, "train")
    carve_validation(torch.as_tensor(dataset_labels(dataset)), opts["val_fraction"], ev.data.subset_seed,
                     f"{metrics[0].name}.val_fraction")
    ms = ev.settings.metric_settings()
    for layer in ev.layers[:1]:
        T, D, _ = _geometry(ev, layer)
        if any(m.name in READS_TOKENS for m in metrics):
            check_budget(int(opts["token_budget_mb"] * 2**20), T * D * (2 if opts["token_dtype"] == "float16" else 4))
        for m in metrics:
            if m.name in READS_TOKENS:
                check_head(m.name, ms.options_of(m.name), D)


def check_head(name: str, o, D: int) -> None:
    """EP's value width must split into its queries; the attentive pooler's heads must divide the width."""
    if name == "ep" and (D % o.d_out or (D // o.d_out) % o.queries):
        raise UserError(f"ep.queries {o.queries} and ep.d_out {o.d_out}: the value width {D} / {o.d_out} must split "
                        f"into {o.queries} equal chunks; choose queries dividing {D // o.d_out if D % o.d_out == 0 else D}")
    if name == "attentive" and o.heads is not None and D % o.heads:
        raise UserError(f"attentive.heads {o.heads} does not divide the token width {D}; choose a divisor of {D}")


SOURCES = (Source(PROBING, prepare=prepare_probing, baseline=baseline_probing, check=check_probing),)
