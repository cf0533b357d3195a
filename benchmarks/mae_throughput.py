"""MAE training throughput: images/s, ms/step, peak memory and MFU of one full training step,
resdecay's model next to a naive eager re-implementation of the same architecture.

What is measured
    One training step = forward (random masking, encoder, decoder, norm-pix loss), backward and
    an AdamW step (weight decay on matrices only, as ``resdecay.train``), on a fixed batch of
    synthetic random images already on the device (no data loading, no augmentation). Rows:

    resdecay (eager)                    ``build_model(load_config(preset, overrides).model)``
    resdecay (torch.compile)            the same, through ``torch.compile`` (only with --compile)
    reference (eager, naive attention)  ``RefMAE`` below: the same U-Net MAE written plainly,
                                        attention as softmax(q @ k^T) @ v (no SDPA) and every
                                        residual as ``a * x + f(x)`` (a separate multiply and add)

    The reference holds the same parameters under the same names: it loads the resdecay model's
    state dict strictly, and both parameter counts are printed. Before timing, both get the same
    randomly perturbed weights (so that zero-initialised layers are not zero) and the same mask
    seed, and their fp32 losses, predictions and full gradient vectors are compared (relative
    differences; ~1e-7 is rounding, > 1e-4 is reported as a MISMATCH and exits 1): this shows
    that the rows time the same computation.

How
    bf16 autocast on CUDA (fused AdamW, as the trainer), fp32 on CPU. Each row runs alone
    (the previous row's model is freed first); ``--warmup`` steps (which include compilation),
    then ``--steps`` steps, each timed between ``torch.cuda.synchronize()`` calls.

How to read the numbers
    ms/step is the median step time; img/s = batch / median step time. Peak memory is what the
    row needed above what was allocated at its start (benchmarks/_measure.py): on CUDA
    ``torch.cuda.max_memory_allocated`` during the row minus ``torch.cuda.memory_allocated`` at
    its start (weights, gradients, AdamW state, activations; the synthetic batch, allocated
    before the rows, is not included); on CPU the growth of the process's peak resident set over
    the row's start (VmHWM reset through /proc/self/clear_refs; falls back to the getrusage
    ru_maxrss growth, which under-reports rows after the first) - an approximation that includes
    allocator slack (and, for the torch.compile row, the compiler's own memory).
    MFU (CUDA only) = 3 * model.flops_per_sample() * img/s / peak bf16 FLOP/s of the GPU
    (resdecay.train.runlog.peak_flops); the analytic count covers matmuls only. One untimed step runs
    before the table so that one-time allocations do not land on the first row.

    python benchmarks/mae_throughput.py                                   # mae-tiny-digits, CPU
    python benchmarks/mae_throughput.py alpha_min=1.0 skips=false         # plain-MAE variant
    python benchmarks/mae_throughput.py --preset mae-b16 --device cuda --batch-size 256 --compile
"""

from __future__ import annotations

import argparse
import copy
import json
import platform
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from resdecay.train.config import load_config
from resdecay.models import build_model
from resdecay.models.mae import choose_skip_sources
from resdecay.train.runlog import peak_flops
from resdecay.schedule import alpha_schedule
from resdecay.train import param_groups

from _measure import MEM_LABEL, mem_peak, mem_start, timed_steps


# ============================================================================ naive reference
def _linear_pair(d_in: int, d_hidden: int, d_out: int) -> nn.Module:
    m = nn.Module()
    m.fc1, m.fc2 = nn.Linear(d_in, d_hidden), nn.Linear(d_hidden, d_out)
    return m


class RefBlock(nn.Module):
    """Pre-LN block, ``x = a1 * x + attn(LN x); x = a2 * x + mlp(LN x)``, attention by hand."""

    def __init__(self, d: int, heads: int, mlp_ratio: float, a1: float = 1.0, a2: float = 1.0):
        super().__init__()
        self.heads, self.a1, self.a2 = heads, a1, a2
        self.norm1, self.norm2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
        self.attn = nn.Module()
        self.attn.qkv, self.attn.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = _linear_pair(d, int(d * mlp_ratio), d)

    def attention(self, x):
        B, T, D = x.shape
        q, k, v = self.attn.qkv(x).reshape(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        w = (q @ k.transpose(-2, -1)) * (D // self.heads) ** -0.5  # (B, H, T, T) materialised
        return self.attn.proj((w.softmax(dim=-1) @ v).transpose(1, 2).reshape(B, T, D))

    def forward(self, x):
        x = self.a1 * x + self.attention(self.norm1(x))
        return self.a2 * x + self.mlp.fc2(F.gelu(self.mlp.fc1(self.norm2(x))))


def unshuffle(x, ids_restore, token):
    """(B, 1+K, D) kept tokens -> (B, 1+N, D) in image order, ``token`` at removed places."""
    B, T, D = x.shape
    N = ids_restore.shape[1]
    full = torch.cat([x[:, 1:], token.to(x.dtype).expand(B, N + 1 - T, D)], dim=1)
    return torch.cat([x[:, :1], torch.gather(full, 1, ids_restore[..., None].expand(B, N, D))], dim=1)


class RefMAE(nn.Module):
    """The (U-Net) MAE of resdecay.models.mae, same parameter names, written without helpers."""

    def __init__(self, cfg):
        super().__init__()
        self.cfg, D, Dd, p = cfg, cfg.embed_dim, cfg.decoder_embed_dim, cfg.patch_size
        self.grid = cfg.img_size // p
        N = self.grid**2
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(cfg.in_chans, D, p, stride=p)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.pos_embed = nn.Parameter(torch.zeros(1, N + 1, D), requires_grad=False)
        alphas = alpha_schedule(cfg.depth, cfg.alpha_min, cfg.schedule).tolist()
        self.blocks = nn.ModuleList(RefBlock(D, cfg.num_heads, cfg.mlp_ratio, a, m) for a, m in alphas)
        self.norm = nn.LayerNorm(D, eps=1e-6) if cfg.encoder_norm else nn.Identity()
        self.sources = choose_skip_sources(cfg.depth, cfg.decoder_depth, cfg.skip_sources) if cfg.skips else []
        if cfg.skips:
            self.decoder_cls_token = nn.Parameter(torch.zeros(1, 1, Dd))
            self.decoder_embed = nn.Linear(Dd, Dd)
            self.skip_fusions = nn.ModuleList(_linear_pair(D + Dd, Dd, Dd) for _ in self.sources)
            for f in self.skip_fusions:
                f.mask_token = nn.Parameter(torch.zeros(1, 1, D))
        else:
            self.decoder_embed = nn.Linear(D, Dd)
            self.mask_token = nn.Parameter(torch.zeros(1, 1, Dd))
        self.decoder_pos_embed = nn.Parameter(torch.zeros(1, N + 1, Dd), requires_grad=False)
        self.decoder_blocks = nn.ModuleList(RefBlock(Dd, cfg.decoder_num_heads, cfg.mlp_ratio) for _ in range(cfg.decoder_depth))
        self.decoder_norm = nn.LayerNorm(Dd, eps=1e-6)
        self.decoder_pred = nn.Linear(Dd, p * p * cfg.in_chans)

    def forward(self, imgs):
        cfg, p, g = self.cfg, self.cfg.patch_size, self.grid
        x = self.patch_embed.proj(imgs).flatten(2).transpose(1, 2) + self.pos_embed[:, 1:]
        B, N, D = x.shape
        keep = int(N * (1 - cfg.mask_ratio))  # random masking: keep the `keep` smallest noises
        ids_shuffle = torch.argsort(torch.rand(B, N, device=x.device), dim=1)
        ids_restore = torch.argsort(ids_shuffle, dim=1)
        x = torch.gather(x, 1, ids_shuffle[:, :keep, None].expand(B, keep, D))
        mask = torch.gather((torch.arange(N, device=x.device) >= keep).float().expand(B, N), 1, ids_restore)
        x = torch.cat([(self.cls_token + self.pos_embed[:, :1]).expand(B, -1, -1), x], dim=1)
        outs = {}
        for i, blk in enumerate(self.blocks):
            x = outs[i] = blk(x)
        x = self.norm(x)
        if cfg.skips:  # content-free decoder start; the image enters through the skips
            pos = self.decoder_pos_embed
            y = self.decoder_embed(torch.cat([pos[:, :1] + self.decoder_cls_token, pos[:, 1:]], dim=1)).expand(B, -1, -1)
        else:
            y = unshuffle(self.decoder_embed(x), ids_restore, self.mask_token) + self.decoder_pos_embed
        for j, blk in enumerate(self.decoder_blocks):
            if j < len(self.sources):  # fusion j takes the j-th deepest source block
                f = self.skip_fusions[j]
                enc = unshuffle(outs[self.sources[j]], ids_restore, f.mask_token)
                y = y + f.fc2(F.silu(f.fc1(torch.cat([enc, y], dim=-1))))
            y = blk(y)
        pred = self.decoder_pred(self.decoder_norm(y))[:, 1:]
        target = imgs.reshape(B, cfg.in_chans, g, p, g, p).permute(0, 2, 4, 3, 5, 1).reshape(B, N, -1)
        if cfg.norm_pix_loss:
            target = (target - target.mean(-1, keepdim=True)) / (target.var(-1, keepdim=True) + 1e-6) ** 0.5
        loss = ((pred.float() - target) ** 2).mean(-1)
        return (loss * mask).sum() / mask.sum(), pred, mask


# ============================================================================ measurement
def run_row(make, imgs, cfg, args, device) -> dict:
    method, base = mem_start(device)
    net = make()
    opt = torch.optim.AdamW(param_groups(net, cfg.train.weight_decay), lr=1e-4,
                            betas=(cfg.train.beta1, cfg.train.beta2), fused=device.type == "cuda")

    def step():
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = net(imgs)[0]
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    times, loss = timed_steps(step, args.warmup, args.steps, device)
    peak = mem_peak(device, method, base)
    del net, opt, loss
    step_s = statistics.median(times)
    return {"ms_per_step": step_s * 1e3, "img_per_s": imgs.shape[0] / step_s, "peak_mem_mb": peak,
            "mem_method": method, "step_ms_all": [t * 1e3 for t in times]}


def check_same_model(model, ref, cfg, device, batch: int) -> dict:
    """Both models on the same perturbed weights, images and mask seed, in fp32: relative
    difference of the losses, of the predictions and of the whole gradient vectors."""
    torch.manual_seed(1)
    state = {k: v + 0.05 * torch.randn_like(v) for k, v in model.state_dict().items()}  # no zero layers
    imgs = torch.randn(batch, cfg.in_chans, cfg.img_size, cfg.img_size, device=device)
    out = {}
    for name, m in (("resdecay", model), ("reference", ref)):
        m = copy.deepcopy(m).to(device)
        m.load_state_dict(state)
        torch.manual_seed(2)  # same noise -> same mask
        loss, pred, _ = m(imgs)
        loss.backward()
        grads = torch.cat([p.grad.double().flatten() for _, p in sorted(m.named_parameters()) if p.grad is not None])
        out[name] = (loss.item(), pred.detach().double(), grads)
        del m
    (la, pa, ga), (lb, pb, gb) = out["resdecay"], out["reference"]
    rel = lambda a, b: ((a - b).norm() / a.norm().clamp_min(1e-30)).item()  # noqa: E731
    res = {"batch": batch, "loss_resdecay": la, "loss_reference": lb, "loss_rel_diff": abs(la - lb) / max(abs(la), 1e-30),
           "pred_rel_diff": rel(pa, pb), "grad_rel_diff": rel(ga, gb) if ga.shape == gb.shape else float("inf")}
    res["ok"] = max(res["loss_rel_diff"], res["pred_rel_diff"], res["grad_rel_diff"]) <= 1e-4  # fp32 rounding: ~1e-7
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. alpha_min=1.0 skips=false")
    ap.add_argument("--preset", default="mae-tiny-digits")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batch-size", type=int, default=None, help="default: the preset's train.batch_size (mae-b16 on one H100/H200: try 256)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps per row (default cpu 5, cuda 10)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per row (default 30)")
    ap.add_argument("--compile", action="store_true", help="add a torch.compile row for resdecay")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) (CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device visible")
    device, cuda = torch.device(args.device), args.device == "cuda"
    args.warmup = args.warmup if args.warmup is not None else (10 if cuda else 5)
    args.steps = args.steps if args.steps is not None else 30
    if args.steps < 1:
        ap.error("--steps must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    cfg = load_config(args.preset, args.overrides)
    mc = cfg.model
    batch = args.batch_size or cfg.train.batch_size

    torch.manual_seed(args.seed)
    model = build_model(mc)  # on CPU; each row copies it to the device
    ref = RefMAE(mc)
    ref.load_state_dict(model.state_dict())  # strict: same names and shapes, i.e. the same parameters
    n_model, n_ref = (sum(p.numel() for p in m.parameters()) for m in (model, ref))

    name = torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine())
    flops = model.flops_per_sample()
    gpu_peak = peak_flops(device)
    print(f"mae_throughput | torch {torch.__version__} | {args.device} ({name}) | "
          f"{'bf16 autocast' if cuda else 'fp32'} | threads {torch.get_num_threads()}")
    print(f"preset {' '.join([cfg.preset, *args.overrides])} | img {mc.img_size}x{mc.img_size}x{mc.in_chans} patch {mc.patch_size} "
          f"| enc {mc.embed_dim}x{mc.depth} dec {mc.decoder_embed_dim}x{mc.decoder_depth} | alpha_min {mc.alpha_min} "
          f"skips {mc.skips} | batch {batch} | {args.warmup} warmup + {args.steps} timed steps")
    print(f"parameters: resdecay {n_model:,} | reference {n_ref:,} -> {'same' if n_model == n_ref else 'DIFFERENT'}"
          f" | analytic forward {flops / 1e9:.4g} GFLOP/img")
    check = check_same_model(model, ref, mc, device, min(batch, 8))
    print(f"same-model check (fp32, batch {check['batch']}, perturbed shared weights, same mask seed): loss resdecay "
          f"{check['loss_resdecay']:.6f} reference {check['loss_reference']:.6f}; relative differences: loss "
          f"{check['loss_rel_diff']:.1e}, predictions {check['pred_rel_diff']:.1e}, gradients {check['grad_rel_diff']:.1e} "
          f"-> {'OK' if check['ok'] else 'MISMATCH (> 1e-4)'}")

    imgs = torch.randn(batch, mc.in_chans, mc.img_size, mc.img_size, device=device)  # synthetic batch
    # One untimed step first, so one-time allocations (thread pools, kernel caches, cuBLAS
    # workspaces) are not charged to the first row's memory.
    run_row(lambda: copy.deepcopy(model).to(device), imgs, cfg, argparse.Namespace(warmup=0, steps=1), device)
    rows = [("resdecay (eager)", lambda: copy.deepcopy(model).to(device))]
    if args.compile:
        rows.append(("resdecay (torch.compile)", lambda: torch.compile(copy.deepcopy(model).to(device))))
    rows.append(("reference (eager, naive attention)", lambda: copy.deepcopy(ref).to(device)))

    method = mem_start(device)[0]
    mem_head = MEM_LABEL[method]
    head = f"{'row':<36} {'img/s':>10} {'ms/step':>10} {mem_head:>28} {'MFU':>7}"
    print(head)
    print("-" * len(head))
    results = []
    for label, make in rows:
        torch.manual_seed(args.seed)
        r = run_row(make, imgs, cfg, args, device)
        if "compile" in label:
            torch._dynamo.reset()  # drop compiled graphs (and what they hold) before the next row
        r["row"] = label
        r["mfu"] = 3 * flops * r["img_per_s"] / gpu_peak if gpu_peak else None
        results.append(r)
        mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None else "-"
        print(f"{label:<36} {r['img_per_s']:>10.1f} {r['ms_per_step']:>10.2f} {r['peak_mem_mb']:>28.0f} {mfu:>7}", flush=True)
    base = results[0]["img_per_s"]
    print("speed vs resdecay (eager): " + ", ".join(f"{r['row']} {r['img_per_s'] / base:.2f}x" for r in results[1:]))
    if not cuda:
        how = ("peak resident set (VmHWM, reset per row) minus the resident set at the row's start"
               if method == "vmhwm" else "ru_maxrss growth during the row (under-reports rows after the first)")
        print(f"CPU memory = {how}; approximate, includes allocator slack. MFU needs a GPU.")

    if args.json:
        meta = {"benchmark": "mae_throughput", "torch": torch.__version__, "device": args.device, "device_name": name,
                "dtype": "bf16-autocast" if cuda else "fp32", "threads": torch.get_num_threads(), "preset": cfg.preset,
                "overrides": args.overrides, "batch": batch, "warmup": args.warmup, "steps": args.steps,
                "params_resdecay": n_model, "params_reference": n_ref, "flops_per_sample": flops,
                "peak_flops": gpu_peak, "check": check, "model": cfg.to_dict()["model"]}
        with open(args.json, "w") as f:
            json.dump({**meta, "rows": results}, f, indent=2)
        print(f"wrote {args.json}")
    return 0 if check["ok"] and n_model == n_ref else 1


if __name__ == "__main__":
    sys.exit(main())
