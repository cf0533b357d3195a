"""``resdecay demo --diffusion``: train a plain and a decayed tiny U-ViT side by side on small data
(Fashion-MNIST if installed, else digits) on a CPU, then sample both, score the samples with a
proxy FID and probe both networks' blocks at several noise levels (paper Table 4 at toy scale).

Plain = alpha 1 without long skips; decayed = alpha_min (default 0.7, Table 4's best) with U-ViT's
long skips and zero-initialised branches. Same seed, data order and budget. Numbers are printed as
measured, whichever way they go.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import torch

from ..errors import UserError
from ..eval.fid import ProxyCNN
from ..train import train
from ..train.config import load_config
from ..viz.online_figures import online_hooks
from ..viz.plots import plot_sample_grids
from .demo import pick_data
from .evaluate import run_eval_diffusion
from .fid import run_fid
from .sample import run_sample

# Sized so both models train, sample and get probed in about 15 minutes on a 2-core CPU.
DEMO_DATA = {
    "fashion-mnist": (["data.train_subset=30000", "train.epochs=4"], 1000, 3000, 2000),
    "digits": (["data.name=digits", "model.img_size=8", "model.patch_size=2", "train.epochs=60"], 500, None, None),
}
SAMPLER, STEPS = "dpm-solver++", 25
LEVELS = (0.0, 0.1, 0.25, 0.5)


def run_diffusion_demo(data: str = "auto", out_dir: str = "runs/demo_diffusion", epochs: int | None = None,
                       alpha_min: float = 0.7, seed: int = 0, progress: bool = True,
                       samples: int | None = None, max_images: int | None = None) -> dict:
    """Train, sample, score and probe a plain and a decayed tiny U-ViT; write ``results.json`` and figures.

    Args:
        data: ``auto`` (Fashion-MNIST when installed, else digits), ``digits`` or ``fashion-mnist``.
        out_dir: folder for both runs, their samples, the probe grids and ``results.json``.
        epochs: training epochs of both models (default: the demo's, per data set).
        alpha_min: alpha of the decayed model's last sub-block.
        seed: training and sampling seed, the same for both models.
        progress: show progress bars.
        samples: images sampled per model for the proxy FID (default 1000 on fashion-mnist, 500 on digits).
        max_images: cap on the training images and on the probe grid's train and test images (quick runs);
            the proxy FID's reference stays the whole training split.

    Returns:
        The report written to ``results.json``.
    """
    if data not in ("auto", *DEMO_DATA):  # the MAE demo's fashion-mnist-m has no diffusion recipe here
        raise UserError(f"--data {data!r} is not a diffusion demo dataset; choose auto, {', '.join(DEMO_DATA)}")
    name = pick_data(data)
    extra, n_samples, max_train, max_test = DEMO_DATA[name]
    if samples is not None:
        # checked before any training: n images give a covariance of rank <= n - 1, so the proxy FID of
        # fewer than dim + 1 samples would be refused only after both models had trained and sampled
        dim = ProxyCNN(1, 1).head.in_features
        if samples <= dim:
            raise UserError(f"--samples {samples} is too few for a proxy FID on {dim}-d features: "
                            f"pass --samples {dim + 1} or more (default {n_samples})")
        n_samples = samples
    if max_images is not None:
        batch = max(load_config(p, list(extra)).train.batch_size for p in ("uvit-tiny-fmnist-plain", "uvit-tiny-fmnist"))
        if max_images < batch:  # the demo has no batch-size knob, so say it here rather than in train()
            raise UserError(f"--max-images {max_images} is fewer than one training batch of the demo: "
                            f"pass --max-images {batch} or more")
        extra = [*extra, f"data.train_subset={max_images}"]  # after the demo's own subset, so it wins
        max_train, max_test = (min(m or max_images, max_images) for m in (max_train, max_test))
    out = Path(out_dir)
    common = [*extra, f"train.seed={seed}", "train.ckpt_every=100000"]
    if epochs is not None:
        common.append(f"train.epochs={epochs}")
    variants = {"plain U-ViT (alpha 1, no skips)": ("uvit-tiny-fmnist-plain", [], "plain"),
                f"U-ViT, alpha_min {alpha_min:g} + skips": ("uvit-tiny-fmnist", [f"alpha_min={alpha_min}"], "decayed")}
    results, t0 = {}, time.time()
    for label, (preset, own, slug) in variants.items():
        cfg = load_config(preset, [*common, *own, f"train.out_dir={out / slug}"])
        print(f"\n=== {label}: preset {preset} ===")
        summary = train(cfg, hooks=online_hooks(), progress=progress, overwrite=True)  # a demo rerun redoes the demo (it says so)
        ck = summary["checkpoint"]
        s = run_sample(ck, n=n_samples, sampler=SAMPLER, steps=STEPS, seed=seed, out=str(out / slug / "samples"), progress=progress)
        f = run_fid(s["npz"], ref=name, proxy=True, ref_out=str(out / f"fid_ref_{name}.pt"), progress=progress)
        g = run_eval_diffusion(ck, out=str(out / slug / "eval_diffusion"), levels=LEVELS, max_train=max_train,
                               max_test=max_test, progress=progress)
        results[label] = {"preset": preset, "run_dir": str(out / slug), "alpha_min": cfg.model.alpha_min, "skips": cfg.model.skips,
                          "alpha_eff": summary["alpha_eff"], "final_loss": summary["final_loss"], "steps": summary["steps"],
                          "train_time_s": summary["train_time_s"], "samples": s, "fid": f, "probe_grid": g}
    grid_png = plot_sample_grids(results, out / "samples_side_by_side.png", f"samples on {name}: {SAMPLER}, {STEPS} steps, EMA weights")
    report = {"demo": {"data": name, "seed": seed, "total_time_s": time.time() - t0, "host": platform.node(),
                       "torch": torch.__version__, "threads": torch.get_num_threads(), "sampler": SAMPLER, "steps": STEPS},
              "results": results, "figures": [str(grid_png)] + [r["probe_grid"]["paths"]["png"] for r in results.values()]}
    (out / "results.json").write_text(json.dumps(report, indent=2, default=str))
    print("\n" + format_table(results, name))
    print(f"\nwrote {out / 'results.json'}, {grid_png.name} and the probe heat maps in {out}/")
    return report


def format_table(results: dict, data_name: str) -> str:
    first = next(iter(results.values()))
    fp = first["fid"]["protocol"]
    gp = first["probe_grid"]["protocol"]
    head = (f"{'model':<34} {'alpha_eff':>9} {'loss':>7} {'time':>6} {'proxy FID':>10} {'best probe cell (block, noise)':>31} "
            f"{'clean, last block':>18}")
    lines = [f"resdecay demo --diffusion on {data_name} | samples: {SAMPLER} {STEPS} steps, {fp['n_samples']} images, EMA | "
             f"{first['fid']['label'].split(' (')[0]} vs {fp['n_ref']} training images ({fp['extractor']}) | probe: fast recipe, "
             f"train {gp['train_images']} -> test {gp['test_images']}, mean tokens, null label", head, "-" * len(head)]
    for label, r in results.items():
        g = r["probe_grid"]
        b = g["best"]
        clean_last = g["top1"][-1][g["levels"].index(0.0)] if 0.0 in g["levels"] else float("nan")
        cell = f"{b['top1']:.3f} ({b['layer']}, {b['level']:g})"
        lines.append(f"{label:<34} {r['alpha_eff']:>9.2g} {r['final_loss']:>7.4f} {r['train_time_s']:>5.0f}s "
                     f"{r['fid']['value']:>10.2f} {cell:>31} {clean_last:>18.3f}")
    return "\n".join(lines)
