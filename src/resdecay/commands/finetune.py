"""``resdecay finetune --from SOURCE --preset finetune-mae|linprobe-mae``: MAE's supervised
protocols on a pretrained (decayed) encoder, through the one training loop.

SOURCE is a resdecay MAE checkpoint or run folder, or, imported in memory in the same step with
``import-weights``' own conversion (``interop.import_weights.load_pretrained``), any source of the
import-format registry: an official facebookresearch/mae checkpoint, the authors' U-Net MAE, a timm ViT,
a Hugging Face ViTMAE folder or a plugin's; the format is detected (or given with ``--format``), and what
was imported from where (path, format, sha256) goes into summary.json and eval.json.

The classifier is rebuilt from the pretrained config (alpha_min and schedule included), its
encoder weights are loaded on a fresh start, and the run trains, checkpoints and resumes like any
other. As MAE's main_finetune.py, the test split is measured every ``train.online_eval_every``
epochs and at the last (split across torchrun ranks; ``eval.classifier_eval.EpochEval``), the best
epoch's weights kept as ``checkpoints/best.pt``; the final numbers are written as ``eval.json``
with the protocol card, so ``resdecay compare`` can put runs side by side.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from ..data import build_dataset
from ..errors import CheckpointError, ConfigError
from ..eval.classifier_eval import BEST, EpochEval, best_in_log, evaluate_classifier
from ..interop.import_weights import Pretrained, load_pretrained
from ..io import atomic_write_text, file_sha256, run_dir_of
from ..train import train
from ..train.config import _read_preset, from_dict, parse_overrides
from ..train.distributed import is_main_process
from ..train.run.summary import write_summary


def build_config(checkpoint: str | Path | Pretrained, preset: str, overrides: list[str]):
    """The classifier run config: the recipe preset, the pretrained encoder and data, overrides.
    Returns (RunConfig, the pretrained checkpoint's state)."""
    pretrained = checkpoint if isinstance(checkpoint, Pretrained) else load_pretrained(checkpoint, "resdecay")
    state, path = pretrained.state, pretrained.path
    pre = from_dict(state["config"])
    if pre.model.family != "mae":
        raise CheckpointError(f"{path} holds a {pre.model.family!r} model; finetune needs an MAE pretraining checkpoint")
    raw = _read_preset(preset)
    if (raw.get("model") or {}).get("family") != "classifier":
        raise ConfigError(f"preset {preset!r} is not a fine-tuning recipe; use finetune-mae or linprobe-mae")
    overridden = parse_overrides(overrides, "classifier")
    # the overrides win here too: a foreign file's config states no data.path, so DIR may come only from them
    data = {**dataclasses.asdict(pre.data), "train_subset": None, **(raw.get("data") or {}), **overridden.get("data", {})}
    _, info = build_dataset(from_dict({"data": data}).data, "test", pre.model.img_size, augment=False)
    raw["model"] = {**raw["model"], "encoder": dataclasses.asdict(pre.model), "num_classes": info.num_classes,
                    "pretrained": str(path)}
    raw["data"] = data
    # beside the pretrained model: a checkpoint's run folder (or a weights file's folder), or inside a source folder
    home = path if path.is_dir() else run_dir_of(path)
    raw.setdefault("train", {})["out_dir"] = str(home / preset)
    for section, values in overridden.items():
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


def run_finetune(checkpoint: str, preset: str = "finetune-mae", overrides: list[str] | None = None,
                 resume: str | None = None, progress: bool = True, overwrite: bool = False, allow_changes: bool = False,
                 fmt: str | None = None, import_preset: str | None = None, alpha_min: float | None = None,
                 import_overrides: list[str] | None = None) -> dict:
    pretrained = load_pretrained(checkpoint, fmt, import_preset, alpha_min, import_overrides)
    cfg, state = build_config(pretrained, preset, overrides or [])
    evaluation = EpochEval()  # test accuracy every train.online_eval_every epochs
    summary = train(cfg, hooks=[evaluation], resume=resume, progress=progress, init=encoder_loader(state),
                    overwrite=overwrite, allow_changes=allow_changes)
    if not is_main_process():  # other torchrun ranks only helped train and evaluate
        return summary
    out = Path(summary["out_dir"])
    last = evaluation.last
    if last is None or last["step"] != summary["steps"]:  # no evaluation at the last step: measure the final weights
        report = evaluate_classifier(summary["checkpoint"], "test", device=cfg.train.device, progress=progress)
        last = {**report["values"], "images": report["protocol"]["images"], "protocol": report["protocol"]}
    values = {"top1": last["top1"], "top5": last["top5"]}
    best = best_in_log(out)
    record = pretrained.record()
    if not summary.get("already_finished"):  # a finished run's summary is left as it was
        summary = {**summary, "pretrained": record, "final_top1": values["top1"], "final_top5": values["top5"],
                   "eval_protocol": last["protocol"]}
        if best is not None:
            summary.update(best_top1=best["top1"], best_top5=best["top5"], best_epoch=best["epoch"], best_step=best["step"],
                           best_checkpoint=str(out / "checkpoints" / BEST))
        write_summary(out, summary)
    write_report(cfg, preset, pretrained, record, summary, values, last, best)
    return {**summary, **values}


def write_report(cfg, preset: str, pretrained: Pretrained, record: dict, summary: dict, values: dict, last: dict,
                 best: dict | None) -> None:
    """``<run>/eval.json`` (the protocol card ``resdecay compare`` reads) and the closing line."""
    m, t, n_test = cfg.model, cfg.train, last["images"]
    card = {"recipe": preset, "pretrained": record["path"], "pretrained_format": record["format"],
            "pretrained_sha256": record["sha256"], "pretrained_step": pretrained.state["train_state"]["step"],
            "data": cfg.data.name, "train_images": summary.get("images"), "test_images": n_test, "test_augmentation": "none",
            "train_augmentation": cfg.data.augment, "head": m.head, "pool": m.pool, "freeze_encoder": m.freeze_encoder,
            "drop_path": m.drop_path, "layer_decay": m.layer_decay, "mixup": m.mixup, "cutmix": m.cutmix,
            "label_smoothing": m.label_smoothing, "optimizer": t.optimizer, "epochs": t.epochs,
            "warmup_epochs": t.warmup_epochs, "effective_batch": summary.get("effective_batch"), "base_lr": t.base_lr,
            "lr": summary.get("lr"), "weight_decay": t.weight_decay, "seed": t.seed, "eval": last["protocol"]}
    metric = "linprobe" if m.freeze_encoder else "finetune"
    report = {"resdecay_eval": 1, "checkpoint": summary["checkpoint"], "checkpoint_sha256": file_sha256(Path(summary["checkpoint"])),
              "step": summary["steps"], "preset": preset,
              "label": f"{metric} of {run_dir_of(pretrained.path).name if pretrained.native else pretrained.path.name} "
                       f"(alpha_min {m.alpha_min:g})",
              "model": dataclasses.asdict(m), "results": [{"metric": metric, "layer": m.depth - 1, "feature": m.pool,
                                                           "values": values, "protocol": card}]}
    if best is not None:
        report["best"] = {**best, "checkpoint": str(Path(summary["out_dir"]) / "checkpoints" / BEST)}
    out = Path(summary["out_dir"])
    atomic_write_text(out / "eval.json", json.dumps(report, indent=2))
    best_text = f"; best top-1 {best['top1']:.4f} at epoch {best['epoch']} (checkpoints/{BEST})" if best else ""
    print(f"{metric}: test top-1 {values['top1']:.4f}, top-5 {values['top5']:.4f} on {n_test} {cfg.data.name} test images "
          f"({preset}, {t.epochs} epochs){best_text}; wrote {out / 'eval.json'}")
