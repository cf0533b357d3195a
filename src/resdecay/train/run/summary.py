"""What a run says about itself: the header printed at the start (model, data, batch and lr
arithmetic, resume point), ``<run>/summary.json`` at the end, including the summary of a resumed
run that had nothing left to train, and ``<run>/pretrained.json``, the source a run's weights started
from (``pretrain --from``), which summary.json repeats whichever launch of the run wrote it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from ...io import atomic_write_text
from ...nn.hyper import hyper_summary
from ...nn.shortcut_info import describe_model, shortcut_settings
from ...schedule import effective_decay
from .. import distributed as dist_env
from ..log.runlog import read_log
from ..parallel import describe as describe_parallel
from .environment import numerics_environment

PRETRAINED_RECORD = "pretrained.json"  # in the run folder, beside summary.json


def announce(run, resume: str | None) -> None:
    """The run's header (``run``: the launch's ``setup.Run``): model, data, device, batch and lr
    arithmetic, resume point."""
    cfg, env, data, say = run.cfg, run.env, run.data, run.say
    tc = cfg.train
    say(f"resdecay train | preset {cfg.preset} | {cfg.model.family} depth {cfg.model.num_blocks} "
        f"| alpha_min {cfg.model.alpha_min} | shortcut {describe_model(cfg.model)} | alpha_eff {effective_decay(run.raw.alphas):.3g}")
    say(f"data {cfg.data.name}: {len(data.samples)} images | device {env.device} x {env.world_size} | "
        f"precision {run.amp_dtype or torch.float32} | params {sum(p.numel() for p in run.raw.parameters()) / 1e6:.2f} M")
    if env.distributed or tc.parallel != "ddp" or tc.noise_scope != "rank":
        say(describe_parallel(tc.parallel, env.world_size, tc.hsdp_nodes, tc.reshard_after_forward, tc.noise_scope))
    hyper = hyper_summary(run.raw)
    if hyper is not None:
        flops = f"{hyper['flops_fraction']:+.1%} of the model's" if hyper["flops_fraction"] is not None else "of the model's"
        say(f"hyper-connections {hyper['variant']} x {hyper['streams']} streams: +{hyper['params']} params "
            f"({hyper['params_fraction']:+.2%}), +{hyper['flops_per_sample'] / 1e6:.3g} MFLOPs/sample forward ({flops})")
    if data.normalization:
        say(f"normalised with {data.normalization}")
    say(f"base lr {tc.base_lr:.2e} | effective batch {data.eff_batch} = {tc.batch_size} per device x {tc.accum_steps} accum "
        f"x {env.world_size} devices | lr {data.peak_lr:.2e}{' (set directly)' if tc.lr is not None else ''} | "
        f"{data.steps_per_epoch} steps/epoch x {tc.epochs} epochs = {data.total_steps} steps, {data.warmup_steps} warmup")
    # where to look while it runs (tensorboard --logdir <run>/tb, tail -f <run>/log.jsonl)
    say(f"run folder {cfg.out_dir}: log.jsonl, checkpoints/, summary.json | trackers {', '.join(tc.loggers) or 'none'}")
    if run.resumed_from is not None:
        say(f"resumed from {run.resumed_from} at step {run.step}")
    elif resume == "auto":
        say("no checkpoint to resume from yet; starting fresh")


def run_summary(run, seconds: float | None) -> dict:
    """What summary.json holds for ``run`` (``setup.Run``). ``final_loss``: the last log row's loss,
    the mean over the steps since the previous multiple of train.log_every and over all ranks (None,
    JSON null, when no row was logged); ``train_time_s``: ``seconds``, summed over every launch of the run."""
    cfg, data, last_loss = run.cfg, run.data, run.last_loss
    last_loss = last_loss if last_loss is not None and math.isfinite(last_loss) else None  # never NaN in JSON
    summary = {"preset": cfg.preset, "out_dir": str(run.out), "steps": run.step, "epochs": cfg.train.epochs,
               "images": len(data.samples), "effective_batch": data.eff_batch, "lr": data.peak_lr, "final_loss": last_loss,
               "train_time_s": seconds, "alpha_min": cfg.model.alpha_min, "skips": cfg.model.skips,
               # the formula by name and the run's label (``nn.shortcut_info``): what compare, plot and ablate show
               "shortcut": shortcut_settings(cfg.model)["shortcut"], "shortcut_label": describe_model(cfg.model),
               "alpha_eff": effective_decay(run.raw.alphas), "checkpoint": str(run.last_ckpt) if run.last_ckpt else None,
               "resumed_from": str(run.resumed_from) if run.resumed_from else None,
               "numerics": numerics_environment()}  # threads, CPU kernels, builds: what the exact numbers depend on
    hyper = hyper_summary(run.raw)  # n residual streams: their extra parameters and FLOPs (nn.hyper); absent with one
    return summary if hyper is None else {**summary, "hyper_connections": hyper}


def summary_scalars(summary: dict) -> dict[str, float]:
    """The summary's finite numbers as tracker tags (``summary/final_loss``, ``summary/alpha_eff``, ...)."""
    return {f"summary/{k}": v for k, v in summary.items()
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)}


def write_summary(out: Path, summary: dict) -> None:
    """``<run>/summary.json``, atomically and as strict JSON (a NaN would make the file unreadable)."""
    atomic_write_text(out / "summary.json", json.dumps(summary, indent=2, allow_nan=False))


def write_pretrained_record(out: Path, record: dict) -> None:
    """``<run>/pretrained.json``: where the run's weights came from (path, format, sha256, ...), atomically."""
    atomic_write_text(Path(out) / PRETRAINED_RECORD, json.dumps(record, indent=2))


def read_pretrained_record(out: Path) -> dict | None:
    """The source a run's weights started from (its pretrained.json), or None for a run started from scratch."""
    try:
        return json.loads((Path(out) / PRETRAINED_RECORD).read_text())
    except (OSError, ValueError):
        return None


def remove_pretrained_record(out: Path) -> None:
    """Forget a start's source: a fresh start without one, or one that failed before its first step."""
    (Path(out) / PRETRAINED_RECORD).unlink(missing_ok=True)


def not_json(constant: str):
    """``json.loads(..., parse_constant=not_json)``: NaN and Infinity are Python's extension, not JSON."""
    raise ValueError(f"{constant} is not valid JSON")


def finished_summary(run) -> dict:
    """A resumed run (``setup.Run``) that has nothing left to train: say so and change nothing. The
    summary is the one the run wrote (rebuilt from the checkpoint, and written, only if it is
    missing); the returned dict carries ``already_finished: True``."""
    out, step, total = run.out, run.step, run.data.total_steps
    past = "" if step == total else f", past the {total} that train.epochs={run.cfg.train.epochs} gives"
    run.say(f"{out} is already finished: {step} steps{past} (checkpoint {run.resumed_from}); nothing changed. "
            f"To train longer, raise train.epochs and resume again")
    try:  # a summary.json with NaN in it (older versions wrote the float as is) is not valid JSON: rebuilt
        summary = json.loads((out / "summary.json").read_text(), parse_constant=not_json)
        if summary.get("steps") == step:
            return {**summary, "already_finished": True}
    except (OSError, ValueError):
        pass
    if run.last_loss is None:  # older checkpoints do not hold the final loss; their log does
        run.last_loss = next((r["loss"] for r in read_log(out) if r.get("step") == step and "loss" in r), None)
    summary = run_summary(run, run.so_far.get("train_time_s"))
    summary["resumed_from"] = None  # this launch trained nothing; the summary describes the finished run
    if dist_env.is_main_process():
        write_summary(out, summary)
    return {**summary, "already_finished": True}


def forget_stale_record(out_dir: Path):
    """``train(init=...)`` for a run without --from: a fresh start in a folder that kept another start's record
    (an --overwrite, a start killed before its first log row) removes it."""

    def init(model: torch.nn.Module) -> None:  # noqa: ARG001  (train's init hook takes the model)
        if dist_env.is_main_process():
            remove_pretrained_record(out_dir)

    return init
