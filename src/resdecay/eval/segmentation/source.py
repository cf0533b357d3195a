"""The ``segmentation`` source of ``resdecay eval --evals segmentation``: patch tokens of one block and
the label maps, for the model and for the same protocol's raw-pixel and random-init baselines.

Order matters (project rule): the label maps are read and every setting is checked (data with masks,
sizes, class counts, K against the number of tokens, the solver) in ``check``, before any token is
extracted. The tokens are the patch tokens of one encoder block (cls dropped) of the unmasked images in
eval mode, the authors' ``forward_feat`` reading (the last block by default); the grid is the model
contract's ``cfg.token_grid``. The raw-pixel baseline runs the same protocol on the normalised pixels of
each patch (the token the patch embedding would read).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...data.seg_folders import without_absent_classes
from ...data.seg_masks import SEG_FIX, masked_images
from ...errors import UserError
from ...io import progress_bar
from ..features import baselines as bl
from ..metrics import SEGMENTATION
from ..sources import Evaluation, Prepared, Source

__all__ = ["SEG_FIX", "SegmentationSet", "patch_tokens", "pixel_patches", "token_grid"]


@dataclass
class SegmentationSet:
    """What a ``segmentation`` metric reads: patch tokens (cls dropped) of N images and their label maps.

    Args:
        tokens: (N, T, D), T = grid[0] * grid[1] in raster order; grid: the token grid;
        labels: (N, H, W) class indices, 255 ignored; classes: the number of classes;
        protocol: the segmentation protocol (``eval.segmentation.SegProtocol``);
        keep: where the metric leaves its cluster maps and embedding for figures (None: not kept);
        names: the class names (label i is names[i]; None: unknown).
    """

    tokens: torch.Tensor
    grid: tuple[int, int]
    labels: torch.Tensor
    classes: int
    protocol: Any
    keep: dict | None = None
    names: tuple[str, ...] | None = None


def token_grid(model) -> tuple[int, int]:
    """The patch-token grid of the encoder (the model contract's ``cfg.token_grid``); a model without
    patch tokens is refused."""
    grid = model.cfg.token_grid
    if grid is None:
        raise UserError(f"segmentation clusters patch tokens, and a {type(model).__name__} has none; "
                        "evaluate a ViT-style checkpoint (MAE, classifier), or drop segmentation from --evals")
    return grid


def _check(ev: Evaluation, metrics: list) -> None:
    """Read the label maps and check every setting, before anything is extracted."""
    p = ev.settings.metric_settings().options_of("segmentation")  # --seg-* and --metric-option segmentation.*
    p.validate()
    if len(ev.layers) != 1:
        raise UserError("segmentation measures one block: pass --layer N (or -1 for the last), not --layer all")
    grid, chans = token_grid(ev.model), ev.cfg.model.in_chans
    masked = masked_images(p.data or ev.data.name, ev.data, p.path, ev.cfg.model.img_size, p.images, p.seed,
                           p.ignore_index, chans)
    name = masked.card["data"]
    masked = without_absent_classes(masked, name)  # a folder's already are; a built-in set's few drawn images
    if masked.images.shape[1] != chans:
        raise UserError(f"{name} images have {masked.images.shape[1]} channels but the model reads {chans}; pass "
                        "--seg-data with images of its kind (a folder's images are converted to the model's)")
    k, tokens = p.k or masked.classes, grid[0] * grid[1]
    if k > len(masked.images) * tokens:
        raise UserError(f"--seg-k {k} is more clusters than the {len(masked.images) * tokens} tokens of "
                        f"{len(masked.images)} images; lower --seg-k or raise --seg-images")
    if p.k is not None and p.k < masked.classes:
        raise UserError(f"--seg-k {p.k} is fewer clusters than {name}'s {masked.classes} classes: one-to-one matching "
                        f"would leave classes unmatched; use --seg-k >= {masked.classes} (default: the class count)")
    ev.shared["segmentation"] = dict(masked=masked, protocol=p, grid=grid, keep={})


@torch.no_grad()
def patch_tokens(model, images: torch.Tensor, layer: int, batch_size: int, device, progress: bool) -> torch.Tensor:
    """(N, T, D) patch tokens of one block, cls dropped, no masking, eval mode."""
    was = model.training
    model.eval()
    out, t = [], model.cfg.token_grid[0] * model.cfg.token_grid[1]
    for i in progress_bar(range(0, len(images), batch_size), desc="tokens (segmentation)", disable=not progress,
                          leave=False):
        tokens = model.forward_intermediates(images[i:i + batch_size].to(device), [layer])[0]
        out.append(tokens[:, -t:].float().cpu())  # the patch tokens follow the cls token
    model.train(was)
    return torch.cat(out)


def pixel_patches(images: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(N, T, C*p*p) the normalised pixels under each patch: the raw-pixel baseline's tokens."""
    n, c, h, w = images.shape
    ph, pw = h // grid[0], w // grid[1]
    x = images.reshape(n, c, grid[0], ph, grid[1], pw).permute(0, 2, 4, 1, 3, 5)
    return x.reshape(n, grid[0] * grid[1], c * ph * pw)


def _prepared(ev: Evaluation, tokens: torch.Tensor, source: str, layer: int | None, card: dict) -> Prepared:
    seg = ev.shared["segmentation"]
    m = seg["masked"]
    inputs = SegmentationSet(tokens, seg["grid"], m.labels, m.classes, seg["protocol"], seg["keep"].setdefault(source, {}),
                             m.names or None)
    data = {"train": {"data": m.card["data"], "images": 0, "note": "none: the protocol is transductive"}, "test": m.card,
            "norm": "none"}
    return Prepared(layer, inputs, {**data, **card})


def _prepare(ev: Evaluation, metrics: list):
    s = ev.settings
    tokens = patch_tokens(ev.model, ev.shared["segmentation"]["masked"].images, ev.layers[0], s.batch_size, ev.device,
                          s.progress)
    yield _prepared(ev, tokens, "model", ev.layers[0], {"checkpoint_sha256": ev.sha})


def _baseline(ev: Evaluation, metrics: list, name: str):
    seg = ev.shared["segmentation"]
    x = seg["masked"].images
    if name == "pixels":
        yield _prepared(ev, pixel_patches(x, seg["grid"]), "pixels", None, {})
        return
    random_model = bl.random_init_model(ev.cfg).to(ev.device)
    tokens = patch_tokens(random_model, x, ev.layers[0], ev.settings.batch_size, ev.device, False)
    yield _prepared(ev, tokens, "random-init", ev.layers[0], {"init_seed": ev.cfg.train.seed})


SOURCES = (Source(SEGMENTATION, prepare=_prepare, baseline=_baseline, check=_check, every_rank=False),)  # registered by eval/__init__.py
