"""The training loop: one for every model family, on CPU, one GPU or many (torchrun).

Read it top to bottom: ``train`` (the one entry: run folder, lock, fresh-start check) ->
``train_in_folder`` (setup from ``setup.py``: data, model and optimizer, resumed state; the header)
-> ``train_epochs`` (lr schedule, accumulated micro-batches, optimizer step, log, checkpoint, the
epoch-end hook) -> summary. The model family supplies the objective (``models.FAMILIES``); online
evaluation comes in as a hook, so this folder never imports ``eval/``.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

from ..data.badfiles import count_bad_files
from ..errors import ConfigError, DataError, TrainingDiverged, UserError, one_line
from ..io import progress_bar
from ..nn.decayify import alphas_of
from . import checkpoint as ckpt
from . import distributed as dist_env
from .async_checkpoint import CheckpointWriter
from .config import RunConfig
from .lr_sched import lr_at, set_lr
from .run.previous_run import check_fresh_start
from .run.run_folder import run_folder
from .log.runlog import LossWindow, RunLog, peak_flops, peak_memory_mb
from .setup import Data, Trainee, build_data, build_trainee, settings_warnings
from .stability import FIX, BlockNormMonitor
from .run.summary import announce, finished_summary, run_summary, summary_scalars, write_summary
from .log.tracking import check_installed


def train(cfg: RunConfig, resume: str | None = None, progress: bool = True, on_epoch_end=None, init=None,
          online_eval=None, overwrite: bool = False, allow_changes: bool = False) -> dict:
    """Train ``cfg``, write ``<run>/summary.json`` (rank 0) and return the summary (final loss,
    steps, time, checkpoint path). Resuming a finished run trains nothing and changes nothing; its
    summary comes back with ``already_finished: True``.

    Args:
        resume: None (fresh run), "auto" (newest checkpoint in the run folder, if any) or a path.
        on_epoch_end: ``hook(model, epoch, step, log)`` after every epoch; it gets the EMA weights
            when the run keeps them (train.ema_decay > 0), else the raw model.
        init: ``init(model)``, called on fresh starts only, before the optimizer sees the weights.
        online_eval: ``factory(cfg, device) -> hook``, used for ``train.online_eval_every > 0`` when
            no ``on_epoch_end`` is given (``resdecay.commands.pretrain.train_with_online_eval``
            passes the evaluators).
        overwrite: a fresh start into a folder that holds a run removes that run first (else refused).
        allow_changes: resume even if batch, data, seed, lr or process count changed (no longer exact).
    """
    if overwrite and resume is not None:  # contradictory: it once resumed and wrote NaN (issue 23.12)
        raise UserError(f"--overwrite starts the run over but --resume {resume} continues it; give one of them")
    if dist_env.is_main_process():  # only rank 0 logs; a missing tracker package is one line, before anything is made
        check_installed(cfg.train.loggers)
    env = dist_env.setup(cfg.train.device)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    say = print if env.is_main else (lambda *a, **k: None)
    with run_folder(cfg.out_dir, env, say) as out:  # locked: one run per folder at a time
        if env.is_main:
            check_fresh_start(out, resume, overwrite, say)  # a finished run is never overwritten silently
        dist_env.barrier(env)
        return train_in_folder(Launch(cfg, env, out, say, resume, progress, on_epoch_end, init, online_eval, allow_changes))


@dataclass
class Launch:
    """What one call of ``train`` asked for, in the run folder it holds (arguments as ``train``'s)."""
    cfg: RunConfig
    env: dist_env.DistEnv
    out: Path  # the run folder, locked
    say: Callable[..., None]  # print on rank 0, silent elsewhere
    resume: str | None = None
    progress: bool = True
    on_epoch_end: Callable | None = None
    init: Callable | None = None
    online_eval: Callable | None = None
    allow_changes: bool = False

    @property
    def ckpt_dir(self) -> Path:
        return self.out / "checkpoints"


@dataclass
class Run:
    """One launch after setup: its data and trainee, and what the loop carries from step to step."""
    launch: Launch
    data: Data
    trainee: Trainee
    log: RunLog
    bar: Any  # the progress bar
    # The loss and the divergence flag stay on the device: reading them every step would make the
    # host wait for the GPU; they are read at log steps, and the flag at checkpoints.
    window: LossWindow
    writer: CheckpointWriter  # checkpoints are written in a background thread, one at a time
    norms: BlockNormMonitor  # block output RMS at log steps
    autocast: dict  # torch.autocast arguments of every forward
    flops_per_image: float  # forward + backward, for MFU
    gpu_peak: float | None  # the device's peak FLOP/s (None on CPU)
    earlier_s: float  # training time of the launches before this one
    started: float  # perf_counter when this launch's training began
    window_started: float  # perf_counter when the open log window began
    last_ckpt: Path | None
    last_loss: float | None
    bad_seen: int  # unreadable images replaced so far (data.on_bad_file=skip)
    timed_steps: int = 0  # steps in the open log window

    def train_time(self) -> float:
        """Training seconds of the whole run so far, every launch included."""
        return self.earlier_s + time.perf_counter() - self.started

    def close(self, ok: bool = True) -> None:
        """Release the hooks, the checkpoint thread, the bar and the trackers (``ok=False``: the
        launch failed or was interrupted, so tracker runs are marked failed)."""
        self.norms.remove()
        self.writer.wait()  # never leave a half-written checkpoint behind a crash or Ctrl-C
        self.bar.close()
        self.log.close(ok)


def train_in_folder(launch: Launch) -> dict:
    """Set up (data, model, optimizer, resumed state), train the remaining steps, write the summary."""
    cfg, env, say = launch.cfg, launch.env, launch.say
    data = build_data(cfg, env, launch.out)
    resumed_from, state = ckpt.load_resume(launch.resume, launch.ckpt_dir, say)  # auto: skips a truncated newest file
    tracker_refs = state["train_state"].get("trackers") if state else None  # the W&B / MLflow runs to continue
    trainee = build_trainee(cfg, env, data.peak_lr, resumed_from, launch.init, say, len(data.samples),
                            allow_changes=launch.allow_changes, state=state)
    del state  # the weights are in the model now; do not hold a second copy through training
    if trainee.resumed_from is not None and trainee.step >= data.total_steps:  # issue 23.4: nothing to train
        summary = finished_summary(cfg, launch.out, data, trainee, say)
        dist_env.cleanup(env)
        return summary
    announce(cfg, env, data, trainee, launch.resume, say)
    for line in settings_warnings(cfg, data):
        say(line)
    bad_seen = count_bad_files(data.bad_files)
    on_epoch_end = epoch_hook(launch)  # built here: it may draw from the seeded RNG, as it always did
    run, ok = start_run(launch, data, trainee, bad_seen, tracker_refs), False
    try:
        train_epochs(run, on_epoch_end)
        run.writer.wait()
        run.writer.raise_if_failed()  # a failed background write fails the run
        summary = run_summary(cfg, launch.out, data, trainee, run.last_loss, run.last_ckpt, run.train_time())
        run.log.log_summary(summary_scalars(summary), trainee.step)
        ok = True
    except TrainingDiverged:
        run.writer.wait()
        raise TrainingDiverged(diverged_message(trainee.step, launch.ckpt_dir)) from None
    finally:
        run.close(ok)
    dist_env.barrier(env)
    if env.is_main:  # rank 0 alone writes it (issue 23.6)
        write_summary(launch.out, summary)
    dist_env.cleanup(env)
    return summary


def epoch_hook(launch: Launch):
    """The epoch-end hook: the caller's ``on_epoch_end``, else the online evaluator for
    ``train.online_eval_every > 0``, else None."""
    if launch.on_epoch_end is not None or launch.cfg.train.online_eval_every <= 0:
        return launch.on_epoch_end
    if launch.online_eval is None:
        raise ConfigError("train.online_eval_every needs an online evaluator: train with "
                          "resdecay.commands.pretrain.train_with_online_eval (as `resdecay pretrain` does) "
                          "or pass on_epoch_end=")
    return launch.online_eval(launch.cfg, launch.env.device)


def start_run(launch: Launch, data: Data, trainee: Trainee, bad_seen: int, tracker_refs: dict | None = None) -> Run:
    """The log (and its trackers: ``tracker_refs`` are the runs a resumed checkpoint names), progress
    bar, loss window, clocks, checkpoint writer and norm monitor of this launch."""
    env, tc = launch.env, launch.cfg.train
    norms = BlockNormMonitor(trainee.raw, tc.norm_growth_warn, tc.norm_growth_window)
    resume_step = trainee.step if trainee.resumed_from is not None else None
    log = RunLog(launch.out, resume_step=resume_step, enabled=env.is_main, loggers=tc.loggers,
                 config=launch.cfg.to_dict(), resume_refs=tracker_refs, block_names=norms.names)
    if resume_step is None:
        log.describe_model(alphas_of(trainee.raw))  # the alpha schedule, once per run
    flops_per_image, gpu_peak = 3 * trainee.raw.flops_per_sample(), peak_flops(env.device)  # forward + backward
    bar = progress_bar(total=data.total_steps, initial=trainee.step, disable=not (launch.progress and env.is_main),
                       unit="step", dynamic_ncols=True)
    window = LossWindow(env.device)
    window.load(trainee.progress.get("loss_window"))
    window_started, started = time.perf_counter(), time.perf_counter()
    autocast = dict(device_type=env.device.type, dtype=trainee.amp_dtype or torch.float32, enabled=trainee.amp_dtype is not None)
    return Run(launch, data, trainee, log, bar, window, CheckpointWriter(), autocast=autocast, norms=norms,
               flops_per_image=flops_per_image, gpu_peak=gpu_peak, earlier_s=trainee.progress.get("train_time_s") or 0.0,
               started=started, window_started=window_started, last_ckpt=trainee.resumed_from,
               last_loss=trainee.progress.get("final_loss"), bad_seen=bad_seen)


def train_epochs(run: Run, on_epoch_end) -> None:
    """Train from the trainee's step to the last: each step sets the lr, steps the optimizer over
    the accumulated micro-batches and updates the EMA; then the log row and checkpoint it is due."""
    launch, data, trainee = run.launch, run.data, run.trainee
    tc, env = launch.cfg.train, launch.env
    trainee.model.train()
    epoch, in_epoch = divmod(trainee.step, data.steps_per_epoch)
    while trainee.step < data.total_steps:
        # The sampler restarts mid-epoch after a resume: skip the micro-batches already seen.
        data.sampler.set_epoch(epoch, start=in_epoch * tc.accum_steps * tc.batch_size)
        batches = iter(data.loader)
        for _ in range(in_epoch, data.steps_per_epoch):
            lr = lr_at(trainee.step, data.total_steps, data.warmup_steps, data.peak_lr, tc.min_lr, tc.lr_schedule)
            if is_log_step(trainee.step + 1, tc, data.total_steps):
                run.norms.arm()  # record block norms in this step's forwards (no extra pass)
            set_lr(trainee.optimizer, lr)
            run.window.add(train_step(trainee, tc, env, batches, run.autocast))
            trainee.step, run.timed_steps = trainee.step + 1, run.timed_steps + 1
            if trainee.ema is not None:
                trainee.ema.update(trainee.raw, step=trainee.step)
            run.bar.update(1)
            after_step(run, lr, checkpoint=trainee.step % data.steps_per_epoch != 0)  # the epoch's last: below
        if on_epoch_end is not None:  # on forked RNG, so evaluation never shifts the training stream
            with torch.random.fork_rng(devices=[env.device] if env.device.type == "cuda" else []):
                on_epoch_end(trainee.ema.module if trainee.ema is not None else trainee.raw, epoch, trainee.step, run.log)  # the weights one samples with
        # The epoch's last checkpoint comes after its hook: a run killed during the hook resumes from the
        # checkpoint before and runs the hook again, instead of skipping it for good.
        checkpoint_if_due(run)
        epoch, in_epoch = epoch + 1, 0


def after_step(run: Run, lr: float, checkpoint: bool = True) -> None:
    """The log row and (``checkpoint``) the checkpoint the step just taken is due for."""
    if is_log_step(run.trainee.step, run.launch.cfg.train, run.data.total_steps):
        log_row(run, lr)
    if checkpoint:
        checkpoint_if_due(run)


def checkpoint_if_due(run: Run) -> None:
    """The checkpoint the step just taken is due for (never of a diverged model)."""
    launch, data, trainee = run.launch, run.data, run.trainee
    tc = launch.cfg.train
    if trainee.step % tc.ckpt_every == 0 or trainee.step == data.total_steps:
        if len(run.window) and run.window.diverged(launch.env):  # not checked at a log step just now
            raise TrainingDiverged(trainee.step)
        so_far = {"train_time_s": run.train_time(), "final_loss": run.last_loss}
        if run.log.refs:  # the tracker runs a resumed launch continues (W&B / MLflow run ids)
            so_far["trackers"] = run.log.refs
        run.last_ckpt = ckpt.save_training(launch.cfg, launch.env, trainee, data, launch.ckpt_dir, run.writer, so_far,
                                           run.window)


def log_row(run: Run, lr: float) -> None:
    """Close the log window: one row (loss over the window and the ranks, lr, throughput, memory,
    block RMS, MFU) to log.jsonl and the trackers; the one host-device sync per log window."""
    launch, data, step = run.launch, run.data, run.trainee.step
    norm_fields = run.norms.report(step, launch.say)  # block_rms; before the divergence check: warns first
    window_loss, diverged = run.window.close(launch.env)
    if diverged:  # never log or checkpoint a diverged model
        raise TrainingDiverged(step)
    now = time.perf_counter()
    img_s = run.timed_steps * data.eff_batch / max(now - run.window_started, 1e-9)
    run.last_loss = window_loss
    row = {"step": step, "epoch": step / data.steps_per_epoch, "loss": window_loss, "lr": lr, "img_per_s": img_s,
           "peak_mem_mb": peak_memory_mb(launch.env.device), "time_s": run.earlier_s + now - run.started, **norm_fields}
    if run.gpu_peak:
        row["mfu"] = run.flops_per_image * img_s / launch.env.world_size / run.gpu_peak
    run.bad_seen = note_bad_files(data.bad_files, run.bad_seen, row, launch.say)
    run.log.write(row)
    run.bar.set_postfix(loss=f"{window_loss:.4f}", lr=f"{lr:.2e}", img_s=f"{img_s:.0f}")
    run.timed_steps, run.window_started = 0, now


def train_step(trainee: Trainee, tc, env, batches, autocast: dict) -> torch.Tensor:
    """One optimizer step over ``train.accum_steps`` micro-batches; returns this rank's loss of the
    step (a device scalar: the mean over its share of the effective batch)."""
    step_loss = None
    for micro in range(tc.accum_steps):
        try:
            images, labels = next(batches)
        except DataError as e:  # re-raised from a worker with its traceback inside
            raise DataError(one_line(e)) from None
        images = images.to(env.device, non_blocking=True)
        # DDP all-reduces gradients on every backward; during accumulation only the last
        # micro-batch needs it, so the others run under no_sync.
        last = micro == tc.accum_steps - 1
        sync = contextlib.nullcontext() if last or not env.distributed else trainee.model.no_sync()
        with sync, torch.autocast(**autocast):
            # divided so the accumulated gradient is the mean over the effective batch
            loss = trainee.family.objective(trainee.model, images, labels.to(env.device, non_blocking=True)) / tc.accum_steps
        # the scaler multiplies fp16 losses so small gradients do not underflow (no-op otherwise)
        trainee.scaler.scale(loss).backward()
        step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
    if tc.grad_clip:
        trainee.scaler.unscale_(trainee.optimizer)  # clip the true gradients, not the scaled ones
        torch.nn.utils.clip_grad_norm_(trainee.raw.parameters(), tc.grad_clip)
    trainee.scaler.step(trainee.optimizer)  # skips the step if fp16 gradients overflowed
    trainee.scaler.update()
    trainee.optimizer.zero_grad(set_to_none=True)  # set_to_none frees the memory until the next backward
    return step_loss


def note_bad_files(bad_files, seen: int, row: dict, say) -> int:
    """Under data.on_bad_file=skip: the count of unreadable images replaced so far goes into the log
    row, and a note is printed when it grew. Returns the new count."""
    if bad_files is None or not (bad := count_bad_files(bad_files)):
        return seen
    row["bad_files"] = bad
    if bad > seen:
        say(f"\nnote: {bad} unreadable image(s) skipped so far; listed in {bad_files}")
    return bad


def is_log_step(step: int, tc, total_steps: int) -> bool:
    """Steps that end with a log line (and the divergence check): multiples of train.log_every and
    the last step. Not checkpoints: rows, and the final loss, must not depend on ckpt_every."""
    return step % tc.log_every == 0 or step == total_steps


def diverged_message(step: int, ckpt_dir) -> str:
    good = ckpt.list_checkpoints(ckpt_dir)
    keep = f"the last good checkpoint {good[-1]} is kept" if good else "no checkpoint had been written yet"
    return f"loss became non-finite by step {step}; {keep}; {FIX}"
