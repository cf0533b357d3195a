"""What many test files share: the tiny model sizes (``tiny_config``) and run overrides, the command-line runner
and its one-line-error check, copies of the session's shared runs and proxy extractor (``copy_run``,
``seed_proxy_cache``), the torch threads of a test process (``THREADS``), a free TCP port for torchrun, and the IDX writer behind the fake Fashion-MNIST folders.

Modules beside this one: ``helpers.interop`` (foreign checkpoints in each format), ``helpers.adapter_models``
(one tiny model per row of docs/coverage.md), ``helpers.doc_pages`` (the commands and python blocks the pages
show), ``helpers.readme_commands`` and ``helpers.readme_blocks`` (how each command and block is shrunk for the executable-docs test) and ``helpers.readme_workspace``
(the artifacts standing in for the pages' placeholder paths)."""

from __future__ import annotations

import gzip
import os
import shutil
import socket
import struct
from pathlib import Path

import numpy as np

from resdecay.models import TINY as TINY_MODELS
from resdecay.models import model_config_class

ROOT = Path(__file__).resolve().parents[2]

# torch CPU threads of a test process. README's test command spreads the tests over the CPUs with pytest-xdist
# (-n auto, one worker process per CPU): each worker gets its share, one thread on a 2-core machine. Two threads
# in each of two workers on two cores are ruinous, not just wasted: a thread that waits on its busy sibling spins,
# and the tiny digits run took 47-107 s with 2 threads and 2.5 s with 1 beside another job. A plain run (no -n)
# is alone and keeps two. Tests that pin the threads of the runs they compare pin them to this.
CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
THREADS = max(1, min(2, CPUS // WORKERS)) if WORKERS else 2

# The digits images (8x8, one channel) in 2x2 patches: the geometry of most tests' hand-built models.
DIGITS_IMAGE = dict(img_size=8, in_chans=1, patch_size=2)
# The keys that size a transformer (its widths and depths), apart from its images and its settings.
WIDTHS = ("embed_dim", "depth", "num_heads", "decoder_embed_dim", "decoder_depth", "decoder_num_heads")


def tiny_config(family: str, /, **overrides):
    """``family``'s model config at its tiny size (``resdecay.models.TINY``, the size the contract tests build)
    with ``overrides``: the one place the tests size their small models. A test whose numbers depend on a size
    names it in ``overrides``, so the numbers stay put when the registry's tiny size moves."""
    return model_config_class(family)(**{**TINY_MODELS[family], **overrides})


def model_overrides(family: str, /, keys=WIDTHS, **overrides) -> list[str]:
    """``tiny_config(family, **overrides)``'s ``keys`` as run-config overrides (``model.KEY=VALUE``), for the
    tests that shrink a preset: its image geometry and other settings stay the preset's."""
    cfg = tiny_config(family, **overrides)
    return [f"model.{k}={getattr(cfg, k)}" for k in keys]


# mae-tiny-* presets shrunk to a seconds-long run (4 blocks of width 32, 2 epochs).
TINY = [*model_overrides("mae"), "train.epochs=2", "train.warmup_epochs=1", "train.batch_size=64",
        "train.log_every=5"]


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


def copy_run(checkpoint, dest: Path) -> Path:
    """A copy of the run folder that holds ``checkpoint`` (a shared fixture's run, which no test may change) at
    ``dest``: the copied checkpoint's path, to resume or evaluate into."""
    checkpoint = Path(checkpoint)
    run_dir = checkpoint.parent.parent  # RUN/checkpoints/step_*.pt
    shutil.copytree(run_dir, dest)
    return dest / checkpoint.relative_to(run_dir)


def seed_proxy_cache(proxy_file: Path, cache_dir: Path) -> Path:
    """Put a trained proxy FID extractor (the ``digits_proxy`` fixture's file) into ``cache_dir``, where
    ``proxy_extractor(..., cache_dir=cache_dir)`` finds it instead of training its own."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    target = cache_dir / proxy_file.name
    if not target.exists():
        shutil.copy2(proxy_file, target)
    return cache_dir


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_idx(path, array: np.ndarray) -> None:
    header = struct.pack(">HBB", 0, 0x08, array.ndim) + b"".join(struct.pack(">I", s) for s in array.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + array.astype(np.uint8).tobytes())


def train_online(cfg, **options) -> dict:
    """What ``resdecay pretrain`` runs: the one loop with the online evaluation and its figures as hooks."""
    from resdecay.train import train
    from resdecay.viz.online_figures import online_hooks

    return train(cfg, hooks=online_hooks(), **options)
