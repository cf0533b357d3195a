"""Diffusion throughput: training steps/s (one full step: noise, forward, loss, backward, AdamW) and
sampling images/s of a preset with decayed shortcuts and long skips, next to the straightforward
eager reference measured in the same run: the same network with the paper's changes off (plain
residual alpha = 1, no long skips), i.e. what the method costs. A torch.compile row is optional.

    python benchmarks/diffusion_throughput.py                          # CPU: uvit-tiny-fmnist, sit-tiny-fmnist
    python benchmarks/diffusion_throughput.py --device cuda --preset sit-xl2 --batch-size 256 --compile
    python benchmarks/diffusion_throughput.py --preset sit-tiny-fmnist --repa-target timm:vit_tiny_patch16_224 \
        --repa-target-weights random

--repa-target SPEC (a pixel-space preset) adds a row: the decayed network's step with REPA (train.aux=repa, its
projector and frozen encoder) and, timed apart on the same batch, the frozen encoder's forward alone. A timm /
torchvision encoder needs --repa-target-weights: a file, or ``random`` (its random weights; the time is the same).

Sampling: a fixed-step sampler, so rows compare like with like (dpm-solver++ for DDPM eps models,
euler-maruyama for velocity models; not the adaptive dopri5) with --sample-steps steps, no guidance, batch = --sample-n. bf16 autocast on CUDA.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch

from _measure import MEM_LABEL, bad_input, mem_peak, mem_start, sync, timed_steps
from resdecay.commands.aux_target import load_aux_target
from resdecay.diffusion import diffusion_loss
from resdecay.diffusion.samplers import sample
from resdecay.errors import UserError, one_line
from resdecay.models import build_model, get_family
from resdecay.train import param_groups
from resdecay.train.aux_objective import AuxObjective
from resdecay.train.config import load_config
from resdecay.train.log.runlog import peak_flops

FIXED_STEP_SAMPLER = {"ddpm-eps": "dpm-solver++", "interp-v": "euler-maruyama"}


def train_row(model, cfg, batch: int, args, device) -> dict:
    m = cfg.model
    x = torch.randn(batch, m.in_chans, m.img_size, m.img_size, device=device)
    y = torch.randint(0, max(m.num_classes, 1), (batch,), device=device)
    method, base = mem_start(device)
    opt = torch.optim.AdamW(param_groups(model, cfg.train.weight_decay), lr=1e-4, fused=device.type == "cuda")
    model.train()
    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = diffusion_loss(model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    times, _ = timed_steps(step, args.warmup, args.steps, device)
    step_s = statistics.median(times)
    return {"steps_per_s": 1 / step_s, "img_per_s": batch / step_s, "ms_per_step": step_s * 1e3,
            "peak_mem_mb": mem_peak(device, method, base)}


def repa_setup(preset: str, args):
    """The REPA row's run config and frozen encoder, resolved before anything is timed: a target that cannot be
    used (no weights, a grid it cannot meet, ...) is one line, exit 2."""
    weights = [f"train.aux_target_weights={args.repa_target_weights}"] if args.repa_target_weights else []
    try:
        cfg = load_config(preset, ["train.aux=repa", f"train.aux_target={args.repa_target}", *weights])
        return cfg, load_aux_target(cfg)
    except UserError as e:
        bad_input(one_line(e))


def repa_row(preset: str, cfg, target, batch: int, args, device) -> dict:
    """The step with REPA beside the denoising loss, and the frozen encoder's forward alone on the same batch."""
    m = cfg.model
    torch.manual_seed(0)
    model = build_model(m).to(device)
    half = (0.5,) * m.in_chans  # the images are random: any pixel statistics do
    aux = AuxObjective(cfg.train, model, target, half, half, device)
    aux.attach(model)
    x = torch.randn(batch, m.in_chans, m.img_size, m.img_size, device=device)
    y = torch.randint(0, max(m.num_classes, 1), (batch,), device=device)
    opt = torch.optim.AdamW([*param_groups(model, cfg.train.weight_decay), *param_groups(aux.projector, 0.0)], lr=1e-4)
    objective = get_family(m.family).objective
    model.train()

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = aux.loss(objective, model, x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        aux.step_parts = {}
        return loss.detach()

    def encoder():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            return aux.target_tokens(x).float().mean()

    step_s = statistics.median(timed_steps(step, args.warmup, args.steps, device)[0])
    encoder_s = statistics.median(timed_steps(encoder, args.warmup, args.steps, device)[0])
    aux.remove()
    t = aux.target
    return {"preset": preset, "row": f"resdecay + REPA ({args.repa_target})", "batch": batch,
            "params": sum(p.numel() for p in model.parameters()) + sum(p.numel() for p in aux.parameters()),
            "steps_per_s": 1 / step_s, "img_per_s": batch / step_s, "ms_per_step": step_s * 1e3,
            "encoder_ms_per_step": encoder_s * 1e3, "encoder_side": t.side, "encoder_grid": t.grid}


def sample_row(model, cfg, args, device) -> dict:
    m = cfg.model
    sampler = FIXED_STEP_SAMPLER[m.objective]
    g = torch.Generator().manual_seed(0)
    model.eval()
    run = lambda: sample(model, args.sample_n, sampler=sampler, steps=args.sample_steps, image_shape=(m.in_chans, m.img_size, m.img_size),
                         generator=g, device=device, batch_size=args.sample_n)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        run()  # warmup (and compilation)
        sync(device)
        t0 = time.perf_counter()
        out = run()
        sync(device)
    dt = time.perf_counter() - t0
    assert torch.isfinite(out.float()).all()
    return {"sampler": sampler, "sample_steps": args.sample_steps, "sample_img_per_s": args.sample_n / dt, "sample_s": dt}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", action="append", default=None, help="repeatable (default cpu: uvit-tiny-fmnist, sit-tiny-fmnist)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batch-size", type=int, default=None, help="training batch (default: the preset's)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps per row (default cpu 3, cuda 10)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per row (default cpu 10, cuda 30)")
    ap.add_argument("--sample-n", type=int, default=None, help="images per sampling run (default cpu 64, cuda 256)")
    ap.add_argument("--sample-steps", type=int, default=None, help="sampler steps (default cpu 10, cuda 50)")
    ap.add_argument("--compile", action="store_true", help="add a torch.compile row (training only)")
    ap.add_argument("--repa-target", metavar="SPEC", help="add a REPA row with this frozen encoder (train.aux_target)")
    ap.add_argument("--repa-target-weights", metavar="FILE", help="its weights file, or 'random' (train.aux_target_weights)")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", metavar="PATH")
    args = ap.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device visible")
    cuda = args.device == "cuda"
    device = torch.device(args.device)
    presets = args.preset or (["sit-xl2"] if cuda else ["uvit-tiny-fmnist", "sit-tiny-fmnist"])
    args.warmup = args.warmup if args.warmup is not None else (10 if cuda else 3)
    args.steps = args.steps if args.steps is not None else (30 if cuda else 10)
    args.sample_n = args.sample_n or (256 if cuda else 64)
    args.sample_steps = args.sample_steps or (50 if cuda else 10)
    if args.threads:
        torch.set_num_threads(args.threads)
    name = torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine())
    print(f"diffusion_throughput | torch {torch.__version__} | {args.device} ({name}) | {'bf16 autocast' if cuda else 'fp32'} "
          f"| threads {torch.get_num_threads()} | {args.warmup} warmup + {args.steps} timed steps | sampling {args.sample_n} "
          f"images x {args.sample_steps} steps")
    gpu_peak = peak_flops(device)
    repa = {preset: repa_setup(preset, args) for preset in presets} if args.repa_target else {}
    results = []
    for preset in presets:
        cfg = load_config(preset, [])
        batch = args.batch_size or cfg.train.batch_size
        variants = [("resdecay (decayed + skips, eager)", []), ("reference (plain: alpha 1, no skips, eager)", ["alpha_min=1.0", "skips=false"])]
        if args.compile:
            variants.append(("resdecay (decayed + skips, torch.compile)", []))
        m0 = cfg.model
        print(f"\n{preset}: {m0.family} {m0.embed_dim}x{m0.depth}, {m0.img_size}x{m0.img_size}x{m0.in_chans} patch {m0.patch_size}, "
              f"alpha_min {m0.alpha_min}, {m0.objective}, batch {batch}")
        head = f"{'row':<44} {'params':>9} {'steps/s':>8} {'img/s':>9} {MEM_LABEL['cuda' if cuda else 'vmhwm']:>26} {'MFU':>6} {'sample img/s':>13}"
        print(head + "\n" + "-" * len(head))
        for label, over in variants:
            c = load_config(preset, over)
            torch.manual_seed(0)
            model = build_model(c.model).to(device)
            run_model = torch.compile(model) if "compile" in label else model
            r = {"preset": preset, "row": label, "params": sum(p.numel() for p in model.parameters()), "batch": batch,
                 **train_row(run_model, c, batch, args, device)}
            r["mfu"] = 3 * model.flops_per_sample() * r["img_per_s"] / gpu_peak if gpu_peak else None
            if "compile" not in label:
                r.update(sample_row(model, c, args, device))
            mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] else "-"
            samp = f"{r['sample_img_per_s']:.1f}" if "sample_img_per_s" in r else "-"
            print(f"{label:<44} {r['params'] / 1e6:>8.2f}M {r['steps_per_s']:>8.2f} {r['img_per_s']:>9.1f} {r['peak_mem_mb']:>26.0f} "
                  f"{mfu:>6} {samp:>13}", flush=True)
            results.append(r)
            del model, run_model
        ours, ref = results[-len(variants)], results[-len(variants) + 1]
        print(f"decayed + skips vs plain: training {ours['img_per_s'] / ref['img_per_s']:.2f}x, "
              f"sampling {ours['sample_img_per_s'] / ref['sample_img_per_s']:.2f}x the reference's speed")
        if args.repa_target:
            r = repa_row(preset, *repa[preset], batch, args, device)
            print(f"{r['row']:<44} {r['params'] / 1e6:>8.2f}M {r['steps_per_s']:>8.2f} {r['img_per_s']:>9.1f}")
            print(f"REPA: {r['ms_per_step']:.1f} ms a step ({ours['ms_per_step']:.1f} without), of which the frozen encoder's "
                  f"forward alone takes {r['encoder_ms_per_step']:.1f} ms ({r['encoder_side']} px, {r['encoder_grid']}^2 tokens)")
            results.append(r)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"benchmark": "diffusion_throughput", "torch": torch.__version__, "device": args.device, "device_name": name,
                       "rows": results}, f, indent=1)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
