"""The training loop: one for every model family, on CPU, one GPU or many (torchrun).

Read it top to bottom: ``train`` (the one entry: run folder, lock, fresh-start check; ``setup.build_run``
builds the launch's state: data, network, optimizer, resumed position) -> ``train_run`` (the header,
the hooks' start, the log and its trackers) -> ``train_epochs`` (lr schedule, accumulated
micro-batches, optimizer step, log row, checkpoint, the epoch-end hooks) -> summary. The model family
supplies the objective (``models.FAMILIES``); online evaluation and figures come in as hooks
(``hooks.py``), so this folder never imports ``eval/``.
"""

from __future__ import annotations

import contextlib
import time
from typing import Iterable

import torch

from ..data.badfiles import count_bad_files
from ..errors import ConfigError, DataError, TrainingDiverged, UserError, one_line
from ..io import progress_bar
from ..nn.decayify import alphas_of
from ..nn.noise import global_batch_noise
from . import checkpoint as ckpt
from . import distributed as dist_env
from .aux_objective import AuxTarget
from .config import RunConfig
from .hooks import Hook, HookLike, as_hooks
from .log.runlog import LossWindow, RunLog, peak_flops, peak_memory_mb
from .log.tracking import check_installed
from .lr_sched import lr_at, set_lr
from .parallel import check_layout, gathered_copy, gradient_sync, is_sharded
from .run.previous_run import check_fresh_start
from .run.run_folder import run_folder
from .run.summary import announce, finished_summary, run_summary, summary_scalars, write_summary
from .setup import Run, build_run, settings_warnings
from .stability import FIX, BlockNormMonitor


def train(cfg: RunConfig, hooks: Iterable[HookLike] = (), *, resume: str | None = None, progress: bool = True,
          init=None, overwrite: bool = False, allow_changes: bool = False, aux_target: AuxTarget | None = None) -> dict:
    """Train ``cfg``, write ``<run>/summary.json`` (rank 0) and return the summary (final loss,
    steps, time, checkpoint path). Resuming a finished run trains nothing and changes nothing; its
    summary comes back with ``already_finished: True``.

    Args:
        hooks: ``hooks.Hook`` objects (or plain ``f(model, epoch, step, log)`` epoch-end functions),
            called in order on every rank; ``train.online_eval_every > 0`` needs at least one (the
            commands that train pass ``viz.online_figures.online_hooks()``).
        resume: None (fresh run), "auto" (newest checkpoint in the run folder, if any) or a path.
        init: ``init(model)``, called on fresh starts only, before the optimizer sees the weights.
        overwrite: a fresh start into a folder that holds a run removes that run first (else refused).
        allow_changes: resume even if batch, data, seed, lr or process count changed (no longer exact).
        aux_target: REPA's frozen encoder (``train.aux=repa``): ``aux_objective.AuxTarget``, as
            ``commands.aux_target.load_aux_target(cfg)`` resolves ``train.aux_target`` (``resdecay pretrain`` does).
    """
    if overwrite and resume is not None:  # contradictory: --overwrite would delete the checkpoint --resume continues
        raise UserError(f"--overwrite starts the run over but --resume {resume} continues it; give one of them")
    if cfg.train.aux == "repa" and aux_target is None:  # before the run folder: nothing written
        raise ConfigError(f"train.aux=repa needs its frozen encoder built: pass aux_target=load_aux_target(cfg) "
                          f"(resdecay.commands.aux_target) for train.aux_target={cfg.train.aux_target}, as resdecay pretrain does")
    if dist_env.is_main_process():  # only rank 0 logs; a missing tracker package is one line, before anything is made
        check_installed(cfg.train.loggers)
    env = dist_env.setup(cfg.train.device)
    check_layout(cfg.train.parallel, env.world_size, cfg.train.hsdp_nodes)  # before the run folder: nothing written
    if cfg.train.threads:
        torch.set_num_threads(cfg.train.threads)
    say = print if env.is_main else (lambda *a, **k: None)
    with run_folder(cfg.out_dir, env, say) as out:  # locked: one run per folder at a time
        if env.is_main:
            check_fresh_start(out, resume, overwrite, say)  # a finished run is never overwritten silently
        dist_env.barrier(env)
        try:
            run = build_run(cfg, env, out, say, resume, init, allow_changes, aux_target)
            return train_run(run, as_hooks(hooks), resume, progress)
        except BaseException:  # a refused resume or a failed step: no process group left behind in this process
            dist_env.cleanup(env)
            raise


def train_run(run: Run, hooks: list[Hook], resume: str | None, progress: bool) -> dict:
    """Train the remaining steps of a built run and write its summary (a finished run: nothing)."""
    if run.resumed_from is not None and run.step >= run.data.total_steps:  # nothing to train: change nothing
        summary = finished_summary(run)
        dist_env.cleanup(run.env)
        return summary
    announce(run, resume)
    for line in settings_warnings(run.cfg, run.data):
        run.say(line)
    if run.aux is not None:
        run.say(run.aux.describe())
    if run.cfg.train.online_eval_every > 0 and not hooks:
        raise ConfigError("train.online_eval_every needs an online evaluator: pass "
                          "hooks=resdecay.viz.online_figures.online_hooks() to train (as `resdecay pretrain` does)")
    for hook in hooks:  # here, as always: what a hook builds may draw from the seeded RNG
        hook.start(run.cfg, run.env.device)
    open_instruments(run, progress)
    ok = False
    try:
        train_epochs(run, hooks)
        run.writer.wait()
        run.writer.raise_if_failed()  # a failed background write fails the run
        summary = run_summary(run, train_time(run))
        if run.aux is not None:  # the settings in force and the frozen encoder's seconds, apart from the step
            summary["aux"] = run.aux.summary()
            if "target_s" in summary["aux"]:
                summary["aux_target_s"] = summary["aux"]["target_s"]
        run.log.log_summary(summary_scalars(summary), run.step)
        ok = True
    except TrainingDiverged:
        run.writer.wait()
        raise TrainingDiverged(diverged_message(run.step, run.ckpt_dir)) from None
    finally:
        close_instruments(run, ok)
    dist_env.barrier(run.env)
    if run.env.is_main:  # one writer: every rank holds the same summary
        write_summary(run.out, summary)
    dist_env.cleanup(run.env)
    return summary


def open_instruments(run: Run, progress: bool) -> None:
    """This launch's log (and its trackers, continuing the runs a resumed checkpoint names), block
    norm monitor, progress bar, loss window (a resumed one continues its checkpoint's) and clocks."""
    env, tc = run.env, run.cfg.train
    run.bad_seen = count_bad_files(run.data.bad_files)
    run.norms = BlockNormMonitor(run.raw, tc.norm_growth_warn, tc.norm_growth_window)
    resume_step = run.step if run.resumed_from is not None else None
    run.log = RunLog(run.out, resume_step=resume_step, enabled=env.is_main, loggers=tc.loggers,
                     config=run.cfg.to_dict(), resume_refs=run.so_far.get("trackers"), block_names=run.norms.names)
    if resume_step is None:
        run.log.describe_model(alphas_of(run.raw))  # the alpha schedule, once per run
    run.flops_per_image, run.gpu_peak = 3 * run.raw.flops_per_sample(), peak_flops(env.device)  # forward + backward
    run.bar = progress_bar(total=run.data.total_steps, initial=run.step, disable=not (progress and env.is_main),
                           unit="step", dynamic_ncols=True)
    run.window = LossWindow(env.device)
    run.window.load(run.so_far.get("loss_window"))
    run.window_started, run.started = time.perf_counter(), time.perf_counter()


def close_instruments(run: Run, ok: bool = True) -> None:
    """Release the norm hooks, the checkpoint thread, the bar and the trackers (``ok=False``: the
    launch failed or was interrupted, so tracker runs are marked failed)."""
    run.norms.remove()
    if run.aux is not None:
        run.aux.remove()
    run.writer.wait()  # never leave a half-written checkpoint behind a crash or Ctrl-C
    run.bar.close()
    run.log.close(ok)


def train_time(run: Run) -> float:
    """Training seconds of the whole run so far, every launch included."""
    return (run.so_far.get("train_time_s") or 0.0) + time.perf_counter() - run.started


def train_epochs(run: Run, hooks: list[Hook]) -> None:
    """Train from the run's step to the last: each step sets the lr, steps the optimizer over the
    accumulated micro-batches and updates the EMA; then the log row and checkpoint it is due."""
    data, tc = run.data, run.cfg.train
    run.model.train()
    if run.aux is not None:
        run.aux.train()
    epoch, in_epoch = divmod(run.step, data.steps_per_epoch)
    while run.step < data.total_steps:
        # The sampler restarts mid-epoch after a resume: skip the micro-batches already seen.
        data.sampler.set_epoch(epoch, start=in_epoch * tc.accum_steps * tc.batch_size)
        batches = iter(data.loader)
        for _ in range(in_epoch, data.steps_per_epoch):
            lr = lr_at(run.step, data.total_steps, data.warmup_steps, data.peak_lr, tc.min_lr, tc.lr_schedule)
            if is_log_step(run.step + 1, tc, data.total_steps):
                run.norms.arm()  # record block norms in this step's forwards (no extra pass)
            set_lr(run.optimizer, lr)
            run.window.add(train_step(run, batches))
            run.step, run.timed_steps = run.step + 1, run.timed_steps + 1
            if run.ema is not None:
                run.ema.update(run.raw, step=run.step)
            run.bar.update(1)
            after_step(run, lr, checkpoint=run.step % data.steps_per_epoch != 0)  # the epoch's last: below
        end_epoch(run, hooks, epoch)
        epoch, in_epoch = epoch + 1, 0


def end_epoch(run: Run, hooks: list[Hook], epoch: int) -> None:
    """The epoch-end hooks, then the epoch's last checkpoint: a run killed during a hook resumes from
    the checkpoint before and runs the hook again, instead of skipping it for good."""
    if hooks:  # on a forked RNG, so evaluation never shifts the training stream
        device = run.env.device
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            model = run.ema.module if run.ema is not None else run.raw  # the weights one samples with
            if is_sharded(model):  # the hooks get the whole model on every rank
                model = gathered_copy(model, run.cfg.model, device)
            for hook in hooks:
                hook.epoch_end(model, epoch, run.step, run.log)
    checkpoint_if_due(run)


def after_step(run: Run, lr: float, checkpoint: bool = True) -> None:
    """The log row and (``checkpoint``) the checkpoint the step just taken is due for."""
    if is_log_step(run.step, run.cfg.train, run.data.total_steps):
        log_row(run, lr)
    if checkpoint:
        checkpoint_if_due(run)


def checkpoint_if_due(run: Run) -> None:
    """The checkpoint the step just taken is due for (never of a diverged model)."""
    tc = run.cfg.train
    if run.step % tc.ckpt_every == 0 or run.step == run.data.total_steps:
        if len(run.window) and run.window.diverged(run.env):  # not checked at a log step just now
            raise TrainingDiverged(run.step)
        so_far = {"train_time_s": train_time(run), "final_loss": run.last_loss}
        if run.log.refs:  # the tracker runs a resumed launch continues (W&B / MLflow run ids)
            so_far["trackers"] = run.log.refs
        run.last_ckpt = ckpt.save_training(run, so_far)


def log_row(run: Run, lr: float) -> None:
    """Close the log window: one row (loss over the window and the ranks, lr, throughput, memory,
    block RMS, MFU) to log.jsonl and the trackers; the one host-device sync per log window."""
    data, step, env = run.data, run.step, run.env
    norm_fields = run.norms.report(step, run.say)  # block_rms; before the divergence check: warns first
    window_loss, diverged = run.window.close(env)
    if diverged:  # never log or checkpoint a diverged model
        raise TrainingDiverged(step)
    now = time.perf_counter()
    img_s = run.timed_steps * data.eff_batch / max(now - run.window_started, 1e-9)
    run.last_loss = window_loss
    earlier = run.so_far.get("train_time_s") or 0.0
    row = {"step": step, "epoch": step / data.steps_per_epoch, "loss": window_loss, "lr": lr, "img_per_s": img_s,
           "peak_mem_mb": peak_memory_mb(env.device), "time_s": earlier + now - run.started, **norm_fields}
    if run.aux is not None:  # the main and the (unweighted) aux loss beside their weighted sum, "loss"
        row.update(run.aux.row(env))
    if run.gpu_peak:
        row["mfu"] = run.flops_per_image * img_s / env.world_size / run.gpu_peak
    run.bad_seen = note_bad_files(data.bad_files, run.bad_seen, row, run.say)
    run.log.write(row)
    aux = {"aux": f"{row['loss_aux']:.4f}"} if "loss_aux" in row else {}
    run.bar.set_postfix(loss=f"{window_loss:.4f}", **aux, lr=f"{lr:.2e}", img_s=f"{img_s:.0f}")
    run.timed_steps, run.window_started = 0, now


def train_step(run: Run, batches) -> torch.Tensor:
    """One optimizer step over ``train.accum_steps`` micro-batches; returns this rank's loss of the
    step (a device scalar: the mean over its share of the effective batch)."""
    tc, env, autocast = run.cfg.train, run.env, run.autocast
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
        sync = gradient_sync(run.model, last, env.distributed)
        with sync, noise_scope(run, micro), torch.autocast(**autocast):
            # divided so the accumulated gradient is the mean over the effective batch
            labels = labels.to(env.device, non_blocking=True)
            if run.aux is None:
                loss = run.family.objective(run.model, images, labels) / tc.accum_steps
            else:  # main + weight * aux, from the same forward
                loss = run.aux.loss(run.family.objective, run.model, images, labels, 1 / tc.accum_steps)
        # the scaler multiplies fp16 losses so small gradients do not underflow (no-op otherwise)
        run.scaler.scale(loss).backward()
        step_loss = loss.detach() if step_loss is None else step_loss + loss.detach()
    extra = []
    if run.aux is not None:
        run.aux.end_step()
        run.aux.sync_gradients(env)
        extra = run.aux.parameters()  # REPA's projector is clipped with the network, as one model
    if tc.grad_clip:
        run.scaler.unscale_(run.optimizer)  # clip the true gradients, not the scaled ones
        torch.nn.utils.clip_grad_norm_([*run.raw.parameters(), *extra], tc.grad_clip)
    run.scaler.step(run.optimizer)  # skips the step if fp16 gradients overflowed
    run.scaler.update()
    run.optimizer.zero_grad(set_to_none=True)  # set_to_none frees the memory until the next backward
    return step_loss


def noise_scope(run: Run, micro: int):
    """Where this micro-batch's masks and noise are drawn: the rank's generator, or the effective batch's."""
    tc, env = run.cfg.train, run.env
    if tc.noise_scope == "rank":
        return contextlib.nullcontext()
    return global_batch_noise(tc.seed, run.step, micro, env.rank, env.world_size)


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
