"""``resdecay pretrain``: train a preset; and ``train_with_online_eval``, the one training loop
(``resdecay.train.train``) with the online evaluators attached, which every command that trains
goes through (the train layer cannot import ``eval/`` itself)."""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch
import yaml

from ..data import build_dataset
from ..eval.online import online_evaluator
from ..models import is_diffusion
from ..train.distributed import is_main_process
from ..viz.figures import plot_pca_maps
from ..viz.plots import plot_reconstructions, reconstruct
from .check_data import check_data
from ..train import train
from ..train.config import RunConfig, load_config


def train_with_online_eval(cfg: RunConfig, resume: str | None = None, progress: bool = True, on_epoch_end=None,
                           init=None, overwrite: bool = False, allow_changes: bool = False) -> dict:
    """``resdecay.train.train`` with ``train.online_eval_every`` served by ``eval.online``."""
    return train(cfg, resume=resume, progress=progress, on_epoch_end=on_epoch_end, init=init,
                 online_eval=online_evaluator_with_figures, overwrite=overwrite, allow_changes=allow_changes)


def online_evaluator_with_figures(cfg: RunConfig, device: torch.device):
    """``eval.online``'s evaluator and, at the same epochs, figures for the experiment trackers
    (rank 0, when a chosen tracker shows figures): PCA maps of the last block's patch tokens and,
    for the MAE, masked reconstructions, of the first 8 test images (as ``resdecay figures`` draws them)."""
    evaluate, shown = online_evaluator(cfg, device), {}
    if is_diffusion(cfg.model.family):  # its online evaluation draws samples for a proxy FID; none are kept
        return evaluate

    def hook(model, epoch: int, step: int, log) -> None:
        evaluate(model, epoch, step, log)
        done = epoch + 1
        if (done % cfg.train.online_eval_every and done != cfg.train.epochs) or not getattr(log, "wants_images", False):
            return
        if not shown:  # built at the first figure: ranks > 0 and runs without figures never read the images
            test, info = build_dataset(cfg.data, "test", cfg.model.img_size, augment=False)
            shown.update(images=torch.stack([test[i][0] for i in range(min(8, len(test)))]), info=info)
        for name, png in online_figures(model, shown["images"], shown["info"]).items():
            log.log_image(step, name, png)

    return hook


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


def run_pretrain(preset: str, overrides: list[str], resume: str | None = None, print_config: bool = False,
                 progress: bool = True, check: bool = False, overwrite: bool = False,
                 allow_changes: bool = False) -> dict | None:
    cfg = load_config(preset, overrides)
    if print_config:
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        return None
    if check and is_main_process():  # every unreadable file at once, before hours of training
        check_data(cfg.data, cfg.model.img_size, progress=progress, stop=cfg.data.on_bad_file == "stop")
    summary = train_with_online_eval(cfg, resume=resume, progress=progress, overwrite=overwrite, allow_changes=allow_changes)
    # the loop wrote summary.json (rank 0); one "done" line, from rank 0, for a run that trained now
    if is_main_process() and summary.get("checkpoint") and not summary.get("already_finished"):
        print(f"done: {summary['steps']} steps, final loss {summary['final_loss']:.4f} (last log window), "
              f"{summary['train_time_s']:.0f}s; checkpoint {summary['checkpoint']}")
    return summary
