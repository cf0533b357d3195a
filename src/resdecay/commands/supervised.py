"""``resdecay train-supervised``: supervised ResNets with decayed shortcuts (paper appendix B.2).

Trains through the one loop, then measures the final checkpoint on the test split: top-1/top-5
accuracy and the effective rank (paper eq. 6) of the penultimate, globally pooled features, both
written to ``eval.json`` with their protocol. ``train.online_eval_every=N`` logs the rank (and
kNN / probe) over epochs for ``resdecay plot``; a grid over ``model.layers`` and
``model.alpha_min`` (grids/figure7-toy.yaml) gives Figure 7's rank against depth.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from ..data import build_dataset
from ..errors import ConfigError
from ..eval.classifier_eval import test_accuracy
from ..eval.features.extract import extract_block_features
from ..eval.features.rank import effective_rank
from ..eval.metrics import result_row
from ..eval.protocol import RANK_FORMS
from ..io import file_sha256
from ..nn.decayify import alphas_of
from ..train import train
from ..train.checkpoint import load_model
from ..train.config import load_config
from ..train.distributed import is_main_process, resolve_device
from ..viz.online_figures import online_hooks


def run_supervised(preset: str, overrides: list[str] | None = None, resume: str | None = None, progress: bool = True,
                   overwrite: bool = False, allow_changes: bool = False) -> dict:
    cfg = load_config(preset, overrides or [])
    if cfg.model.family != "resnet":
        raise ConfigError(f"preset {preset!r} is a {cfg.model.family!r} model; train-supervised takes resnet presets")
    summary = train(cfg, hooks=online_hooks(), resume=resume, progress=progress, overwrite=overwrite,
                    allow_changes=allow_changes)
    if not is_main_process():  # other torchrun ranks only helped train
        return summary
    device = resolve_device(cfg.train.device)
    values, n_test = test_accuracy(Path(summary["checkpoint"]), device, progress=progress)
    model, _ = load_model(summary["checkpoint"], device)
    test, _ = build_dataset(cfg.data, "test", cfg.model.img_size, augment=False)
    feats, _ = extract_block_features(model, test, pools=("mean",), device=device, progress=progress)
    rank = effective_rank(feats[(-1, "mean")])
    m, t = cfg.model, cfg.train
    card = {"data": cfg.data.name, "train_images": summary["images"], "test_images": n_test, "test_augmentation": "none",
            "train_augmentation": cfg.data.augment, "layers": m.layers, "width": m.width, "alpha_min": m.alpha_min,
            "schedule": m.schedule, "zero_init": m.zero_init, "optimizer": t.optimizer, "epochs": t.epochs,
            "effective_batch": summary["effective_batch"], "lr": summary["lr"], "weight_decay": t.weight_decay, "seed": t.seed}
    rank_card = {**card, "feature": "global-average-pooled output of the last block (the classifier's input)",
                 "form": RANK_FORMS[False], "split": "test"}
    layer = m.depth - 1
    report = {"resdecay_eval": 1, "checkpoint": summary["checkpoint"], "checkpoint_sha256": file_sha256(Path(summary["checkpoint"])),
              "step": summary["steps"], "preset": preset, "label": f"{preset} (alpha_min {m.alpha_min:g}, {m.depth} blocks)",
              "model": dataclasses.asdict(m), "alphas": {name: list(a) for name, a in alphas_of(model)},
              "results": [result_row("supervised", layer, "pooled", values, card),
                          result_row("rank", layer, "pooled", {"effective_rank": rank}, rank_card)]}
    out = Path(summary["out_dir"])
    (out / "eval.json").write_text(json.dumps(report, indent=2))
    print(f"supervised: test top-1 {values['top1']:.4f}, top-5 {values['top5']:.4f}, effective rank {rank:.3f} (eq. 6, "
          f"pooled features) on {n_test} {cfg.data.name} test images; wrote {out / 'eval.json'}")
    return {**summary, **values, "effective_rank": rank}
