"""How fast the frozen-feature evaluations run: kNN, linear probe and effective rank of
resdecay.eval, each next to a plain reference implementation measured in the same run.

What is measured
    All inputs are synthetic features made on the device before any timing: Gaussian class means
    plus unit Gaussian noise (train and test drawn around the same means), so that accuracies are
    meaningful; the "Bayes" row is the accuracy of the nearest true class mean, the best any
    classifier can do on these data. Three sections:

    1. kNN      ``knn_topk`` (weighted cosine vote, k=20, T=0.07, top-1/top-5, queries in chunks
                of 1024) vs a plain unchunked reference: normalise, one full ``queries @ bank.T``
                similarity matrix, ``topk``, one-hot weighted vote as DINO's ``knn_classifier``.
                Defaults: CPU bank 60,000 x 192, 10,000 queries, 10 classes (target < 30 s);
                CUDA bank 1,281,167 x 768 (ImageNet-1K train, ViT-B width), 50,000 queries,
                1000 classes (target < 10 s), where the reference's 50,000 x 1,281,167 fp32
                similarity matrix (256 GB) cannot fit: its row then reads "out of memory".
                Check: both rows must give identical top-1 and top-5 (OK/MISMATCH).
    2. probe    ``linear_probe`` with ``IN100_RECIPE`` (AdamW lr 1e-2, wd 0.01, batch 1024,
                200 epochs, per-step cosine to 0) on 60,000 x 768 train / 10,000 test features,
                100 classes, vs the same recipe as a textbook loop: ``DataLoader(TensorDataset,
                shuffle=True)``, ``nn.Linear``, ``torch.optim.AdamW``, ``LambdaLR`` cosine.
                Target (CPU): resdecay < 60 s. The two rows use different initialisations and
                shuffles, so their accuracies agree only roughly.
    3. rank     ``effective_rank`` (paper eq. 6, one SVD of the centred (N, D) matrix) on
                50,000 x 768 features with a power-law spectrum in a random basis, vs eq. 6 on
                the eigenvalues of the D x D covariance (``torch.linalg.eigvalsh``, float64).
                Check: |difference| < 1e-6. A small case (2,000 x 64) adds the N x N Gram form
                (eigenvalues of Xc Xc^T), whose non-zero spectrum is the same.

How
    Timed windows are wall-clock, with ``torch.cuda.synchronize()`` around them on CUDA; one
    small untimed call of every kNN and rank implementation runs first (thread pools, cuBLAS
    handles). kNN and rank rows run ``--repeats`` times in alternation (AB, BA, ...) and report
    the median; each probe row runs once (it is long; its repeat-to-repeat noise on an idle
    machine is a few percent). Timings include moving the inputs where the function moves them
    (``knn_topk`` returns its scores to the CPU).

How to read the numbers
    seconds: median wall time of one full call. peak MB: memory the call needed above what was
    allocated before it (the inputs themselves are not counted): on CUDA
    ``torch.cuda.max_memory_allocated`` minus the allocation at the start of the call; on CPU the
    growth of the process's peak resident set (VmHWM, reset through /proc/self/clear_refs;
    fallback: ru_maxrss growth, which under-reports every call after the first), an
    approximation that includes allocator slack. PASS/FAIL compare resdecay's row with the target
    stated for the default size; with --bank/--queries/--dim/--classes, --probe-train/--probe-test
    or --rank-rows the target is still printed but was set for the default size. The exit status is 1 on a MISMATCH, and on a FAIL
    with --strict.

    python benchmarks/eval_speed.py                              # CPU defaults (~2.5 min on 2 cores)
    python benchmarks/eval_speed.py --probe-epochs 10            # quick check
    python benchmarks/eval_speed.py --bank 2000 --queries 200 --probe-epochs 1 --probe-train 2000 --probe-test 500 \
        --rank-rows 2000 --repeats 1                             # smoke run (seconds; tests/e2e/test_benchmarks.py)
    python benchmarks/eval_speed.py --device cuda --json eval_speed.json
    python benchmarks/eval_speed.py --sections knn --bank 200000 --queries 20000 --dim 384 --classes 100
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import math
import platform
import statistics
import sys
import time

import torch

from _eval_references import KNN_K, KNN_T, knn_reference, probe_reference, rank_covariance, rank_gram
from _measure import MEM_LABEL, bad_input, mem_peak, mem_start, proc_kb, sync
from resdecay.eval.features.knn import knn_topk
from resdecay.eval.features.probe import IN100_RECIPE, linear_probe
from resdecay.eval.features.rank import effective_rank

KNN_DEFAULTS = {"cpu": dict(bank=60_000, queries=10_000, dim=192, classes=10, target_s=30.0),
                "cuda": dict(bank=1_281_167, queries=50_000, dim=768, classes=1000, target_s=10.0)}
KNN_SEP = 0.2  # class-mean scale: top-1 ~0.74 at the CPU default (Bayes ~0.86)
PROBE_SIZE = dict(train=60_000, test=10_000, dim=768, classes=100)
PROBE_SEP = 0.12  # test top-1 ~0.6 after 200 epochs (Bayes ~0.78); the probe overfits (train 1.0)
PROBE_TARGET_S = 60.0  # CPU
RANK_SIZE, RANK_SMALL = (50_000, 768), (2_000, 64)
RANK_TOL = 1e-6


# ============================================================================ measurement
def measure(fn, device: torch.device):
    """(result, seconds, peak MB above the start) of one call."""
    method, base = mem_start(device)
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    seconds = time.perf_counter() - t0
    return out, seconds, mem_peak(device, method, base)


def alternate(fns: dict, repeats: int, device: torch.device) -> dict:
    """Run the callables in alternating order (AB, BA, ...) ``repeats`` times each; per name the
    last result, the median and all seconds, and the largest peak memory."""
    res = {name: {"seconds_all": [], "peak_mb": 0.0} for name in fns}
    names = list(fns)
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            out, s, mb = measure(fns[name], device)
            res[name]["result"] = out
            res[name]["seconds_all"].append(s)
            res[name]["peak_mb"] = max(res[name]["peak_mb"], mb)
    for v in res.values():
        v["seconds"] = statistics.median(v["seconds_all"])
    return res


def gb(n_bytes: float) -> float:
    return n_bytes / 1e9


def available_gb(device: torch.device) -> float:
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return gb(free)
    kb = proc_kb("/proc/meminfo", "MemAvailable")
    return gb(kb * 1024) if kb else float("inf")


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


# ============================================================================ data
def class_data(n: int, means: torch.Tensor, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` samples ``means[y] + N(0, I)`` with uniform labels ``y``, on the means' device."""
    y = torch.randint(0, len(means), (n,), generator=g, device=means.device)
    x = torch.randn(n, means.shape[1], generator=g, device=means.device)
    x += means[y]
    return x, y


def bayes_top1(x: torch.Tensor, y: torch.Tensor, means: torch.Tensor, chunk: int = 4096) -> float:
    """Accuracy of the nearest true class mean (Bayes-optimal for these isotropic Gaussians)."""
    hits = 0
    for i in range(0, len(x), chunk):
        hits += int((torch.cdist(x[i:i + chunk], means).argmin(1) == y[i:i + chunk]).sum())
    return hits / len(x)


def spectrum_feats(n: int, d: int, g: torch.Generator, device: torch.device) -> torch.Tensor:
    """Gaussian features with a power-law covariance spectrum (sigma_i ~ i^-1.5) in a random basis."""
    scale = torch.arange(1, d + 1, device=device, dtype=torch.float32) ** -0.75  # std, so variance ~ i^-1.5
    basis, _ = torch.linalg.qr(torch.randn(d, d, generator=g, device=device))
    return (torch.randn(n, d, generator=g, device=device) * scale) @ basis.T + 0.5


# ============================================================================ sections
def section_knn(args, device, mem_label) -> dict:
    cuda = device.type == "cuda"
    d = {**KNN_DEFAULTS[device.type]}
    custom = any(getattr(args, k) is not None for k in ("bank", "queries", "dim", "classes"))
    N, Q, D, C = (getattr(args, k) if getattr(args, k) is not None else d[k] for k in ("bank", "queries", "dim", "classes"))
    g = torch.Generator(device=device).manual_seed(args.seed)
    means = KNN_SEP * torch.randn(C, D, generator=g, device=device)
    bank, bank_y = class_data(N, means, g)
    queries, query_y = class_data(Q, means, g)
    bayes = bayes_top1(queries, query_y, means)
    # the reference needs the (Q, N) similarity matrix, normalised copies of both inputs, one-hot votes
    need = gb(4 * (Q * N + N * D + Q * D + Q * KNN_K * C))
    avail = available_gb(device)

    print(f"\n== 1. kNN (weighted cosine vote, k={KNN_K}, T={KNN_T}): bank {N:,} x {D}, {Q:,} queries, {C} classes, "
          f"fp32 on {device.type}; median of {args.repeats} alternating runs")
    oom = []

    def reference():
        if oom:  # it did not fit once: no further attempts
            return None
        try:
            return knn_reference(bank, bank_y, queries, query_y, KNN_K, KNN_T, C)
        except torch.cuda.OutOfMemoryError:  # the (Q, N) matrix does not fit: report it as the row
            oom.append(True)
            gc.collect()
            torch.cuda.empty_cache()
            return None

    fns = {"resdecay knn_topk (chunks of 1024)": lambda: knn_topk(bank, bank_y, queries, query_y, KNN_K, KNN_T, (1, 5))}
    ref_note = None
    if need > 0.8 * avail and not cuda:  # on CPU an oversized allocation is an OOM kill, not an exception
        ref_note = f"skipped (needs {need:.1f} GB, {avail:.1f} GB available)"
    else:  # on CUDA an oversized allocation raises OutOfMemoryError, which reference() turns into a row
        fns["reference (unchunked, full Q x N)"] = reference
    # untimed warm-up on a slice (thread pools, cuBLAS handles, allocator)
    knn_topk(bank[:4096], bank_y[:4096], queries[:256], query_y[:256], KNN_K, KNN_T, (1, 5))
    knn_reference(bank[:4096], bank_y[:4096], queries[:256], query_y[:256], KNN_K, KNN_T, C)
    res = alternate(fns, args.repeats, device)
    if oom:
        res.pop("reference (unchunked, full Q x N)", None)
        ref_note = f"out of memory (needs {need:.0f} GB, {avail:.0f} GB free on the GPU)"

    head = f"{'row':<36} {'top1':>7} {'top5':>7} {'seconds':>9} {mem_label:>25}"
    print(head)
    print("-" * len(head))
    rows = []
    for name, r in res.items():
        acc = r["result"]
        rows.append({"row": name, **acc, "seconds": r["seconds"], "seconds_all": r["seconds_all"], "peak_mb": r["peak_mb"]})
        print(f"{name:<36} {acc['top1']:>7.4f} {acc['top5']:>7.4f} {r['seconds']:>9.3f} {r['peak_mb']:>25.0f}")
    if ref_note:
        rows.append({"row": "reference (unchunked, full Q x N)", "note": ref_note, "needs_gb": need})
        print(f"{'reference (unchunked, full Q x N)':<36} reference: {ref_note}")
    print(f"{'Bayes (nearest true class mean)':<36} {bayes:>7.4f}")

    ours = rows[0]
    if len(rows) > 1 and "top1" in rows[1]:
        same = ours["top1"] == rows[1]["top1"] and ours["top5"] == rows[1]["top5"]
        check = "OK" if same else "MISMATCH"
        speed = f"; resdecay takes {ours['seconds'] / rows[1]['seconds']:.2f}x the reference's time"
    else:
        check, speed = "not checked (no reference result)", ""
    target = d["target_s"]
    passed = ours["seconds"] < target
    print(f"check: identical top-1/top-5 -> {check}{speed}")
    print(f"target: resdecay < {target:g} s -> {verdict(passed)}" + (" (target set for the default size)" if custom else ""))
    # no `del bank, queries` here: reference() and the lambda above close over them, and returning frees them
    return {"bank": N, "queries": Q, "dim": D, "classes": C, "k": KNN_K, "temperature": KNN_T, "sep": KNN_SEP,
            "bayes_top1": bayes, "reference_needs_gb": need, "rows": rows, "check": check, "target_s": target,
            "pass": passed, "custom_size": custom}


def section_probe(args, device) -> dict:
    cuda = device.type == "cuda"
    epochs = args.probe_epochs
    recipe = dataclasses.replace(IN100_RECIPE, epochs=epochs)
    n_tr, n_te, D, C = (PROBE_SIZE[k] for k in ("train", "test", "dim", "classes"))
    custom = (args.probe_train, args.probe_test) != (None, None)
    n_tr, n_te = args.probe_train or n_tr, args.probe_test or n_te
    g = torch.Generator().manual_seed(args.seed + 1)
    means = PROBE_SEP * torch.randn(C, D, generator=g)
    xtr, ytr = class_data(n_tr, means, g)
    xte, yte = class_data(n_te, means, g)
    bayes = bayes_top1(xte, yte, means)
    steps = epochs * math.ceil(n_tr / recipe.batch_size)
    print(f"\n== 2. linear probe (IN100_RECIPE: AdamW lr {recipe.lr:g} wd {recipe.weight_decay:g}, batch {recipe.batch_size}, "
          f"{epochs} epochs = {steps:,} steps, per-step cosine to 0): train {n_tr:,} x {D}, test {n_te:,}, {C} classes, "
          f"fp32 on {device.type}; one run each")
    head = f"{'row':<44} {'test top1':>9} {'test top5':>9} {'seconds':>9} {'ms/step':>8}"
    print(head)
    print("-" * len(head))
    rows = []
    for name, fn in (("resdecay linear_probe", lambda: linear_probe(xtr, ytr, xte, yte, recipe, device, C)),
                     ("reference (DataLoader + nn.Linear + AdamW)", lambda: probe_reference(xtr, ytr, xte, yte, epochs, device, C))):
        out, s, _ = measure(fn, device)
        rows.append({"row": name, **out, "seconds": s})
        print(f"{name:<44} {out['top1']:>9.4f} {out['top5']:>9.4f} {s:>9.2f} {1e3 * s / steps:>8.2f}", flush=True)
    print(f"{'Bayes (nearest true class mean)':<44} {bayes:>9.4f}")
    ours = rows[0]
    print(f"resdecay train top-1 {ours['train_top1']:.4f}, final loss {ours['final_loss']:.4f}; "
          f"resdecay takes {ours['seconds'] / rows[1]['seconds']:.2f}x the reference's time")
    if cuda:
        passed = None
        print(f"target: resdecay < {PROBE_TARGET_S:g} s on CPU -> n/a on cuda")
    else:
        passed = ours["seconds"] < PROBE_TARGET_S
        note = "" if epochs == IN100_RECIPE.epochs and not custom else \
            f" (target set for {IN100_RECIPE.epochs} epochs on {PROBE_SIZE['train']:,} features)"
        print(f"target: resdecay < {PROBE_TARGET_S:g} s -> {verdict(passed)}{note}")
    return {"train": n_tr, "test": n_te, "dim": D, "classes": C, "sep": PROBE_SEP, "epochs": epochs, "steps": steps,
            "recipe": recipe.card(), "bayes_top1": bayes, "rows": rows, "target_s": PROBE_TARGET_S, "pass": passed,
            "custom_size": custom}


def rank_large(args, device, g: torch.Generator) -> tuple[list, float, bool]:
    """The timed rows of section 3 on RANK_SIZE features (``--rank-rows`` of them): (rows, |difference|, ok).
    A function of its own so that the large features, which the timed lambdas close over, are freed when it returns."""
    N, D = args.rank_rows or RANK_SIZE[0], RANK_SIZE[1]
    x = spectrum_feats(N, D, g, device)
    effective_rank(x[:512, :64]), rank_covariance(x[:512, :64])  # warm-up
    print(f"\n== 3. effective rank (paper eq. 6, rho = -sum p log p): {N:,} x {D} features (power-law spectrum, random basis), "
          f"float64 on {device.type}; median of {args.repeats} alternating runs")
    res = alternate({"resdecay effective_rank (SVD of N x D)": lambda: effective_rank(x),
                     "reference (eigvalsh of D x D covariance)": lambda: rank_covariance(x)}, args.repeats, device)
    head = f"{'row':<44} {'rho':>18} {'exp(rho)':>9} {'seconds':>9}"
    print(head)
    print("-" * len(head))
    rows = []
    for name, r in res.items():
        rows.append({"row": name, "rho": r["result"], "seconds": r["seconds"], "seconds_all": r["seconds_all"]})
        print(f"{name:<44} {r['result']:>18.12f} {math.exp(r['result']):>9.2f} {r['seconds']:>9.3f}")
    diff = abs(rows[0]["rho"] - rows[1]["rho"])
    ok = diff < RANK_TOL
    print(f"check: |difference| {diff:.1e} -> {'OK' if ok else 'MISMATCH'} (< {RANK_TOL:g}); "
          f"resdecay takes {rows[0]['seconds'] / rows[1]['seconds']:.2f}x the reference's time")
    return rows, diff, ok


def section_rank(args, device) -> dict:
    g = torch.Generator(device=device).manual_seed(args.seed + 2)
    N, D = args.rank_rows or RANK_SIZE[0], RANK_SIZE[1]
    rows, diff, ok = rank_large(args, device, g)
    n, d = RANK_SMALL
    xs = spectrum_feats(n, d, g, device)
    small = {"svd (resdecay)": effective_rank(xs), "covariance D x D": rank_covariance(xs), "Gram N x N": rank_gram(xs)}
    sdiff = max(abs(v - small["svd (resdecay)"]) for v in small.values())
    sok = sdiff < RANK_TOL
    print(f"small case {n:,} x {d}: " + ", ".join(f"{k} {v:.12f}" for k, v in small.items())
          + f"; max |difference| {sdiff:.1e} -> {'OK' if sok else 'MISMATCH'}")
    return {"n": N, "dim": D, "rows": rows, "abs_diff": diff, "ok": ok, "tolerance": RANK_TOL,
            "small": {"n": n, "dim": d, **small, "max_abs_diff": sdiff, "ok": sok}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--sections", default="knn,probe,rank", help="comma-separated subset of knn,probe,rank")
    ap.add_argument("--bank", type=int, default=None, help="kNN bank size (default cpu 60,000, cuda 1,281,167)")
    ap.add_argument("--queries", type=int, default=None, help="kNN queries (default cpu 10,000, cuda 50,000)")
    ap.add_argument("--dim", type=int, default=None, help="kNN feature width (default cpu 192, cuda 768)")
    ap.add_argument("--classes", type=int, default=None, help="kNN classes (default cpu 10, cuda 1000)")
    ap.add_argument("--probe-epochs", type=int, default=IN100_RECIPE.epochs, help="probe epochs (default: the recipe's 200)")
    ap.add_argument("--probe-train", type=int, default=None, help="probe train features (default 60,000)")
    ap.add_argument("--probe-test", type=int, default=None, help="probe test features (default 10,000)")
    ap.add_argument("--rank-rows", type=int, default=None, help="rows of the timed effective-rank case (default 50,000)")
    ap.add_argument("--repeats", type=int, default=3, help="alternating runs per kNN and rank row; medians over these")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) (CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--strict", action="store_true", help="exit 1 on a FAIL as well as on a MISMATCH")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()

    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    if not sections or set(sections) - {"knn", "probe", "rank"}:
        bad_input(f"--sections {args.sections!r}: choose from knn,probe,rank")
    if args.repeats < 1 or args.probe_epochs < 1:
        bad_input("--repeats and --probe-epochs must be at least 1")
    for k in ("bank", "queries", "dim", "classes", "probe_train", "probe_test"):
        if getattr(args, k) is not None and getattr(args, k) < 1:
            bad_input(f"--{k.replace('_', '-')} must be positive")
    if args.rank_rows is not None and args.rank_rows < 2:
        bad_input("--rank-rows must be at least 2 (a covariance needs two rows)")
    if args.bank is not None and args.bank < KNN_K:
        bad_input(f"--bank must hold at least k={KNN_K} entries")
    if args.device == "cuda" and not torch.cuda.is_available():
        bad_input("--device cuda: no CUDA device visible; run on the CPU (the default) or on a machine with a GPU")
    if args.threads:
        torch.set_num_threads(args.threads)
    device, cuda = torch.device(args.device), args.device == "cuda"

    name = torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine())
    print(f"eval_speed | torch {torch.__version__} | {args.device} ({name}) | threads {torch.get_num_threads()} | seed {args.seed}")
    mem_label = MEM_LABEL[mem_start(device)[0]]
    t_start = time.perf_counter()
    out, summary, mismatch, failed = {}, [], False, False
    if "knn" in sections:
        r = out["knn"] = section_knn(args, device, mem_label)
        summary.append((f"kNN resdecay < {r['target_s']:g} s ({r['rows'][0]['seconds']:.2f} s)", verdict(r["pass"])))
        summary.append(("kNN identical accuracies vs unchunked reference", r["check"]))
        mismatch |= r["check"] == "MISMATCH"
        failed |= not r["pass"]
    if "probe" in sections:
        r = out["probe"] = section_probe(args, device)
        s = r["rows"][0]["seconds"]
        summary.append((f"probe resdecay < {r['target_s']:g} s on CPU ({s:.1f} s, {r['epochs']} epochs)",
                        "n/a (cuda)" if r["pass"] is None else verdict(r["pass"])))
        failed |= r["pass"] is False
    if "rank" in sections:
        r = out["rank"] = section_rank(args, device)
        summary.append((f"effective rank SVD vs covariance, |diff| < {RANK_TOL:g} ({r['abs_diff']:.1e})", "OK" if r["ok"] else "MISMATCH"))
        summary.append((f"effective rank small case, SVD = covariance = Gram ({r['small']['max_abs_diff']:.1e})",
                        "OK" if r["small"]["ok"] else "MISMATCH"))
        mismatch |= not (r["ok"] and r["small"]["ok"])
    total = time.perf_counter() - t_start

    print(f"\n== summary ({total:.0f} s in all)")
    width = max(len(k) for k, _ in summary)
    for k, v in summary:
        print(f"{k:<{width}}  {v}")
    if not cuda:
        how = ("peak resident set (VmHWM, reset per call) minus the resident set at the call's start"
               if mem_label.startswith("peak MB (VmHWM") else "ru_maxrss growth (under-reports calls after the first)")
        print(f"CPU memory = {how}; inputs excluded; approximate, includes allocator slack.")

    if args.json:
        meta = {"benchmark": "eval_speed", "torch": torch.__version__, "device": args.device, "device_name": name,
                "threads": torch.get_num_threads(), "seed": args.seed, "repeats": args.repeats, "memory": mem_label,
                "total_seconds": total}
        with open(args.json, "w") as f:
            json.dump({**meta, **out}, f, indent=2)
        print(f"wrote {args.json}")
    return 1 if mismatch or (args.strict and failed) else 0


if __name__ == "__main__":
    sys.exit(main())
