"""What many test files share: the tiny run overrides, the command-line runner and its one-line-error check,
a free TCP port for torchrun, and the IDX writer behind the fake Fashion-MNIST folders.

Modules beside this one: ``helpers.interop`` (foreign checkpoints in each format), ``helpers.adapter_models``
(one tiny model per row of docs/plug-and-play.md) and ``helpers.readme_commands`` (how each documented command
is shrunk for the executable-docs test)."""

from __future__ import annotations

import gzip
import socket
import struct
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]

# mae-tiny-* presets shrunk to a seconds-long run (4 blocks of width 32, 2 epochs).
TINY = ["model.embed_dim=32", "model.depth=4", "model.num_heads=2", "model.decoder_embed_dim=32",
        "model.decoder_depth=2", "model.decoder_num_heads=2", "train.epochs=2", "train.warmup_epochs=1",
        "train.batch_size=64", "train.log_every=5"]


def run(capsys, *argv):
    """``resdecay ARGV`` in this process: (exit code, stdout, stderr)."""
    from resdecay.cli import main

    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return code, out, err


def assert_one_line_error(code, err, *fragments):
    """Bad input's contract: exit 2, one ``resdecay: error: ...`` line naming the problem, no traceback."""
    assert code == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip() and "it/s" not in ln]
    assert len(lines) == 1 and lines[0].startswith("resdecay: error: "), err
    assert "Traceback" not in err
    for f in fragments:
        assert f in lines[0], lines[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_idx(path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + b"".join(struct.pack(">I", s) for s in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())
