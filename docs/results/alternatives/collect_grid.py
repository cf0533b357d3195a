"""RESULTS §19 (a): the table of grid_fmnistm.sh's runs, read from each finished variant's eval.json — per cell and
design, kNN top-1, linear-probe top-1 and effective rank (cls) as mean ± sample std over the seeds that finished (and
each seed's own numbers, grid.json's "per_seed"), the paired difference against the plain MAE of the same seed (and,
with --versus NAME, against that design too), and how many seeds the design is ahead in. Where a run also holds
`resdecay eval … --evals ep,linear_sweep --out <run>/eval-probes` (issue 50's probes: EP, Q 32, and the 48 swept
linear heads), a second table per cell gives those two the same way.

    python docs/results/alternatives/collect_grid.py [RUNS] [--out DIR] [--versus "decay 0.8"]
        (RUNS default runs/alternatives/grid; DIR default docs/results/alternatives/grid)
writes DIR/grid.json and DIR/grid.md and prints the tables. It reads, never trains (unlike `ablate --seeds`, which
would train a missing seed).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from resdecay.commands.ablate import load_grid, slug

GRID = "alternatives-fmnistm"
BASELINE = "plain MAE"
CELLS = {"all": "all four nuisances", "clean": "clean garments"}


PROBES = {"ep": "EP (Q 32)", "linear_sweep": "swept linear"}  # read from <run>/eval-probes/*/eval.json when there


def measures(run: Path) -> dict:
    """kNN and probe top-1 and the cls token's effective rank (the first rank row is the cls feature's); EP and the
    swept linear heads' top-1 too where the run was measured by them."""
    results = json.loads((run / "eval" / "eval.json").read_text())["results"]
    knn = next(r["values"]["top1"] for r in results if r["metric"] == "knn")
    probe = next(r["values"]["top1"] for r in results if r["metric"] == "probe")
    rank = next(r["values"]["effective_rank"] for r in results if r["metric"] == "rank")
    found = {"knn": knn, "probe": probe, "rank": rank}
    for eval_json in sorted(run.glob("eval-probes/*/eval.json")):
        found.update({r["metric"]: r["values"]["top1"] for r in json.loads(eval_json.read_text())["results"]
                      if r["metric"] in PROBES})
    return found


def spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else None,
            "n": len(values)}


def collect_cell(folder: Path, names: list[str], versus: list[str]) -> dict:
    seeds = {p.name: p for p in sorted(folder.glob("seed*"))}
    runs = {name: {s: measures(p / slug(name)) for s, p in seeds.items()
                   if (p / slug(name) / "eval" / "eval.json").is_file()} for name in names}
    table = {}
    for name, by_seed in runs.items():
        if not by_seed:
            continue
        # a probe counts for a design only once every seed of it was measured by it: no mean over fewer seeds
        probes = [m for m in PROBES if all(m in v for v in by_seed.values())]
        row = {m: spread([v[m] for v in by_seed.values()]) for m in ("knn", "probe", "rank", *probes)}
        for ref in versus:
            key = "" if ref == BASELINE else f" vs {ref}"
            paired = [s for s in by_seed if s in runs[ref]] if name != ref else []
            for m in ("knn", "probe", *probes):
                deltas = [by_seed[s][m] - runs[ref][s][m] for s in paired if m in runs[ref][s]]
                row[f"d_{m}{key}"] = spread(deltas) if deltas else None
                row[f"wins_{m}{key}"] = f"{sum(d > 0 for d in deltas)}/{len(deltas)}"
        row["seeds"] = sorted(by_seed)
        row["per_seed"] = {s: by_seed[s] for s in sorted(by_seed)}  # the raw numbers, so later seeds can be paired
        table[name] = row
    return table


def fmt(s: dict | None, signed: bool = False) -> str:
    if s is None:
        return "-"
    mean = f"{s['mean']:+.3f}" if signed else f"{s['mean']:.3f}"
    return mean + (f" ± {s['std']:.3f}" if s["std"] is not None else "") + f" (n={s['n']})"


def delta(row: dict, measure: str) -> str:
    """A paired Δ cell, e.g. measure "probe vs decay 0.8": mean ± std (n) and the seeds the design is ahead in."""
    d = row.get(f"d_{measure}")
    return "-" if d is None else f"{fmt(d, True)} ({row[f'wins_{measure}']})"


def markdown(cell: str, table: dict, versus: list[str]) -> str:
    keys = ["" if ref == BASELINE else f" vs {ref}" for ref in versus]
    heads = [f"Δ {m} (wins){key}" for key in keys for m in ("kNN", "probe")]
    lines = [f"**{CELLS.get(cell, cell)}**", "", "| design | kNN | probe | rank (cls) | " + " | ".join(heads) + " |",
             "|---|---|---|---|" + "---|" * len(heads)]
    for name, r in table.items():
        deltas = [delta(r, m + key) for key in keys for m in ("knn", "probe")]
        lines.append(f"| {name} | {fmt(r['knn'])} | {fmt(r['probe'])} | {fmt(r['rank'])} | " + " | ".join(deltas) + " |")
    return "\n".join(lines + probe_lines(table, keys))


def probe_lines(table: dict, keys: list[str]) -> list[str]:
    """The second table of a cell: EP and the swept linear heads, for the designs measured by them."""
    measured = {name: r for name, r in table.items() if all(m in r for m in PROBES)}
    if not measured:
        return []
    heads = [f"Δ {label} (wins){key}" for key in keys for label in PROBES.values()]
    lines = ["", "| design | " + " | ".join(PROBES.values()) + " | " + " | ".join(heads) + " |",
             "|---|" + "---|" * (len(PROBES) + len(heads))]
    for name, r in measured.items():
        deltas = [delta(r, m + key) for key in keys for m in PROBES]
        lines.append(f"| {name} | " + " | ".join(fmt(r[m]) for m in PROBES) + " | " + " | ".join(deltas) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="?", default="runs/alternatives/grid")
    ap.add_argument("--out", default=str(Path(__file__).parent / "grid"))
    ap.add_argument("--versus", action="append", default=[], help="a second design to pair every design with")
    args = ap.parse_args()
    names = [v["name"] for v in load_grid(GRID)["variants"]]
    unknown = [v for v in args.versus if v not in names]
    if unknown:
        print(f"error: --versus {unknown[0]!r} is not a design of {GRID}; choose one of: {', '.join(names)}",
              file=sys.stderr)
        raise SystemExit(2)
    versus = [BASELINE, *args.versus]
    tables = {cell: collect_cell(Path(args.runs) / cell, names, versus) for cell in CELLS
              if (Path(args.runs) / cell).is_dir()}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grid.json").write_text(json.dumps(tables, indent=2))
    text = "\n\n".join(markdown(cell, t, versus) for cell, t in tables.items())
    (out / "grid.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
