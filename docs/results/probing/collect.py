"""Issue 50 item 7: plain vs decayed under every protocol, from evaluate.sh's reports.

Reads RUNS/eval/<level>/seed<N>/<variant>/eval.json (every RUNS given; default runs/probing, runs/probing-e32,
runs/probing-textures and runs/probing-demo) and writes probing.md / probing.json (beside this script, or in --out
DIR): per level and protocol, each variant's top-1 (mean ± sample std over seeds), Δ = decayed − plain of the same
seed (mean ± std) and the seeds where Δ > 0. A level measured on the second generator (data.composition=textures,
read from the reports' cards) is named LEVEL-textures; the decayed variant is the one beside the plain one
(alpha-0-8 on the where-map, decayed in demo.sh's runs, alpha_min in the decayed column).

    .venv/bin/python docs/results/probing/collect.py [RUNS ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROTOCOLS = [("knn", "kNN k 20 T 0.07 (paper)"), ("probe", "linear probe, IN-100 recipe (paper)"),
             ("knn_sweep", "kNN, k x T chosen on val"), ("linear_sweep", "48 swept linear heads, chosen on val"),
             ("ep", "EP (Q 32), small recipe, chosen on val"), ("attentive", "V-JEPA attentive, small recipe, chosen on val")]
PLAIN = ("plain-mae", "plain")


def level_name(level: str, report: dict) -> str:
    """``level``, or ``level-textures`` when the reports were measured on the second generator."""
    card = report["results"][0].get("protocol", {}).get("train", {}) if report.get("results") else {}
    return f"{level}-textures" if card.get("generator", {}).get("composition") == "textures" else level


def split_pair(variants: dict) -> tuple[dict, dict] | None:
    """(plain, decayed) reports of one seed, or None when one is missing."""
    plain = next((v for k, v in variants.items() if k in PLAIN), None)
    decayed = next((v for k, v in variants.items() if k not in PLAIN), None)
    return None if plain is None or decayed is None else (plain, decayed)


def top1(report: dict, metric: str) -> float | None:
    row = next((r for r in report["results"] if r["metric"] == metric), None)
    return None if row is None else row["values"]["top1"]


def spread(xs: list[float], sign: str = "") -> str:
    if not xs:
        return "–"
    mean = format(statistics.mean(xs), f"{sign}.3f")
    return f"{mean} ± {statistics.stdev(xs):.3f}" if len(xs) > 1 else mean


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="*", type=Path, help="run folders (default: runs/probing and runs/probing-e32)")
    p.add_argument("--out", type=Path, default=HERE, help="where probing.md / probing.json go (default: beside this file)")
    a = p.parse_args()
    runs_dirs = a.runs or [HERE.parents[2] / "runs" / name
                           for name in ("probing", "probing-e32", "probing-textures", "probing-demo")]
    found: dict = {}
    for file in sorted(f for runs in runs_dirs for f in (runs / "eval").glob("*/seed*/*/eval.json")):
        level, seed, variant = file.parts[-4], file.parts[-3], file.parts[-2]
        report = json.loads(file.read_text())
        found.setdefault(level_name(level, report), {}).setdefault(seed, {})[variant] = report
    table = {}
    lines = ["| level | protocol | plain | decayed | Δ (decayed − plain) | wins |", "|---|---|---|---|---|---|"]
    for level, seeds in sorted(found.items()):
        for metric, words in PROTOCOLS:
            pairs = [(top1(p, metric), top1(d, metric)) for p, d in filter(None, map(split_pair, seeds.values()))]
            pairs = [(p, d) for p, d in pairs if p is not None and d is not None]
            deltas = [d - p for p, d in pairs]
            table.setdefault(level, {})[metric] = {"plain": [p for p, _ in pairs], "decayed": [d for _, d in pairs],
                                                   "delta": deltas}
            lines.append(f"| {level} | {words} | {spread([p for p, _ in pairs])} | {spread([d for _, d in pairs])} | "
                         f"{spread(deltas, '+')} | {sum(x > 0 for x in deltas)}/{len(deltas)} |")
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "probing.json").write_text(json.dumps(table, indent=1))
    (a.out / "probing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
