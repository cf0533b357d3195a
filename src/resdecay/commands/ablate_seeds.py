"""``resdecay ablate --grid GRID --seeds 0,1,2``: the whole grid once per seed, then mean ± std.

Seed N runs into ``<out>/seed<N>/`` exactly as ``resdecay ablate --grid GRID --out <out>/seed<N>
train.seed=<N>`` would (same configs, same folders, its own ablate.json / table.txt there), so an
interrupted multi-seed run resumes where it stopped, finished variants are read back, and folders a
shell loop of that manual form made are reused. ``<out>/ablate.json`` and ``<out>/table.txt`` then
give, per variant and registered metric, the mean and the sample standard deviation (n - 1 in the
denominator) over the seeds, of the value and of its delta against the baseline, with n, the
number of seeds behind each cell.

``run_ablate`` is ``resdecay ablate`` itself: ``--list``, the grid once (ablate.py) or once per seed.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from ..errors import UserError
from ..train import distributed as dist_env
from ..train.distributed import is_main_process
from ..train.log.tracking import tracker_group
from ..viz.plots import plot_bars, plot_rank_vs_depth
from .ablate import list_grids, plan_grid, run_grid, run_plan, table_metrics

SEED_KEYS = ("train.seed", "seed")  # what --seeds sets; the same key in the overrides would contradict it
STAT_NOTE = "mean ± sample std (n - 1) over seeds; n = seeds with that value"


def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` -> [0, 1, 2]; anything else is one line naming the form that works."""
    parts = [p.strip() for p in str(text).split(",")]
    fix = "pass distinct non-negative integers separated by commas, e.g. --seeds 0,1,2"
    if not any(parts):
        raise UserError(f"--seeds is empty: {fix}")
    try:
        seeds = [int(p) for p in parts]
    except ValueError:
        bad = next(p for p in parts if not p.lstrip("-").isdigit())
        raise UserError(f"--seeds {text!r}: {bad!r} is not an integer; {fix}") from None
    if any(s < 0 for s in seeds):
        raise UserError(f"--seeds {text!r}: {min(seeds)} is negative; {fix}")
    if any(s >= 2**32 for s in seeds):  # numpy's and torch's seed range
        raise UserError(f"--seeds {text!r}: {max(seeds)} is 2**32 or more; {fix}, each below 2**32")
    if len(set(seeds)) != len(seeds):
        raise UserError(f"--seeds {text!r} repeats a seed; {fix}")
    return seeds


def seed_dir(out_dir: Path, seed: int) -> Path:
    return Path(out_dir) / f"seed{seed}"


def run_seeds(grid: str, seeds: list[int], out: str | None = None, only: list[str] | None = None,
              extra: list[str] | None = None, progress: bool = True) -> dict:
    """Run a grid once per seed (each as ``ablate --out <out>/seed<N> train.seed=<N>``), then write the
    mean ± std summary to ``<out>``. Returns that summary ({} on non-zero torchrun ranks).

    Args:
        grid: a shipped grid name or a YAML file; seeds: the seeds; out: the folder (default runs/ablate/<grid>);
        only, extra, progress: as ``run_grid`` (variants to run now, overrides for every variant, bars).
    """
    clash = [o for o in extra or [] if o.split("=", 1)[0].strip().replace("-", "_") in SEED_KEYS]
    if clash:
        raise UserError(f"--seeds sets train.seed for each run; drop the override {clash[0]!r}")
    first = plan_grid(grid, out, only, extra, progress)
    out_dir = first.out_dir
    # every seed's configs resolved before the first trains: a typo costs a second, not a seed's worth of runs
    plans = {s: plan_grid(grid, str(seed_dir(out_dir, s)), only, [*(extra or []), f"train.seed={s}"], progress)
             for s in seeds}
    env = dist_env.setup(first.cfgs[first.grid["baseline"]].train.device)
    try:
        results = {}
        with tracker_group(first.grid["name"], out_dir):  # every seed's variants in one W&B group / MLflow experiment
            for i, (seed, plan) in enumerate(plans.items(), 1):
                if env.is_main:
                    print(f"\n##### {first.grid['name']}: seed {seed} ({i} of {len(plans)}) -> {plan.out_dir} #####")
                results[seed] = run_plan(plan, env, progress)
    finally:
        dist_env.cleanup(env)
    if not is_main_process():
        return {}
    return _write(summarize_seeds(first.grid, results, {s: p.out_dir for s, p in plans.items()}), out_dir)


def run_ablate(grid: str | None, out: str | None = None, only: str | None = None, seeds: str | None = None,
               extra: list[str] | None = None, progress: bool = True, list_only: bool = False) -> None:
    """``resdecay ablate``: the shipped grids listed (``--list``), or a grid run once, or once per seed
    (``--seeds 0,1,2``: into <out>/seed<N>, then mean ± std).

    Args:
        grid: a shipped grid name or a YAML file; out: the folder (default runs/ablate/<grid>);
        only: comma list of variant names to run now; seeds: the ``--seeds`` text;
        extra: key=value overrides added to every variant; progress: bars; list_only: ``--list``.
    """
    if list_only:
        for g in list_grids():
            print(g)
        return
    if not grid:
        raise UserError("--grid is required (a shipped grid name or a YAML file); --list shows the shipped ones")
    names = only.split(",") if only else None
    if seeds is not None:
        run_seeds(grid, parse_seeds(seeds), out, only=names, extra=extra, progress=progress)
        return
    run_grid(grid, out, only=names, extra=extra, progress=progress)


def stat(values: list[tuple[int, float]]) -> dict:
    """Mean, sample standard deviation (None for one seed) and n of ``(seed, value)`` pairs."""
    xs = [v for _, v in values]
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else None, "n": len(xs),
            "seeds": [s for s, _ in values], "values": xs}


def _stats(per_seed: dict[int, dict], field: str) -> dict:
    """{column: stat} of one field of a variant's row ("measures", "delta", "random_init") over its seeds."""
    keys = dict.fromkeys(k for row in per_seed.values() for k in row.get(field, {}))
    return {k: stat([(s, row[field][k]) for s, row in per_seed.items() if row.get(field, {}).get(k) is not None])
            for k in keys}


def summarize_seeds(g: dict, results: dict[int, dict], dirs: dict[int, Path]) -> dict:
    """The per-seed summaries (``ablate.summarize``) pooled: per variant and column, mean ± std and n."""
    names = list(dict.fromkeys(n for r in results.values() for n in r.get("rows", {})))
    key = next((r["compared_to"] for r in results.values() if r), "probe_top1")
    rows = {}
    for name in names:
        per_seed = {s: r["rows"][name] for s, r in results.items() if name in r.get("rows", {})}
        one = next(iter(per_seed.values()))
        row = {"seeds": list(per_seed), "measures": _stats(per_seed, "measures"), "delta": _stats(per_seed, "delta"),
               "random_init": _stats(per_seed, "random_init"), "paper": one.get("paper"),
               "run_dirs": {str(s): r["run_dir"] for s, r in per_seed.items()},
               **{k: one.get(k) for k in ("overrides", "family", "alpha_min", "depth")}}
        if "paper_delta" in one:
            row["paper_delta"] = one["paper_delta"]
            ours = row["delta"].get(key)
            if name != g["baseline"] and ours is not None and one["paper_delta"] != 0:
                row["direction"] = "same" if (ours["mean"] > 0) == (one["paper_delta"] > 0) else "opposite"
                row["direction_per_seed"] = {d: sum(r.get("direction") == d for r in per_seed.values()) for d in ("same", "opposite")}
        rows[name] = row
    pixels = {s: {"pixels": r["pixels"]} for s, r in results.items() if r.get("pixels")}
    first = next((r for r in results.values() if r), {})
    return {"grid": g["name"], "description": g.get("description", ""), "baseline": g["baseline"], "seeds": list(results),
            "statistic": STAT_NOTE, "per_seed": {str(s): str(dirs[s] / "ablate.json") for s in results},
            "pixels": _stats(pixels, "pixels"), "protocol": first.get("protocol", {}),
            "paper_metric": first.get("paper_metric"), "compared_to": key, "rows": rows}


def _pm(st: dict | None, width: int, signed: bool = False, seeds: int | None = None) -> str:
    """One cell: mean±std (mean alone for one seed), with (n) where fewer seeds than the row's stand behind it."""
    if not st:
        return f"{'-':>{width}}"
    text = f"{st['mean']:+.3f}" if signed else f"{st['mean']:.3f}"
    if st["std"] is not None and math.isfinite(st["std"]):
        text += f"±{st['std']:.3f}"
    if seeds is not None and st["n"] != seeds:
        text += f" ({st['n']})"
    return f"{text:>{width}}"


def _direction(row: dict) -> str:
    if "direction" not in row:
        return "-"
    counts = row["direction_per_seed"]
    return f"{row['direction']} ({counts['same']}/{sum(counts.values())} same)"


def format_seed_table(result: dict) -> str:
    """Like ``ablate.format_table``, every cell mean±std over the seeds; column n = the variant's seeds."""
    specs = [(m.display.key, m.display.table) for m in table_metrics()]
    rand = [(k, t) for k, t in specs if t.random]
    w = 16
    head = (f"{'variant':<28} {'n':>2} " + " ".join(f"{t.header:>{w}} {t.delta:>{w}}" for _, t in specs)
            + "".join(f" {t.random:>{w}}" for _, t in rand) + f" {'paper':>6} {'d paper':>8} {'direction':>18}")
    seeds = ", ".join(map(str, result["seeds"]))
    lines = [f"{result['grid']} over seeds {seeds} ({result['statistic']}): deltas against '{result['baseline']}'; "
             f"paper = {result.get('paper_metric') or '-'}; direction compares mean d {result['compared_to']} with d paper",
             head, "-" * len(head)]
    for name, r in result["rows"].items():
        n = len(r["seeds"])
        paper = f"{r['paper']:>6.1f}" if r["paper"] is not None else f"{'-':>6}"
        pd = f"{r['paper_delta']:>+8.1f}" if "paper_delta" in r else f"{'-':>8}"
        cells = " ".join(f"{_pm(r['measures'].get(k), w, seeds=n)} {_pm(r['delta'].get(k), w, True, n)}" for k, _ in specs)
        rand_cells = "".join(f" {_pm(r['random_init'].get(k), w, seeds=n)}" for k, _ in rand)
        lines.append(f"{name:<28} {n:>2} {cells}{rand_cells} {paper} {pd} {_direction(r):>18}")
    px = result.get("pixels") or {}
    if px:
        cells = " ".join(f"{_pm(px.get(k), w)} {'':>{w}}" for k, _ in specs)
        lines.append(f"{'raw pixels (no model)':<28} {'':>2} {cells}".rstrip())
    lines.append(f"n: seeds per variant; a cell backed by fewer seeds shows its own n in brackets; direction: of the "
                 f"mean delta, with the seeds whose own delta moves the same way as the paper's. "
                 f"{' / '.join(t.random for _, t in rand)}: the variant's encoder at its random initialisation. "
                 f"Per-seed tables: {', '.join(result['per_seed'].values())}")
    return "\n".join(lines)


def _write(result: dict, out_dir: Path) -> dict:
    """ablate.json, table.txt and the bar chart (with std error bars) of the pooled seeds in ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "ablate.json").write_text(json.dumps(result, indent=2))
    table = format_seed_table(result)
    (out_dir / "table.txt").write_text(table + "\n")
    print("\n" + table)
    rows = result["rows"]
    keys = [m.display.key for m in table_metrics()]
    means = {k: {n: r["measures"][k]["mean"] for n, r in rows.items() if k in r["measures"]} for k in keys}
    errors = {k: {n: r["measures"][k]["std"] for n, r in rows.items() if k in r["measures"]} for k in keys}
    plot_bars({k: v for k, v in means.items() if v}, out_dir / "ablate.png",
              f"{result['grid']}: mean ± std over seeds {', '.join(map(str, result['seeds']))}", errors=errors)
    if len({r["depth"] for r in rows.values()}) > 1 and all(r["family"] == "resnet" for r in rows.values()):
        flat = {n: {**r, "measures": {k: v["mean"] for k, v in r["measures"].items()}} for n, r in rows.items()}
        plot_rank_vs_depth(flat, out_dir / "rank_vs_depth.png", f"{result['grid']} (mean over seeds)")  # Figure 7
    print(f"\nwrote {out_dir / 'ablate.json'}, {out_dir / 'table.txt'}, {out_dir / 'ablate.png'}")
    return result
