"""What a decayed shortcut costs: forward+backward time of one transformer block, decayed vs plain.

What is measured
    One ``resdecay.nn.blocks.Block`` with ``alpha_attn=0.9, alpha_mlp=0.85`` (the decayed block) and
    the same block with both alphas 1.0 (the plain ViT block), with identical weights, on random
    input of shape (batch, tokens, width). One iteration is ``out = block(x); out.backward(g)``
    with ``x.requires_grad`` (inside a network the block's input needs a gradient too, and
    that gradient is where the decay adds its multiply: ``dL/dx = alpha * g + ...``).
    The only difference between the two blocks is ``torch.add(branch, x, alpha=a)`` instead of
    ``x + branch``: one fused multiply-add, so the target is decayed/plain <= 1.01.

How
    bf16 autocast on CUDA, fp32 on CPU; ``torch.cuda.synchronize()`` around every timed window.
    After warmup, plain and decayed are measured in alternation (AB, BA, AB, ...) for
    ``--repeats`` rounds of ``--iters`` iterations each, so that drift (clock boost, heat, other
    processes) hits both alike. Per round we take the ratio decayed/plain of the two windows.

How to read the numbers
    plain ms / decayed ms: median time of one forward+backward. ratio: median of the per-round
    ratios; +-: half the inter-quartile range of those ratios, i.e. the timing noise. A ratio
    above 1.01 by less than the noise is noise, not overhead; re-run with more ``--repeats``
    (or ``--threads 1`` on a busy CPU). Verdicts are printed per row; the exit status is
    non-zero on a FAIL only with ``--strict``.

    python benchmarks/block_overhead.py                       # CPU, small shapes
    python benchmarks/block_overhead.py --device cuda         # ViT-B shapes, bf16
    python benchmarks/block_overhead.py --shape 8,197,768,12 --json out.json
    python benchmarks/block_overhead.py --update orthogonal   # the orthogonal update (alpha 1) against the plain add
    python benchmarks/block_overhead.py --compile             # both blocks through torch.compile
                                                              # (inductor fuses the alpha scale of the
                                                              # identity gradient into a neighbouring kernel)
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys
import time

import torch

from resdecay.nn.blocks import Block
from resdecay.nn.updates import RESIDUAL_UPDATES, update_named

ALPHA_ATTN, ALPHA_MLP = 0.9, 0.85
# (batch, tokens, width, heads): CPU = the tiny presets' sizes, CUDA = ViT-B/16 MAE encoder
# (50 tokens: 1 cls + 49 visible at mask 0.75) and a full ViT-B/16 sequence (197 tokens).
DEFAULT_SHAPES = {"cpu": [(32, 50, 192, 3), (64, 17, 64, 4)], "cuda": [(256, 50, 768, 12), (256, 197, 768, 12)]}


def parse_shape(text: str) -> tuple[int, int, int, int]:
    parts = [int(v) for v in text.split(",")]
    if len(parts) == 3:
        parts.append(max(1, parts[2] // 64))  # ViT convention: 64 channels per head
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"--shape {text!r}: write batch,tokens,width[,heads]")
    return tuple(parts)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def fwd_bwd_ms(block: Block, x: torch.Tensor, g: torch.Tensor, iters: int, amp: bool) -> float:
    """Mean milliseconds of one forward+backward over ``iters`` back-to-back iterations."""
    sync(x.device)
    t0 = time.perf_counter()
    for _ in range(iters):
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=amp):
            out = block(x)
        out.backward(g)
        x.grad = None
        block.zero_grad(set_to_none=True)
    sync(x.device)
    return (time.perf_counter() - t0) * 1e3 / iters


def check_same_weights(plain: Block, decayed: Block, x: torch.Tensor) -> float:
    """max |decayed(x) - manual decayed forward with the plain block's modules| (fp32)."""
    with torch.no_grad():
        y = ALPHA_ATTN * x + plain.attn(plain.norm1(x))
        y = ALPHA_MLP * y + plain.mlp(plain.norm2(y))
        return (decayed(x) - y).abs().max().item()


def bench_shape(shape, device, args) -> dict:
    B, T, D, H = shape
    amp = device.type == "cuda"
    torch.manual_seed(0)
    plain = Block(D, H).to(device)  # alphas 1.0: the standard ViT block
    decayed = copy.deepcopy(plain)  # identical weights ...
    if args.update is None:
        decayed.alpha_attn, decayed.alpha_mlp = ALPHA_ATTN, ALPHA_MLP  # ... only the shortcut factors differ
    else:  # ... only the update of the branch differs (alpha 1: its cost alone)
        decayed.update, decayed.update_fn = args.update, update_named(args.update)
    x = torch.randn(B, T, D, device=device, requires_grad=True)
    g = torch.randn(B, T, D, device=device)
    err = check_same_weights(plain, decayed, x[:2].detach()) if args.update is None else 0.0
    if err > 1e-4:
        raise SystemExit(f"decayed block does not compute {ALPHA_ATTN}*x + Attn(LN x), ... (max err {err:.2e})")
    if args.compile:  # each block gets its own compiled graph (the alphas are constants in it)
        plain, decayed = torch.compile(plain), torch.compile(decayed)

    for blk in (plain, decayed):
        fwd_bwd_ms(blk, x, g, args.warmup, amp)
    t_plain, t_dec, ratios = [], [], []
    for r in range(args.repeats):
        order = (plain, decayed) if r % 2 == 0 else (decayed, plain)  # AB, BA, AB, ...
        ms = {id(blk): fwd_bwd_ms(blk, x, g, args.iters, amp) for blk in order}
        t_plain.append(ms[id(plain)])
        t_dec.append(ms[id(decayed)])
        ratios.append(ms[id(decayed)] / ms[id(plain)])
    q1, _, q3 = statistics.quantiles(ratios, n=4)
    ratio = statistics.median(ratios)
    return {"batch": B, "tokens": T, "width": D, "heads": H,
            "plain_ms": statistics.median(t_plain), "decayed_ms": statistics.median(t_dec),
            "ratio": ratio, "ratio_noise": (q3 - q1) / 2, "pass": ratio <= args.threshold,
            "plain_ms_all": t_plain, "decayed_ms_all": t_dec}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--shape", type=parse_shape, action="append", metavar="B,T,D[,H]",
                    help="batch,tokens,width[,heads] (repeatable; default depends on the device)")
    ap.add_argument("--warmup", type=int, default=None, help="warmup iterations per block (default cpu 3, cuda 20)")
    ap.add_argument("--iters", type=int, default=None, help="iterations per timed window (default cpu 3, cuda 20)")
    ap.add_argument("--repeats", type=int, default=None, help="AB rounds; medians over these (default cpu 60, cuda 30)")
    ap.add_argument("--threshold", type=float, default=1.01, help="largest acceptable decayed/plain ratio")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) (CPU)")
    ap.add_argument("--strict", action="store_true", help="exit 1 if any row fails the threshold")
    ap.add_argument("--compile", action="store_true", help="torch.compile both blocks (warmup includes compilation)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    ap.add_argument("--update", default=None, choices=sorted(RESIDUAL_UPDATES),
                    help="time a block whose adds apply this residual update (alpha 1) instead of the decay")
    args = ap.parse_args()

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device visible")
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    args.warmup = args.warmup if args.warmup is not None else (20 if cuda else 3)
    args.iters = args.iters if args.iters is not None else (20 if cuda else 3)
    args.repeats = args.repeats if args.repeats is not None else (30 if cuda else 60)
    if args.repeats < 2:
        ap.error("--repeats must be at least 2")
    if args.threads:
        torch.set_num_threads(args.threads)
    shapes = args.shape or DEFAULT_SHAPES[args.device]

    name = torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine())
    print(f"block_overhead | torch {torch.__version__} | {args.device} ({name}) | "
          f"{'bf16 autocast' if cuda else 'fp32'} | threads {torch.get_num_threads()} | {'compiled' if args.compile else 'eager'}")
    what = f"Block with the {args.update} update (alpha 1)" if args.update else \
        f"decayed Block (alpha_attn={ALPHA_ATTN}, alpha_mlp={ALPHA_MLP})"
    print(f"{what} vs plain Block (1.0, 1.0), same weights; "
          f"forward+backward, {args.repeats} interleaved rounds x {args.iters} iters, {args.warmup} warmup")
    head = f"{'shape (B, T, D, heads)':<24} {'plain ms':>10} {'decayed ms':>11} {'ratio':>7} {'+-':>6}  verdict (<= {args.threshold})"
    print(head)
    print("-" * len(head))
    rows = []
    for shape in shapes:
        row = bench_shape(shape, device, args)
        rows.append(row)
        print(f"{str(shape):<24} {row['plain_ms']:>10.3f} {row['decayed_ms']:>11.3f} {row['ratio']:>7.3f} "
              f"{row['ratio_noise']:>6.3f}  {'PASS' if row['pass'] else 'FAIL'}", flush=True)
    failed = [r for r in rows if not r["pass"]]
    print(f"{len(rows) - len(failed)}/{len(rows)} shapes within {args.threshold}x"
          + ("" if not failed else " (a FAIL within the +- noise is not a real overhead; try more --repeats)"))

    if args.json:
        meta = {"benchmark": "block_overhead", "torch": torch.__version__, "device": args.device, "device_name": name,
                "dtype": "bf16-autocast" if cuda else "fp32", "threads": torch.get_num_threads(), "compiled": args.compile,
                "alpha_attn": ALPHA_ATTN, "alpha_mlp": ALPHA_MLP, "update": args.update, "threshold": args.threshold,
                "warmup": args.warmup, "iters": args.iters, "repeats": args.repeats}
        with open(args.json, "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=2)
        print(f"wrote {args.json}")
    return 1 if (args.strict and failed) else 0


if __name__ == "__main__":
    sys.exit(main())
