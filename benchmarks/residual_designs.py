"""What each residual design costs: the MAE's training step per design, against the same model with plain adds.

What is measured
    One U-Net MAE (a preset, default ``mae-tiny-fmnist``: skips, zero-initialised branches) built once per design
    from the same seed, with the design's ``model.*`` settings on top (``DESIGNS``: the decay, a learnable alpha,
    Table 3b's scalings, the orthogonal update, branch gains, stochastic depth on either path, hyper-connections).
    One step is the trainer's: the MAE's masked loss, backward, AdamW. The reference row is the same preset with
    ``alpha_min=1.0`` (the plain residual of Table 3b), so each ratio is the design's cost alone.

How
    bf16 autocast on CUDA, fp32 on CPU. After warmup, the designs are timed in rotating order (ABC.., BC..A, ...) for
    ``--rounds`` rounds of ``--steps`` steps, so drift hits every design alike; per round each design's median step
    is divided by the plain model's of the same round. Peak memory is measured around each design's build and warmup
    (``_measure.mem_start`` / ``mem_peak``: CUDA max allocated, or the CPU's VmHWM growth).

How to read the numbers
    ms: median step. ratio: median over rounds of design / plain; +-: half the inter-quartile range of those ratios
    (the timing noise). params: the design's parameters and what it adds to the plain model's.

    python benchmarks/residual_designs.py                              # every design, CPU
    python benchmarks/residual_designs.py --designs plain,orthogonal --threads 1 --json out.json
    python benchmarks/residual_designs.py --device cuda --preset mae-b16 --batch-size 64
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys

import torch

from _measure import bad_input, mae_config, mem_peak, mem_start, sync, timed_steps
from resdecay.models import build_model

# design -> its model settings on top of the preset (the reference "plain" is the preset at alpha 1)
DESIGNS: dict[str, list[str]] = {
    "plain": ["model.alpha_min=1.0"],
    "decay 0.6": ["model.alpha_min=0.6"],
    "learnable alpha": ["model.shortcut=learnable"],
    "sqrt(0.5) (x + f)": ["model.shortcut=scaled_sum"],
    "orthogonal": ["model.alpha_min=1.0", "model.shortcut=orthogonal"],
    "orthogonal + decay 0.6": ["model.alpha_min=0.6", "model.shortcut=orthogonal_decay"],
    "LayerScale": ["model.alpha_min=1.0", "model.branch_scale=layerscale"],
    "ReZero": ["model.alpha_min=1.0", "model.branch_scale=rezero"],
    "SkipInit": ["model.alpha_min=1.0", "model.branch_scale=skipinit"],
    "drop branch 0.1": ["model.alpha_min=1.0", "model.drop_branch=0.1"],
    "drop identity 0.1": ["model.alpha_min=1.0", "model.drop_identity=0.1"],
    "hyper-connections n=2": ["model.alpha_min=1.0", "model.hyper_streams=2"],
    "hyper-connections n=4": ["model.alpha_min=1.0", "model.hyper_streams=4"],
    "mHC n=4": ["model.alpha_min=1.0", "model.hyper_streams=4", "model.hyper_variant=mhc"],
    "hyper-connections n=4 + decay 0.6": ["model.alpha_min=0.6", "model.hyper_streams=4"],
}


def build(preset: str, overrides: list[str], device: torch.device, seed: int):
    cfg = mae_config(preset, overrides)
    torch.manual_seed(seed)
    model = build_model(cfg.model).to(device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=cfg.train.weight_decay)
    return cfg, model, opt


class Design:
    """One design's model, optimizer, fixed batch and measurements."""

    def __init__(self, name: str, args, device: torch.device):
        self.name, self.device = name, device
        method, base = mem_start(device)
        cfg, self.model, self.opt = build(args.preset, [*args.set, *DESIGNS[name]], device, args.seed)
        g = torch.Generator().manual_seed(args.seed)
        m = cfg.model
        self.images = torch.rand(args.batch_size, m.in_chans, m.img_size, m.img_size, generator=g).to(device)
        self.params = sum(p.numel() for p in self.model.parameters())
        timed_steps(self.step, args.warmup, 0, device)
        sync(device)
        self.peak_mb, self.mem_method = mem_peak(device, method, base), method
        self.times: list[float] = []

    def step(self) -> torch.Tensor:
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            loss = self.model(self.images)[0]
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()


def measure(designs: list[Design], args) -> list[dict]:
    plain = designs[0]
    per_round: dict[str, list[float]] = {d.name: [] for d in designs}
    ratios: dict[str, list[float]] = {d.name: [] for d in designs}
    for r in range(args.rounds):
        k = r % len(designs)
        for d in designs[k:] + designs[:k]:  # rotate the order: drift hits every design alike
            times, _ = timed_steps(d.step, 0, args.steps, d.device)
            per_round[d.name].append(statistics.median(times) * 1e3)
        for d in designs:
            ratios[d.name].append(per_round[d.name][-1] / per_round[plain.name][-1])
    rows = []
    for d in designs:
        q1, _, q3 = statistics.quantiles(ratios[d.name], n=4) if args.rounds >= 2 else (0.0, 0.0, 0.0)
        rows.append({"design": d.name, "settings": DESIGNS[d.name], "params": d.params,
                     "extra_params": d.params - plain.params, "ms": statistics.median(per_round[d.name]),
                     "ratio": statistics.median(ratios[d.name]), "ratio_noise": (q3 - q1) / 2,
                     "peak_mb": d.peak_mb, "mem_method": d.mem_method, "ms_all": per_round[d.name]})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="mae-tiny-fmnist", help="an MAE preset (the U-Net MAE: skips, zero-init)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="more settings for every design")
    ap.add_argument("--designs", default=",".join(DESIGNS), help=f"comma list of: {', '.join(DESIGNS)}")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=2, help="steps per design before timing (and for its memory)")
    ap.add_argument("--steps", type=int, default=3, help="steps per design per round")
    ap.add_argument("--rounds", type=int, default=8, help="rotating rounds; medians over these")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) (CPU)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()
    names = [n.strip() for n in args.designs.split(",") if n.strip()]
    unknown = [n for n in names if n not in DESIGNS]
    if unknown:
        bad_input(f"--designs: unknown {', '.join(unknown)}; choose from {', '.join(DESIGNS)}")
    if args.batch_size < 1 or args.steps < 1 or args.rounds < 1 or args.warmup < 0:
        bad_input("--batch-size, --steps and --rounds must be >= 1 and --warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        bad_input("--device cuda: no CUDA device visible")
    if args.threads:
        torch.set_num_threads(args.threads)
    names = ["plain"] + [n for n in names if n != "plain"]  # the reference first
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    where = torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine())
    print(f"residual_designs | torch {torch.__version__} | {args.device} ({where}) | {'bf16 autocast' if cuda else 'fp32'}"
          f" | threads {torch.get_num_threads()} | preset {args.preset} {' '.join(args.set)} | batch {args.batch_size}")
    print(f"MAE training step (loss, backward, AdamW) per design vs the same preset at alpha 1; {args.rounds} rotating "
          f"rounds x {args.steps} steps, {args.warmup} warmup")
    Design("plain", args, device)  # thrown away: the process's first build and steps pay one-off allocations
    designs = [Design(n, args, device) for n in names]
    rows = measure(designs, args)
    head = f"{'design':<34} {'params':>9} {'extra':>7} {'ms/step':>9} {'ratio':>7} {'+-':>6} {'peak MB':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['design']:<34} {r['params']:>9,} {r['extra_params']:>+7,} {r['ms']:>9.2f} {r['ratio']:>7.3f} "
              f"{r['ratio_noise']:>6.3f} {r['peak_mb']:>8.1f}", flush=True)
    if args.json:
        meta = {"benchmark": "residual_designs", "torch": torch.__version__, "device": args.device, "device_name": where,
                "dtype": "bf16-autocast" if cuda else "fp32", "threads": torch.get_num_threads(), "preset": args.preset,
                "set": args.set, "batch_size": args.batch_size, "warmup": args.warmup, "steps": args.steps,
                "rounds": args.rounds}
        with open(args.json, "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
