"""Output files of ``import-weights`` and ``export``: checked before any work, written like every
other resdecay output (atomically, with the umask's mode)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

from ..errors import CheckpointError, UserError
from ..io import temp_path


def unwritable(out: Path, e: OSError) -> UserError:
    """The one-line error for an output that cannot be written."""
    return UserError(f"cannot write --out {out} ({e.strerror or e}); pass a path in a folder you can write")


def check_out_file(out: str | Path) -> Path:
    """``out``, once its nearest existing folder has been probed for writing, before any expensive
    work: a folder given as ``out``, a file in the way, or an unwritable place is one line, not a
    traceback after the work. Nothing is created, so a command that fails later leaves no empty folder behind.

    Args:
        out: the file a command will write.

    Returns:
        ``out`` as a Path.
    """
    out = Path(out)
    if out.is_dir():
        raise UserError(f"--out {out} is a folder; pass the file to write inside it (e.g. {out / 'imported.pt'})")
    folder = out.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    probe = temp_path(folder / out.name)
    try:
        if not folder.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, f"{folder} is a file, not a folder")
        with open(probe, "wb"):
            pass
    except OSError as e:
        raise unwritable(out, e) from None
    finally:
        if probe.exists():
            probe.unlink()
    return out


def make_parent(out: Path) -> None:
    """Create ``out``'s folder (at write time), or the one-line error.

    Args:
        out: the file about to be written.
    """
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise unwritable(out, e) from None


def write_bytes_atomically(data: bytes, out: Path) -> None:
    """``data`` into ``out`` through a temporary file beside it and a rename (the file is never seen
    half written), created by ``open`` so that its mode is 0666 minus the umask, as torch.save's.

    Args:
        data: the file's contents.
        out: where to write them.
    """
    make_parent(out)
    tmp = temp_path(out)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, out)
    except OSError as e:
        raise unwritable(out, e) from None
    finally:
        if tmp.exists():
            tmp.unlink()


def read_json_object(path: Path, what: str, fix: str) -> dict:
    """A JSON object from ``path``, or one CheckpointError line naming the file, what it should be, and ``fix``."""
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise CheckpointError(f"{path} is not a readable {what} ({' '.join(str(e).split())[:100]}); {fix}") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} is not a {what} (a JSON object); {fix}")
    return data
