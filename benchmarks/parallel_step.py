"""The training step under ``train.parallel=ddp`` and ``fsdp2`` on one device: step time, peak memory and MFU, side by
side in one run (issue 53's GPU rows: mae-b16 and sit-xl2 on one GPU).

What is measured
    One process with a one-rank process group (gloo on CPU, NCCL on GPU), as a one-GPU torchrun would have. Per preset
    and layout the network is built from the same seed and wrapped as the trainer wraps it: DDP, or resdecay's
    ``parallelize`` (FSDP2 per block and root; bf16 weights in the forward and fp32 gradient reduction on GPU). One
    step is the trainer's: the family's objective (MAE's masked loss; SiT's velocity loss) under bf16 autocast on GPU
    (fp32 on CPU), backward, AdamW. On one device FSDP2 shards nothing, so the ratio is its bookkeeping's cost
    (per-block all-gather and reduce-scatter calls, DTensor parameters); the memory it saves needs several ranks
    (``fsdp_memory.py``).

How
    After ``--warmup`` steps each, the layouts alternate for ``--rounds`` rounds of ``--steps`` steps; medians. Peak
    memory: CUDA max allocated (CPU: the process's VmHWM growth, approximate). MFU: 3 x the model's analytic forward
    FLOPs per image x images/s over the GPU's peak bf16 FLOP/s (none on CPU).

    python benchmarks/parallel_step.py --device cuda --presets mae-b16,sit-xl2 --batch-size 64 --json gpu.json
    python benchmarks/parallel_step.py --presets mae-tiny-digits --batch-size 16     # CPU smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import warnings

from _measure import bad_input, mem_peak, mem_start, timed_steps

LAYOUTS = ("ddp", "fsdp2")


def build_step(cfg, layout: str, device, batch: int):
    """(step function, images per step, forward FLOPs per image) of one preset under one layout."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    from resdecay.models import build_model, get_family
    from resdecay.train.optim import autocast_dtype, make_optimizer, param_groups
    from resdecay.train.parallel import device_mesh, parallelize

    torch.manual_seed(0)
    model = build_model(cfg.model).to(device).train()
    amp = autocast_dtype("auto", device)
    flops = model.flops_per_sample()
    if layout == "fsdp2":
        wrapped = parallelize(model, device_mesh("fsdp2", 1, device), param_dtype=amp)
    else:
        wrapped = DDP(model, device_ids=[device.index or 0] if device.type == "cuda" else None,
                      gradient_as_bucket_view=True)
    optimizer = make_optimizer(param_groups(model, 0.05), "adamw", 1e-4, (0.9, 0.95))
    objective = get_family(cfg.model.family).objective
    images = torch.randn(batch, cfg.model.in_chans, cfg.model.img_size, cfg.model.img_size, device=device)
    labels = torch.randint(0, max(getattr(cfg.model, "num_classes", 0), 1), (batch,), device=device)

    def step():
        with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
            loss = objective(wrapped, images, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step, flops


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="mae-b16,sit-xl2", help="comma list of presets")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=5, help="steps per layout per round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) (CPU)")
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()
    if min(args.batch_size, args.steps, args.rounds) < 1 or args.warmup < 0:
        bad_input("--batch-size, --steps and --rounds must be >= 1 and --warmup >= 0")
    from resdecay.errors import ConfigError
    from resdecay.train.config import load_config

    configs = {}
    for name in [n.strip() for n in args.presets.split(",") if n.strip()]:
        try:
            configs[name] = load_config(name, [])
        except (ConfigError, ValueError, OSError) as e:
            bad_input(f"--presets {name}: {str(e).splitlines()[0]}")
    import torch
    import torch.distributed as dist

    from resdecay.train.log.runlog import peak_flops

    if args.device == "cuda" and not torch.cuda.is_available():
        bad_input("--device cuda: no CUDA device visible")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    print(f"parallel_step | torch {torch.__version__} | {where} | one rank | batch {args.batch_size} | "
          f"{args.rounds} rounds x {args.steps} steps, {args.warmup} warmup")
    head = f"{'preset':<16} {'layout':<6} {'ms/step':>9} {'img/s':>8} {'x ddp':>6} {'peak MB':>9} {'MFU':>6}"
    print(head + "\n" + "-" * len(head))
    rows, peak = [], peak_flops(device)
    warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")  # as the trainer
    build_step(next(iter(configs.values())), "ddp", device, args.batch_size)  # thrown away: one-off allocations
    for name, cfg in configs.items():
        times, mem, flops = {}, {}, 0.0
        steps = {}
        for layout in LAYOUTS:
            method, base = mem_start(device)
            steps[layout], flops = build_step(cfg, layout, device, args.batch_size)
            timed_steps(steps[layout], args.warmup, 1, device)
            mem[layout], times[layout] = mem_peak(device, method, base), []
        for _ in range(args.rounds):  # alternating, so drift hits both alike
            for layout in LAYOUTS:
                times[layout] += timed_steps(steps[layout], 0, args.steps, device)[0]
        for layout in LAYOUTS:
            ms = 1000 * statistics.median(times[layout])
            img_s = args.batch_size / (ms / 1000)
            row = {"preset": name, "layout": layout, "ms": ms, "img_per_s": img_s, "peak_mb": mem[layout],
                   "mfu": 3 * flops * img_s / peak if peak else None,
                   "ratio": ms / (1000 * statistics.median(times["ddp"]))}
            rows.append(row)
            mfu = f"{row['mfu']:.1%}" if row["mfu"] is not None else "-"
            print(f"{name:<16} {layout:<6} {ms:>9.1f} {img_s:>8.1f} {row['ratio']:>6.2f} {mem[layout]:>9.0f} {mfu:>6}",
                  flush=True)
        steps.clear()
    dist.destroy_process_group()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "parallel_step", "torch": torch.__version__, "device": args.device,
                       "device_name": where, "batch_size": args.batch_size, "rounds": args.rounds, "steps": args.steps,
                       "warmup": args.warmup, "rows": rows}, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
