"""``resdecay finetune CHECKPOINT --preset finetune-mae|linprobe-mae``: MAE's supervised
protocols on a pretrained (decayed) encoder, through the one training loop.

The classifier is rebuilt from the checkpoint's own config (alpha_min and schedule included),
its encoder weights are loaded on a fresh start, and the run trains, checkpoints and resumes like
any other. At the end the final weights are measured on the test split (no augmentation) and
written as ``eval.json`` with the protocol card, so ``resdecay compare`` can put runs side by side.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from torch.utils.data import DataLoader
from ..io import progress_bar

from ..train.checkpoint import load_checkpoint, load_model
from ..train.config import _read_preset, from_dict, parse_overrides
from ..data import build_dataset
from ..train.distributed import resolve_device
from ..errors import CheckpointError, ConfigError
from ..eval.knn import topk_accuracy
from ..io import file_sha256, run_dir_of
from ..train.distributed import is_main_process
from .pretrain import train_with_online_eval


def build_config(checkpoint: Path, preset: str, overrides: list[str]):
    """The classifier run config: the recipe preset, the checkpoint's encoder and data, overrides."""
    state = load_checkpoint(checkpoint)
    pre = from_dict(state["config"])
    if pre.model.family != "mae":
        raise CheckpointError(f"{checkpoint} holds a {pre.model.family!r} model; finetune needs an MAE pretraining checkpoint")
    raw = _read_preset(preset)
    if (raw.get("model") or {}).get("family") != "classifier":
        raise ConfigError(f"preset {preset!r} is not a fine-tuning recipe; use finetune-mae or linprobe-mae")
    data = {**dataclasses.asdict(pre.data), "train_subset": None, **(raw.get("data") or {})}
    _, info = build_dataset(pre.data, "test", pre.model.img_size, augment=False)
    raw["model"] = {**raw["model"], "encoder": dataclasses.asdict(pre.model), "num_classes": info.num_classes,
                    "pretrained": str(checkpoint)}
    raw["data"] = data
    raw.setdefault("train", {})["out_dir"] = str(run_dir_of(checkpoint) / preset)
    for section, values in parse_overrides(overrides, "classifier").items():
        raw.setdefault(section, {}).update(values)
    return from_dict(raw, preset=preset), state


def encoder_loader(state: dict):
    """``init`` for the trainer: copy the pretrained encoder into a fresh classifier."""

    def init(model: torch.nn.Module) -> None:
        weights = {k: v for k, v in state["model"].items() if k in model.state_dict()}
        missing, _ = model.load_state_dict(weights, strict=False)
        unexpected_missing = [k for k in missing if not k.startswith(("head", "fc_norm"))]
        if unexpected_missing:
            raise CheckpointError(f"the checkpoint lacks encoder weights {unexpected_missing[:3]}; is it an MAE checkpoint?")

    return init


@torch.no_grad()
def test_accuracy(checkpoint: Path, device: torch.device, batch_size: int = 256, progress: bool = True) -> tuple[dict, int]:
    model, cfg = load_model(checkpoint, device)
    dataset, _ = build_dataset(cfg.data, "test", cfg.model.img_size, augment=False)
    scores, labels = [], []
    for images, y in progress_bar(DataLoader(dataset, batch_size=batch_size), desc="test", disable=not progress, leave=False):
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            scores.append(model(images.to(device)).float().cpu())
        labels.append(torch.as_tensor(y))
    return topk_accuracy(torch.cat(scores), torch.cat(labels), (1, 5)), len(dataset)


def run_finetune(checkpoint: str, preset: str = "finetune-mae", overrides: list[str] | None = None,
                 resume: str | None = None, progress: bool = True, overwrite: bool = False, allow_changes: bool = False) -> dict:
    checkpoint = Path(checkpoint)
    cfg, state = build_config(checkpoint, preset, overrides or [])
    summary = train_with_online_eval(cfg, resume=resume, progress=progress, init=encoder_loader(state), overwrite=overwrite,
                    allow_changes=allow_changes)
    if not is_main_process():  # other torchrun ranks only helped train
        return summary
    device = resolve_device(cfg.train.device)
    values, n_test = test_accuracy(Path(summary["checkpoint"]), device, progress=progress)
    m, t = cfg.model, cfg.train
    card = {"recipe": preset, "pretrained": str(checkpoint), "pretrained_sha256": file_sha256(checkpoint),
            "pretrained_step": state["train_state"]["step"], "data": cfg.data.name, "train_images": summary.get("images"),
            "test_images": n_test, "test_augmentation": "none", "train_augmentation": cfg.data.augment,
            "head": m.head, "pool": m.pool, "freeze_encoder": m.freeze_encoder, "drop_path": m.drop_path,
            "layer_decay": m.layer_decay, "mixup": m.mixup, "cutmix": m.cutmix, "label_smoothing": m.label_smoothing,
            "optimizer": t.optimizer, "epochs": t.epochs, "warmup_epochs": t.warmup_epochs, "effective_batch": summary.get("effective_batch"),
            "base_lr": t.base_lr, "lr": summary.get("lr"), "weight_decay": t.weight_decay, "seed": t.seed}
    metric = "linprobe" if m.freeze_encoder else "finetune"
    report = {"resdecay_eval": 1, "checkpoint": summary["checkpoint"], "checkpoint_sha256": file_sha256(Path(summary["checkpoint"])),
              "step": summary["steps"], "preset": preset,
              "label": f"{metric} of {Path(run_dir_of(checkpoint)).name} (alpha_min {m.alpha_min:g})",
              "model": dataclasses.asdict(m), "results": [{"metric": metric, "layer": m.depth - 1, "feature": m.pool,
                                                           "values": values, "protocol": card}]}
    out = Path(summary["out_dir"])
    (out / "eval.json").write_text(json.dumps(report, indent=2))
    print(f"{metric}: test top-1 {values['top1']:.4f}, top-5 {values['top5']:.4f} on {n_test} {cfg.data.name} test images "
          f"({preset}, {t.epochs} epochs); wrote {out / 'eval.json'}")
    return {**summary, **values}
