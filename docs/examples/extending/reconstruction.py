"""A new input kind in one file: the MAE's own per-patch pixel reconstructions, and a metric on them.

``resdecay eval`` measures frozen features; this plugin adds what the MAE is trained to do. Its source
makes a ``Reconstructions`` input (the decoder's prediction, the normalised pixel target and the mask of
N test images, one seeded mask), and ``recon_mse`` reports the mean squared error on the removed patches:
the pretraining loss, measured on held-out images. ``--evals recon_mse`` then runs it, with its options
(``--metric-option recon_mse.images=64``), its protocol card, the report table and ``compare``, with no edit
to resdecay. A model without a pixel decoder (a classifier) is refused in one line by the source's check.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from resdecay.errors import UserError
from resdecay.eval.inputs import eval_split
from resdecay.eval.metrics import Display, Metric, Result, register_metric
from resdecay.eval.protocol import MetricSettings
from resdecay.eval.sources import Evaluation, Prepared, register_source

KIND = "reconstructions"


@dataclass
class Reconstructions:
    """What a ``reconstructions`` metric reads: (N, T, p*p*C) predictions and targets, (N, T) mask (1 = removed)."""

    pred: torch.Tensor
    target: torch.Tensor
    mask: torch.Tensor


@dataclass(frozen=True)
class ReconOptions:
    images: int = 128  # test images reconstructed
    seed: int = 0  # the masks' seed


def _check(ev: Evaluation, metrics: list) -> None:
    if not hasattr(ev.model, "forward_decoder"):
        raise UserError(f"recon_mse reads an MAE's pixel reconstructions, and a {type(ev.model).__name__} has no "
                        "decoder: evaluate a pretraining checkpoint, or drop recon_mse from --evals")


@torch.no_grad()
def _prepare(ev: Evaluation, metrics: list):
    o = ev.settings.metric_settings().options_of("recon_mse")
    test = eval_split(ev.data, "test", ev.cfg.model.img_size)
    images = torch.stack([test[i][0] for i in range(min(o.images, len(test)))]).to(ev.device)
    torch.manual_seed(o.seed)  # the same masks for every checkpoint
    _, pred, mask = ev.model(images)
    target = ev.model.patchify(images)
    if ev.cfg.model.norm_pix_loss:  # the MAE's target: each patch normalised
        mean, var = target.mean(-1, keepdim=True), target.var(-1, keepdim=True)
        target = (target - mean) / (var + 1e-6) ** 0.5
    test_card = {"data": ev.data.name, "split": "test", "images": len(images)}
    card = {"train": {**test_card, "split": "train", "images": 0, "note": "none: nothing is fitted"}, "test": test_card,
            "split": "test", "mask_seed": o.seed}  # the card every report reads: data, splits, then the metric's own
    yield Prepared(ev.layers[0], Reconstructions(pred[:, -target.shape[1]:].cpu(), target.cpu(), mask.cpu()), card)


def _recon_mse(x: Reconstructions, s: MetricSettings) -> list[Result]:
    per_patch = ((x.pred - x.target) ** 2).mean(-1)  # (N, T)
    mse = float((per_patch * x.mask).sum() / x.mask.sum())
    return [Result("pixels", {"mse": mse})]


register_source(KIND, prepare=_prepare, check=_check)
RECON_MSE = register_metric(Metric(
    name="recon_mse", compute=_recon_mse, headline="mse", higher_is_better=False, applies_to=KIND,
    where=frozenset({"eval"}), options=ReconOptions(),
    protocol=lambda s: {"images": s.options_of("recon_mse").images, "target": "the MAE's pixel target"},
    display=Display("reconstruction MSE", describe=lambda p: f"{p['images']} test images, removed patches")))
