"""Issue 20's phase diagram from the where-map runs: copy each finished variant's log.jsonl, summary.json
and eval.json here, then build Δ = decayed − plain (kNN and fast probe, online protocol) per nuisance level
× training length × alpha_min, mean ± std over the seeds present, with the raw-pixel kNN / probe of each
level under the same protocol. Writes where-map.json, where-map.md (table) and where-map.png (heat map).

Usage: .venv/bin/python docs/results/where-map/collect.py [--runs RUNS] [--no-copy] [--out DIR]
  RUNS: the folder run.sh wrote (default <repo>/runs/where-map); the copies go beside this script (not with
  --no-copy), the tables and figures to --out (default: beside this script).
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
LEVELS = {"clean": [], "bg": ["background"], "bg-colour": ["background", "colour"],
          "bg-colour-scale": ["background", "colour", "scale"], "all": ["background", "colour", "scale", "position"],
          "all-e64": ["background", "colour", "scale", "position"]}  # the all level trained 64 epochs (run.sh: LEVEL-eN)
PIXEL_LEVEL = {"all-e64": "all"}  # same data, same raw pixels
VARIANTS = {"plain-mae": "plain", "alpha-0-8": "alpha 0.8", "alpha-0-6": "alpha 0.6"}
MEASURES = {"online_knn_top1": "kNN", "online_probe_top1": "probe"}


def online_rows(log: Path) -> dict[int, dict]:
    """epoch -> the online row of that epoch (the last one written, should a resume repeat it)."""
    rows = {}
    for line in log.read_text().splitlines():
        row = json.loads(line)
        if "online_knn_top1" in row:
            rows[int(row["epoch"])] = row
    return rows


def gather(runs: Path, copy: bool) -> dict:
    """level -> variant -> seed -> {epoch: {measure: value}}, plus the final full-protocol eval where finished.
    The copies committed here are read first and the run folders under ``runs`` after them, so a checkout without
    runs/ rebuilds the whole map and a new run adds to (or replaces) what is here."""
    out: dict = {}
    gather_root(HERE, False, out)
    if runs.resolve() != HERE:
        gather_root(runs, copy, out)
    return out


def gather_root(runs: Path, copy: bool, out: dict) -> None:
    for level in LEVELS:
        for seed_dir in sorted((runs / level).glob("seed*")):
            seed = int(seed_dir.name[4:])
            for slug, variant in VARIANTS.items():
                run = seed_dir / slug
                if not (run / "log.jsonl").exists():
                    continue
                rows = online_rows(run / "log.jsonl")
                cell = {"online": {e: {m: r[m] for m in MEASURES} for e, r in rows.items()},
                        "finished": (run / "summary.json").exists()}
                for eval_path in (run / "eval" / "eval.json", run / "eval.json"):  # a run folder / the copy here
                    if eval_path.exists():
                        cell["eval"] = json.loads(eval_path.read_text())
                out.setdefault(level, {}).setdefault(variant, {})[seed] = cell
                if copy and cell["finished"]:
                    dest = HERE / level / seed_dir.name / slug
                    dest.mkdir(parents=True, exist_ok=True)
                    for name in ("log.jsonl", "summary.json", "eval/eval.json"):
                        if (run / name).exists():
                            shutil.copy(run / name, dest / Path(name).name)
            for name in ("table.txt", "ablate.json", "ablate.png"):
                if copy and (seed_dir / name).exists():
                    (HERE / level / seed_dir.name).mkdir(parents=True, exist_ok=True)
                    shutil.copy(seed_dir / name, HERE / level / seed_dir.name / name)


def pixel_baselines(size: int = 2000) -> dict:
    """Raw pixels under the online protocol: first ``size`` train images as bank / probe training set,
    first ``size`` test images as queries, k=20, T=0.07, the fast probe recipe."""
    from resdecay.api import knn_accuracy, linear_probe
    from resdecay.data import DataConfig, build_dataset
    from resdecay.eval.features.probe import FAST_RECIPE

    out = {}
    for level, nuisances in LEVELS.items():
        if level in PIXEL_LEVEL:
            continue
        cfg = DataConfig(name="fashion-mnist-m", canvas=32, nuisances=list(nuisances), train_subset=20000)
        feats = {}
        for split in ("train", "test"):
            ds, _ = build_dataset(cfg, split, 32, augment=False)
            x = torch.stack([ds[i][0] for i in range(size)]).flatten(1)
            y = torch.tensor([int(ds[i][1]) for i in range(size)])
            feats[split] = (x, y)
        (tr, tr_y), (te, te_y) = feats["train"], feats["test"]
        out[level] = {"kNN": knn_accuracy(tr, tr_y, te, te_y, k=20, temperature=0.07),
                      "probe": linear_probe(tr, tr_y, te, te_y, recipe=FAST_RECIPE)["top1"]}
    return out


def mean_std(values: list[float]) -> tuple[float, float, int]:
    return (statistics.mean(values), statistics.stdev(values) if len(values) > 1 else float("nan"), len(values))


def deltas(data: dict) -> dict:
    """(level, variant, epoch, measure) -> (mean, std, n, wins) of decayed − plain over the seeds both have."""
    out = {}
    for level, by_variant in data.items():
        plain = by_variant.get("plain", {})
        for variant in ("alpha 0.8", "alpha 0.6"):
            for seed, cell in by_variant.get(variant, {}).items():
                if seed not in plain:
                    continue
                for epoch, row in cell["online"].items():
                    if epoch not in plain[seed]["online"]:
                        continue
                    for m in MEASURES.values():
                        key = MEASURES_INV[m]
                        out.setdefault((level, variant, epoch, m), []).append(row[key] - plain[seed]["online"][epoch][key])
    return {k: (*mean_std(v), sum(x > 0 for x in v)) for k, v in out.items()}  # + how many seeds the decay won


MEASURES_INV = {v: k for k, v in MEASURES.items()}


def absolute(data: dict) -> dict:
    """(level, variant, epoch, measure) -> (mean, std, n) of the measure itself."""
    out = {}
    for level, by_variant in data.items():
        for variant, seeds in by_variant.items():
            for cell in seeds.values():
                for epoch, row in cell["online"].items():
                    for key, m in MEASURES.items():
                        out.setdefault((level, variant, epoch, m), []).append(row[key])
    return {k: mean_std(v) for k, v in out.items()}


def final_metrics(ev: dict) -> dict:
    """The full-protocol kNN / probe top-1 of one eval.json (last block, mean-pooled) and its raw-pixel baselines."""
    own = {r["metric"]: r["values"]["top1"] for r in ev["results"] if r["metric"] in ("knn", "probe") and r["feature"] == "mean"}
    px = {r["metric"]: r["values"]["top1"] for r in ev["baselines"] if r["source"] == "pixels" and r["metric"] in ("knn", "probe")}
    return {"kNN": own["knn"], "probe": own["probe"], "pixels kNN": px["knn"], "pixels probe": px["probe"]}


def final_table(data: dict) -> tuple[str, dict]:
    """The end-of-run full-protocol eval (bank 20k train images, 10k test queries, 200-epoch probe), per level and
    alpha: mean ± std over seeds of each model and of Δ, how many seeds the decay won, and the pixels it beats."""
    lines = ["Full protocol after the last epoch (eval.json: bank = 20k train images, queries = 10k test images, last block "
             "mean-pooled, kNN k=20 T=0.07, linear probe 200 epochs); mean ± sample std over seeds (n); "
             "wins = seeds where Δ > 0.", "",
             "| level | epochs | pixels kNN / probe | plain kNN / probe | decayed | kNN / probe | Δ kNN | Δ probe | wins kNN / probe |",
             "|---|---|---|---|---|---|---|---|---|"]
    out = {}
    for level, by_variant in data.items():
        plain = {s: final_metrics(c["eval"]) for s, c in by_variant.get("plain", {}).items() if "eval" in c}
        for variant in ("alpha 0.8", "alpha 0.6"):
            dec = {s: final_metrics(c["eval"]) for s, c in by_variant.get(variant, {}).items() if "eval" in c and s in plain}
            if not dec:
                continue
            seeds = sorted(dec)
            cell = {m: mean_std([dec[s][m] for s in seeds]) for m in ("kNN", "probe")}
            cell |= {f"plain {m}": mean_std([plain[s][m] for s in seeds]) for m in ("kNN", "probe")}
            cell |= {f"Δ {m}": mean_std([dec[s][m] - plain[s][m] for s in seeds]) for m in ("kNN", "probe")}
            cell |= {f"wins {m}": sum(dec[s][m] > plain[s][m] for s in seeds) for m in ("kNN", "probe")}
            cell |= {f"pixels {m}": plain[seeds[0]][f"pixels {m}"] for m in ("kNN", "probe")}
            cell["seeds"] = seeds
            epochs = max(max(c["online"]) for c in by_variant[variant].values() if c["online"])
            out[f"{level} | {variant}"] = cell
            lines.append(f"| {level} | {epochs} | {cell['pixels kNN']:.3f} / {cell['pixels probe']:.3f} "
                         f"| {fmt(cell['plain kNN'])} / {fmt(cell['plain probe'])} | {variant} | {fmt(cell['kNN'])} / {fmt(cell['probe'])} "
                         f"| {fmt(cell['Δ kNN'], True)} | {fmt(cell['Δ probe'], True)} | {cell['wins kNN']}/{len(seeds)} / {cell['wins probe']}/{len(seeds)} |")
    return "\n".join(lines), out


def fmt(ms: tuple | None, signed: bool = False) -> str:
    if ms is None:
        return "–"
    mean, std, n = ms[:3]
    s = f"{mean:+.3f}" if signed else f"{mean:.3f}"
    return s + (f" ± {std:.3f}" if n > 1 else "") + f" (n={n})"


def missing_online_rows(data: dict) -> list[str]:
    """The finished runs that lack an online row their level's other runs have (a run killed during its epoch-end
    evaluation lost that row for good until the trainer wrote the epoch's checkpoint after the hook)."""
    out = []
    for level, by_variant in data.items():
        runs = [(v, s, c) for v, seeds in by_variant.items() for s, c in seeds.items() if c["finished"]]
        expected = set().union(*(c["online"] for _, _, c in runs)) if runs else set()
        for variant, seed, cell in runs:
            if gone := sorted(expected - set(cell["online"])):
                out.append(f"{level} seed {seed} {variant}: no online row at epoch {', '.join(map(str, gone))}")
    return out


def table(d: dict, a: dict, pixels: dict, epochs: list[int], missing: list[str]) -> str:
    gaps = (" Rows missing from finished runs (killed during that evaluation; the Δ there is over the seeds that have "
            "both rows, the full-protocol table is complete): " + "; ".join(missing) + ".") if missing else ""
    lines = ["Online curves (every 4 epochs of each run). Online protocol: first 2000 train images as bank / probe set, first 2000 test images as queries, "
             "last encoder block, mean-pooled, kNN k=20 T=0.07, fast probe (30 epochs, batchnorm); mean ± sample std over seeds (n)." + gaps,
             "", "| level | measure | pixels | epochs | plain | α 0.8 | Δ α 0.8 | α 0.6 | Δ α 0.6 |", "|---|---|---|---|---|---|---|---|---|"]
    for level in LEVELS:
        for m in MEASURES.values():
            for e in epochs:
                if (level, "plain", e, m) not in a:
                    continue
                px = f"{pixels[level][m]:.3f}" if level in pixels else "–"
                lines.append(f"| {level} | {m} | {px} | {e} | {fmt(a.get((level, 'plain', e, m)))} | {fmt(a.get((level, 'alpha 0.8', e, m)))} "
                             f"| {fmt(d.get((level, 'alpha 0.8', e, m)), True)} | {fmt(a.get((level, 'alpha 0.6', e, m)))} "
                             f"| {fmt(d.get((level, 'alpha 0.6', e, m)), True)} |")
    return "\n".join(lines)


def heat_map(d: dict, a: dict, pixels: dict, epochs: list[int], path: Path) -> None:
    levels = [lv for lv in LEVELS if any(k[0] == lv for k in d)]
    # One panel per row, full width: the 64-epoch row has 16 columns and each cell carries two lines of text.
    fig, axes = plt.subplots(4, 1, figsize=(2.5 + 0.85 * len(epochs), 4 * (0.8 + 0.6 * len(levels))), squeeze=False)
    for col, variant in enumerate(("alpha 0.8", "alpha 0.6")):
        for row, m in enumerate(MEASURES.values()):
            ax = axes[2 * col + row][0]
            grid = torch.full((len(levels), len(epochs)), float("nan"))
            for i, lv in enumerate(levels):
                for j, e in enumerate(epochs):
                    if (lv, variant, e, m) in d:
                        grid[i, j] = d[(lv, variant, e, m)][0]
            im = ax.imshow(grid.numpy(), cmap="RdBu", vmin=-0.12, vmax=0.12, aspect="auto")  # clipped: the +-0.04 cells must show
            for i, lv in enumerate(levels):
                for j, e in enumerate(epochs):
                    cell = d.get((lv, variant, e, m))
                    if cell is None:
                        continue
                    beats = lv in pixels and a[(lv, variant, e, m)][0] > pixels[lv][m]
                    spread = f"±{cell[1]:.2f} n{cell[2]}" if cell[2] > 1 else "n1"
                    ax.text(j, i, f"{cell[0]:+.2f}{' *' if beats else ''}\n{spread}", ha="center", va="center", fontsize=7,
                            color="white" if abs(cell[0]) > 0.08 else "black")  # readable on the saturated cells
            ax.set_xticks(range(len(epochs)), [str(e) for e in epochs])
            ax.set_yticks(range(len(levels)), [f"{lv}\npixels {pixels[lv][m]:.2f}" if lv in pixels else lv for lv in levels])
            ax.set_xlabel("epochs (online eval of a 32-epoch run; row all-e64: of a 64-epoch run)")
            ax.set_title(f"Δ {m}: {variant} − plain")
            fig.colorbar(im, ax=ax, fraction=0.04)
    fig.suptitle("Fashion-MNIST-M nuisance level × training length (where-map grid, 64-wide U-Net MAE, patch 8); "
                 "* = the decayed model beats raw pixels (same protocol); colours clipped at ±0.12", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# Cost of reaching an epoch: both models, one core each. 0.234 s per step of 256 images is this encoder's fastest
# uncontended measurement (where-small seed 1 plain: 1248 steps in 292 s of train_time_s at train.threads=1).
STEP_S, STEPS_PER_EPOCH = 292 / 1248, 78


def cost_curve(d: dict, path: Path, levels: tuple[str, ...] = ("all", "all-e64")) -> None:
    """Δ (decayed − plain) against the CPU-seconds both models need to reach that epoch (the online points of the
    32-epoch and, dashed, the 64-epoch schedule), mean ± std over seeds, for kNN and the probe."""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.8))
    for ax, m in zip(axes, MEASURES.values(), strict=True):
        for level, style in zip(levels, ("-", "--"), strict=False):
            for variant, colour in (("alpha 0.8", "tab:orange"), ("alpha 0.6", "tab:red")):
                pts = sorted((e, v) for (lv, var, e, mm), v in d.items() if lv == level and var == variant and mm == m)
                if not pts:
                    continue
                x = [2 * e * STEPS_PER_EPOCH * STEP_S / 60 for e, _ in pts]
                err = [v[1] if v[2] > 1 else 0.0 for _, v in pts]
                ax.errorbar(x, [v[0] for _, v in pts], yerr=err, marker="o", ms=3, capsize=3, color=colour, ls=style,
                            label=f"{level}, {variant} (n = {min(v[2] for _, v in pts)}-{max(v[2] for _, v in pts)} seeds)")
                every = [(xi, v[0]) for xi, (_, v) in zip(x, pts, strict=True) if v[2] >= 3 and v[3] == v[2]]
                if every:  # the reliable points: >= 3 seeds, the decay ahead in each
                    ax.scatter(*zip(*every, strict=True), s=70, facecolors="none", edgecolors=colour, zorder=3)
        ax.axhline(0, color="k", lw=0.8)
        ax.axhline(0.05, color="gray", ls=":", lw=0.8)
        ax.set_xlabel("CPU-minutes for both models (1 core each) to reach the epoch")
        ax.set_ylabel(f"Δ {m} (decayed − plain)")
        ax.set_title(f"all nuisances: Δ {m} against cost\n(dotted: +5 points; ringed: >= 3 seeds, every seed Δ > 0)", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", default=str(ROOT / "runs" / "where-map"), help="the folder run.sh wrote")
    ap.add_argument("--no-copy", action="store_true", help="do not copy the finished runs' files beside this script")
    ap.add_argument("--out", default=str(HERE), help="where the tables and figures go (default: beside this script)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = gather(Path(args.runs), copy=not args.no_copy)
    pix_path = HERE / "pixels.json"
    if pix_path.exists():
        pixels = json.loads(pix_path.read_text())
    else:
        pixels = pixel_baselines()
        pix_path.write_text(json.dumps(pixels, indent=1))
    pixels |= {level: pixels[source] for level, source in PIXEL_LEVEL.items()}
    d, a = deltas(data), absolute(data)
    epochs = sorted({k[2] for k in a})
    final_md, final = final_table(data)
    (out / "where-map.md").write_text(final_md + "\n\n" + table(d, a, pixels, epochs, missing_online_rows(data)) + "\n")
    (out / "where-map.json").write_text(json.dumps(
        {"pixels": pixels, "final": final, "delta": {" | ".join(map(str, k)): v for k, v in d.items()},
         "absolute": {" | ".join(map(str, k)): v for k, v in a.items()}}, indent=1))
    if d:
        heat_map(d, a, pixels, epochs, out / "where-map.png")
        cost_curve(d, out / "cost.png")
    print((out / "where-map.md").read_text())


if __name__ == "__main__":
    main()
