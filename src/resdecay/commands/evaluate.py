"""``resdecay eval``, ``compare`` and ``eval-diffusion``: measure checkpoints and write the
reports (JSON with protocol cards, PNG profiles, heat maps)."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist
from torch.utils.data import Subset

from ..data import build_dataset
from ..errors import UserError
from ..eval.compare import compare_reports, format_comparison, load_report
from ..eval.diffusion_probe import FAST_RECIPE, NOISE_LEVELS, probe_grid
from ..eval.suite import EvalSettings, evaluate_checkpoint, format_report
from ..io import run_dir_of
from ..models import is_diffusion
from ..train import distributed as D
from ..train.checkpoint import load_checkpoint, load_model
from ..train.distributed import resolve_device
from ..viz.plots import plot_bars, plot_grid, plot_profile


def run_eval(checkpoints: list[str], settings: EvalSettings, out: str | None = None) -> dict:
    """Evaluate each checkpoint, write ``eval.json`` (or ``profile.json`` + PNG with ``layer="all"``)
    and, for several profiles, an overlay. Under torchrun every rank extracts, rank 0 reports."""
    layer = settings.layer
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    env = D.setup("cpu" if settings.device == "cpu" else "auto") if distributed else None
    profiles, reports = {}, {}
    for ckpt in checkpoints:
        report = evaluate_checkpoint(ckpt, settings)
        if report is None:  # a non-zero torchrun rank: it only helped extract features
            continue
        folder = Path(out) / run_dir_of(Path(ckpt)).name if out else run_dir_of(Path(ckpt)) / "eval"
        folder.mkdir(parents=True, exist_ok=True)
        name = "profile" if layer == "all" else "eval"
        (folder / f"{name}.json").write_text(json.dumps(report, indent=2))
        print(format_report(report))
        if layer == "all":
            profiles[report["label"]] = report["profile"]
            plot_profile({report["label"]: report["profile"]}, folder / "profile.png")
        hits = report["cache"]
        print(f"wrote {folder / (name + '.json')} (feature cache: train {'hit' if hits['train_hit'] else 'new'}, "
              f"test {'hit' if hits['test_hit'] else 'new'}, in {hits['dir']})\n")
        reports[str(ckpt)] = report
    if len(profiles) > 1:
        path = plot_profile(profiles, Path(out or "runs/eval") / "profile_overlay.png",
                            note=f"feature {settings.feature}; kNN k={settings.knn_k}, T={settings.knn_temperature}; "
                                 "fast probe; ranks on test split")
        print(f"overlay: {path}")
    if env is not None and dist.is_initialized():
        D.cleanup(env)
    return reports


def run_compare(runs: list[str], out: str, force: bool = False) -> dict:
    """Runs side by side: a table, ``compare.json`` and a bar PNG; unlike protocols are refused
    unless ``force``."""
    if len(runs) < 2:
        raise UserError("compare needs at least two runs or eval.json files")
    reports = [load_report(r) for r in runs]
    labels = [rep.get("label", Path(r).name) for rep, r in zip(reports, runs)]
    if len(set(labels)) < len(labels):
        labels = [f"{lab} [{i}]" for i, lab in enumerate(labels)]
    result = compare_reports(reports, labels, force=force)
    print(format_comparison(result, labels))
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "compare.json").write_text(json.dumps({"runs": dict(zip(labels, [r["_source"] for r in reports])), **result}, indent=2))
    png = plot_bars(result["rows"], folder / "compare.png",
                    "resdecay compare (* = protocols differ)" if result["differences"] else "resdecay compare")
    print(f"wrote {folder / 'compare.json'} and {png}")
    return result


def format_grid(r: dict) -> str:
    """The probe grid as a table, with its protocol line and the best cell."""
    p = r["protocol"]
    head = (f"diffusion probe grid | {p['checkpoint']} (step {p['step']}, {p['weights']} weights) | {p['data']} "
            f"train {p['train_images']} -> test {p['test_images']} | fast probe, mean tokens, null label")
    lines = [head, "block  " + "".join(f"{f'noise {lv:g}':>12}" for lv in r["levels"])]
    for layer, row in zip(r["layers"], r["top1"]):
        lines.append(f"{layer:>5}  " + "".join(f"{v:>12.4f}" for v in row))
    b = r["best"]
    lines.append(f"best cell: block {b['layer']}, noise level {b['level']:g}, top-1 {b['top1']:.4f}")
    return "\n".join(lines)


def run_eval_diffusion(checkpoint: str, data=None, out: str | None = None, layers: list[int] | None = None,
                       levels: tuple[float, ...] = NOISE_LEVELS, max_train: int | None = None,
                       max_test: int | None = None, device: str = "auto", batch_size: int = 256,
                       progress: bool = True) -> dict:
    """``resdecay eval-diffusion``: the probe grid of one checkpoint (EMA weights where kept)."""
    dev = resolve_device(device, "--device")
    state = load_checkpoint(checkpoint)
    model, cfg = load_model(checkpoint, dev, ema=True, state=state)
    if not is_diffusion(cfg.model.family):
        raise UserError(f"{checkpoint} is a {cfg.model.family} model; eval-diffusion probes diffusion models "
                        "(uvit, sit); use `resdecay eval` for encoders")
    data_cfg = replace(data or cfg.data, train_subset=None)
    train_set, _ = build_dataset(data_cfg, "train", cfg.model.img_size, augment=False)
    test_set, _ = build_dataset(data_cfg, "test", cfg.model.img_size, augment=False)
    if max_train:
        train_set = Subset(train_set, range(min(max_train, len(train_set))))
    if max_test:
        test_set = Subset(test_set, range(min(max_test, len(test_set))))
    result = probe_grid(model, train_set, test_set, layers, levels, dev, batch_size, progress)
    step = int(state["train_state"]["step"])
    result["protocol"] = {"checkpoint": str(checkpoint), "step": step, "weights": "EMA" if cfg.train.ema_decay > 0 else "raw",
                          "data": data_cfg.name, "train_images": len(train_set), "test_images": len(test_set),
                          "feature": "mean of all tokens of the block output", "probe": FAST_RECIPE.card(),
                          "noise": f"{cfg.model.objective}: level = fraction of the diffusion time (0 clean, 1 pure noise), "
                                   "one seeded noise draw per image", "labels": "null label (no class leak)"}
    out_dir = Path(out) if out else run_dir_of(Path(checkpoint)) / "eval_diffusion"
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "probe_grid.json").write_text(json.dumps(result, indent=2))
    plot_grid(result, out_dir / "probe_grid.png", f"{cfg.preset} (alpha_min {cfg.model.alpha_min:g}), step {step}")
    result["paths"] = {"json": str(out_dir / "probe_grid.json"), "png": str(out_dir / "probe_grid.png")}
    return result
