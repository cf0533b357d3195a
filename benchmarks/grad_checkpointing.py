"""Activation checkpointing's trade: peak memory and step time of one training step (forward, backward,
AdamW) with and without ``model.grad_checkpointing``, the same model, weights and batch, interleaved rounds.

The reference is the same model without checkpointing: the lever's price (recomputation) and its gain
(activation memory) side by side. On the CPU the peak is the growth of the process's resident set during
the steps (VmHWM, reset before each variant; approximate), on a GPU ``torch.cuda.max_memory_allocated``.

    python benchmarks/grad_checkpointing.py                                   # mae-b16 and sit-b2, batch 8, CPU
    python benchmarks/grad_checkpointing.py --device cuda --batch-size 128    # on a GPU (bf16 autocast)
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys

import torch

from _measure import MEM_LABEL, bad_input, mem_peak, mem_start, sync, timed_steps
from resdecay.errors import ConfigError
from resdecay.models import build_model
from resdecay.models.registry import get_family
from resdecay.train.config import load_config


class Variant:
    def __init__(self, preset: str, checkpointed: bool, batch: int, device: torch.device):
        try:
            cfg = load_config(preset, [f"model.grad_checkpointing={str(checkpointed).lower()}"])
        except (ConfigError, ValueError, OSError) as exc:
            bad_input(str(exc).splitlines()[0])
        self.label = f"{preset} {'checkpointed' if checkpointed else 'plain'}"
        self.preset, self.checkpointed, self.device, self.times, self.peaks = preset, checkpointed, device, [], []
        self.spec = get_family(cfg.model.family)
        torch.manual_seed(0)
        self.model = build_model(cfg.model).to(device).train()
        self.batch = self.spec.example_batch(self.model, batch)
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)

    def step(self):
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            torch.manual_seed(1)
            loss = self.spec.objective(self.model, self.batch.images.to(self.device), self.batch.labels.to(self.device))
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()

    def measure(self, warmup: int, steps: int) -> None:
        if warmup:  # the first round: AdamW's state exists before the peak is measured
            timed_steps(self.step, warmup, 0, self.device)
        method, base = mem_start(self.device)
        times, _ = timed_steps(self.step, 0, steps, self.device)
        sync(self.device)
        self.times += times
        self.peaks.append(mem_peak(self.device, method, base))
        self.method = method


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--presets", default="mae-b16,sit-b2", help="comma-separated transformer presets")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per variant first (at least 1)")
    ap.add_argument("--steps", type=int, default=2, help="timed steps per variant per round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    if min(args.batch_size, args.steps, args.rounds, args.warmup) < 1:
        bad_input("--batch-size, --steps, --rounds and --warmup must be at least 1 (the warm-up creates AdamW's state)")
    if args.device == "cuda" and not torch.cuda.is_available():
        bad_input("--device cuda: no CUDA device visible")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else (platform.processor() or platform.machine())
    print(f"grad_checkpointing | torch {torch.__version__} | {args.device} ({name}) | threads {torch.get_num_threads()} | "
          f"batch {args.batch_size} | {'bf16 autocast' if device.type == 'cuda' else 'fp32'} | {args.rounds} rounds x "
          f"{args.steps} steps after {args.warmup} warmup")
    variants = [Variant(p, c, args.batch_size, device) for p in args.presets.split(",") for c in (False, True)]
    for r in range(args.rounds):
        for v in variants if r % 2 == 0 else variants[::-1]:  # alternate the order: load hits both alike
            v.measure(max(args.warmup, 1) if r == 0 else 0, args.steps)
    rows = []
    head = f"{'preset':<12}{'checkpointing':>15}{'s/step':>10}{MEM_LABEL[variants[0].method]:>28}{'time x':>9}{'memory x':>10}"
    print(head)
    print("-" * len(head))
    for plain, ckpt in zip(variants[::2], variants[1::2], strict=True):
        for v in (plain, ckpt):
            t, m = statistics.median(v.times), statistics.median(v.peaks)
            rows.append({"preset": v.preset, "grad_checkpointing": v.checkpointed, "seconds_per_step": t, "peak_mb": m,
                         "time_vs_plain": t / statistics.median(plain.times),
                         "memory_vs_plain": m / max(statistics.median(plain.peaks), 1e-9)})
            print(f"{v.preset:<12}{'on' if v.checkpointed else 'off':>15}{t:>10.3f}{m:>28.0f}"
                  f"{rows[-1]['time_vs_plain']:>9.2f}{rows[-1]['memory_vs_plain']:>10.2f}")
    print("memory: the growth of the peak during the timed steps (activations, gradients, temporaries); 'x': "
          "over the same model without checkpointing")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": name, "batch": args.batch_size, "method": variants[0].method, "rows": rows}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
