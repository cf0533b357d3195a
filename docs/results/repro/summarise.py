"""Issue 23.11: what the demo's numbers depend on. Reads the demo runs made by run_seeds.sh and
run_threads_isa.sh (results.json of each, copied beside this file as <name>.json, or any folder of such
copies: --results) and prints, per data set, each seed's row, mean ± std over seeds, and the
thread-count / CPU-kernel comparisons; with --runs DIR (the scripts' RUNS, default <repo>/runs/repro) also
the relative weight distance between the 1-thread and 2-thread runs of each model (needs the checkpoints,
which are not committed).

    .venv/bin/python docs/results/repro/summarise.py [--results DIR] [--runs runs/repro]
"""

from __future__ import annotations

import argparse
import glob
import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
KEYS = ("knn_top1", "effective_rank_cls", "final_loss")


def rows(results: Path, name: str) -> dict:
    r = json.loads((results / f"{name}.json").read_text())
    num = r["demo"].get("numerics", {})
    return {("plain" if k.startswith("plain") else "decayed"): {key: v[key] for key in KEYS} | {"threads": num.get("threads"),
            "isa": num.get("cpu_capability")} for k, v in r["results"].items()}


def weight_distance(a: Path, b: Path) -> float:
    import torch
    sa = torch.load(glob.glob(str(a / "checkpoints" / "*.pt"))[0], weights_only=True)["model"]
    sb = torch.load(glob.glob(str(b / "checkpoints" / "*.pt"))[0], weights_only=True)["model"]
    num = sum(((sa[k].double() - sb[k].double()) ** 2).sum() for k in sa if sa[k].is_floating_point())
    den = sum((sa[k].double() ** 2).sum() for k in sa if sa[k].is_floating_point())
    return float((num / den).sqrt())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--results", default=str(HERE), help="folder of the <name>.json copies (default: beside this file)")
    p.add_argument("--runs", default=None, help="folder of the demo runs (for weight distances), e.g. runs/repro")
    args = p.parse_args()
    results = Path(args.results)
    for data, seeds, pairs in (("digits", ["digits_t2_AVX512", "digits_t2_seed1", "digits_t2_seed2"],
                                [("digits_t1_AVX512", "digits_t2_AVX512"), ("digits_t2_AVX2", "digits_t2_AVX512"),
                                 ("digits_t1_AVX2", "digits_t1_AVX512"), ("digits_t2_MKLAVX2", "digits_t2_AVX512")]),
                               ("fashion-mnist", ["fmnist_t2_seed0", "fmnist_t2_seed1", "fmnist_t2_seed2"],
                                [("fmnist_t1_seed0", "fmnist_t2_seed0")])):
        have = [s for s in seeds if (results / f"{s}.json").exists()]
        print(f"\n== resdecay demo --data {data}: seeds (2 threads, AVX512) ==")
        print(f"{'run':<22}{'model':<9}{'kNN':>7}{'rank cls':>10}{'loss':>9}")
        for s in have:
            for m, v in rows(results, s).items():
                print(f"{s:<22}{m:<9}{v['knn_top1']:>7.3f}{v['effective_rank_cls']:>10.2f}{v['final_loss']:>9.4f}")
        for m in ("plain", "decayed"):
            for key in KEYS:
                vals = [rows(results, s)[m][key] for s in have]
                if len(vals) > 1:
                    print(f"  {m:<8} {key:<20} mean {statistics.mean(vals):.4f}  std {statistics.stdev(vals):.4f}  "
                          f"range {min(vals):.4f}-{max(vals):.4f}  (n={len(vals)})")
        print("-- same seed (0), other thread count or CPU kernels --")
        for a, b in pairs:
            if not ((results / f"{a}.json").exists() and (results / f"{b}.json").exists()):
                continue
            ra, rb = rows(results, a), rows(results, b)
            for m in ("plain", "decayed"):
                d = {k: ra[m][k] - rb[m][k] for k in KEYS}
                dist = (f"  weights rel. distance {weight_distance(Path(args.runs) / a / m, Path(args.runs) / b / m):.2e}"
                        if args.runs else "")
                print(f"  {a} - {b} {m:<8} dkNN {d['knn_top1']:+.3f} drank {d['effective_rank_cls']:+.2f} "
                      f"dloss {d['final_loss']:+.4f}{dist}")


if __name__ == "__main__":
    main()
