"""The training loop: one for every model family, on CPU, one GPU or many (torchrun).

Read it top to bottom: setup -> data -> model and optimizer -> resume -> loop (lr schedule,
accumulated micro-batches, optimizer step, log, checkpoint) -> summary. The model family
supplies the objective (``models.FAMILIES``); everything else is shared.
"""

from __future__ import annotations

import contextlib
import math
import os
import random
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from . import checkpoint as ckpt
from . import distributed as D
from .config import RunConfig
from .data import ResumableSampler, SeededSamples, build_dataset, check_first_sample
from .errors import CheckpointError, ConfigError, DataError, TrainingDiverged, UserError, one_line
from .models import build_model, get_family, is_diffusion
from .runlog import RunLog, peak_flops, peak_memory_mb
from .schedule import effective_decay


def lr_at(step: int, total: int, warmup: int, peak: float, floor: float, schedule: str = "cosine") -> float:
    """Per-iteration linear warmup, then half-cycle cosine from ``peak`` to ``floor`` (MAE) or a
    constant ``peak`` (DiT / SiT / U-ViT)."""
    if step < warmup:
        return peak * step / warmup
    if schedule == "constant":
        return peak
    progress = (step - warmup) / max(1, total - warmup)
    return floor + (peak - floor) * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Weight decay on matrices only: biases and 1-D parameters (norms) get none."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name.endswith(".bias") else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def prepare_out_dir(path: Path) -> Path:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write-test-{os.getpid()}"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        raise UserError(f"output folder {path} is not writable ({e.strerror or e}); "
                        "pass train.out_dir=<a folder you can write>") from None
    return path


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]


def make_optimizer(groups: list[dict], t, lr: float, device: torch.device) -> torch.optim.Optimizer:
    """AdamW (fused on GPU); timm's LARS with MAE's rule (trust-ratio adaptation for weight
    matrices only, momentum 0.9); or SGD with Nesterov momentum 0.9 (supervised ResNets)."""
    if t.optimizer == "lars":
        from timm.optim import Lars

        for g in groups:
            g["always_adapt"] = any(p.ndim > 1 for p in g["params"])
        return Lars(groups, lr=lr, momentum=0.9)
    if t.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9, nesterov=True)
    return torch.optim.AdamW(groups, lr=lr, betas=(t.beta1, t.beta2), fused=device.type == "cuda")


def train(cfg: RunConfig, resume: str | None = None, progress: bool = True, on_epoch_end=None, init=None) -> dict:
    """Train ``cfg`` and return a summary (final loss, steps, time, checkpoint path).

    ``resume``: None (fresh run), "auto" (newest checkpoint in the run folder, if any) or a path.
    ``on_epoch_end(model, epoch, step, log)``: hook for online evaluation; it gets the EMA weights when
    the run keeps them (train.ema_decay > 0), else the raw model.
    ``init(model)``: called on fresh starts only, before the optimizer sees the weights.
    """
    t = cfg.train
    env = D.setup(t.device)
    if t.threads:
        torch.set_num_threads(t.threads)
    out = prepare_out_dir(cfg.out_dir)
    ckpt_dir = out / "checkpoints"
    say = print if env.is_main else (lambda *a, **k: None)

    # ------------------------------------------------------------------ data
    dataset, info = build_dataset(cfg.data, "train", cfg.model.img_size)
    samples = SeededSamples(dataset, t.seed)
    check_first_sample(samples, cfg.model.in_chans, cfg.model.img_size, cfg.data.name)
    sampler = ResumableSampler(len(samples), env.rank, env.world_size, seed=t.seed, shuffle=True)
    workers = cfg.data.num_workers
    loader = DataLoader(samples, batch_size=t.batch_size, sampler=sampler, num_workers=workers, drop_last=True,
                        pin_memory=env.device.type == "cuda", persistent_workers=workers > 0,
                        generator=torch.Generator())  # own generator: never draws from the global RNG
    micro_per_epoch = sampler.per_rank // t.batch_size
    steps_per_epoch = micro_per_epoch // t.accum_steps
    if steps_per_epoch < 1:
        raise ConfigError(f"{cfg.data.name} has {len(samples)} training images, fewer than one optimizer step "
                          f"needs ({t.batch_size} x {t.accum_steps} accum x {env.world_size} ranks); lower train.batch_size")
    total_steps, warmup_steps = t.epochs * steps_per_epoch, int(round(t.warmup_epochs * steps_per_epoch))
    eff_batch = t.batch_size * t.accum_steps * env.world_size
    peak_lr = t.lr if t.lr is not None else t.base_lr * eff_batch / 256

    # ------------------------------------------------------------------ model, optimizer
    random.seed(t.seed + env.rank)
    np.random.seed(t.seed + env.rank)
    torch.manual_seed(t.seed + env.rank)
    raw_model = build_model(cfg.model).to(env.device)
    family = get_family(cfg.model.family)
    resumed_from = ckpt.resolve_resume(resume, ckpt_dir)
    if init is not None and resumed_from is None:
        init(raw_model)  # e.g. pretrained encoder weights for fine-tuning; a resumed run has its own
    groups = (family.param_groups or param_groups)(raw_model, t.weight_decay)
    optimizer = make_optimizer(groups, t, peak_lr, env.device)
    amp_dtype = autocast_dtype(t.precision, env.device)
    scaler = torch.amp.GradScaler(env.device.type, enabled=amp_dtype == torch.float16)

    # ------------------------------------------------------------------ resume
    step = 0
    ema_state = None
    if resumed_from is not None:
        state = ckpt.load_checkpoint(resumed_from)
        diffs = ckpt.model_differences(state["config"]["model"], cfg.to_dict()["model"])
        if diffs:
            raise CheckpointError(f"cannot resume from {resumed_from}: it is a different model ({'; '.join(diffs[:3])}); "
                                  "use the checkpoint's settings or a new train.out_dir")
        for section in ("data", "train"):
            for k, v in cfg.to_dict()[section].items():
                if state["config"][section].get(k) != v:
                    say(f"note: {section}.{k} changed since the checkpoint ({state['config'][section].get(k)!r} -> {v!r})")
        raw_model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scaler.load_state_dict(state["scaler"])
        step = int(state["train_state"]["step"])
        ema_state = state.get("ema")
        rngs = state["rng"]
        if len(rngs) == env.world_size:
            ckpt.set_rng_state(rngs[env.rank])
        else:
            say(f"note: checkpoint has RNG states of {len(rngs)} ranks, this run has {env.world_size}; reseeding")
            torch.manual_seed(t.seed + env.rank + step)
    ema = None
    if t.ema_decay > 0:  # an exponential moving average of the weights, used for sampling (DiT, SiT, U-ViT)
        from timm.utils import ModelEmaV3

        ema = ModelEmaV3(raw_model, decay=t.ema_decay, use_warmup=t.ema_warmup)
        if ema_state is not None:
            ema.module.load_state_dict(ema_state)
        elif resumed_from is not None:
            say(f"note: {resumed_from} has no EMA weights; the EMA starts from the resumed weights")
    model = raw_model
    if t.compile:
        model = torch.compile(model)
    if env.distributed:
        model = DDP(model, device_ids=[env.device.index] if env.device.type == "cuda" else None)

    say(f"resdecay train | preset {cfg.preset} | {cfg.model.family} depth {getattr(cfg.model, 'depth', '?')} "
        f"| alpha_min {cfg.model.alpha_min} ({cfg.model.schedule}) alpha_eff {effective_decay(raw_model.alphas):.3g}")
    say(f"data {cfg.data.name}: {len(samples)} images | device {env.device} x {env.world_size} | "
        f"precision {amp_dtype or torch.float32} | params {sum(p.numel() for p in raw_model.parameters()) / 1e6:.2f} M")
    say(f"base lr {t.base_lr:.2e} | effective batch {eff_batch} = {t.batch_size} per device x {t.accum_steps} accum "
        f"x {env.world_size} devices | lr {peak_lr:.2e}{' (set directly)' if t.lr is not None else ''} | "
        f"{steps_per_epoch} steps/epoch x {t.epochs} epochs = {total_steps} steps, {warmup_steps} warmup")
    if resumed_from is not None:
        say(f"resumed from {resumed_from} at step {step}")
    elif resume == "auto":
        say("no checkpoint to resume from yet; starting fresh")

    # ------------------------------------------------------------------ loop
    if on_epoch_end is None and t.online_eval_every > 0:
        if is_diffusion(cfg.model.family):  # samples -> proxy FID, and a probe grid
            from .eval.online_diffusion import OnlineDiffusionEval as OnlineEval
        else:  # kNN, probe and effective rank of the encoder (Figure 4)
            from .eval.online import OnlineEval

        on_epoch_end = OnlineEval(cfg, t.online_eval_every, t.online_eval_size, env.device)
    log = RunLog(out, resume_step=step if resumed_from is not None else None, enabled=env.is_main)
    flops_per_img = 3 * raw_model.flops_per_sample()  # forward + backward
    gpu_peak = peak_flops(env.device)
    bar = tqdm(total=total_steps, initial=step, disable=not (progress and env.is_main), unit="step", dynamic_ncols=True)
    loss_sum = torch.zeros((), device=env.device)
    nonfinite = torch.zeros((), dtype=torch.bool, device=env.device)
    window_steps, window_t0, t_start = 0, time.perf_counter(), time.perf_counter()
    last_ckpt, last_loss = resumed_from, float("nan")  # a finished run resumed again reports its checkpoint
    model.train()
    epoch, in_epoch = divmod(step, steps_per_epoch)
    try:
        while step < total_steps:
            sampler.set_epoch(epoch, start=in_epoch * t.accum_steps * t.batch_size)
            batches = iter(loader)
            for _ in range(in_epoch, steps_per_epoch):
                lr = lr_at(step, total_steps, warmup_steps, peak_lr, t.min_lr, t.lr_schedule)
                for group in optimizer.param_groups:
                    group["lr"] = lr * group.get("lr_scale", 1.0)
                for micro in range(t.accum_steps):
                    try:
                        images, labels = next(batches)
                    except DataError as e:  # re-raised from a worker with its traceback inside
                        raise DataError(one_line(e)) from None
                    images = images.to(env.device, non_blocking=True)
                    sync = contextlib.nullcontext() if micro == t.accum_steps - 1 or not env.distributed else model.no_sync()
                    with sync, torch.autocast(env.device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None):
                        loss = family.objective(model, images, labels.to(env.device, non_blocking=True)) / t.accum_steps
                    scaler.scale(loss).backward()
                    loss_sum += loss.detach()
                    nonfinite |= ~torch.isfinite(loss.detach())
                if t.grad_clip:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(raw_model.parameters(), t.grad_clip)
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad(set_to_none=True)
                step, window_steps = step + 1, window_steps + 1
                if ema is not None:
                    ema.update(raw_model, step=step)
                bar.update(1)

                if step % t.log_every == 0 or step == total_steps or step % t.ckpt_every == 0:
                    if bool(nonfinite):
                        raise TrainingDiverged(step)
                    now = time.perf_counter()
                    img_s = window_steps * eff_batch / max(now - window_t0, 1e-9)
                    last_loss = float(loss_sum) / window_steps
                    row = {"step": step, "epoch": step / steps_per_epoch, "loss": last_loss, "lr": lr,
                           "img_per_s": img_s, "peak_mem_mb": peak_memory_mb(env.device), "time_s": now - t_start}
                    if gpu_peak:
                        row["mfu"] = flops_per_img * img_s / env.world_size / gpu_peak
                    log.write(row)
                    bar.set_postfix(loss=f"{last_loss:.4f}", lr=f"{lr:.2e}", img_s=f"{img_s:.0f}")
                    loss_sum.zero_()
                    window_steps, window_t0 = 0, now
                if step % t.ckpt_every == 0 or step == total_steps:
                    last_ckpt = save(cfg, env, raw_model, optimizer, scaler, step, steps_per_epoch, ckpt_dir, ema)
            if on_epoch_end is not None:  # on forked RNG, so evaluation never shifts the training stream
                with torch.random.fork_rng(devices=[env.device] if env.device.type == "cuda" else []):
                    on_epoch_end(ema.module if ema is not None else raw_model, epoch, step, log)  # the weights one samples with
            epoch, in_epoch = epoch + 1, 0
    except TrainingDiverged:
        good = ckpt.list_checkpoints(ckpt_dir)
        keep = f"the last good checkpoint {good[-1]} is kept" if good else "no checkpoint had been written yet"
        raise TrainingDiverged(
            f"loss became non-finite by step {step}; {keep}. Likely fixes: raise model.alpha_min (e.g. 0.6 -> 0.7), "
            "keep model.zero_init=true, lower train.base_lr") from None
    finally:
        bar.close()
        log.close()
    D.barrier(env)
    summary = {"preset": cfg.preset, "out_dir": str(out), "steps": step, "epochs": t.epochs, "images": len(samples),
               "effective_batch": eff_batch, "lr": peak_lr,
               "final_loss": last_loss, "train_time_s": time.perf_counter() - t_start,
               "alpha_min": cfg.model.alpha_min, "skips": getattr(cfg.model, "skips", None), "alpha_eff": effective_decay(raw_model.alphas),
               "checkpoint": str(last_ckpt) if last_ckpt else None, "resumed_from": str(resumed_from) if resumed_from else None}
    D.cleanup(env)
    return summary


def save(cfg, env, model, optimizer, scaler, step, steps_per_epoch, ckpt_dir, ema=None) -> Path:
    """Every rank contributes its RNG state; rank 0 writes the file atomically."""
    rngs = D.gather_objects(env, ckpt.rng_state())
    path = ckpt.checkpoint_path(ckpt_dir, step)  # every rank returns it; rank 0 writes it
    if env.is_main:
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict(),
                 "train_state": {"step": step, "epoch": step // steps_per_epoch, "step_in_epoch": step % steps_per_epoch,
                                 "world_size": env.world_size},
                 "rng": rngs, "config": cfg.to_dict()}
        if ema is not None:
            state["ema"] = ema.module.state_dict()
        ckpt.save_checkpoint(state, ckpt_dir, step, cfg.train.keep_last)
    D.barrier(env)
    return path
