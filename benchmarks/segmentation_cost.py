"""What the segmentation metric costs: wall seconds and peak memory of
``resdecay.eval.segmentation.segment.segment`` with each solver, beside the kNN on the same features.

What is measured
    Synthetic token features with planted classes, made before any timing (seeded): each image has a
    background class and one rectangle of another class on its h x w token grid (tokens = h * w, a
    square grid); a token is ``SEP * mean[class] + N(0, I)`` in ``--dim`` dimensions, so the cosine
    similarity of two tokens of one class is about SEP^2 / (SEP^2 + 1) = 0.2 and of two classes about 0.
    The label maps are the token grids themselves (no upsampling). Per (images, tokens), rows:

    knn      the reference row: ``knn_topk`` (k 20, T 0.07, chunks of 1024) with the tokens of the first
             half of the images as the bank and those of the second half as queries, token labels = the
             planted classes; its sanity value is kNN top-1, not an mIoU;
    exact    ``segment`` with ``SegProtocol(solver="exact")`` (10 seeded batchings of 40-image batch
             graphs, their union, eigsh for 100 eigenvectors, K-Means);
    learned  ``SegProtocol(solver="learned")`` (200 epochs of batch graphs, 5 AdamW steps each, EMA, SVD,
             K-Means);
    kmeans   ``SegProtocol(solver="kmeans")`` (K-Means, n_init 10, on the L2-normalised tokens).

    Every protocol constant is the default of ``SegProtocol``; K = the number of planted classes. The
    sanity column is the Hungarian mIoU over all planted classes (K-Means must find the classes).

How
    Each row runs in a child process (this script with ``--_row``), so a row can be stopped: the parent
    kills a child that runs past ``--timeout-per-row`` seconds (counted from the child's start: imports
    and making the features, ~1-3 s, are inside it) or whose resident set passes ``--max-mb``, and prints
    the row as "skipped (> S s)" / "skipped (> M MB)". The cost grows with images and tokens, so once a
    solver was stopped at some size, its rows at sizes at least as large in both are not started; they
    print "skipped (> S s at a smaller size)" (``--no-prune`` runs them anyway). Inside the child the
    timed window is one call of ``segment`` (or ``knn_topk``): wall-clock; peak MB is the growth of the
    process's peak resident set over the call (``_measure.mem_start``/``mem_peak``: VmHWM reset through
    /proc/self/clear_refs; the features themselves are not counted; approximate, includes allocator
    slack; scipy and scikit-learn, which segmentation.py imports lazily, are loaded before the call). One run
    per row: a laptop-scale measurement, not a median.

    python benchmarks/segmentation_cost.py                       # 1,000 and 10,000 images x 16 and 64 tokens
    python benchmarks/segmentation_cost.py --timeout-per-row 150 --json seg_cost.json
    python benchmarks/segmentation_cost.py --images 40 --tokens 4 --dim 16 --classes 3 --epochs 2 --graph-rounds 2
                                                                 # smoke run (seconds; tests/e2e/test_benchmarks.py)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

SOLVERS = ("knn", "exact", "learned", "kmeans")
SEP = 0.5
POLL_S = 0.2


# ============================================================================ data
def planted(images: int, tokens: int, dim: int, classes: int, seed: int):
    """(x (N, T, D) float32, labels (N, h, w) int64, grid) with one background class and one rectangle of
    another class per image."""
    import torch

    side = math.isqrt(tokens)
    g = torch.Generator().manual_seed(seed)
    means = SEP * torch.randn(classes, dim, generator=g)
    bg = torch.randint(0, classes, (images,), generator=g)
    fg = (bg + torch.randint(1, classes, (images,), generator=g)) % classes  # never the background's class
    # a rectangle [r0, r1) x [c0, c1) of at least one token per image
    r = torch.randint(0, side, (images, 2), generator=g).sort(1).values
    c = torch.randint(0, side, (images, 2), generator=g).sort(1).values
    rows, cols = torch.arange(side)[None, :, None], torch.arange(side)[None, None, :]
    inside = ((rows >= r[:, :1, None]) & (rows <= r[:, 1:, None]) & (cols >= c[:, :1, None]) & (cols <= c[:, 1:, None]))
    labels = torch.where(inside, fg[:, None, None], bg[:, None, None])
    x = torch.randn(images, tokens, dim, generator=g)
    x += means[labels.reshape(images, tokens)]
    return x, labels, (side, side)


# ============================================================================ one row (child process)
def run_row(args) -> dict:
    import torch

    from _measure import mem_peak, mem_start
    from resdecay.eval.segmentation import segment as seg
    from resdecay.io import progress_bar

    if args.threads:
        torch.set_num_threads(args.threads)
    n, t, solver = args.images[0], args.tokens[0], args.solvers[0]
    x, labels, grid = planted(n, t, args.dim, args.classes, args.seed)
    if solver != "knn":  # knn_topk needs neither (a row's process, ~3 s shorter without them)
        import scipy.optimize  # noqa: F401  segmentation.py imports these lazily: loaded before the timed call,
        import scipy.sparse.linalg  # noqa: F401  so the row measures the work, not the imports
        import sklearn.cluster  # noqa: F401

    device = torch.device("cpu")
    extra = {}
    if solver == "knn":
        from resdecay.eval.features.knn import knn_topk

        half = n // 2
        bank, bank_y = x[:half].reshape(-1, args.dim), labels[:half].reshape(-1)
        queries, query_y = x[half:].reshape(-1, args.dim), labels[half:].reshape(-1)
        method, base = mem_start(device)
        t0 = time.perf_counter()
        out = knn_topk(bank, bank_y, queries, query_y, topk=(1,))
        seconds = time.perf_counter() - t0
        sanity, sanity_name = out["top1"], "knn_top1"
        extra = {"bank": len(bank), "queries": len(queries)}
    else:
        p = seg.SegProtocol(solver=solver, images=n, seed=args.seed, epochs=args.epochs, graph_rounds=args.graph_rounds)
        if solver == "exact":  # segmentation.py has a bar for the learned epochs only: one over the batch graphs here
            batches = math.ceil(n / p.batch_images) * (p.graph_rounds if n > p.batch_images else 1)
            bar = progress_bar(total=batches, desc="exact: batch graphs", leave=False)
            inner = seg.batch_graph

            def counted(*a, **k):
                out = inner(*a, **k)
                bar.update()
                if bar.n == batches:
                    bar.set_description("exact: eigsh + K-Means")
                return out

            seg.batch_graph = counted  # dataset_graph looks the name up in the module at each call
        method, base = mem_start(device)
        t0 = time.perf_counter()
        out = seg.segment(x, grid, labels, args.classes, p, progress=True)
        seconds = time.perf_counter() - t0
        if solver == "exact":
            bar.close()
        sanity, sanity_name = out["values"]["miou"], "miou"
        extra = {"pixel_acc": out["values"]["pixel_acc"], "protocol": p.card()}
    return {"images": n, "tokens": t, "solver": solver, "status": "ok", "seconds": seconds,
            "peak_mb": mem_peak(device, method, base), "memory": method, "sanity": sanity, "sanity_name": sanity_name,
            **extra}


# ============================================================================ the parent
def rss_mb(pid: int) -> float:
    from _measure import proc_kb

    kb = proc_kb(f"/proc/{pid}/status", "VmRSS")
    return kb / 1024 if kb else 0.0


def child(args, n: int, t: int, solver: str) -> dict:
    """Run one row in a child process, stopping it at the time or memory limit."""
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    cmd = [sys.executable, os.path.abspath(__file__), "--_row", out, "--images", str(n), "--tokens", str(t),
           "--solvers", solver, "--dim", str(args.dim), "--classes", str(args.classes), "--seed", str(args.seed),
           "--epochs", str(args.epochs), "--graph-rounds", str(args.graph_rounds)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd)  # stdout/stderr pass through: the child's progress bars show
    stopped, peak_rss = None, 0.0
    try:
        while proc.poll() is None:
            time.sleep(POLL_S)
            peak_rss = max(peak_rss, rss_mb(proc.pid))
            if args.timeout_per_row and time.perf_counter() - t0 > args.timeout_per_row:
                stopped = f"skipped (> {args.timeout_per_row:g} s)"
            elif peak_rss > args.max_mb:
                stopped = f"skipped (> {args.max_mb:.0f} MB)"
            if stopped:
                proc.kill()
                proc.wait()
                break
        base = {"images": n, "tokens": t, "solver": solver, "wall_s": time.perf_counter() - t0}
        if stopped:
            return {**base, "status": stopped, "child_rss_mb": peak_rss}
        if proc.returncode != 0:
            return {**base, "status": f"failed (exit {proc.returncode})"}
        with open(out) as f:
            return {**base, **json.load(f)}
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.unlink(out)


def ints(text: str, flag: str) -> list[int]:
    from _measure import bad_input

    try:
        vals = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        bad_input(f"{flag} must be comma-separated positive integers, got {text!r}")
    if not vals or min(vals) < 1:
        bad_input(f"{flag} must be comma-separated positive integers, got {text!r}")
    return vals


def parse():
    from _measure import bad_input

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", default="1000,10000", help="comma-separated image counts")
    ap.add_argument("--tokens", default="16,64", help="comma-separated tokens per image (square grids: 4, 16, 64, ...)")
    ap.add_argument("--solvers", default=",".join(SOLVERS), help=f"comma-separated subset of {','.join(SOLVERS)}")
    ap.add_argument("--dim", type=int, default=192, help="token width (default 192, a ViT-Tiny's)")
    ap.add_argument("--classes", type=int, default=6, help="planted classes = K (default 6)")
    ap.add_argument("--epochs", type=int, default=None, help="learned solver epochs (default: the protocol's 200)")
    ap.add_argument("--graph-rounds", type=int, default=None, help="exact solver batchings (default: the protocol's 10)")
    ap.add_argument("--timeout-per-row", type=float, default=None, metavar="S",
                    help="stop a row after S seconds and print it as skipped (default: no limit)")
    ap.add_argument("--max-mb", type=float, default=None, metavar="MB",
                    help="stop a row whose resident set passes MB (default: half of MemAvailable at the start)")
    ap.add_argument("--no-prune", action="store_true", help="start every row, even where a smaller size of its solver was stopped")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) in each row")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--_row", help=argparse.SUPPRESS)
    args = ap.parse_args()

    from resdecay.eval.segmentation.segment import SegProtocol

    d = SegProtocol()
    args.epochs = d.epochs if args.epochs is None else args.epochs
    args.graph_rounds = d.graph_rounds if args.graph_rounds is None else args.graph_rounds
    args.images, args.tokens = ints(args.images, "--images"), ints(args.tokens, "--tokens")
    args.solvers = [s.strip() for s in args.solvers.split(",") if s.strip()]
    if not args.solvers or set(args.solvers) - set(SOLVERS):
        bad_input(f"--solvers {','.join(args.solvers) or repr('')}: choose from {','.join(SOLVERS)}")
    if min(args.images) < 2:
        bad_input("--images must be at least 2 (the kNN row splits the images into bank and queries)")
    for t in args.tokens:
        if t < 4 or math.isqrt(t) ** 2 != t:
            bad_input(f"--tokens {t}: tokens per image must be a square grid of at least 2x2 (4, 9, 16, ..., 64)")
    if args.dim < 1 or args.classes < 2:
        bad_input("--dim must be positive and --classes at least 2")
    if args.epochs < 1 or args.graph_rounds < 1:
        bad_input("--epochs and --graph-rounds must be at least 1")
    if min(args.images) * min(args.tokens) < args.classes:
        bad_input(f"--classes {args.classes} is more than the {min(args.images) * min(args.tokens)} tokens of the smallest size")
    if args.timeout_per_row is not None and args.timeout_per_row <= 0:
        bad_input("--timeout-per-row must be a positive number of seconds")
    if args.max_mb is not None and args.max_mb <= 0:
        bad_input("--max-mb must be a positive number of MB")
    if args.threads is not None and args.threads < 1:
        bad_input("--threads must be a positive integer")
    return args


def cell(r: dict) -> tuple[str, str, str]:
    if r["status"] != "ok":
        return r["status"], "", ""
    return f"{r['seconds']:.2f}", f"{r['peak_mb']:.0f}", f"{r['sanity']:.3f}" + (" (top-1)" if r["solver"] == "knn" else "")


def main() -> int:
    args = parse()
    if args._row:  # a child: one row, its result to the file the parent named
        result = run_row(args)
        with open(args._row, "w") as f:
            json.dump(result, f)
        return 0

    from _measure import MEM_LABEL, proc_kb

    if args.max_mb is None:
        avail = proc_kb("/proc/meminfo", "MemAvailable")
        args.max_mb = avail / 2048 if avail else 8192.0
    import torch

    load0 = os.getloadavg()
    print(f"segmentation_cost | torch {torch.__version__} | cpu ({platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cores) | threads {args.threads or torch.get_num_threads()} | dim {args.dim} | "
          f"{args.classes} classes | seed {args.seed} | timeout per row "
          f"{f'{args.timeout_per_row:g} s' if args.timeout_per_row else 'none'} | max {args.max_mb:.0f} MB per row | "
          f"load average {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}", flush=True)
    plan = [(n, t, s) for n in sorted(args.images) for t in sorted(args.tokens) for s in args.solvers]
    rows, stopped_at = [], {}
    t_start = time.perf_counter()
    for i, (n, t, s) in enumerate(plan, 1):
        smaller = [(n0, t0) for n0, t0 in stopped_at.get(s, []) if n0 <= n and t0 <= t]
        if smaller and not args.no_prune:
            prev = next(r for r in rows if r["solver"] == s and (r["images"], r["tokens"]) == smaller[0])
            r = {"images": n, "tokens": t, "solver": s, "status": prev["status"].rstrip(")") + " at a smaller size)",
                 "not_started": True}
        else:
            print(f"[{i}/{len(plan)}] {n:,} images x {t} tokens, {s} ...", flush=True)
            r = child(args, n, t, s)
            if r["status"].startswith("skipped"):
                stopped_at.setdefault(s, []).append((n, t))
        rows.append(r)
        secs, mb, san = cell(r)
        print(f"[{i}/{len(plan)}] {n:,} x {t} {s}: {secs}" + (f" s, {mb} MB, {san}" if mb else ""), flush=True)
    total = time.perf_counter() - t_start
    load1 = os.getloadavg()

    method = next((r["memory"] for r in rows if r.get("memory")), "vmhwm")
    mem_label = MEM_LABEL[method]
    head = f"{'images':>7} {'tokens':>6} {'solver':<8} {'seconds':>40} {mem_label:>23} {'mIoU (knn: top-1)':>18}"
    print("\n" + head)
    print("-" * len(head))
    for r in rows:
        secs, mb, san = cell(r)
        print(f"{r['images']:>7,} {r['tokens']:>6} {r['solver']:<8} {secs:>40} {mb:>23} {san:>18}")
    print(f"{total:.0f} s in all; load average at the end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}. knn = knn_topk "
          "(k 20) of the second half's tokens on the first half's, its sanity value is top-1 on the planted classes; "
          "the other rows are segment() with SegProtocol's defaults, Hungarian mIoU over all classes.")
    skipped = [r for r in rows if r["status"] != "ok"]
    if skipped:
        print("not measured: " + "; ".join(f"{r['images']:,} x {r['tokens']} {r['solver']} {r['status']}" for r in skipped))

    if args.json:
        meta = {"benchmark": "segmentation_cost", "torch": torch.__version__, "device": "cpu",
                "device_name": platform.processor() or platform.machine(), "cpu_count": os.cpu_count(),
                "threads": args.threads or torch.get_num_threads(), "dim": args.dim, "classes": args.classes, "sep": SEP,
                "seed": args.seed, "epochs": args.epochs, "graph_rounds": args.graph_rounds,
                "timeout_per_row_s": args.timeout_per_row, "max_mb": args.max_mb, "pruned": not args.no_prune,
                "memory": mem_label, "load_average_start": load0, "load_average_end": load1, "total_seconds": total}
        with open(args.json, "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
