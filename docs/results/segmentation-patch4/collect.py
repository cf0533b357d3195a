"""Collects the plain vs decayed segmentation table of RESULTS section 15 from the eval.json files that
eval.sh wrote (ROOT/eval/<level>/seed<N>/<solver>/<variant>/eval.json): mean ± sample std over seeds,
the per-seed Δ (decayed − plain), and the raw-pixel and random-init baselines of the same protocol.

Usage: python docs/results/segmentation-patch4/collect.py [ROOT]   (ROOT default /work/segruns)
Writes table.md and table.json beside this file."""

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(sys.argv[1] if len(sys.argv) > 1 else "/work/segruns")
HERE = Path(__file__).parent


def spread(xs: list[float]) -> str:
    if len(xs) == 1:
        return f"{xs[0]:.4f} (n=1)"
    return f"{statistics.mean(xs):.4f} ± {statistics.stdev(xs):.4f} (n={len(xs)})"


rows, table = [], {}
for level in ("clean", "all"):
    for solver in ("exact", "kmeans", "learned"):
        cells = {"plain": [], "a08": [], "pixels": [], "random-init plain": [], "random-init a08": [], "delta": [],
                 "acc plain": [], "acc a08": [], "acc pixels": []}
        for seed_dir in sorted((ROOT / "eval" / level).glob("seed*")):
            found = {v: seed_dir / solver / v / "eval.json" for v in ("plain", "a08")}
            if not all(f.is_file() for f in found.values()):
                continue
            reports = {v: json.loads(f.read_text()) for v, f in found.items()}
            miou = {v: r["results"][0]["values"]["miou"] for v, r in reports.items()}
            cells["plain"].append(miou["plain"])
            cells["a08"].append(miou["a08"])
            cells["delta"].append(miou["a08"] - miou["plain"])
            for v in ("plain", "a08"):
                cells[f"acc {v}"].append(reports[v]["results"][0]["values"]["pixel_acc"])
            cells["acc pixels"].append(next(b["values"]["pixel_acc"] for b in reports["plain"]["baselines"]
                                            if b["source"] == "pixels"))
            base = {v: {b["source"]: b["values"]["miou"] for b in r["baselines"]} for v, r in reports.items()}
            cells["pixels"].append(base["plain"]["pixels"])
            for v in ("plain", "a08"):
                cells[f"random-init {v}"].append(base[v]["random-init"])
        if not cells["plain"]:
            continue
        wins = sum(d > 0 for d in cells["delta"])
        table[f"{level}/{solver}"] = cells
        rows.append(f"| {level} | {solver} | {spread(cells['plain'])} | {spread(cells['a08'])} | "
                    f"{spread(cells['delta'])} | {wins}/{len(cells['delta'])} | {spread(cells['pixels'])} | "
                    f"{spread(cells['random-init plain'])} / {spread(cells['random-init a08'])} | "
                    f"{statistics.mean(cells['acc plain']):.3f} / {statistics.mean(cells['acc a08']):.3f} / "
                    f"{statistics.mean(cells['acc pixels']):.3f} |")
head = ("| level | solver | plain MAE mIoU | α_min 0.8 mIoU | Δ (decayed − plain) | wins | raw pixel patches | "
        "random init (plain / α 0.8) | pixel acc plain / α 0.8 / pixels |\n|---|---|---|---|---|---|---|---|---|")
(HERE / "table.md").write_text(head + "\n" + "\n".join(rows) + "\n")
(HERE / "table.json").write_text(json.dumps(table, indent=2))
print(head + "\n" + "\n".join(rows))
