"""What a run folder already holds, and the two refusals that keep finished work safe:

- a fresh start into a folder that holds a run (checkpoints, log, summary) is refused unless the
  user says ``--overwrite`` (then the old run's files are removed first, so no stale eval.json or
  TensorBoard events of the previous run are mixed into the new one);
- a resume whose settings would make it differ from an uninterrupted run (batch, data, seed, lr, number
  of processes) is refused unless the user says ``--allow-changes``; it then says in one line
  what is no longer exact.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from ...errors import UserError
from .summary import PRETRAINED_RECORD

RUN_FILES = ("checkpoints", "log.jsonl", "summary.json", PRETRAINED_RECORD, "tb", "eval", "bad_files.txt", "summary.csv",
             "wandb", "mlruns")
# Settings a resumed run may change without being refused: they do not change what it computes, or (epochs)
# they are how people extend a run; each change is still noted in one line.
HARMLESS = {"train": {"device", "threads", "log_every", "ckpt_every", "keep_last", "out_dir", "compile",
                      "online_eval_every", "online_eval_size", "epochs", "norm_growth_warn", "norm_growth_window",
                      "loggers", "parallel", "reshard_after_forward", "hsdp_nodes"},
            "data": {"num_workers", "path"}}


def holds_run(out: Path) -> list[str]:
    """The run files already in ``out`` (empty when it holds no run)."""
    found = []
    ckpts = sorted((out / "checkpoints").glob("step_*[0-9t]")) if (out / "checkpoints").is_dir() else []  # .pt or DCP
    if ckpts:
        found.append(f"{len(ckpts)} checkpoint{'s' * (len(ckpts) > 1)}")
    found += [name for name in ("log.jsonl", "summary.json") if (out / name).exists()]
    return found


def check_fresh_start(out: Path, resume: str | None, overwrite: bool, say=print) -> None:
    """Refuse to start a new run over an old one, or clear the old one when asked to."""
    if resume is not None:
        return
    found = holds_run(out)
    if not found:
        return
    if not overwrite:
        raise UserError(f"{out} already holds a run ({', '.join(found)}); continue it with --resume auto, start over "
                        f"with --overwrite (deletes that run's files), or choose another train.out_dir")
    say(f"note: --overwrite: removing the previous run in {out} ({', '.join(found)})")
    for name in RUN_FILES:
        p = out / name
        if p.is_dir():
            shutil.rmtree(p)
        elif p.exists():
            p.unlink()


def inexact_changes(saved: dict, current: dict, saved_world: int | None, world: int) -> list[str]:
    """Settings that differ between a checkpoint and this run in a way that breaks exact resume."""
    changes = []
    # train.noise_scope=global: the losses depend on the effective batch, not on how it is split (nn/noise.py)
    split = {"batch_size"} if same_effective_batch(saved, current, saved_world, world) else set()
    for section in ("data", "train"):
        for k, v in current[section].items():
            if k in HARMLESS[section] or k not in saved.get(section, {}) or (section == "train" and k in split):
                continue
            if saved[section][k] != v:
                changes.append(f"{section}.{k} {saved[section][k]!r} -> {v!r}")
    if saved_world is not None and saved_world != world and not split:
        changes.append(f"processes {saved_world} -> {world}")
    return changes


def same_effective_batch(saved: dict, current: dict, saved_world: int | None, world: int) -> bool:
    """Both runs draw their noise for the whole batch of each micro-step (nn/noise.py), and those batches are the
    same: as many images per micro-step over all ranks, as many micro-steps (another accumulation regroups the draws)."""
    s, c = saved.get("train", {}), current["train"]
    if saved_world is None or s.get("noise_scope") != "global" or c.get("noise_scope") != "global":
        return False
    return s["accum_steps"] == c["accum_steps"] and s["batch_size"] * saved_world == c["batch_size"] * world


def check_resume_changes(changes: list[str], allow: bool, path: Path, say=print) -> None:
    if not changes:
        return
    if not allow:
        raise UserError(f"cannot resume {path} exactly: {'; '.join(changes)} changed since the checkpoint; "
                        "use the checkpoint's settings, or pass --allow-changes to continue anyway (no longer exact)")
    say(f"note: --allow-changes: resuming with {'; '.join(changes)}; the run no longer matches an uninterrupted one")
