"""``resdecay eval --evals segmentation``: the unsupervised-segmentation metric on a checkpoint, and on
the same protocol's raw-pixel and random-init baselines.

Order matters (project rule): the label maps are read and every setting is checked (data with masks,
sizes, class counts, K against the number of tokens, the solver) before any token is extracted. The
tokens are the patch tokens of one encoder block (cls dropped) of the unmasked images in eval mode,
the authors' ``forward_feat`` reading (the last block by default). The raw-pixel baseline runs the same
protocol on the normalised pixels of each patch (the token the patch embedding would read).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from ..data.seg_masks import SEG_FIX, MaskedImages, masked_images
from ..errors import UserError
from ..io import progress_bar
from .metrics import SEGMENTATION, Metric, SegmentationSet, measure, registered
from .protocol import MetricSettings
from .segmentation import SegProtocol


@dataclass
class Segmentation:
    """A checked segmentation evaluation, ready to measure: the metrics, the images and the protocol."""

    metrics: list[Metric]
    masked: MaskedImages
    protocol: SegProtocol
    grid: tuple[int, int]
    keep: dict = field(default_factory=dict)  # per source: cluster maps and embedding, for figures


def selected(evals) -> list[Metric]:
    """The registered segmentation metrics among ``evals``."""
    return [m for m in registered(SEGMENTATION, "eval") if m.name in evals]


def token_grid(model) -> tuple[int, int]:
    """The patch-token grid of a ViT-style encoder; a model without patch tokens is refused."""
    pe = getattr(model, "patch_embed", None)
    grid = getattr(pe, "grid", None)
    if grid is None:
        raise UserError(f"segmentation clusters patch tokens, and a {type(model).__name__} has none; "
                        "evaluate a ViT-style checkpoint (MAE, classifier), or drop segmentation from --evals")
    return (grid, grid) if isinstance(grid, int) else tuple(grid)


def in_channels(model) -> int:
    """The encoder's input channels (3 where it does not say)."""
    cfg = getattr(model, "cfg", None)
    return int(getattr(cfg, "in_chans", getattr(model.patch_embed, "in_chans", 3)))


def prepare(model, data, s, layers: list[int]) -> Segmentation | None:
    """Read the label maps and check every setting, before anything is extracted; None when not asked.

    Args:
        model: the encoder; data: the evaluation's ``DataConfig``; s: the ``EvalSettings``; layers: the blocks.
    """
    metrics = selected(s.evals)
    if not metrics:
        return None
    p = s.metric_settings().options_of("segmentation")  # --seg-* and --metric-option segmentation.*
    p.validate()
    if len(layers) != 1:
        raise UserError("segmentation measures one block: pass --layer N (or -1 for the last), not --layer all")
    grid = token_grid(model)
    name = s.seg_data or data.name
    chans = in_channels(model)
    masked = masked_images(name, data, s.seg_path, int(model.patch_embed.img_size), p.images, p.seed, p.ignore_index,
                           chans)
    name = masked.card["data"]
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
    return Segmentation(metrics, masked, p, grid)


@torch.no_grad()
def patch_tokens(model, images: torch.Tensor, layer: int, batch_size: int, device, progress: bool) -> torch.Tensor:
    """(N, T, D) patch tokens of one block, cls dropped, no masking, eval mode."""
    was = model.training
    model.eval()
    out, t = [], model.patch_embed.num_patches
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


def _card(seg: Segmentation, sha: str | None) -> dict:
    m = seg.masked.card
    card = {"train": {"data": m["data"], "images": 0, "note": "none: the protocol is transductive"}, "test": m,
            "norm": "none"}
    return {**card, "checkpoint_sha256": sha} if sha else card


def _inputs(seg: Segmentation, tokens: torch.Tensor, source: str) -> SegmentationSet:
    keep = seg.keep.setdefault(source, {})
    return SegmentationSet(tokens, seg.grid, seg.masked.labels, seg.masked.classes, seg.protocol, keep,
                           seg.masked.names or None)


def measure_segmentation(seg: Segmentation, model, layer: int, s, ms: MetricSettings, sha: str, device,
                         random_model=None, init_seed: int | None = None) -> tuple[list[dict], list[dict]]:
    """(``results`` rows, ``baselines`` rows) of the segmentation metrics: the model, then raw pixel
    patches and the randomly initialised encoder (``random_model``) under the same protocol."""
    x = seg.masked.images
    tokens = patch_tokens(model, x, layer, s.batch_size, device, s.progress)
    rows = measure(seg.metrics, _inputs(seg, tokens, "model"), ms, _card(seg, sha), layer)[0]
    if not s.baselines:
        return rows, []
    quiet = replace(ms, progress=False)
    base = measure(seg.metrics, _inputs(seg, pixel_patches(x, seg.grid), "pixels"), quiet, _card(seg, None), None, "pixels")[0]
    if random_model is not None:
        rand = patch_tokens(random_model.to(device), x, layer, s.batch_size, device, False)
        card = {**_card(seg, None), "init_seed": init_seed}
        base += measure(seg.metrics, _inputs(seg, rand, "random-init"), quiet, card, layer, "random-init")[0]
    return rows, base


__all__ = ["SEG_FIX", "Segmentation", "measure_segmentation", "patch_tokens", "pixel_patches", "prepare", "selected"]
