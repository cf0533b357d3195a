"""One run per folder at a time: an exclusive ``flock`` on ``<run>/run.lock``.

The lock belongs to the open file, so the operating system drops it when the process ends in any
way (exit, exception, SIGKILL): a killed run never leaves a stale lock behind. The file holds the
holder's PID, host, start time and command line, so a second start is refused naming who runs; it is
removed when the lock is released (a finished, failed or interrupted run leaves no ``run.lock``; only a
killed one leaves the file, which the next start takes over). A start that opened the file just as its
holder removed it checks that it locked the file still at that path, else it tries again.
A process may take the lock of a folder it already holds (nested calls); it is released when the
outermost holder lets go, so ``resdecay ablate`` and tests that train twice in one process work.
On systems without ``fcntl`` (Windows) no lock is taken.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: no advisory locks; runs are not protected there
    fcntl = None

from ...errors import UserError

LOCK_NAME = "run.lock"
_held: dict[str, list] = {}  # resolved folder -> [fd, depth] of the locks this process holds


class RunFolderBusy(UserError):
    """Another live process trains into this run folder."""


def holder_of(folder: Path) -> dict:
    """What the lock file says about its holder ({} when unreadable)."""
    try:
        return json.loads((Path(folder) / LOCK_NAME).read_text() or "{}")
    except (OSError, ValueError):
        return {}


def acquire(folder: Path) -> None:
    """Take the run folder's lock or raise RunFolderBusy (one line naming the running process)."""
    key = str(Path(folder).resolve())
    if key in _held:
        _held[key][1] += 1
        return
    if fcntl is None:
        _held[key] = [None, 1]
        return
    fd = _lock_file(Path(folder))
    info = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
            "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300]}
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(info).encode())
    _held[key] = [fd, 1]


def _lock_file(folder: Path) -> int:
    """The descriptor of ``<folder>/run.lock``, exclusively locked, or RunFolderBusy naming the holder."""
    path = folder / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            h = holder_of(folder)
            who = f"process {h.get('pid', '?')} on {h.get('host', '?')}" if h else "another process"
            cmd = f" ({h['command']}, started {h.get('started', '?')})" if h.get("command") else ""
            raise RunFolderBusy(f"run folder {folder} is in use by {who}{cmd}; wait for it to finish, stop it, "
                                "or pass train.out_dir=<another folder>") from None
        if _is_at(fd, path):
            return fd
        os.close(fd)  # its holder removed it between our open and lock: lock the file now at the path


def _is_at(fd: int, path: Path) -> bool:
    """Whether ``path`` names the open file ``fd``."""
    try:
        here, mine = os.stat(path), os.fstat(fd)
    except FileNotFoundError:
        return False
    return (here.st_dev, here.st_ino) == (mine.st_dev, mine.st_ino)


def release(folder: Path) -> None:
    key = str(Path(folder).resolve())
    entry = _held.get(key)
    if entry is None:
        return
    entry[1] -= 1
    if entry[1] > 0:
        return
    del _held[key]
    if entry[0] is not None:
        path = Path(key) / LOCK_NAME
        try:
            if _is_at(entry[0], path):  # still ours (a failed start's clean-up may have removed it already)
                path.unlink()
        except OSError:  # a folder that became read-only: the lock is dropped all the same
            pass
        os.close(entry[0])  # closing the descriptor drops the flock


@contextmanager
def run_lock(folder: Path):
    """``with run_lock(out):`` holds the folder's lock for the block."""
    acquire(folder)
    try:
        yield
    finally:
        release(folder)
