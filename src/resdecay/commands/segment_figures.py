"""``resdecay figures CKPT... --segmentation``: the segmentation protocol's figures for several
checkpoints on the same images (plain vs decayed side by side): ``spectral_rgb.png`` (the top 3
components of each model's embedding as RGB, normalised globally over all images) and
``segmentation.png`` (image, ground truth, clusters after Hungarian matching), with ``figures.json``
holding the protocol and each model's mIoU on the images the embedding was fitted on."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from ..data import DataConfig
from ..data.seg_folders import without_absent_classes
from ..data.seg_masks import IGNORE, masked_images
from ..data.subsets import label_map_order
from ..errors import UserError
from ..eval.segmentation.segment import SegProtocol, segment
from ..eval.segmentation.source import patch_tokens, token_grid
from ..io import run_dir_of
from ..nn.shortcut_info import describe_model
from ..train.checkpoint import load_model
from ..viz.segmentation_figures import plot_segmentation, plot_spectral_rgb, spectral_rgb


def shown_images(labels: torch.Tensor, n: int, seed: int) -> torch.Tensor:
    """Sorted indices of ``n`` of these label maps, drawn class-balanced (``subsets.label_map_order``)."""
    present = [np.setdiff1d(lab.unique().numpy(), [IGNORE]) for lab in labels]
    return torch.from_numpy(np.sort(label_map_order(present, seed)[:n]))


def run_segmentation_figures(checkpoints: list[str], out: str, protocol: SegProtocol, data: DataConfig | None = None,
                             seg_data: str | None = None, seg_path: str | None = None, images: int = 8,
                             layer: int = -1, progress: bool = True) -> dict:
    """Both figures; every checkpoint is embedded and clustered on the same ``protocol.images`` images
    (a seeded class-balanced draw) and ``images`` of them, drawn class-balanced from those, are shown.

    Args:
        checkpoints: ViT-style encoder checkpoints; out: the folder; protocol: the segmentation protocol;
        data: the data config (default: the first checkpoint's); seg_data, seg_path: where label maps come
        from (default: that data set); images: how many to draw; layer: the block.
    """
    protocol.validate()
    models = {}
    for c in checkpoints:
        model, cfg = load_model(c)
        models[f"{run_dir_of(Path(c)).name} ({describe_model(cfg.model)})"] = (model, cfg)
    first = next(iter(models.values()))[1]
    if len({(cfg.model.img_size, cfg.model.patch_size) for _, cfg in models.values()}) > 1:
        raise UserError("the checkpoints read different image or patch sizes; the figures need one token grid")
    data = data or replace(first.data, augment="none", train_subset=None)
    grid = token_grid(next(iter(models.values()))[0])
    masked = masked_images(seg_data or data.name, data, seg_path, first.model.img_size, protocol.images, protocol.seed,
                           protocol.ignore_index, first.model.in_chans)
    masked = without_absent_classes(masked, masked.card["data"])  # scored over the classes present, as eval scores them
    k = protocol.k or masked.classes
    if k > len(masked.images) * grid[0] * grid[1]:
        raise UserError(f"--seg-k {k} is more clusters than the tokens of {len(masked.images)} images; lower --seg-k")
    shown = shown_images(masked.labels, images, protocol.seed)
    rgb, preds, scores = {}, {}, {}
    for label, (model, _) in models.items():
        tokens = patch_tokens(model, masked.images, layer, 64, "cpu", progress)
        res = segment(tokens, grid, masked.labels, masked.classes, protocol, progress, masked.names or None)
        rgb[label] = spectral_rgb(res["embedding"], protocol.solver, len(tokens), grid)[shown.numpy()]
        preds[label] = torch.from_numpy(res["mapping"])[res["clusters"][shown]]
        scores[label] = res["values"]
    where = f"{masked.card['data']} {masked.card['split']}, {len(masked.images)} images"
    out_dir = Path(out)
    block = layer % len(next(iter(models.values()))[0].blocks)
    note = (f"{protocol.solver} solver on block {block} patch tokens ({grid[0]}x{grid[1]}), fitted per model over {where}; "
            "RGB = " + ("eigenvectors 1-3 of P" if protocol.solver == "exact" else "top-3 left singular vectors") +
            ", min-max over all images")
    plot_spectral_rgb(masked.images[shown], masked.mean, masked.std, rgb, out_dir / "spectral_rgb.png", note)
    seg_note = (f"K-Means K={k} over all {len(masked.images)} images, clusters matched to classes by Hungarian "
                f"(pixel counts); mIoU " + ", ".join(f"{lbl.split(' ')[0]} {v['miou']:.3f}" for lbl, v in scores.items()))
    plot_segmentation(masked.images[shown], masked.mean, masked.std, masked.labels[shown], preds, masked.classes,
                      out_dir / "segmentation.png", seg_note)
    card = {"figure": "segmentation", "protocol": protocol.card(), "k": k, "data": masked.card, "layer": block,
            "token_grid": list(grid), "drawn": len(shown), "shown": shown.tolist(), "values": scores,
            "paths": [str(out_dir / "spectral_rgb.png"), str(out_dir / "segmentation.png")]}
    (out_dir / "figures.json").write_text(json.dumps({"segmentation": card}, indent=2, default=str))
    for label, v in scores.items():
        print(f"{label}: segmentation mIoU {v['miou']:.4f} (pixel acc {v['pixel_acc']:.4f}; {where}, {protocol.solver}, K={k})")
    print(f"wrote spectral_rgb.png, segmentation.png and figures.json in {out_dir}")
    return card
