"""File helpers every layer may use: atomic writes, safe ``torch.load``, hashing, run folders.

They live at the bottom of the package so that data, training and evaluation code can write and
read files without importing each other (the latent cache once pulled ``data`` up to ``checkpoint``).
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

import torch


def atomic_save(obj, path: Path) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over ``path``: a run
    killed mid-write leaves the previous checkpoint intact, never a truncated one."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


_TEMP_FILE = re.compile(r"^\..+\.tmp-(\d+)$")


def temp_path(path: Path) -> Path:
    """Where ``atomic_save`` writes before the rename: ``.<name>.tmp-<pid>`` beside ``path``."""
    path = Path(path)
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def sweep_stale_temps(folder: Path, owned: bool = False) -> list[Path]:
    """Delete the ``.<name>.tmp-<pid>`` files that writers killed mid-write (SIGKILL, power loss)
    left in ``folder``; returns them. A temp file is stale when its writer's process is gone or,
    with ``owned=True`` (the caller holds the folder's run lock, so nobody else writes there),
    when it is not this process's."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    gone = []
    for p in folder.iterdir():
        m = _TEMP_FILE.match(p.name)
        if not m or int(m.group(1)) == os.getpid():
            continue
        if owned or not _alive(int(m.group(1))):
            try:
                p.unlink()
                gone.append(p)
            except OSError:
                pass
    return gone


def safe_load(path: str | Path, error: type[Exception], message: str):
    """``torch.load(path, weights_only=True)`` on the CPU, or ``error(message)`` as one line.

    weights_only: a file from elsewhere cannot run code. In ``message``, ``{reason}`` becomes the
    loader's own complaint (shortened) and ``{kind}`` its exception class.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        reason = " ".join(str(e).split())[:160]
        raise error(message.replace("{reason}", reason).replace("{kind}", type(e).__name__)) from None


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 4 MiB chunks (checkpoints are large)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def run_dir_of(checkpoint: Path) -> Path:
    """The run folder of ``<run>/checkpoints/step_*.pt`` (or the checkpoint's own folder)."""
    checkpoint = Path(checkpoint)
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent
