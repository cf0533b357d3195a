"""Issue 20.4: how far apart do two machines' runs of the same cell drift, plain vs decayed?

The all-e64 runs of seeds 1 and 2 ran on a CPU with AVX2 kernels, the 32-epoch all runs of the same seeds on one
with AVX-512 (each summary.json's ``numerics`` block says so). Code from commits cc37cdd and 4ee0b75 (RESULTS §14
Design: they train identical losses on one machine), same seed, initial weights, data order and
learning rate for the first 156 steps (the 2 warm-up epochs are the same in both schedules; after them the cosine
of a 64-epoch schedule decays more slowly). So up to step 140 the only difference is the CPU's GEMM kernels, and
the logged training loss shows how much each model amplifies that round-off. Writes machines.md and .json here.

Usage: .venv/bin/python docs/results/where-map/machines.py [--results DIR] [--out DIR]
  --results: the copied runs (default: beside this script, as collect.py copies them: <level>/seed<N>/<variant>/)
  --out: where machines.md and machines.json go (default: beside this script)
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

HERE = Path(__file__).resolve().parent
WARMUP_STEPS = 156  # 2 epochs × 78 steps: the learning rate is the same in both schedules before this step
VARIANTS = {"plain-mae": "plain MAE", "alpha-0-8": "alpha 0.8"}


def run(results: Path, level: str, seed: int, slug: str) -> tuple[dict[int, float], str]:
    folder = results / level / f"seed{seed}" / slug
    losses = {int(r["step"]): r["loss"] for r in map(json.loads, (folder / "log.jsonl").read_text().splitlines())
              if "loss" in r}
    return losses, json.loads((folder / "summary.json").read_text())["numerics"]["cpu_capability"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", default=str(HERE), help="the copied runs (default: beside this script)")
    ap.add_argument("--out", default=str(HERE), help="where machines.md and machines.json go (default: beside this script)")
    args = ap.parse_args()
    results, dest = Path(args.results), Path(args.out)
    dest.mkdir(parents=True, exist_ok=True)
    rows, out = [], {}
    for seed in (1, 2):
        for slug, name in VARIANTS.items():
            (a, cap_a), (b, cap_b) = run(results, "all", seed, slug), run(results, "all-e64", seed, slug)
            steps = [s for s in sorted(set(a) & set(b)) if s < WARMUP_STEPS]
            gaps = {s: abs(a[s] - b[s]) for s in steps}
            out[f"seed {seed} {name}"] = {"kernels": [cap_a, cap_b], "abs loss difference": gaps}
            rows.append(f"| {seed} | {name} | {cap_a} vs {cap_b} | " + " | ".join(f"{gaps[s]:.1e}" for s in steps) + " |")
    head = "| seed | model | kernels | " + " | ".join(f"step {s}" for s in steps) + " |"
    text = "\n".join([
        "|loss difference| between the same run on two CPUs (all level; 32-epoch run vs 64-epoch run, identical up to "
        f"step {WARMUP_STEPS}: same code, seed, initial weights, data order and learning rate; logged loss = mean of the "
        "last 20 steps)", "", head, "|" + "---|" * (3 + len(steps)), *rows])
    (dest / "machines.md").write_text(text + "\n")
    (dest / "machines.json").write_text(json.dumps(out, indent=1))
    print(text)


if __name__ == "__main__":
    main()
