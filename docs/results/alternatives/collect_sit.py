"""RESULTS §19 (b): the table of grid_sit.sh's runs — per (decay, aux) the mean ± sample std over seeds of the final
training loss (the denoising loss, and the auxiliary term where there is one), the proxy FID and the best probe cell
of the online evaluation after the last epoch.

    python docs/results/alternatives/collect_sit.py [RUNS] [--out DIR]   (RUNS default runs/alternatives/sit;
                                                                           DIR default docs/results/alternatives/sit)
writes DIR/sit_grid.json and DIR/sit_grid.md and prints the table.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

DECAYS = ("plain", "decay0.8")
AUXES = ("none", "repa", "dispersive")
COLUMNS = {"loss": "final loss", "loss_main": "denoising loss", "loss_aux": "aux loss",
           "online_proxy_fid": "proxy FID (500)", "online_probe_best_top1": "best probe cell"}


def read_run(folder: Path) -> dict | None:
    """The last training row's losses and the last online row's measures of one run, or None if it is unfinished."""
    if not (folder / "summary.json").is_file():
        return None
    rows = [json.loads(line) for line in (folder / "log.jsonl").read_text().splitlines() if line.strip()]
    train = [r for r in rows if "loss" in r]
    online = [r for r in rows if "online_proxy_fid" in r]
    if not train or not online:
        return None
    out = {k: train[-1][k] for k in ("loss", "loss_main", "loss_aux") if k in train[-1]}
    out.update({k: online[-1][k] for k in ("online_proxy_fid", "online_probe_best_top1")})
    out["step"] = online[-1]["step"]
    return out


def spread(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else None,
            "n": len(values), "values": values}


def cell(s: dict | None, digits: int) -> str:
    if s is None:
        return "-"
    std = f" ± {s['std']:.{digits}f}" if s["std"] is not None else ""
    return f"{s['mean']:.{digits}f}{std} (n={s['n']})"


def collect(runs: Path) -> dict:
    table = {}
    for decay in DECAYS:
        for aux in AUXES:
            found = [r for seed in sorted((runs / f"{decay}-{aux}").glob("seed*")) if (r := read_run(seed))]
            if found:
                table[f"{decay} + {aux}"] = {k: spread([r[k] for r in found]) for k in COLUMNS if all(k in r for r in found)}
    return table


def markdown(table: dict) -> str:
    head = "| decay + aux | " + " | ".join(COLUMNS.values()) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 1)]
    for name, row in table.items():
        lines.append(f"| {name} | " + " | ".join(cell(row.get(k), 2 if "fid" in k else 4) for k in COLUMNS) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", nargs="?", default="runs/alternatives/sit")
    ap.add_argument("--out", default=str(Path(__file__).parent / "sit"))
    args = ap.parse_args()
    table = collect(Path(args.runs))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sit_grid.json").write_text(json.dumps(table, indent=2))
    text = markdown(table)
    (out / "sit_grid.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
