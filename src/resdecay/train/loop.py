"""The training loop: one for every model family, on CPU, one GPU or many (torchrun).

Read it top to bottom: setup (``setup.py``: data, model and optimizer, resume) -> loop (lr
schedule, accumulated micro-batches, optimizer step, log, checkpoint, the epoch-end hook) ->
summary. The model family supplies the objective (``models.FAMILIES``); online evaluation comes
in as a hook, so this folder never imports ``eval/``.
"""

from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path

import torch

from ..data.badfiles import count_bad_files
from ..errors import ConfigError, DataError, TrainingDiverged, UserError, one_line
from ..io import atomic_write_text, progress_bar
from ..schedule import effective_decay
from .environment import numerics_environment
from . import checkpoint as ckpt
from . import distributed as dist_env
from .async_checkpoint import CheckpointWriter
from .config import RunConfig
from .runlog import LossWindow, RunLog, peak_flops, peak_memory_mb, read_log
from .previous_run import check_fresh_start
from .setup import build_data, build_trainee, lr_at, run_folder, save, settings_warnings
from .stability import FIX, BlockNormMonitor


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
            no ``on_epoch_end`` is given (``resdecay.commands.pretrain.train`` passes the evaluators).
        overwrite: a fresh start into a folder that holds a run removes that run first (else refused).
        allow_changes: resume even if batch, data, seed, lr or process count changed (no longer exact).
    """
    if overwrite and resume is not None:  # contradictory: it once resumed and wrote NaN (issue 23.12)
        raise UserError(f"--overwrite starts the run over but --resume {resume} continues it; give one of them")
    env = dist_env.setup(cfg.train.device)
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    say = print if env.is_main else (lambda *a, **k: None)
    with run_folder(cfg.out_dir, env, say) as out:  # locked: one run per folder at a time
        if env.is_main:
            check_fresh_start(out, resume, overwrite, say)  # a finished run is never overwritten silently
        dist_env.barrier(env)
        return _train(cfg, env, out, say, resume, progress, on_epoch_end, init, online_eval, allow_changes)


def _train(cfg: RunConfig, env, out, say, resume, progress, on_epoch_end, init, online_eval, allow_changes) -> dict:
    tc = cfg.train
    ckpt_dir = out / "checkpoints"
    data = build_data(cfg, env, out)
    resumed_from, state = ckpt.load_resume(resume, ckpt_dir, say)  # auto: skips a truncated newest file
    t = build_trainee(cfg, env, data.peak_lr, resumed_from, init, say, len(data.samples),
                      allow_changes=allow_changes, state=state)
    del state  # the weights are in the model now; do not hold a second copy through training
    if t.resumed_from is not None and t.step >= data.total_steps:  # issue 23.4: nothing to train
        summary = finished_summary(cfg, out, data, t, say)
        dist_env.cleanup(env)
        return summary
    announce(cfg, env, data, t, resume, say)
    for line in settings_warnings(cfg, data, t.raw):
        say(line)
    bad_seen = count_bad_files(data.bad_files)
    if on_epoch_end is None and tc.online_eval_every > 0:
        if online_eval is None:
            raise ConfigError("train.online_eval_every needs an online evaluator: train with "
                              "resdecay.commands.pretrain.train (as `resdecay pretrain` does) or pass on_epoch_end=")
        on_epoch_end = online_eval(cfg, env.device)  # built here: it may draw from the seeded RNG, as it always did

    log = RunLog(out, resume_step=t.step if t.resumed_from is not None else None, enabled=env.is_main)
    flops_per_img, gpu_peak = 3 * t.raw.flops_per_sample(), peak_flops(env.device)  # forward + backward
    bar = progress_bar(total=data.total_steps, initial=t.step, disable=not (progress and env.is_main), unit="step", dynamic_ncols=True)
    # The loss and the divergence flag stay on the device (a LossWindow): reading them every step
    # would make the host wait for the GPU; they are read at log steps, and the flag at checkpoints.
    window = LossWindow(env.device)
    window.load(t.progress.get("loss_window"))
    timed_steps, window_t0, t_start = 0, time.perf_counter(), time.perf_counter()
    earlier_s = t.progress.get("train_time_s") or 0.0  # training time of the launches before this one
    last_ckpt, last_loss = t.resumed_from, t.progress.get("final_loss")
    autocast = dict(device_type=env.device.type, dtype=t.amp_dtype or torch.float32, enabled=t.amp_dtype is not None)
    writer = CheckpointWriter()  # checkpoints are written in a background thread, one at a time
    norms = BlockNormMonitor(t.raw, tc.norm_growth_warn, tc.norm_growth_window)  # block output RMS at log steps
    t.model.train()
    epoch, in_epoch = divmod(t.step, data.steps_per_epoch)
    try:
        while t.step < data.total_steps:
            # The sampler restarts mid-epoch after a resume: skip the micro-batches already seen.
            data.sampler.set_epoch(epoch, start=in_epoch * tc.accum_steps * tc.batch_size)
            batches = iter(data.loader)
            for _ in range(in_epoch, data.steps_per_epoch):
                lr = lr_at(t.step, data.total_steps, data.warmup_steps, data.peak_lr, tc.min_lr, tc.lr_schedule)
                if is_log_step(t.step + 1, tc, data.total_steps):
                    norms.arm()  # record block norms in this step's forwards (no extra pass)
                for group in t.optimizer.param_groups:
                    group["lr"] = lr * group.get("lr_scale", 1.0)  # layer-wise lr decay when fine-tuning
                window.add(train_step(t, tc, env, batches, autocast))
                t.step, timed_steps = t.step + 1, timed_steps + 1
                if t.ema is not None:
                    t.ema.update(t.raw, step=t.step)
                bar.update(1)

                if is_log_step(t.step, tc, data.total_steps):
                    norm_fields = norms.report(t.step, say)  # block_rms; before the divergence check: warns first
                    window_loss, diverged = window.close(env)  # the one host-device sync per log window
                    if diverged:  # never log or checkpoint a diverged model
                        raise TrainingDiverged(t.step)
                    now = time.perf_counter()
                    img_s = timed_steps * data.eff_batch / max(now - window_t0, 1e-9)
                    last_loss = window_loss
                    row = {"step": t.step, "epoch": t.step / data.steps_per_epoch, "loss": last_loss, "lr": lr,
                           "img_per_s": img_s, "peak_mem_mb": peak_memory_mb(env.device),
                           "time_s": earlier_s + now - t_start, **norm_fields}
                    if gpu_peak:
                        row["mfu"] = flops_per_img * img_s / env.world_size / gpu_peak
                    bad_seen = note_bad_files(data.bad_files, bad_seen, row, say)
                    log.write(row)
                    bar.set_postfix(loss=f"{last_loss:.4f}", lr=f"{lr:.2e}", img_s=f"{img_s:.0f}")
                    timed_steps, window_t0 = 0, now
                if t.step % tc.ckpt_every == 0 or t.step == data.total_steps:
                    if len(window) and window.diverged(env):  # not checked at a log step just now
                        raise TrainingDiverged(t.step)
                    so_far = {"train_time_s": earlier_s + time.perf_counter() - t_start, "final_loss": last_loss}
                    last_ckpt = save(cfg, env, t, data, ckpt_dir, writer, so_far, window)
            if on_epoch_end is not None:  # on forked RNG, so evaluation never shifts the training stream
                with torch.random.fork_rng(devices=[env.device] if env.device.type == "cuda" else []):
                    on_epoch_end(t.ema.module if t.ema is not None else t.raw, epoch, t.step, log)  # the weights one samples with
            epoch, in_epoch = epoch + 1, 0
        writer.wait()
        writer.raise_if_failed()  # a failed background write fails the run
    except TrainingDiverged:
        writer.wait()
        raise TrainingDiverged(diverged_message(t.step, ckpt_dir)) from None
    finally:
        norms.remove()
        writer.wait()  # never leave a half-written checkpoint behind a crash or Ctrl-C
        bar.close()
        log.close()
    dist_env.barrier(env)
    summary = run_summary(cfg, out, data, t, last_loss, last_ckpt, earlier_s + time.perf_counter() - t_start)
    if env.is_main:  # rank 0 alone writes it (issue 23.6)
        write_summary(out, summary)
    dist_env.cleanup(env)
    return summary


def train_step(t, tc, env, batches, autocast: dict) -> torch.Tensor:
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
        sync = contextlib.nullcontext() if last or not env.distributed else t.model.no_sync()
        with sync, torch.autocast(**autocast):
            # divided so the accumulated gradient is the mean over the effective batch
            loss = t.family.objective(t.model, images, labels.to(env.device, non_blocking=True)) / tc.accum_steps
        # the scaler multiplies fp16 losses so small gradients do not underflow (no-op otherwise)
        t.scaler.scale(loss).backward()
        step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
    if tc.grad_clip:
        t.scaler.unscale_(t.optimizer)  # clip the true gradients, not the scaled ones
        torch.nn.utils.clip_grad_norm_(t.raw.parameters(), tc.grad_clip)
    t.scaler.step(t.optimizer)  # skips the step if fp16 gradients overflowed
    t.scaler.update()
    t.optimizer.zero_grad(set_to_none=True)  # set_to_none frees the memory until the next backward
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


def run_summary(cfg: RunConfig, out, data, t, last_loss: float | None, last_ckpt, seconds: float | None) -> dict:
    """What summary.json holds. ``final_loss``: the last log row's loss, the mean over the steps
    since the previous multiple of train.log_every and over all ranks (None, JSON null, when no
    row was logged); ``train_time_s``: summed over every launch of the run."""
    last_loss = last_loss if last_loss is not None and math.isfinite(last_loss) else None  # never NaN in JSON
    return {"preset": cfg.preset, "out_dir": str(out), "steps": t.step, "epochs": cfg.train.epochs, "images": len(data.samples),
            "effective_batch": data.eff_batch, "lr": data.peak_lr, "final_loss": last_loss, "train_time_s": seconds,
            "alpha_min": cfg.model.alpha_min, "skips": getattr(cfg.model, "skips", None), "alpha_eff": effective_decay(t.raw.alphas),
            "checkpoint": str(last_ckpt) if last_ckpt else None, "resumed_from": str(t.resumed_from) if t.resumed_from else None,
            "numerics": numerics_environment()}  # threads, CPU kernels, builds: what the exact numbers depend on


def write_summary(out: Path, summary: dict) -> None:
    """``<run>/summary.json``, atomically and as strict JSON (a NaN would make the file unreadable)."""
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, allow_nan=False))


def not_json(constant: str):
    """``json.loads(..., parse_constant=not_json)``: NaN and Infinity are Python's extension, not JSON."""
    raise ValueError(f"{constant} is not valid JSON")


def finished_summary(cfg: RunConfig, out: Path, data, t, say) -> dict:
    """A resumed run that has nothing left to train (issue 23.4): say so and change nothing. The
    summary is the one the run wrote (rebuilt from the checkpoint, and written, only if it is
    missing); the returned dict carries ``already_finished: True``."""
    total = data.total_steps
    past = "" if t.step == total else f", past the {total} that train.epochs={cfg.train.epochs} gives"
    say(f"{out} is already finished: {t.step} steps{past} (checkpoint {t.resumed_from}); nothing changed. "
        f"To train longer, raise train.epochs and resume again")
    try:  # a summary.json with NaN in it (written before issue 23.4 was fixed) is not valid JSON: rebuilt
        summary = json.loads((out / "summary.json").read_text(), parse_constant=not_json)
        if summary.get("steps") == t.step:
            return {**summary, "already_finished": True}
    except (OSError, ValueError):
        pass
    final_loss = t.progress.get("final_loss")  # older checkpoints do not hold it; their log does
    if final_loss is None:
        final_loss = next((r["loss"] for r in read_log(out) if r.get("step") == t.step and "loss" in r), None)
    summary = run_summary(cfg, out, data, t, final_loss, t.resumed_from, t.progress.get("train_time_s"))
    summary["resumed_from"] = None  # this launch trained nothing; the summary describes the finished run
    if dist_env.is_main_process():
        write_summary(out, summary)
    return {**summary, "already_finished": True}


def announce(cfg: RunConfig, env, data, t, resume: str | None, say) -> None:
    """The run's header: model, data, device, batch and lr arithmetic, resume point."""
    tc = cfg.train
    say(f"resdecay train | preset {cfg.preset} | {cfg.model.family} depth {getattr(cfg.model, 'depth', '?')} "
        f"| alpha_min {cfg.model.alpha_min} ({cfg.model.schedule}) alpha_eff {effective_decay(t.raw.alphas):.3g}")
    say(f"data {cfg.data.name}: {len(data.samples)} images | device {env.device} x {env.world_size} | "
        f"precision {t.amp_dtype or torch.float32} | params {sum(p.numel() for p in t.raw.parameters()) / 1e6:.2f} M")
    say(f"base lr {tc.base_lr:.2e} | effective batch {data.eff_batch} = {tc.batch_size} per device x {tc.accum_steps} accum "
        f"x {env.world_size} devices | lr {data.peak_lr:.2e}{' (set directly)' if tc.lr is not None else ''} | "
        f"{data.steps_per_epoch} steps/epoch x {tc.epochs} epochs = {data.total_steps} steps, {data.warmup_steps} warmup")
    if t.resumed_from is not None:
        say(f"resumed from {t.resumed_from} at step {t.step}")
    elif resume == "auto":
        say("no checkpoint to resume from yet; starting fresh")
