"""Everything the training loop needs before its first step: the process environment, the data
pipeline, the model with its optimizer, and the state of a resumed run. ``loop.train`` reads these
top to bottom; the helpers are here so that the loop itself is only the loop."""

from __future__ import annotations

import math
import os
import random
import shutil
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from ..data import DeviceLoader, ResumableSampler, SeededSamples, build_dataset, check_first_sample, uint8_batches
from ..data.dali_images import DaliLoader, folder_samples
from ..data.fast_images import crop_scale
from ..data.badfiles import SkipBadFiles
from ..errors import CheckpointError, ConfigError, UserError
from ..io import sweep_stale_temps
from ..models import Family, build_model, get_family
from . import checkpoint as ckpt
from .previous_run import HARMLESS, check_resume_changes, inexact_changes
from . import distributed as dist_env
from . import runlock
from .capacity import check_fits
from .config import RunConfig, TrainConfig


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


@contextmanager
def run_folder(path: Path, env: dist_env.DistEnv, say):
    """The run folder, created and locked for the block (one run per folder: rank 0 holds the
    lock, every rank learns of a refusal), with the temp files of killed checkpoint writers swept.
    A launch that fails before its first log row or checkpoint removes what it created (the lock
    file, ``tb/``, an empty ``checkpoints/``, the folder itself): a wrong data path or a refused
    start leaves nothing behind (issue 23.13)."""
    path = Path(path)
    created = not path.exists()
    prepare_out_dir(path)
    before = set(os.listdir(path))
    problem = None
    if env.is_main:
        try:
            runlock.acquire(path)
        except runlock.RunFolderBusy as e:
            problem = str(e)
    problem = next((p for p in dist_env.gather_objects(env, problem) if p), None)
    if problem:
        raise runlock.RunFolderBusy(problem)
    try:
        if env.is_main:
            stale = sweep_stale_temps(path / "checkpoints", owned=True)
            if stale:
                say(f"removed {len(stale)} partial checkpoint file(s) left by a killed run in {path / 'checkpoints'}")
        yield path
    except BaseException:
        if env.is_main:
            remove_failed_start(path, before, created)
            runlock.release(path)
        raise
    else:
        if env.is_main:
            runlock.release(path)


def remove_failed_start(path: Path, before: set[str], created: bool) -> None:
    """Remove the run files a failed launch created, unless it wrote a log row or a checkpoint
    (then it made progress worth keeping, or resuming); rank 0, still holding the lock."""
    new = set(os.listdir(path)) - before
    if "log.jsonl" in new or ("checkpoints" in new and ckpt.list_checkpoints(path / "checkpoints")):
        return
    for name in new & {"tb", "checkpoints", "bad_files.txt", runlock.LOCK_NAME}:
        target = path / name
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)
    if created and not any(path.iterdir()):
        path.rmdir()


def autocast_dtype(precision: str, device: torch.device) -> torch.dtype | None:
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else None
    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": None}[precision]


def make_optimizer(groups: list[dict], tc: TrainConfig, lr: float, device: torch.device) -> torch.optim.Optimizer:
    """AdamW (fused on GPU and, where this torch has the kernel, on CPU); timm's LARS with MAE's
    rule (trust-ratio adaptation for weight matrices only, momentum 0.9); or SGD with Nesterov
    momentum 0.9 (supervised ResNets)."""
    if tc.optimizer == "lars":
        from timm.optim import Lars

        for g in groups:
            g["always_adapt"] = any(p.ndim > 1 for p in g["params"])
        return Lars(groups, lr=lr, momentum=0.9)
    if tc.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=lr, momentum=0.9, nesterov=True)
    try:  # fused AdamW on CPU: about 5x faster than foreach on mae-tiny-digits (docs/speed-notes.md)
        return torch.optim.AdamW(groups, lr=lr, betas=(tc.beta1, tc.beta2), fused=True)
    except (RuntimeError, ValueError):  # a device or dtype without the fused kernel: the foreach one
        return torch.optim.AdamW(groups, lr=lr, betas=(tc.beta1, tc.beta2))


@dataclass
class Data:
    """The training split, its resumable sampler and loader, and the step counts they imply."""
    samples: SeededSamples
    sampler: ResumableSampler
    loader: DataLoader
    steps_per_epoch: int
    total_steps: int
    warmup_steps: int
    eff_batch: int
    peak_lr: float
    bad_files: Path | None = None  # <run>/bad_files.txt under data.on_bad_file=skip


def build_data(cfg: RunConfig, env: dist_env.DistEnv, out: Path | None = None) -> Data:
    tc = cfg.train
    dataset, _ = build_dataset(cfg.data, "train", cfg.model.img_size)
    samples = SeededSamples(dataset, tc.seed)
    bad_files = Path(out) / "bad_files.txt" if out is not None and cfg.data.on_bad_file == "skip" else None
    if bad_files is not None:
        samples = SkipBadFiles(samples, bad_files)
    check_first_sample(samples, cfg.model.in_chans, cfg.model.img_size, cfg.data.name)
    sampler = ResumableSampler(len(samples), env.rank, env.world_size, seed=tc.seed, shuffle=True)
    workers = cfg.data.num_workers
    uint8_stats = uint8_batches(samples)  # ImageFolder on the uint8 path: batches stay uint8 until the device
    if cfg.data.decoder == "dali":  # the same crops, decoded on the GPU by DALI; workers become its threads
        scale = crop_scale(cfg.data.augment)
        loader = DaliLoader(folder_samples(samples), sampler, tc.batch_size, cfg.model.img_size, scale, tc.seed,
                            *uint8_stats, env.device, threads=max(workers, 1))
    else:
        loader = DataLoader(samples, batch_size=tc.batch_size, sampler=sampler, num_workers=workers, drop_last=True,
                            pin_memory=env.device.type == "cuda", persistent_workers=workers > 0,
                            generator=torch.Generator())  # own generator: never draws from the global RNG
        if uint8_stats is not None:  # a quarter of the bytes to copy; the side-stream copy overlaps compute
            loader = DeviceLoader(loader, env.device, *uint8_stats)
    steps_per_epoch = sampler.per_rank // tc.batch_size // tc.accum_steps
    if steps_per_epoch < 1:
        raise ConfigError(f"{cfg.data.name} has {len(samples)} training images, fewer than one optimizer step "
                          f"needs ({tc.batch_size} x {tc.accum_steps} accum x {env.world_size} ranks); lower train.batch_size")
    eff_batch = tc.batch_size * tc.accum_steps * env.world_size
    return Data(samples, sampler, loader, steps_per_epoch, tc.epochs * steps_per_epoch,
                int(round(tc.warmup_epochs * steps_per_epoch)), eff_batch,
                tc.lr if tc.lr is not None else tc.base_lr * eff_batch / 256, bad_files)


def settings_warnings(cfg: RunConfig, data: Data, raw) -> list[str]:
    """Settings that silently do (almost) nothing, as one line each (printed once at the start)."""
    tc, out = cfg.train, []
    if data.warmup_steps > data.total_steps:
        out.append(f"warning: train.warmup_epochs={tc.warmup_epochs:g} is longer than the run (train.epochs={tc.epochs}): "
                   f"the lr never reaches its peak {data.peak_lr:.2e} (it stops at "
                   f"{data.peak_lr * data.total_steps / data.warmup_steps:.2e}); lower train.warmup_epochs")
    dropped = dropped_per_epoch(len(data.samples), data.eff_batch)
    if dropped >= 0.1 * len(data.samples):  # drop_last: a batch that does not fill is left out (issue 23.13)
        better = max((b for b in range(1, tc.batch_size + 1)
                      if dropped_per_epoch(len(data.samples), data.eff_batch * b // tc.batch_size) < 0.1 * len(data.samples)),
                     default=1)
        out.append(f"warning: an effective batch of {data.eff_batch} fits {len(data.samples) // data.eff_batch} time(s) into "
                   f"the {len(data.samples)} training images: {dropped} ({100 * dropped / len(data.samples):.0f}%) are left "
                   f"out of every epoch (a different subset each epoch); lower train.batch_size to {better} or less")
    sources, depth = getattr(raw, "skip_sources", None), getattr(cfg.model, "depth", None)
    if sources and depth and 4 * len(sources) < depth:
        out.append(f"warning: only {len(sources)} of {depth} encoder blocks feed the decoder (model.decoder_depth="
                   f"{cfg.model.decoder_depth} long skips); raise model.decoder_depth to about {math.ceil(depth / 2)} "
                   "or set model.skip_sources")
    return out


def dropped_per_epoch(images: int, eff_batch: int) -> int:
    """Images an epoch leaves out when only whole effective batches are drawn (drop_last)."""
    return images - (images // eff_batch) * eff_batch if eff_batch <= images else images


@dataclass
class Trainee:
    """The network in its wrappers, with everything that steps it and is saved with it."""
    raw: torch.nn.Module  # the bare network: state_dict, EMA and FLOPs read this one
    model: torch.nn.Module  # raw, compiled and/or DDP-wrapped: the forward pass calls this one
    family: Family
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    amp_dtype: torch.dtype | None
    ema: object | None  # timm ModelEmaV3 when train.ema_decay > 0
    step: int  # optimizer steps done (the resumed step, or 0)
    resumed_from: Path | None
    # what the resumed checkpoint says of the run so far: train_time_s (all launches), final_loss,
    # loss_window (this rank's open log window); empty on a fresh start
    progress: dict = field(default_factory=dict)


def build_trainee(cfg: RunConfig, env: dist_env.DistEnv, peak_lr: float, resumed_from: Path | None, init, say,
                  images: int | None = None, allow_changes: bool = False, state: dict | None = None) -> Trainee:
    """Seed, build the model (``init`` on fresh starts), its optimizer and scaler, restore a resumed
    run's state (``state``: the checkpoint, already loaded) and wrap the model for compilation and DDP."""
    tc = cfg.train
    check_fits(cfg, env.device)  # a model that cannot fit is refused before minutes of allocation
    random.seed(tc.seed + env.rank)
    np.random.seed(tc.seed + env.rank)
    torch.manual_seed(tc.seed + env.rank)
    raw = build_model(cfg.model).to(env.device)
    family = get_family(cfg.model.family)
    if init is not None and resumed_from is None:
        init(raw)  # e.g. pretrained encoder weights for fine-tuning; a resumed run has its own
    optimizer = make_optimizer((family.param_groups or param_groups)(raw, tc.weight_decay), tc, peak_lr, env.device)
    amp_dtype = autocast_dtype(tc.precision, env.device)
    scaler = torch.amp.GradScaler(env.device.type, enabled=amp_dtype == torch.float16)
    step, ema_state, progress = 0, None, {}
    if resumed_from is not None:
        step, ema_state, progress = restore(cfg, env, resumed_from, raw, optimizer, scaler, say, images, allow_changes, state)
    ema = None
    if tc.ema_decay > 0:  # an exponential moving average of the weights, used for sampling (DiT, SiT, U-ViT)
        from timm.utils import ModelEmaV3

        ema = ModelEmaV3(raw, decay=tc.ema_decay, use_warmup=tc.ema_warmup)
        if ema_state is not None:
            ema.module.load_state_dict(ema_state)
        elif resumed_from is not None:
            say(f"note: {resumed_from} has no EMA weights; the EMA starts from the resumed weights")
    model = torch.compile(raw) if tc.compile else raw
    if env.distributed:
        model = DDP(model, device_ids=[env.device.index] if env.device.type == "cuda" else None,
                    gradient_as_bucket_view=True)  # gradients live in the all-reduce buckets: no copy in or out
    return Trainee(raw, model, family, optimizer, scaler, amp_dtype, ema, step, resumed_from, progress)


def restore(cfg: RunConfig, env, path: Path, raw, optimizer, scaler, say, images: int | None = None,
            allow_changes: bool = False, state: dict | None = None) -> tuple[int, dict | None, dict]:
    """Load a checkpoint of the same model into this run; returns (step, EMA weights or None, the
    run's progress: Trainee.progress)."""
    state = ckpt.load_checkpoint(path) if state is None else state
    saved_images = state["train_state"].get("images")
    if images is not None and saved_images is not None and saved_images != images:
        say(f"note: the training set has {images} images now but had {saved_images} when {path.name} was written; "
            "the data order from here on differs from the original run's")
    diffs = ckpt.model_differences(state["config"]["model"], cfg.to_dict()["model"])
    if diffs:
        raise CheckpointError(f"cannot resume from {path}: it is a different model ({'; '.join(diffs[:3])}); "
                              "use the checkpoint's settings or a new train.out_dir")
    changes = inexact_changes(state["config"], cfg.to_dict(), state["train_state"].get("world_size"), env.world_size)
    check_resume_changes(changes, allow_changes, path, say)
    for section in ("data", "train"):  # the harmless ones (device, workers, logging, ...) are only noted
        for k, v in cfg.to_dict()[section].items():
            if k in HARMLESS[section] and state["config"][section].get(k, v) != v:
                say(f"note: {section}.{k} changed since the checkpoint ({state['config'][section].get(k)!r} -> {v!r})")
    raw.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    step = int(state["train_state"]["step"])
    rngs, windows = state["rng"], state.get("loss_window")
    if len(rngs) == env.world_size:
        ckpt.set_rng_state(rngs[env.rank])
    else:
        say(f"note: checkpoint has RNG states of {len(rngs)} ranks, this run has {env.world_size}; reseeding")
        torch.manual_seed(cfg.train.seed + env.rank + step)
    ts = state["train_state"]
    progress = {"train_time_s": ts.get("train_time_s"), "final_loss": ts.get("final_loss"),
                "loss_window": windows[env.rank] if windows and len(windows) == env.world_size else None}
    return step, state.get("ema"), progress


def save(cfg: RunConfig, env, trainee: Trainee, data: Data, ckpt_dir: Path, writer=None, progress: dict | None = None,
         window=None) -> Path:
    """Every rank contributes its RNG state and open loss window (``window``: a runlog.LossWindow);
    rank 0 writes the file atomically (``writer``: an ``async_checkpoint.CheckpointWriter`` that
    snapshots now and writes in the background). ``progress`` (train_time_s over all launches,
    final_loss) goes into ``train_state``."""
    step = trainee.step
    ranks = dist_env.gather_objects(env, (ckpt.rng_state(), window.state() if window is not None else None))
    rngs = [r for r, _ in ranks]
    path = ckpt.checkpoint_path(ckpt_dir, step)  # every rank returns it; rank 0 writes it
    if env.is_main:
        state = {"model": trainee.raw.state_dict(), "optimizer": trainee.optimizer.state_dict(),
                 "scaler": trainee.scaler.state_dict(),
                 "train_state": {"step": step, "epoch": step // data.steps_per_epoch,
                                 "step_in_epoch": step % data.steps_per_epoch, "world_size": env.world_size,
                                 "images": len(data.samples), **(progress or {})},
                 "rng": rngs, "config": cfg.to_dict()}
        if window is not None:
            state["loss_window"] = [w for _, w in ranks]
        if trainee.ema is not None:
            state["ema"] = trainee.ema.module.state_dict()
        if writer is not None:
            writer.submit(state, ckpt_dir, step, cfg.train.keep_last)
        else:
            ckpt.save_checkpoint(state, ckpt_dir, step, cfg.train.keep_last)
    dist_env.barrier(env)
    return path
