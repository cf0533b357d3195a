"""Figures for the experiment trackers during training, as a training hook: at the online
evaluation's epochs (rank 0, when a chosen tracker shows figures), PCA maps of the last block's patch
tokens and, for the MAE, masked reconstructions of the first 8 test images, drawn as
``resdecay figures`` draws them. ``online_hooks()`` is what every command that pretrains passes to
``train``: the online evaluation, then these figures."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from ..data import build_dataset
from ..eval.online_hook import OnlineEvaluation
from ..models import is_diffusion
from ..train.hooks import Hook, is_eval_epoch
from .figures import plot_pca_maps
from .plots import plot_reconstructions, reconstruct


def online_hooks() -> list[Hook]:
    """The hooks of a pretraining run: ``train.online_eval_every``'s evaluation, then its figures
    (in this order, on the one forked RNG of the epoch's end, as every pretraining run has had them)."""
    return [OnlineEvaluation(), OnlineFigures()]


class OnlineFigures(Hook):
    """PCA maps and (MAE) reconstructions to the trackers at every online-evaluation epoch; none for
    the diffusion families (their online evaluation draws samples for a proxy FID; none are kept)."""

    def __init__(self):
        self.cfg, self.shown = None, {}

    def start(self, cfg, device: torch.device) -> None:
        self.cfg = cfg if cfg.train.online_eval_every > 0 and not is_diffusion(cfg.model.family) else None

    def epoch_end(self, model, epoch: int, step: int, log) -> None:
        cfg = self.cfg
        if cfg is None or not is_eval_epoch(epoch, cfg.train) or not getattr(log, "wants_images", False):
            return
        if not self.shown:  # built at the first figure: ranks > 0 and runs without figures never read the images
            test, info = build_dataset(cfg.data, "test", cfg.model.img_size, augment=False)
            self.shown.update(images=torch.stack([test[i][0] for i in range(min(8, len(test)))]), info=info)
        for name, png in online_figures(model, self.shown["images"], self.shown["info"]).items():
            log.log_image(step, name, png)


def online_figures(model, images: torch.Tensor, info) -> dict[str, bytes]:
    """PNG bytes by tracker tag: ``online/pca_maps`` (ViT encoders) and ``online/reconstructions`` (MAE)."""
    figures, training = {}, model.training
    with tempfile.TemporaryDirectory() as tmp:
        if hasattr(model, "patch_embed"):
            plot_pca_maps({"last block": model}, images, info.mean, info.std, Path(tmp) / "pca.png")
            figures["online/pca_maps"] = (Path(tmp) / "pca.png").read_bytes()
        if hasattr(model, "forward_decoder"):
            masked, recon = reconstruct(model, images.to(next(model.parameters()).device), seed=0)
            rows = {"original": images, "masked": masked, "reconstruction": recon}
            plot_reconstructions(images, rows, info.mean, info.std, Path(tmp) / "recon.png")
            figures["online/reconstructions"] = (Path(tmp) / "recon.png").read_bytes()
    model.train(training)  # reconstruct() leaves the model in eval mode; training continues after this hook
    return figures
