"""Do the residual-stream diagnostics of a *plain* MAE predict whether decaying its shortcuts helps?

For each where-map nuisance level (docs/results/where-map: clean, bg, bg-colour, bg-colour-scale, all) and seed 0, 1,
the plain MAE trained by train_plain.sh (the where-map's plain recipe, stopped at step 300 of its 32-epoch schedule)
is diagnosed on its level's data (1,000 test / 1,000 train images, class-balanced, knock-out on 256), and each
diagnostic is set against the gain of decaying measured by the where-map at 32 epochs, for the same level and seed:
Δ = (alpha_min 0.8) − (plain), kNN and linear probe, full protocol (eval.json of the where-map runs).

The candidates are fixed here, before any number is seen, all at the last encoder block (the feature kNN and the probe
read): the direct path's share of the stream, its share of the variance across images, the pixel R^2 and the
high-frequency R^2 of the tokens. The raw-pixel kNN of each level's data (the where-map's pixel baseline) is shown beside
them as the reference a diagnostic must beat: it is a property of the data alone.

Tests, for each candidate and each Δ: Spearman's rank correlation over the 10 (level, seed) points and over the 5 level
means; whether one threshold separates the levels where the mean Δ is positive from those where it is negative (in
sample); and the leave-one-level-out version, which is the honest one: the threshold is placed at the midpoint of the
largest gap that separates the 4 other levels' signs (the direction chosen on them), and the held-out level's sign is
predicted; nothing is tuned on the held-out level.

Usage: predict.py [RUNS] (default <repo>/runs/diagnostics-predict); writes predict.json, predict.md, predict.png here.
LEVELS, SEEDS and STEP (environment) as train_plain.sh's.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
WHERE = ROOT / "docs" / "results" / "where-map"
LEVELS = tuple(os.environ.get("LEVELS", "clean bg bg-colour bg-colour-scale all").split())  # as train_plain.sh
SEEDS = tuple(int(s) for s in os.environ.get("SEEDS", "0 1").split())
STEP = int(os.environ.get("STEP", "300"))
CANDIDATES = {  # name -> (report part, key); the last block
    "direct share": ("paths", "direct_projection"),
    "direct share (variance)": ("paths", "direct_projection_centred"),
    "pixel R2": ("pixels", "r2_pixels"),
    "high-freq R2": ("pixels", "r2_high_freq"),
}
OUTCOMES = ("kNN", "probe")


def measured_delta(level: str, seed: int) -> dict:
    """Δ kNN / Δ probe of alpha 0.8 over plain at 32 epochs, full protocol, from the where-map's eval.json."""
    def top1(variant, metric):
        rows = json.loads((WHERE / level / f"seed{seed}" / variant / "eval.json").read_text())["results"]
        return next(r["values"]["top1"] for r in rows if r["metric"] == metric and r["feature"] == "mean")
    return {m: top1("alpha-0-8", m.lower()) - top1("plain-mae", m.lower()) for m in OUTCOMES}


def same_run_check(run: Path, level: str, seed: int) -> float:
    """The largest |loss difference| at the logged steps both runs have, against the where-map's plain run of the
    same level and seed. Not 0: the where-map runs (2026-11-25) trained on the *first* 20,000 images; today's
    data.train_subset draws a class-balanced 20,000 (data.subset_seed), so these are the same recipe, level and seed
    on another 20,000 images of the same distribution, not the where-map checkpoints themselves."""
    def losses(path):
        out = {}
        for line in path.read_text().splitlines():
            row = json.loads(line)
            if "loss" in row:
                out[row["step"]] = row["loss"]
        return out
    if not (run / "log.jsonl").is_file():
        return float("nan")
    ours, theirs = losses(run / "log.jsonl"), losses(WHERE / level / f"seed{seed}" / "plain-mae" / "log.jsonl")
    common = [s for s in ours if s in theirs and s <= STEP]
    return max(abs(ours[s] - theirs[s]) for s in common) if common else float("nan")


def diagnose_run(ckpt: Path) -> dict:
    from resdecay.eval.diagnostics.source import DiagnosticsOptions, diagnose_data
    from resdecay.train.checkpoint import load_model

    model, cfg = load_model(ckpt)
    data = replace(cfg.data, augment="none", train_subset=None)
    options = DiagnosticsOptions(images=1000, train_images=1000, knockout_images=256, pixel_patches=64)
    report, n_test, n_train = diagnose_data(model, data, cfg.model.img_size, options)
    return {"report": report, "test_images": n_test, "train_images": n_train}


def threshold_rule(x: np.ndarray, positive: np.ndarray) -> tuple[float, int, int] | None:
    """(threshold, direction, errors): the midpoint of the widest gap between sorted values that best separates the
    positive from the negative levels (direction +1: above the threshold predicts a gain)."""
    order = np.argsort(x)
    best = None
    for cut in range(len(x) + 1):
        lo, hi = x[order[:cut]], x[order[cut:]]
        t = (lo.max() + hi.min()) / 2 if cut and cut < len(x) else (x.min() - 1 if cut == 0 else x.max() + 1)
        gap = hi.min() - lo.max() if cut and cut < len(x) else 0.0
        for d in (1, -1):
            pred = (x > t) if d == 1 else (x < t)
            errors = int((pred != positive).sum())
            key = (errors, -gap)
            if best is None or key < best[0]:
                best = (key, (float(t), d, errors))
    return best[1]


def analyse(points: list[dict]) -> dict:
    out = {}
    names = [*CANDIDATES, "raw-pixel kNN (data)"]
    for outcome in OUTCOMES:
        means = {lv: np.mean([p["delta"][outcome] for p in points if p["level"] == lv]) for lv in LEVELS}
        positive = np.array([means[lv] > 0 for lv in LEVELS])
        for name in names:
            xs = np.array([p["values"][name] for p in points])
            ys = np.array([p["delta"][outcome] for p in points])
            xl = np.array([np.mean([p["values"][name] for p in points if p["level"] == lv]) for lv in LEVELS])
            rule = threshold_rule(xl, positive)
            loo = []
            for i in range(len(LEVELS)):
                keep = np.arange(len(LEVELS)) != i
                t, d, _ = threshold_rule(xl[keep], positive[keep])
                loo.append(bool(((xl[i] > t) if d == 1 else (xl[i] < t)) == positive[i]))
            out[f"{outcome} | {name}"] = {
                "spearman_points": float(spearmanr(xs, ys)[0]), "spearman_levels": float(spearmanr(xl, [means[lv] for lv in LEVELS])[0]),
                "in_sample_threshold": rule[0], "direction": "above -> gain" if rule[1] == 1 else "below -> gain",
                "in_sample_errors": rule[2], "leave_one_level_out_correct": sum(loo), "loo_by_level": dict(zip(LEVELS, loo, strict=True)),
                "level_means": dict(zip(LEVELS, map(float, xl), strict=True)), "delta_means": {k: float(v) for k, v in means.items()}}
    return out


def main(runs: Path) -> None:
    pixels = json.loads((WHERE / "where-map.json").read_text())["pixels"]
    points = []
    for level in LEVELS:
        for seed in SEEDS:
            run = runs / level / f"seed{seed}"
            d = diagnose_run(run / "checkpoints" / f"step_{STEP:08d}.pt")
            values = {name: d["report"][part][key][-1] for name, (part, key) in CANDIDATES.items()}
            values["raw-pixel kNN (data)"] = pixels[level]["kNN"]
            points.append({"level": level, "seed": seed, "values": values, "delta": measured_delta(level, seed),
                           "same_run_max_loss_diff": same_run_check(run, level, seed), "report": d["report"],
                           "images": {"test": d["test_images"], "train": d["train_images"]}})
            print(level, seed, {k: round(v, 4) for k, v in values.items()}, points[-1]["delta"], flush=True)
    result = {"protocol": {"checkpoints": f"plain MAE (where-small encoder), step {STEP} of the where-map's 32-epoch run "
                                          f"(~{STEP / 78:.1f} epochs), seeds {list(SEEDS)}",
                           "diagnostics": "last encoder block; 1000 test / 1000 train images (class-balanced), "
                                          "all 16 patches per image in the ridge (ridge 1e-3), knock-out on 256",
                           "outcome": "Δ = alpha_min 0.8 − plain at 32 epochs, full protocol (where-map eval.json), same seed",
                           "rule": "threshold at the midpoint of the widest separating gap; leave-one-level-out"},
              "analysis": analyse(points), "points": points}
    (HERE / "predict.json").write_text(json.dumps(result, indent=1))
    write_table(result)
    plot(result)


def write_table(result: dict) -> None:
    a = result["analysis"]
    lines = [f"Protocol: {result['protocol']['checkpoints']}; diagnostics: {result['protocol']['diagnostics']}; "
             f"outcome: {result['protocol']['outcome']}; rule: {result['protocol']['rule']}.", "",
             "| Δ | predictor (last block) | Spearman, 10 points | Spearman, 5 levels | one threshold: errors in sample "
             "| leave-one-level-out correct |", "|---|---|---|---|---|---|"]
    for key, r in a.items():
        outcome, name = key.split(" | ")
        lines.append(f"| {outcome} | {name} | {r['spearman_points']:+.2f} | {r['spearman_levels']:+.2f} | "
                     f"{r['in_sample_errors']}/5 ({r['direction']}, t = {r['in_sample_threshold']:.3f}) | "
                     f"{r['leave_one_level_out_correct']}/5 |")
    lines += ["", "| level | seed | " + " | ".join(result["points"][0]["values"]) + " | Δ kNN | Δ probe | max loss diff vs where-map run |",
              "|---" * (len(result["points"][0]["values"]) + 5) + "|"]
    for p in result["points"]:
        lines.append(f"| {p['level']} | {p['seed']} | " + " | ".join(f"{v:.4f}" for v in p["values"].values())
                     + f" | {p['delta']['kNN']:+.3f} | {p['delta']['probe']:+.3f} | {p['same_run_max_loss_diff']:.1e} |")
    (HERE / "predict.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def plot(result: dict) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["points"][0]["values"])
    fig, axes = plt.subplots(2, len(names), figsize=(3.3 * len(names), 6.2), squeeze=False)
    colours = dict(zip(LEVELS, plt.cm.viridis(np.linspace(0, 0.9, len(LEVELS))), strict=True))
    for row, outcome in enumerate(OUTCOMES):
        for col, name in enumerate(names):
            ax = axes[row, col]
            for p in result["points"]:
                ax.scatter(p["values"][name], p["delta"][outcome], color=colours[p["level"]],
                           label=p["level"] if p["seed"] == 0 else None)
            ax.axhline(0, color="grey", lw=0.8)
            r = result["analysis"][f"{outcome} | {name}"]
            ax.set_title(f"ρ = {r['spearman_points']:+.2f}, LOLO {r['leave_one_level_out_correct']}/5", fontsize=9)
            ax.set_xlabel(f"plain MAE: {name}", fontsize=8)
            ax.set_ylabel(f"Δ {outcome} (α 0.8 − plain)", fontsize=8)
    axes[0, 0].legend(fontsize=7)
    fig.suptitle("Do the plain MAE's diagnostics (step 300) predict the decay's gain at 32 epochs? (where-map, seeds 0-1)",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(HERE / "predict.png", dpi=120)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "runs" / "diagnostics-predict")
