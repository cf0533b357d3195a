"""Running scripts (benchmarks/, docs/results/) from the tests: in a subprocess, or as ``__main__`` in the test's own
process (no second torch start-up) with what they change on the process (modules, RNG, threads) put back."""

from __future__ import annotations

import contextlib
import gc
import io
import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def run_script(script: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.run([sys.executable, str(ROOT / "benchmarks" / script), *args], capture_output=True, text=True,
                          env=env, timeout=600)


def run_script_here(script: str, *args: str, capfd, monkeypatch) -> tuple[int | str | None, str, str]:
    """``python benchmarks/SCRIPT ARGS`` run as ``__main__`` in this process: (its exit code, stdout, stderr). The
    benchmark modules it imports (``_measure``, ...) are dropped afterwards, so no other test sees them."""
    capfd.readouterr()
    code = run_path_here(ROOT / "benchmarks" / script, *args, monkeypatch=monkeypatch)
    out, err = capfd.readouterr()
    return code, out, err


def run_path_here(path: Path, *args: str, monkeypatch) -> int | str | None:
    """``python PATH ARGS`` as ``__main__`` in this process: its exit code. What a script changes on the process is put
    back: the modules of its own folder it imported, torch's RNG and threads (its seeds, its --threads), and the objects
    a benchmark froze out of the garbage collector (``_measure.collect_garbage``)."""
    monkeypatch.setattr(sys, "argv", [str(path), *args])
    monkeypatch.syspath_prepend(str(path.parent))  # as `python dir/x.py` puts its folder first
    before, frozen = set(sys.modules), gc.get_freeze_count()
    rng, threads = torch.get_rng_state(), torch.get_num_threads()
    try:
        runpy.run_path(str(path), run_name="__main__")
        code = 0
    except SystemExit as e:
        code = e.code
    finally:
        for name in set(sys.modules) - before:
            if str(getattr(sys.modules[name], "__file__", None) or "").startswith(str(path.parent)):
                del sys.modules[name]
        torch.set_rng_state(rng)
        torch.set_num_threads(threads)
        if not frozen:
            gc.unfreeze()
    return code


def run_python_here(script: Path, args, cwd: Path, env: dict, drop=()) -> tuple[int | str | None, str, str]:
    """``python SCRIPT ARGS`` from ``cwd`` with ``env`` over this process's environment (``drop``: variables
    it must not see): (exit code, stdout, stderr)."""
    import matplotlib.pyplot as plt

    out, err = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        mp.chdir(cwd)
        for key in drop:
            mp.delenv(key, raising=False)
        for key, value in env.items():
            mp.setenv(key, value)
        code = run_path_here(script, *args, monkeypatch=mp)
    plt.close("all")
    return code, out.getvalue(), err.getvalue()
