"""The run folder of one launch: created, checked writable and locked (one run per folder at a time),
with the partial files of killed checkpoint writers swept; a launch that fails before it made
progress removes what it created."""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path

from ...errors import UserError
from ...io import sweep_stale_temps
from .. import checkpoint as ckpt
from .. import distributed as dist_env
from . import runlock


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
    start leaves nothing behind that the next start would take for a run."""
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
    try:
        refused = next((p for p in dist_env.gather_objects(env, problem) if p), None)
    except BaseException:  # interrupted while the ranks agree: the lock taken above is not kept
        if env.is_main and problem is None:
            runlock.release(path)
        raise
    if refused:  # rank 0 was refused: it holds nothing
        raise runlock.RunFolderBusy(refused)
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
    for name in new & {"tb", "checkpoints", "bad_files.txt", "summary.csv", "wandb", "mlruns", runlock.LOCK_NAME}:
        target = path / name
        if target.is_dir():
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)
    if created and not any(path.iterdir()):
        path.rmdir()
