"""How long a ``resdecay`` command takes before it does anything: the import cost of the command line.

What is measured
    Wall time of whole fresh processes, each started ``--repeats`` times, in alternation (A B C A B C ...)
    so that drift hits every row alike:

    torch alone       ``python -c "import torch"``: the floor any PyTorch command line pays.
    resdecay CLI      ``python -m resdecay --version``: what ``--help``, ``presets`` or a one-line config
                      error costs. matplotlib, torchvision and timm load on first use (a figure, a ResNet,
                      stochastic depth), not here.
    eager imports     the same, plus ``import matplotlib.pyplot, torchvision, timm`` first: the
                      straightforward layout where every module imports its libraries at the top (what
                      resdecay did before; ``import timm`` alone loads all of timm's models and data code).
    print-config      ``resdecay pretrain --preset mae-tiny-digits --print-config``: a real command that
                      reads a preset and exits.
    digits, resdecay  ``import resdecay.data`` (torch with it, as in any run), then the digits train split as
                      every digits run loads it (``data/digits.py``: scikit-learn's CSV file read directly,
                      the stored split).
    digits, sklearn   the same import, then the reference: ``load_digits()`` and ``train_test_split(...,
                      stratify=...)``, the calls resdecay made before (scikit-learn and SciPy load).

How to read the numbers
    median / min / max seconds over the repeats; "over torch" is the median minus the torch-alone median,
    i.e. what the package itself adds. Numbers depend on the CPU and the disk cache (the first,
    uncounted warm-up round, ``--warmup``, fills it).

    python benchmarks/startup.py                  # 5 repeats
    python benchmarks/startup.py --repeats 10 --json startup.json
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time

from _measure import bad_input

ROWS = {
    "torch alone": ["-c", "import torch"],
    "resdecay CLI (--version)": ["-m", "resdecay", "--version"],
    "eager imports (--version)": ["-c", "import matplotlib.pyplot, torchvision, timm, sys; from resdecay.cli import main; "
                                        "sys.exit(main(['--version']))"],
    "pretrain --print-config": ["-m", "resdecay", "pretrain", "--preset", "mae-tiny-digits", "--print-config"],
    "digits, resdecay": ["-c", "import resdecay.data; from resdecay.data.digits import load_digits_split; "
                               "load_digits_split(True)"],
    "digits, sklearn": ["-c", "import resdecay.data, numpy as np; from sklearn.datasets import load_digits; "
                              "from sklearn.model_selection import train_test_split; d = load_digits(); "
                              "train_test_split(np.arange(len(d.target)), test_size=0.2, random_state=0, stratify=d.target)"],
}


def time_once(args: list[str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"startup.py: {' '.join(args)} failed: {proc.stderr.strip()[-500:]}")
    return elapsed


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=5, help="timed processes per row")
    ap.add_argument("--warmup", type=int, default=1, help="uncounted rounds first (they fill the disk cache)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()
    if args.repeats < 1:
        bad_input(f"--repeats must be a positive integer, got {args.repeats}")
    if args.warmup < 0:
        bad_input(f"--warmup must be 0 or more, got {args.warmup}")
    for _ in range(args.warmup):  # fills the disk cache; not counted
        for cmd in ROWS.values():
            time_once(cmd)
    times = {name: [] for name in ROWS}
    for _ in range(args.repeats):
        for name, cmd in ROWS.items():
            times[name].append(time_once(cmd))
    floor = statistics.median(times["torch alone"])
    print(f"startup | python {platform.python_version()} | {platform.processor() or platform.machine()} | "
          f"{args.repeats} fresh processes per row, interleaved, after {args.warmup} warm-up round(s)")
    head = f"{'command':<28} {'median s':>9} {'min s':>7} {'max s':>7} {'over torch':>11}"
    print(head)
    print("-" * len(head))
    rows = []
    for name, ts in times.items():
        row = {"command": name, "argv": ROWS[name], "median_s": statistics.median(ts), "min_s": min(ts), "max_s": max(ts),
               "over_torch_s": statistics.median(ts) - floor, "runs_s": ts}
        rows.append(row)
        print(f"{name:<28} {row['median_s']:>9.2f} {row['min_s']:>7.2f} {row['max_s']:>7.2f} {row['over_torch_s']:>+11.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "startup", "python": platform.python_version(), "repeats": args.repeats,
                       "warmup": args.warmup, "rows": rows},
                      f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
