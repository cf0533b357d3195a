"""The batch per device at which a preset trains fastest: resdecay's training step (the one
``mae_throughput.py`` times: forward, backward, AdamW as the trainer makes it, bf16 autocast on
CUDA) at each batch of ``--batches``, interleaved, with img/s, ms/step and peak memory; a batch
that does not fit is listed as "out of memory" (CUDA) instead of ending the sweep.

This is how the ``mae-b16`` preset's ``train.batch_size`` is to be chosen: the fastest
batch whose peak memory fits the card with headroom.

    python benchmarks/batch_sweep.py                                          # tiny preset, CPU
    python benchmarks/batch_sweep.py --preset mae-b16 --device cuda --batches 64,128,256,384,512 --compile
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys

import torch

from _measure import MEM_LABEL, bad_input, mae_config, sync, timed_steps
from mae_throughput import Variant
from resdecay.models import build_model


def is_oom(e: BaseException) -> bool:
    return isinstance(e, torch.OutOfMemoryError) or "out of memory" in str(e).lower()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="mae-tiny-digits")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batches", default="16,32,64,128", help="comma-separated batch sizes per device")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps per batch (default cpu 3, cuda 10)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per batch per round (default cpu 5, cuda 20)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--compile", action="store_true", help="torch.compile the model (as train.compile=true)")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) (CPU)")
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    try:
        batches = [int(b) for b in args.batches.split(",")]
    except ValueError:
        batches = []
    if not batches or min(batches) < 1:
        bad_input(f"--batches must be positive integers separated by commas, got {args.batches!r}")
    if args.rounds < 1 or (args.steps is not None and args.steps < 1) or (args.warmup is not None and args.warmup < 0):
        bad_input("--rounds and --steps must be at least 1, --warmup at least 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        bad_input("--device cuda: no CUDA device visible; run on the CPU (the default) or on a machine with a GPU")
    device, cuda = torch.device(args.device), args.device == "cuda"
    warmup = args.warmup if args.warmup is not None else (10 if cuda else 3)
    steps = args.steps if args.steps is not None else (20 if cuda else 5)
    if args.threads:
        torch.set_num_threads(args.threads)
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
    cfg = mae_config(args.preset)
    mc = cfg.model
    torch.manual_seed(0)
    model = build_model(mc)
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    total = torch.cuda.get_device_properties(device).total_memory / 2**20 if cuda else None
    print(f"batch_sweep | {args.preset} | {name} | {'bf16 autocast' if cuda else 'fp32'} | compile {args.compile} | "
          f"threads {torch.get_num_threads()} | {warmup} warmup, {args.rounds} rounds x {steps} steps")

    variants, oom = [], {}
    for b in batches:
        imgs = torch.randn(b, mc.in_chans, mc.img_size, mc.img_size, device=device)
        make = lambda: torch.compile(copy.deepcopy(model).to(device)) if args.compile else copy.deepcopy(model).to(device)  # noqa: E731
        v = Variant(f"batch {b}", "U-Net", None, make, True, cfg, imgs, device)
        try:
            v.build(warmup)
            variants.append((b, v))
        except Exception as e:  # noqa: BLE001 - only out-of-memory is expected; anything else is re-raised
            if not is_oom(e):
                raise
            oom[b] = True
            del v, imgs
            if cuda:
                torch.cuda.empty_cache()
    for r in range(args.rounds):
        k = r % max(len(variants), 1)
        for _, v in variants[k:] + variants[:k]:
            v.times += timed_steps(v.step, 1, steps, device)[0]
    sync(device)
    rows = []
    label = MEM_LABEL[variants[0][1].mem_method] if variants else "peak MB"
    head = f"{'batch':>7}{'img/s':>10}{'ms/step':>10}{label:>28}"
    print(head + ("   of the card" if cuda else ""))
    print("-" * len(head))
    best = max(variants, key=lambda bv: bv[0] / statistics.median(bv[1].times), default=None)
    for b in batches:
        if b in oom:
            rows.append({"batch": b, "oom": True})
            print(f"{b:>7}{'out of memory':>48}")
            continue
        v = dict(variants)[b]
        ms = statistics.median(v.times) * 1e3
        rows.append({"batch": b, "img_per_s": b / ms * 1e3, "ms_per_step": ms, "peak_mem_mb": v.peak_mb})
        share = f"   {100 * v.peak_mb / total:.0f}%" if total else ""
        print(f"{b:>7}{b / ms * 1e3:>10.1f}{ms:>10.2f}{v.peak_mb:>28.0f}{share}{'   <- fastest' if best and best[0] == b else ''}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "batch_sweep", "preset": args.preset, "device": name, "compile": args.compile,
                       "cpus": os.cpu_count(), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
