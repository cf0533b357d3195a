"""What the training loop needs before its first step, built once per launch, top to bottom: the
data pipeline and the step counts it implies (``build_data`` -> ``Data``), then the network with
everything that steps it, restored from a checkpoint on resume (``build_run`` -> ``Run``, the one
state object of a launch). The optimizer, the lr schedule and checkpoints have their own modules
(``optim``, ``lr_sched``, ``checkpoint``); the run folder is ``run/``."""

from __future__ import annotations

import random
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader

from ..data import (
    DeviceLoader,
    ResumableSampler,
    SeededSamples,
    build_dataset,
    check_first_sample,
    choose_decoder,
    create_transform,
)
from ..data.badfiles import SkipBadFiles
from ..data.dali_images import DaliLoader, folder_samples
from ..data.datasets import normalization_card
from ..errors import ConfigError
from ..models import Family, build_model, get_family
from ..nn.shortcut_info import knob_warnings, shortcut_settings
from . import checkpoint as ckpt
from . import distributed as dist_env
from .async_checkpoint import CheckpointWriter
from .aux_objective import AuxObjective, AuxTarget
from .config import RunConfig
from .log.runlog import LossWindow, RunLog
from .lr_sched import peak_lr
from .optim import autocast_dtype, make_optimizer, param_groups
from .parallel import SHARDED, device_mesh, one_process_group, parallelize
from .run.capacity import refuse_if_too_big
from .stability import BlockNormMonitor


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
    normalization: str = ""  # which mean/std normalise the images, in words (the run header says it)
    pixel_stats: tuple = ((), ())  # (mean, std) per channel: the images are (pixels in [0, 1] - mean) / std


def build_data(cfg: RunConfig, env: dist_env.DistEnv, out: Path | None = None) -> Data:
    tc = cfg.train
    pipeline = choose_decoder(cfg.data)  # the training view's decode path, decided in data/transforms.py only
    # ImageFolder on the uint8 path: batches stay uint8 until the device (a quarter of the bytes to copy)
    uint8 = pipeline in ("uint8", "dali")
    dataset, info = build_dataset(cfg.data, "train", cfg.model.img_size, uint8_out=uint8)
    samples = SeededSamples(dataset, tc.seed)
    bad_files = Path(out) / "bad_files.txt" if out is not None and cfg.data.on_bad_file == "skip" else None
    if bad_files is not None:
        samples = SkipBadFiles(samples, bad_files)
    check_first_sample(samples, cfg.model.in_chans, cfg.model.img_size, cfg.data.name)
    sampler = ResumableSampler(len(samples), env.rank, env.world_size, seed=tc.seed, shuffle=True)
    workers = cfg.data.num_workers
    if pipeline == "dali":  # the same crops, decoded on the GPU by DALI; workers become its threads
        crops = create_transform(cfg.data.augment, cfg.model.img_size, "dali", mean=info.mean, std=info.std)
        loader = DaliLoader(folder_samples(dataset), sampler, tc.batch_size, crops.size, crops.scale, tc.seed,
                            crops.mean, crops.std, env.device, threads=max(workers, 1))
    else:
        loader = DataLoader(samples, batch_size=tc.batch_size, sampler=sampler, num_workers=workers, drop_last=True,
                            pin_memory=env.device.type == "cuda", persistent_workers=workers > 0,
                            generator=torch.Generator())  # own generator: never draws from the global RNG
        if uint8:  # normalised on the device with the dataset's statistics; the side-stream copy overlaps compute
            loader = DeviceLoader(loader, env.device, info.mean, info.std)
    steps_per_epoch = sampler.per_rank // tc.batch_size // tc.accum_steps
    if steps_per_epoch < 1:
        raise ConfigError(f"{cfg.data.name} has {len(samples)} training images, fewer than one optimizer step "
                          f"needs ({tc.batch_size} x {tc.accum_steps} accum x {env.world_size} ranks); lower train.batch_size")
    eff_batch = tc.batch_size * tc.accum_steps * env.world_size
    return Data(samples, sampler, loader, steps_per_epoch, tc.epochs * steps_per_epoch,
                int(round(tc.warmup_epochs * steps_per_epoch)), eff_batch,
                peak_lr(tc.base_lr, eff_batch, tc.lr), bad_files, normalization_card(cfg.data, info),
                (tuple(info.mean), tuple(info.std)))


def settings_warnings(cfg: RunConfig, data: Data) -> list[str]:
    """Settings that silently do (almost) nothing, as one line each (printed once at the start); the
    model family adds its own (``ModelConfig.warnings``)."""
    tc, out = cfg.train, []
    if data.warmup_steps > data.total_steps:
        out.append(f"warning: train.warmup_epochs={tc.warmup_epochs:g} is longer than the run (train.epochs={tc.epochs}): "
                   f"the lr never reaches its peak {data.peak_lr:.2e} (it stops at "
                   f"{data.peak_lr * data.total_steps / data.warmup_steps:.2e}); lower train.warmup_epochs")
    dropped = dropped_per_epoch(len(data.samples), data.eff_batch)
    if dropped >= 0.1 * len(data.samples):  # drop_last: a batch that does not fill is left out
        better = max((b for b in range(1, tc.batch_size + 1)
                      if dropped_per_epoch(len(data.samples), data.eff_batch * b // tc.batch_size) < 0.1 * len(data.samples)),
                     default=1)
        out.append(f"warning: an effective batch of {data.eff_batch} fits {len(data.samples) // data.eff_batch} time(s) into "
                   f"the {len(data.samples)} training images: {dropped} ({100 * dropped / len(data.samples):.0f}%) are left "
                   f"out of every epoch (a different subset each epoch); lower train.batch_size to {better} or less")
    if tc.aux != "repa" and (tc.aux_target or tc.aux_target_weights or tc.aux_target_args):
        out.append(f"warning: train.aux_target* name REPA's frozen encoder, but train.aux={tc.aux} reads none; set "
                   "train.aux=repa or drop them")
    knobs = shortcut_settings(cfg.model)  # e.g. model.alpha_min=0.6 beside a formula that never reads it
    out += knob_warnings(knobs["shortcut"], knobs["alpha_min"], knobs["schedule"], knobs["adds_per_block"])
    return out + cfg.model.warnings()


def dropped_per_epoch(images: int, eff_batch: int) -> int:
    """Images an epoch leaves out when only whole effective batches are drawn (drop_last)."""
    return images - (images // eff_batch) * eff_batch if eff_batch <= images else images


@dataclass
class Run:
    """One launch of a run: what it trains on, what it trains and where it stands. ``build_run``
    makes it; the loop advances it; ``checkpoint.save_training`` saves the network part and the
    position (the checkpoint's ``model``, ``optimizer``, ``scaler``, ``ema``, ``train_state``); the
    header and ``summary.json`` read it (``run/summary.py``)."""
    cfg: RunConfig
    env: dist_env.DistEnv
    out: Path  # the run folder, locked
    say: Callable[..., None]  # print on rank 0, silent elsewhere
    data: Data
    # the network and what steps it
    raw: torch.nn.Module  # the bare network: state_dict, EMA and FLOPs read this one
    model: torch.nn.Module  # raw, compiled and/or DDP-wrapped: the forward pass calls this one
    family: Family
    optimizer: torch.optim.Optimizer
    scaler: torch.amp.GradScaler
    amp_dtype: torch.dtype | None
    autocast: dict  # the torch.autocast arguments of every forward
    ema: Any  # timm ModelEmaV3 when train.ema_decay > 0, else None
    # where the run stands
    step: int  # optimizer steps done (the resumed step, or 0)
    resumed_from: Path | None
    # what the resumed checkpoint says of the run so far: train_time_s (all launches), final_loss,
    # loss_window (this rank's open log window), trackers (the W&B / MLflow runs to continue)
    so_far: dict = field(default_factory=dict)
    last_loss: float | None = None  # the last log row's loss: summary.json's final_loss
    last_ckpt: Path | None = None
    # this launch's instruments (``loop.open_instruments``). The loss and the divergence flag stay on the
    # device (``window``): reading them every step would make the host wait for the GPU; they are read
    # at log steps, and the flag at checkpoints.
    log: RunLog | None = None
    window: LossWindow | None = None
    norms: BlockNormMonitor | None = None  # block output RMS at log steps
    writer: CheckpointWriter = field(default_factory=CheckpointWriter)  # one background write at a time
    bar: Any = None  # the progress bar
    flops_per_image: float = 0.0  # forward + backward, for MFU
    gpu_peak: float | None = None  # the device's peak FLOP/s (None on CPU)
    started: float = 0.0  # perf_counter when this launch's training began
    window_started: float = 0.0  # perf_counter when the open log window began
    timed_steps: int = 0  # steps in the open log window
    bad_seen: int = 0  # unreadable images replaced so far (data.on_bad_file=skip)
    aux: AuxObjective | None = None  # train.aux: REPA / the dispersive loss beside the main loss (aux_objective.py)

    @property
    def ckpt_dir(self) -> Path:
        return self.out / "checkpoints"



def build_run(cfg: RunConfig, env: dist_env.DistEnv, out: Path, say, resume: str | None = None, init=None,
              allow_changes: bool = False, aux_target: AuxTarget | None = None) -> Run:
    """The data, then the network (built once; ``init`` on fresh starts), its optimizer and scaler,
    a resumed run's state, the EMA and the compiled / DDP wrappers.

    Args:
        resume: None (fresh run), "auto" (newest readable checkpoint in ``out``, if any) or a path.
        init: ``init(model)``, called on fresh starts only, before the optimizer sees the weights.
        allow_changes: resume even if settings changed that make the run differ from an uninterrupted one.
        aux_target: REPA's frozen encoder (``train.aux=repa``), resolved by the command that trains.
    """
    tc = cfg.train
    data = build_data(cfg, env, out)
    resumed_from, state = ckpt.load_resume(resume, out / "checkpoints", say)  # auto: skips a truncated newest file
    random.seed(tc.seed + env.rank)
    np.random.seed(tc.seed + env.rank)
    torch.manual_seed(tc.seed + env.rank)
    with refuse_if_too_big(cfg, env.device):  # a model that cannot fit is refused after 16 MiB, not minutes
        raw = build_model(cfg.model)
    raw = raw.to(env.device)
    family = get_family(cfg.model.family)
    if init is not None and resumed_from is None:
        init(raw)  # e.g. pretrained encoder weights for fine-tuning; a resumed run has its own
    amp_dtype = autocast_dtype(tc.precision, env.device)
    ema = None
    if tc.parallel in SHARDED:  # AC (the model's own) -> compile -> shard, before the optimizer sees the parameters
        one_process_group(env, tc.parallel, say)
        # the objectives never modify a model's outputs in place, which FSDP2 warns of for every view it returns
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .* returned a view tensor")
        ema = make_ema(tc, raw)  # a copy of the whole model, then sharded like it
        mesh = device_mesh(tc.parallel, env.world_size, env.device, tc.hsdp_nodes)
        for module in (raw, ema.module) if ema is not None else (raw,):
            parallelize(module, mesh, compile=tc.compile and module is raw,
                        reshard_after_forward=tc.reshard_after_forward, param_dtype=amp_dtype)
    groups = (family.param_groups or param_groups)(raw, tc.weight_decay)
    aux = None
    if tc.aux != "none":  # REPA's projector is trained: its groups follow the network's (checkpoints keep the order)
        aux = AuxObjective(tc, raw, aux_target, *data.pixel_stats, env.device)
        if aux.projector is not None:
            groups = [*groups, *param_groups(aux.projector, tc.weight_decay)]
    optimizer = make_optimizer(groups, tc.optimizer, data.peak_lr, (tc.beta1, tc.beta2))
    scaler = torch.amp.GradScaler(env.device.type, enabled=amp_dtype == torch.float16)
    step, ema_state, so_far = 0, None, {}
    if resumed_from is not None:
        step, ema_state, so_far = ckpt.restore_training(cfg, env, resumed_from, raw, optimizer, scaler, say,
                                                        len(data.samples), allow_changes, state,
                                                        ema.module if ema is not None else None)
    del state  # the weights are in the model now; do not hold a second copy through training
    if aux is not None:
        aux.load(so_far.pop("aux", None), env.rank, env.world_size)
        aux.broadcast(env)
    if tc.ema_decay > 0 and tc.parallel not in SHARDED:
        ema = make_ema(tc, raw)
        if ema_state is not None:
            ema.module.load_state_dict(ema_state)
        elif resumed_from is not None:
            say(f"note: {resumed_from} has no EMA weights; the EMA starts from the resumed weights")
    if aux is not None:  # hooked after the EMA's deep copy, which must not carry the hook
        aux.attach(raw)
    model = torch.compile(raw) if tc.compile and tc.parallel not in SHARDED else raw
    if env.distributed and tc.parallel not in SHARDED:
        model = DDP(model, device_ids=[env.device.index] if env.device.type == "cuda" else None,
                    gradient_as_bucket_view=True)  # gradients live in the all-reduce buckets: no copy in or out
    autocast = dict(device_type=env.device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None)
    return Run(cfg, env, out, say, data, raw, model, family, optimizer, scaler, amp_dtype, autocast, ema, step,
               resumed_from, so_far, last_loss=so_far.get("final_loss"), last_ckpt=resumed_from, aux=aux)


def make_ema(tc, raw: torch.nn.Module):
    """An exponential moving average of the weights, used for sampling (DiT, SiT, U-ViT); None when off."""
    if tc.ema_decay <= 0:
        return None
    from timm.utils import ModelEmaV3

    return ModelEmaV3(raw, decay=tc.ema_decay, use_warmup=tc.ema_warmup)
