"""Collects RESULTS section 15's plain vs decayed tables from what run.sh and eval.sh wrote: segmentation mIoU
per level and solver, kNN and linear probe of the same checkpoints, and every run's final training loss.

Reads (RUNS: default <repo>/runs/segmentation-patch4, the folder run.sh and eval.sh use):
    RUNS/eval/<level>/seed<N>/<solver>/segseed<E>/<variant>/eval.json   segmentation under evaluation seed E
    RUNS/eval/<level>/seed<N>/<solver>/<variant>/eval.json              the older layout (read when there is no segseed*)
    RUNS/eval/<level>/seed<N>/knn-probe/<variant>/eval.json            kNN and probe (eval.sh, KNN_PROBE=1)
    RUNS/<level>/seed<N>/<variant>/summary.json, else its log.jsonl    the run's final training loss
(variant: plain | a08; N: the training seed).

How it counts:
  * A checkpoint's mIoU, pixel accuracy and baselines (raw pixel patches, random init) are the mean over the
    evaluation seeds present for both checkpoints of its pair.
  * Δ = decayed − plain of those means, per training seed; a win is Δ > 0, so wins are counted on the mean over
    evaluation seeds. The tables give mean ± sample std over training seeds, and "Δ spread" the largest range of
    the per-evaluation-seed Δ within one pair (how much the evaluation seed alone moves it).
  * Plateau rule: a run is flagged when its final training loss (summary.json's final_loss, else the last
    log.jsonl row's loss) is more than PLATEAU (default 1.2, --plateau) times the median final loss of the runs of
    the same level and variant (its training-seed siblings, itself included). A pair holding a flagged run is
    named in the tables' "plateau" column, and the runs table shows every final loss.

Usage: python docs/results/segmentation-patch4/collect.py [RUNS] [--out DIR] [--plateau 1.2]
Writes table.md and table.json to --out (default: beside this file) and prints table.md.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
VARIANTS = ("plain", "a08")
SOLVERS = ("exact", "kmeans", "learned")
LEVELS = ("clean", "all")  # first, in this order; other levels found follow, sorted
SEG_KEYS = ("miou", "pixel_acc", "pixels", "acc pixels", "random-init")


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def values(report: dict, metric: str, source: str | None = None) -> dict | None:
    """The values of ``metric`` among the checkpoint's results (source None) or one baseline's rows."""
    rows = report.get("results", []) if source is None else [b for b in report.get("baselines", [])
                                                             if b.get("source") == source]
    return next((r["values"] for r in rows if r.get("metric") == metric), None)


def seg_values(report: dict) -> dict[str, float]:
    own, pixels, rand = (values(report, "segmentation", s) for s in (None, "pixels", "random-init"))
    return {"miou": own["miou"], "pixel_acc": own["pixel_acc"], "pixels": pixels["miou"] if pixels else None,
            "acc pixels": pixels["pixel_acc"] if pixels else None, "random-init": rand["miou"] if rand else None}


def mean(xs: list) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.mean(xs) if xs else None


def spread(xs: list[float], digits: int = 4) -> str:
    xs = [x for x in xs if x is not None]
    if not xs:
        return "-"
    if len(xs) == 1:
        return f"{xs[0]:.{digits}f} (n=1)"
    return f"{statistics.mean(xs):.{digits}f} ± {statistics.stdev(xs):.{digits}f} (n={len(xs)})"


def pair_reports(folder: Path) -> dict[str, dict] | None:
    files = {v: folder / v / "eval.json" for v in VARIANTS}
    return {v: read_json(f) for v, f in files.items()} if all(f.is_file() for f in files.values()) else None


def seg_pair(pair_eval: Path, solver: str) -> dict | None:
    """One pair under one solver: per evaluation seed each checkpoint's values, their means, Δ of the means."""
    base = pair_eval / solver
    folders = [(d.name[len("segseed"):], d) for d in sorted(base.glob("segseed*"))] or [("-", base)]
    per = {e: {v: seg_values(r) for v, r in reports.items()}
           for e, folder in folders if (reports := pair_reports(folder)) is not None}
    if not per:
        return None
    means = {v: {k: mean([per[e][v][k] for e in per]) for k in SEG_KEYS} for v in VARIANTS}
    deltas = [per[e]["a08"]["miou"] - per[e]["plain"]["miou"] for e in per]
    return {"eval_seeds": list(per), "per_eval_seed": per, "mean": means,
            "delta": means["a08"]["miou"] - means["plain"]["miou"], "delta_spread": max(deltas) - min(deltas)}


def knn_probe_pair(pair_eval: Path) -> dict | None:
    reports = pair_reports(pair_eval / "knn-probe")
    if reports is None:
        return None
    out = {}
    for v, r in reports.items():
        out[v] = {m: (values(r, m) or {}).get("top1") for m in ("knn", "probe")}
        out[v] |= {f"pixels {m}": (values(r, m, "pixels") or {}).get("top1") for m in ("knn", "probe")}
    return out


def final_loss(run: Path) -> float | None:
    """summary.json's final_loss, else the last log.jsonl row's loss (a run still training), else None."""
    if (run / "summary.json").is_file() and read_json(run / "summary.json").get("final_loss") is not None:
        return read_json(run / "summary.json")["final_loss"]
    if (run / "log.jsonl").is_file():
        losses = [row["loss"] for row in map(json.loads, filter(str.strip, (run / "log.jsonl").read_text().splitlines()))
                  if "loss" in row]
        return losses[-1] if losses else None
    return None


def plateau_flags(losses: dict[tuple, float | None], factor: float) -> dict[tuple, dict]:
    """(level, seed, variant) -> final loss, its group's median and the flag (the docstring's plateau rule)."""
    out = {}
    for (level, seed, variant), loss in losses.items():
        group = [x for (lv, _, va), x in losses.items() if (lv, va) == (level, variant) and x is not None]
        median = statistics.median(group) if group else None
        out[(level, seed, variant)] = {"final_loss": loss, "group_median": median,
                                       "plateau": loss is not None and median is not None and loss > factor * median}
    return out


def levels_and_seeds(runs: Path) -> dict[str, list[int]]:
    found: dict[str, set[int]] = {}
    for top in (runs / "eval", runs):
        for d in (top.glob("*/seed*") if top.is_dir() else []):
            if d.parent.name not in ("eval", "logs", "claims") and d.is_dir() and d.name[4:].isdigit():
                found.setdefault(d.parent.name, set()).add(int(d.name[4:]))
    order = [lv for lv in LEVELS if lv in found] + sorted(set(found) - set(LEVELS))
    return {lv: sorted(found[lv]) for lv in order}


def gather(runs: Path, factor: float) -> dict:
    """Everything the tables show, per level: the pairs' segmentation and kNN / probe, the runs' losses."""
    found = levels_and_seeds(runs)
    losses = {(lv, s, v): final_loss(runs / lv / f"seed{s}" / v) for lv, seeds in found.items() for s in seeds
              for v in VARIANTS}
    flags = plateau_flags(losses, factor)
    data = {}
    for level, seeds in found.items():
        pairs = {s: runs / "eval" / level / f"seed{s}" for s in seeds}
        data[level] = {"seeds": seeds,
                       "segmentation": {solver: {s: c for s, p in pairs.items() if (c := seg_pair(p, solver))}
                                        for solver in SOLVERS},
                       "knn_probe": {s: c for s, p in pairs.items() if (c := knn_probe_pair(p))},
                       "runs": {(s, v): flags[(level, s, v)] for s in seeds for v in VARIANTS}}
    return data


def plateau_note(level_data: dict, seeds) -> str:
    flagged = [f"{v} seed {s}" for (s, v), r in level_data["runs"].items() if r["plateau"] and s in seeds]
    return ", ".join(flagged) or "none"


def seg_rows(data: dict) -> list[str]:
    rows = []
    for level, d in data.items():
        for solver, cells in d["segmentation"].items():
            if not cells:
                continue
            m = {v: {k: [c["mean"][v][k] for c in cells.values()] for k in SEG_KEYS} for v in VARIANTS}
            deltas = [c["delta"] for c in cells.values()]
            n_eval = sorted({len(c["eval_seeds"]) for c in cells.values()})
            rows.append(f"| {level} | {solver} | {'/'.join(map(str, n_eval))} | {spread(m['plain']['miou'])} | "
                        f"{spread(m['a08']['miou'])} | {spread(deltas)} | {sum(x > 0 for x in deltas)}/{len(deltas)} | "
                        f"{max(c['delta_spread'] for c in cells.values()):.4f} | {spread(m['plain']['pixels'])} | "
                        f"{spread(m['plain']['random-init'])} / {spread(m['a08']['random-init'])} | "
                        f"{fmt(mean(m['plain']['pixel_acc']), 3)} / {fmt(mean(m['a08']['pixel_acc']), 3)} / "
                        f"{fmt(mean(m['plain']['acc pixels']), 3)} | {plateau_note(d, cells)} |")
    return rows


def knn_probe_rows(data: dict) -> list[str]:
    rows = []
    for level, d in data.items():
        cells = d["knn_probe"]
        if not cells:
            continue
        parts = []
        for m in ("knn", "probe"):
            plain, a08 = ([c[v][m] for c in cells.values()] for v in VARIANTS)
            deltas = [a - p for a, p in zip(a08, plain, strict=True) if a is not None and p is not None]
            parts.append(f"{spread(plain)} | {spread(a08)} | {spread(deltas)} | {sum(x > 0 for x in deltas)}/{len(deltas)}")
        pixels = " / ".join(fmt(mean([c["plain"][f"pixels {m}"] for c in cells.values()])) for m in ("knn", "probe"))
        rows.append(f"| {level} | {' | '.join(parts)} | {pixels} | {plateau_note(d, cells)} |")
    return rows


def fmt(x: float | None, digits: int = 4) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def run_rows(data: dict) -> list[str]:
    rows = []
    for level, d in data.items():
        for (seed, variant), r in d["runs"].items():
            seg = [fmt(c["mean"][variant]["miou"]) + f" (n={len(c['eval_seeds'])})" if (c := d["segmentation"][s].get(seed))
                   else "-" for s in SOLVERS]
            kp = d["knn_probe"].get(seed, {}).get(variant, {})
            rows.append(f"| {level} | {seed} | {variant} | {fmt(r['final_loss'])} | {fmt(r['group_median'])} | "
                        f"{'**plateau**' if r['plateau'] else ''} | {' | '.join(seg)} | {fmt(kp.get('knn'))} | "
                        f"{fmt(kp.get('probe'))} |")
    return rows


def markdown(data: dict, factor: float) -> str:
    seg_head = ("| level | solver | eval seeds | plain MAE mIoU | α_min 0.8 mIoU | Δ (decayed − plain) | wins | "
                "Δ spread over eval seeds (max) | raw pixel patches | random init (plain / α 0.8) | "
                "pixel acc plain / α 0.8 / pixels | plateau |\n|---|---|---|---|---|---|---|---|---|---|---|---|")
    kp_head = ("| level | plain kNN | α 0.8 kNN | Δ kNN | wins | plain probe | α 0.8 probe | Δ probe | wins | "
               "pixels kNN / probe | plateau |\n|---|---|---|---|---|---|---|---|---|---|---|")
    run_head = ("| level | seed | variant | final loss | median of level & variant | flag | "
                + " | ".join(f"{s} mIoU (mean over eval seeds)" for s in SOLVERS) + " | kNN | probe |\n|"
                + "---|" * (8 + len(SOLVERS)))
    rule = (f"Checkpoint values: mean over evaluation seeds; Δ per training seed from those means, wins = Δ > 0; "
            f"± sample std over training seeds. Plateau: final training loss > {factor:g} x the median final loss of "
            "the same level and variant.")
    return "\n\n".join([rule, seg_head + "\n" + "\n".join(seg_rows(data)),
                        kp_head + "\n" + "\n".join(knn_probe_rows(data)),
                        run_head + "\n" + "\n".join(run_rows(data))]) + "\n"


def as_json(data: dict) -> dict:
    """``gather``'s result with string keys."""
    return {level: {**d, "segmentation": {solver: {str(s): c for s, c in cells.items()}
                                          for solver, cells in d["segmentation"].items()},
                    "knn_probe": {str(s): c for s, c in d["knn_probe"].items()},
                    "runs": {f"seed{s}/{v}": r for (s, v), r in d["runs"].items()}}
            for level, d in data.items()}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="?", default=str(ROOT / "runs" / "segmentation-patch4"),
                    help="the folder run.sh and eval.sh wrote (default <repo>/runs/segmentation-patch4)")
    ap.add_argument("--out", default=str(HERE), help="where table.md and table.json go (default: beside this file)")
    ap.add_argument("--plateau", type=float, default=1.2, help="the plateau rule's factor (default 1.2)")
    args = ap.parse_args(argv)
    runs, out = Path(args.runs), Path(args.out)
    if not runs.is_dir():
        raise SystemExit(f"collect.py: {runs} does not exist; pass the folder run.sh and eval.sh wrote")
    data = gather(runs, args.plateau)
    text = markdown(data, args.plateau)
    out.mkdir(parents=True, exist_ok=True)
    (out / "table.md").write_text(text)
    (out / "table.json").write_text(json.dumps({"plateau_factor": args.plateau, "levels": as_json(data)}, indent=2))
    print(text)


if __name__ == "__main__":
    main()
