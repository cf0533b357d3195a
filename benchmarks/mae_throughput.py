"""MAE training throughput against fair references: resdecay's U-Net MAE and plain MAE next to
straightforward SDPA implementations of the same two architectures, eager and compiled, in one
process and one run, the variants interleaved.

What is measured
    One training step = forward (random masking, encoder, decoder, norm-pix loss), backward and
    an AdamW step (weight decay on matrices only, as ``resdecay.train``), on a fixed batch of
    synthetic random images already on the device (no data loading). Variants, per architecture
    (``--preset``, the U-Net MAE, and ``--plain-preset``, default ``<preset>-plain``):

    resdecay                   ``build_model(load_config(preset).model)``, AdamW as the trainer
                               makes it (``fused=True`` where torch has the kernel, CPU included)
    reference (SDPA)           ``RefMAE`` below: the same network written the obvious way: fused
                               qkv Linear + ``F.scaled_dot_product_attention``, residuals as
                               ``a * x + f(x)``, the U-Net skip fusion as concatenate-then-fc1 at
                               all 1+N tokens; the same AdamW
    ... (torch.compile)        both of the above through ``torch.compile`` (``--compile``)
    resdecay U-Net, concat fusion
                               U-Net only: the skip fusion as concatenate-then-fc1 (the older
                               formulation) and torch's default AdamW (on the CPU the per-tensor
                               loop), eager: the step the speed targets compare to
    concat fusion + fused AdamW
                               the same with fused AdamW: what the fusion rewrite adds on its own
    reference (naive attn)     ``--naive``: softmax(QK^T) materialised, the reference this script
                               used to have (it flattered resdecay)

    The references hold the same parameters under the same names (strict state-dict load). Before
    timing, each pair gets the same perturbed weights and mask seed and their fp32 losses,
    predictions and gradient vectors are compared (relative differences; ~1e-7 is rounding, >1e-4
    is a MISMATCH and exits 1).

How
    bf16 autocast on CUDA, fp32 on CPU. Every variant is built (memory measured from before it
    is built: weights, gradients, AdamW state and activations) and warmed up (``--warmup`` steps,
    compilation included); then ``--rounds`` rounds of ``--steps`` timed steps per variant, the
    order rotating each round, so that load from other processes on a shared machine falls on all
    variants alike. ms/step is the median over all timed steps; img/s = batch / median.
    MFU (CUDA) = 3 x the architecture's analytic forward FLOPs (``flops_per_sample()`` of the
    resdecay model, matmuls only: the work the architecture needs; the reference U-Net's
    concatenating fusion does 0.69 GFLOP/img more at B/16) x img/s / peak bf16 FLOP/s. "vs ref"
    divides by the reference of the same architecture and mode (eager by eager, compiled by
    compiled); the two "concat fusion" rows are compared to resdecay eager.

    python benchmarks/mae_throughput.py                                        # tiny presets, CPU
    python benchmarks/mae_throughput.py --preset mae-b16 --device cuda --batch-size 256 --compile
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import platform
import statistics
import sys
import time
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

from _measure import MEM_LABEL, mem_peak, mem_start, sync, timed_steps
from resdecay.models import build_model
from resdecay.models.mae import choose_skip_sources, fill_and_unshuffle
from resdecay.schedule import alpha_schedule
from resdecay.train import param_groups
from resdecay.train.config import load_config
from resdecay.train.log.runlog import peak_flops


# ============================================================================ naive reference
def _linear_pair(d_in: int, d_hidden: int, d_out: int) -> nn.Module:
    m = nn.Module()
    m.fc1, m.fc2 = nn.Linear(d_in, d_hidden), nn.Linear(d_hidden, d_out)
    return m


class RefBlock(nn.Module):
    """Pre-LN block, ``x = a1 * x + attn(LN x); x = a2 * x + mlp(LN x)``; attention through SDPA
    (``naive=True``: softmax(QK^T) materialised)."""

    def __init__(self, d: int, heads: int, mlp_ratio: float, a1: float = 1.0, a2: float = 1.0, naive: bool = False):
        super().__init__()
        self.heads, self.a1, self.a2, self.naive = heads, a1, a2, naive
        self.norm1, self.norm2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
        self.attn = nn.Module()
        self.attn.qkv, self.attn.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = _linear_pair(d, int(d * mlp_ratio), d)

    def attention(self, x):
        B, T, D = x.shape
        q, k, v = self.attn.qkv(x).reshape(B, T, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        if self.naive:
            w = (q @ k.transpose(-2, -1)) * (D // self.heads) ** -0.5  # (B, H, T, T) materialised
            o = w.softmax(dim=-1) @ v
        else:
            o = F.scaled_dot_product_attention(q, k, v)
        return self.attn.proj(o.transpose(1, 2).reshape(B, T, D))

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

    def __init__(self, cfg, naive: bool = False):
        super().__init__()
        self.cfg, D, Dd, p = cfg, cfg.embed_dim, cfg.decoder_embed_dim, cfg.patch_size
        self.grid = cfg.img_size // p
        N = self.grid**2
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv2d(cfg.in_chans, D, p, stride=p)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, D))
        self.pos_embed = nn.Parameter(torch.zeros(1, N + 1, D), requires_grad=False)
        alphas = alpha_schedule(cfg.depth, cfg.alpha_min, cfg.schedule).tolist()
        self.blocks = nn.ModuleList(RefBlock(D, cfg.num_heads, cfg.mlp_ratio, a, m, naive) for a, m in alphas)
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
        dec_alphas = alpha_schedule(cfg.decoder_depth, cfg.alpha_min if cfg.decoder_decay else 1.0, cfg.schedule).tolist()
        self.decoder_blocks = nn.ModuleList(RefBlock(Dd, cfg.decoder_num_heads, cfg.mlp_ratio, a, m, naive) for a, m in dec_alphas)
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
def concat_fusion(f, dec, enc, ids_restore):
    """resdecay's older skip fusion: fill at encoder width, unshuffle, concatenate, fc1."""
    enc = fill_and_unshuffle(enc, ids_restore, f.mask_token)
    return dec + f.fc2(f.act(f.fc1(torch.cat([enc, dec], dim=-1))))


def with_concat_fusion(model):
    m = copy.deepcopy(model)
    for f in m.skip_fusions:  # a bound method: a later deepcopy (.to(device)) rebinds it to the copied module
        f.forward = types.MethodType(concat_fusion, f)
    return m


def adamw(net, cfg, fused: bool):
    groups, kw = param_groups(net, cfg.train.weight_decay), dict(lr=1e-4, betas=(cfg.train.beta1, cfg.train.beta2))
    if fused:
        try:
            return torch.optim.AdamW(groups, fused=True, **kw)
        except (RuntimeError, ValueError):
            pass
    return torch.optim.AdamW(groups, **kw)


class Variant:
    def __init__(self, label, arch, ref_label, make, fused, cfg, imgs, device):
        self.label, self.arch, self.ref_label, self.make, self.fused = label, arch, ref_label, make, fused
        self.cfg, self.imgs, self.device, self.times = cfg, imgs, device, []

    def build(self, warmup: int) -> None:
        method, base = mem_start(self.device)
        self.net = self.make()
        self.opt = adamw(self.net, self.cfg, self.fused)
        for _ in range(warmup):  # compilation happens here
            self.step()
        sync(self.device)
        self.peak_mb, self.mem_method = mem_peak(self.device, method, base), method

    def step(self):
        with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            loss = self.net(self.imgs)[0]
        loss.backward()
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.detach()


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
    ap.add_argument("--preset", default="mae-tiny-digits", help="the U-Net MAE preset")
    ap.add_argument("--plain-preset", default=None, help="the plain MAE preset (default: <preset>-plain)")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--batch-size", type=int, default=None, help="default: the preset's train.batch_size")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps per variant before the rounds (default cpu 5, cuda 10)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per variant per round (default cpu 10, cuda 20)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds")
    ap.add_argument("--compile", action="store_true", help="add torch.compile variants")
    ap.add_argument("--naive", action="store_true", help="add the naive-attention U-Net reference")
    ap.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) (CPU)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = ap.parse_args()

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device visible")
    device, cuda = torch.device(args.device), args.device == "cuda"
    args.warmup = args.warmup if args.warmup is not None else (10 if cuda else 5)
    args.steps = args.steps if args.steps is not None else (20 if cuda else 10)
    if args.steps < 1 or args.rounds < 1:
        ap.error("--steps and --rounds must be at least 1")
    if args.threads:
        torch.set_num_threads(args.threads)
    presets = {"U-Net": args.preset, "plain": args.plain_preset or f"{args.preset}-plain"}
    cfgs = {a: load_config(p) for a, p in presets.items()}
    batch = args.batch_size or cfgs["U-Net"].train.batch_size

    name = torch.cuda.get_device_name(device) if cuda else (platform.processor() or platform.machine())
    gpu_peak = peak_flops(device)
    load = os.getloadavg()
    print(f"mae_throughput | torch {torch.__version__} | {args.device} ({name}) | {'bf16 autocast' if cuda else 'fp32'} "
          f"| threads {torch.get_num_threads()} | {os.cpu_count()} CPUs | load average {load[0]:.2f} "
          "(a shared machine: the rounds interleave the variants so other load hits all of them)")
    print(f"batch {batch} | {args.warmup} warmup steps, then {args.rounds} rounds x {args.steps} timed steps per variant")

    models, refs, imgs, flops, checks, ok = {}, {}, {}, {}, {}, True
    for arch, cfg in cfgs.items():
        mc = cfg.model
        torch.manual_seed(args.seed)
        models[arch] = build_model(mc)
        refs[arch] = RefMAE(mc)
        refs[arch].load_state_dict(models[arch].state_dict())  # strict: the same parameters
        n_model, n_ref = (sum(p.numel() for p in m.parameters()) for m in (models[arch], refs[arch]))
        flops[arch] = models[arch].flops_per_sample()
        imgs[arch] = torch.randn(batch, mc.in_chans, mc.img_size, mc.img_size, device=device)
        c = checks[arch] = check_same_model(models[arch], refs[arch], mc, device, min(batch, 8))
        ok &= c["ok"] and n_model == n_ref
        print(f"{arch:>6}: {presets[arch]} | enc {mc.embed_dim}x{mc.depth} dec {mc.decoder_embed_dim}x{mc.decoder_depth} "
              f"| {n_model:,} params (reference {'same' if n_model == n_ref else 'DIFFERENT'}) | {flops[arch] / 1e9:.4g} "
              f"GFLOP/img fwd | same-model check: loss {c['loss_rel_diff']:.1e} pred {c['pred_rel_diff']:.1e} "
              f"grad {c['grad_rel_diff']:.1e} -> {'OK' if c['ok'] else 'MISMATCH (> 1e-4)'}")

    if cuda:  # after the same-model checks, which compare in true fp32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True

    def on_device(m, compiled=False):
        return lambda: torch.compile(copy.deepcopy(m).to(device)) if compiled else copy.deepcopy(m).to(device)

    variants = []
    for compiled in (False, True) if args.compile else (False,):
        tag = " (compiled)" if compiled else ""
        for arch in cfgs:
            ref_label = f"reference {arch} SDPA{tag}"
            variants.append(Variant(f"resdecay {arch}{tag}", arch, ref_label, on_device(models[arch], compiled), True,
                                    cfgs[arch], imgs[arch], device))
            variants.append(Variant(ref_label, arch, None, on_device(refs[arch], compiled), True, cfgs[arch], imgs[arch], device))
    variants.append(Variant("resdecay U-Net, concat fusion", "U-Net", "resdecay U-Net",
                            on_device(with_concat_fusion(models["U-Net"])), cuda, cfgs["U-Net"], imgs["U-Net"], device))
    variants.append(Variant("concat fusion + fused AdamW", "U-Net", "resdecay U-Net",  # splits the gain: optimizer vs fusion
                            on_device(with_concat_fusion(models["U-Net"])), True, cfgs["U-Net"], imgs["U-Net"], device))
    if args.naive:
        naive = RefMAE(cfgs["U-Net"].model, naive=True)
        naive.load_state_dict(models["U-Net"].state_dict())
        variants.append(Variant("reference U-Net naive attn", "U-Net", "reference U-Net SDPA", on_device(naive), True,
                                cfgs["U-Net"], imgs["U-Net"], device))

    t0 = time.perf_counter()
    for v in variants:
        torch.manual_seed(args.seed)
        v.build(args.warmup)
    for r in range(args.rounds):
        k = r % len(variants)
        for v in variants[k:] + variants[:k]:  # rotate the order every round
            v.times += timed_steps(v.step, 1, args.steps, device)[0]
    by_label = {v.label: v for v in variants}
    rows = []
    head = f"{'variant':<34}{'img/s':>10}{'ms/step':>10}{MEM_LABEL[variants[0].mem_method]:>28}{'MFU':>7}{'vs ref':>9}"
    print(head)
    print("-" * len(head))
    for v in variants:
        ms = statistics.median(v.times) * 1e3
        ips = batch / ms * 1e3
        mfu = 3 * flops[v.arch] * ips / gpu_peak if gpu_peak else None
        rows.append({"variant": v.label, "arch": v.arch, "img_per_s": ips, "ms_per_step": ms, "peak_mem_mb": v.peak_mb,
                     "mem_method": v.mem_method, "mfu": mfu, "reference": v.ref_label, "step_ms_all": [t * 1e3 for t in v.times]})
    for row in rows:
        ref = next((r for r in rows if r["variant"] == row["reference"]), None)
        row["ratio_to_reference"] = row["img_per_s"] / ref["img_per_s"] if ref else None
        ratio = f"{row['ratio_to_reference']:.3f}x" if ref else "-"
        mfu = f"{100 * row['mfu']:.1f}%" if row["mfu"] is not None else "-"
        print(f"{row['variant']:<34}{row['img_per_s']:>10.1f}{row['ms_per_step']:>10.2f}{row['peak_mem_mb']:>28.0f}{mfu:>7}{ratio:>9}")
    print(f"'vs ref': img/s over the row named in 'reference' (the SDPA reference of the same architecture and mode; "
          f"for the two 'concat fusion' rows: resdecay U-Net eager) | {time.perf_counter() - t0:.0f} s")
    if not cuda:
        print("CPU: memory is the growth of the peak resident set (approximate); MFU needs a GPU. "
              "GPU rows: not measured here unless run with --device cuda.")
    del by_label
    if args.json:
        meta = {"benchmark": "mae_throughput", "torch": torch.__version__, "device": args.device, "device_name": name,
                "cpus": os.cpu_count(), "load_average": load, "dtype": "bf16-autocast" if cuda else "fp32",
                "threads": torch.get_num_threads(), "presets": presets, "batch": batch, "warmup": args.warmup,
                "steps": args.steps, "rounds": args.rounds, "flops_per_sample": flops, "peak_flops": gpu_peak, "checks": checks}
        with open(args.json, "w") as f:
            json.dump({**meta, "rows": rows}, f, indent=2)
        print(f"wrote {args.json}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
