"""File helpers every layer may use: atomic writes, safe ``torch.load``, hashing, run folders.

They live at the bottom of the package so that data, training and evaluation code can write and
read files without importing each other (the latent cache once pulled ``data`` up to ``checkpoint``).
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import os
import re
import shutil
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm
from tqdm.autonotebook import tqdm as _tqdm_base  # tqdm.notebook's widget in Jupyter, tqdm.std elsewhere

from .errors import UserError


class NoSpaceLeft(UserError, OSError):
    """A write that failed because the disk is full; the message names the file and the space it
    needs. Also an ``OSError``, so code that tolerates a failed cache write still catches it."""


def atomic_save(obj, path: Path, fix: str = "free some space there or write to another disk") -> None:
    """Write to a temporary file in the same folder, fsync, then rename over ``path``: a run
    killed mid-write leaves the previous checkpoint intact, never a truncated one.

    Args:
        obj: what ``torch.save`` writes.
        path: the destination.
        fix: the advice that ends the one-line ``NoSpaceLeft`` raised when the disk is full.
    """
    path = Path(path)
    tmp = temp_path(path)
    try:
        with open(tmp, "wb") as f:
            torch.save(obj, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as e:
        tmp.unlink(missing_ok=True)  # before measuring the free space: the partial file is not kept
        if is_disk_full(e):
            raise NoSpaceLeft(no_space_message(path, tensor_bytes(obj), fix)) from None
        raise


def is_disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is a full disk or quota: ``OSError`` ENOSPC / EDQUOT, or
    the ``RuntimeError`` torch's zip writer raises when a write comes up short ("unexpected pos")."""
    while exc is not None:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if isinstance(exc, RuntimeError) and any(s in str(exc) for s in ("unexpected pos", "No space left", "file write failed")):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def tensor_bytes(obj) -> int:
    """Bytes of the tensor storages in a nested dict / list / tuple (what ``torch.save`` writes, give
    or take the small pickle around them); a storage shared by several tensors counts once."""
    seen, total, todo = set(), 0, [obj]
    while todo:
        x = todo.pop()
        if isinstance(x, torch.Tensor):
            storage = x.untyped_storage()
            if storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(x, dict):
            todo.extend(x.values())
        elif isinstance(x, (list, tuple)):
            todo.extend(x)
    return total


def format_bytes(n: float) -> str:
    """``1536`` -> ``'1.5 KiB'``: sizes in messages."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def no_space_message(path: Path, need: int, fix: str) -> str:
    try:
        free = f"{format_bytes(shutil.disk_usage(Path(path).parent).free)} free there"
    except OSError:
        free = "the free space could not be read"
    return f"no space left on the device while writing {path}: it needs about {format_bytes(need)}, {free}; {fix}"


def atomic_write_text(path: Path, text: str) -> None:
    """``path.write_text(text)`` through a temporary file and a rename: readers never see half a file."""
    path = Path(path)
    tmp = temp_path(path)
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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


def training_script_globals() -> list:
    """Python objects the field's training scripts store beside the weights, none of which can run
    code when unpickled: ``argparse.Namespace`` (the ``args`` of facebookresearch/mae's and timm's
    checkpoints) and NumPy scalars and dtypes (metrics such as timm's ``metric``)."""
    dtypes = {type(np.dtype(t)) for t in ("float16", "float32", "float64", "int32", "int64", "bool")}
    return [argparse.Namespace, np.dtype, *dtypes, getattr(np, "_core", np).multiarray.scalar]


def safe_load(path: str | Path, error: type[Exception], message: str):
    """``torch.load(path, weights_only=True)`` on the CPU, or ``error(message)`` as one line.

    weights_only: a file from elsewhere cannot run code. Besides tensors and containers it admits
    only ``training_script_globals()``, so an official MAE or timm checkpoint loads. In ``message``,
    ``{reason}`` becomes the loader's complaint in words and ``{kind}`` its exception class.
    """
    try:
        with warnings.catch_warnings(), torch.serialization.safe_globals(training_script_globals()):
            warnings.simplefilter("ignore")  # torch warns about pickle protocols on stderr: not one line
            return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        reason = load_failure(path, e)
        raise error(message.replace("{reason}", reason).replace("{kind}", type(e).__name__)) from None


def first_sentence(text: str, limit: int = 160) -> str:
    """The first sentence of ``text`` on one line, cut at a word (marked ``...``) past ``limit``."""
    text = " ".join(str(text).split())
    m = re.search(r"(?<![A-Z.][a-z])(?<!\d)\.(\s|$)", text)
    text = text[: m.start()] if m else text
    if len(text) > limit:  # end at the last whole clause (outside brackets) that fits, else at a word
        depth, cut = 0, None
        for i, ch in enumerate(text[:limit]):
            depth += (ch in "([") - (ch in ")]")
            if depth == 0 and ch in ";:" and text[i + 1: i + 2] == " " and i > limit // 3:
                cut = i
        text = text[:cut] if cut else text[:limit].rsplit(" ", 1)[0].rstrip(",;:") + " ..."
    return text


def load_failure(path: str | Path, exc: Exception) -> str:
    """Why ``torch.load(path, weights_only=True)`` failed, in words: what the file is (or is not)
    rather than the loader's internals, and never advice to load it unsafely."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(512)
    except OSError as e:
        return f"cannot read it: {e.strerror or e}"
    msg = " ".join(str(exc).split())
    if size == 0:
        return "the file is empty"
    if "Weights only load failed" in msg:
        code = re.search(r"GLOBAL ([\w.]+)", msg)
        if code:
            return f"it contains code-bearing Python objects such as {code.group(1)} and is refused for safety"
        if head[:1] == b"\x80" or head[:2] == b"PK":
            return "it contains pickled Python data that is not plain tensors and is refused for safety"
    if head[:2] == b"PK":
        if "zip archive" in msg or "central directory" in msg or isinstance(exc, (EOFError, RuntimeError, OSError)):
            return f"it is truncated or damaged: an incomplete zip archive of {size} bytes"
        return first_sentence(msg) or type(exc).__name__
    if head[:6] == b"\x93NUMPY":
        return "it is a NumPy .npy file, not a torch file"
    if head[:1] == b"\x80":
        return f"it is truncated or not a torch pickle: {first_sentence(msg) or type(exc).__name__}"
    try:
        text = head.decode("utf-8")
        if "\x00" not in text:
            return f"it is a text file, not a torch file; it starts {' '.join(text.split())[:40]!r}"
    except UnicodeDecodeError:
        pass
    return "it is neither a torch zip archive nor a pickle"


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file, read in 4 MiB chunks (checkpoints are large); of a folder (a sharded DCP
    checkpoint), over its files' relative names and hashes in name order."""
    h = hashlib.sha256()
    path = Path(path)
    if path.is_dir():
        for p in sorted(q for q in path.rglob("*") if q.is_file()):
            h.update(f"{p.relative_to(path).as_posix()}\0{file_sha256(p)}\0".encode())
        return h.hexdigest()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


def run_dir_of(checkpoint: Path) -> Path:
    """The run folder of ``<run>/checkpoints/step_*.pt`` (or the checkpoint's own folder)."""
    checkpoint = Path(checkpoint)
    return checkpoint.parent.parent if checkpoint.parent.name == "checkpoints" else checkpoint.parent


def interactive_stderr() -> bool:
    """Whether a progress bar can redraw itself: stderr is a terminal, or Jupyter shows tqdm's widget."""
    if _tqdm_base.__module__ == "tqdm.notebook":
        return True
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # stderr replaced by an object without isatty, or closed
        return False


def progress_bar(iterable=None, disable: bool = False, **kwargs) -> tqdm:
    """``tqdm(iterable, **kwargs)`` where a bar can redraw itself, a silent pass-through elsewhere: a log
    redirected to a file or a pipe gets no carriage-return frames (pip does the same). Every bar of the
    package goes through here.

    Args:
        iterable: what to iterate over; None for a manual bar (``total=``, ``update``).
        disable: no bar in any case (the callers' ``progress=False``, ranks other than 0).
        **kwargs: passed to tqdm (``desc``, ``total``, ``leave``, ``unit``, ...).
    """
    return tqdm(iterable, disable=disable or not interactive_stderr(), **kwargs)
