"""Device sync and peak-memory measurement shared by the benchmark scripts.

``mem_start(device)`` resets the peak counter and returns ``(method, base)``; after the measured
work, ``mem_peak(device, method, base)`` returns the peak in MB above ``base``, i.e. the memory
the work needed on top of what was already held when it started.

CUDA ("cuda")      ``torch.cuda.max_memory_allocated`` since ``reset_peak_memory_stats``, minus
                   ``torch.cuda.memory_allocated`` at the start (tensors the caller allocated
                   before ``mem_start`` are not counted); caching-allocator slack is not counted.
CPU ("vmhwm")      growth of the process's peak resident set: ``malloc_trim(0)`` first (freed heap
                   goes back to the OS), then VmHWM is reset to the current resident set through
                   ``/proc/self/clear_refs``; peak = VmHWM - VmRSS at the start. An approximation
                   that includes allocator slack and anything else the process touches meanwhile.
CPU ("maxrss")     fallback where clear_refs cannot be written: growth of ``ru_maxrss``, which
                   cannot be reset, so it under-reports every measurement after the first.

``bad_input(message)`` ends a benchmark on a wrong argument: one line on stderr, exit status 2.

Used by scripts run as ``python benchmarks/x.py`` (this folder is then on sys.path). torch is imported by the
functions that use it, not with the module: a script that only times other processes (startup.py) or refuses
a bad argument does not pay for it.
"""

from __future__ import annotations

import ctypes
import gc
import os
import re
import resource
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

MEM_LABEL = {"cuda": "peak MB (cuda max alloc)", "vmhwm": "peak MB (VmHWM growth)", "maxrss": "peak MB (maxrss growth)"}


def bad_input(message: str):
    """A wrong argument: ``<script>: error: <message>`` on stderr, exit status 2 (no usage dump, no traceback)."""
    print(f"{os.path.basename(sys.argv[0])}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


def mae_config(preset: str, overrides: list[str] | None = None):
    """The run config of an MAE preset, or ``bad_input`` naming the problem (unknown preset, bad
    override, a preset of another family: these benchmarks time the MAE's training step)."""
    from resdecay.errors import ConfigError
    from resdecay.train.config import load_config

    try:
        cfg = load_config(preset, overrides or [])
    except (ConfigError, ValueError, OSError) as e:
        bad_input(str(e).splitlines()[0] if str(e) else repr(e))
    if cfg.model.family != "mae":
        bad_input(f"preset {preset!r} is a {cfg.model.family} model; this benchmark times MAE presets (e.g. mae-b16)")
    return cfg


def sync(device: torch.device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def proc_kb(path: str, field: str) -> int | None:
    """The ``field:  N kB`` value of a /proc file such as /proc/self/status, or None."""
    try:
        return int(re.search(rf"{field}:\s+(\d+)", open(path).read()).group(1))
    except (OSError, AttributeError):
        return None


def collect_garbage() -> None:
    """``gc.collect()``, walking only the objects made since the first call: that call collects, then moves what
    survives it (the interpreter's and the imported libraries' objects) out of later collections with
    ``gc.freeze()``, unless the process froze them already. A full collection walks all of them again (~0.2 s a
    call in a benchmark, more inside a test process); a benchmark's own garbage, made after the first call, is still
    collected each time."""
    gc.collect()
    if not gc.get_freeze_count():
        gc.freeze()


def mem_start(device: torch.device) -> tuple[str, float]:
    """Reset the peak counter; return (method, baseline in MB)."""
    import torch

    collect_garbage()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
        return "cuda", torch.cuda.memory_allocated(device) / 2**20
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)  # give freed heap back, so the next growth shows
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current resident set
        return "vmhwm", proc_kb("/proc/self/status", "VmRSS") / 1024
    except OSError:
        return "maxrss", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def mem_peak(device: torch.device, method: str, base: float) -> float:
    """Peak MB since ``mem_start`` minus its ``base``."""
    import torch

    if method == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20 - base
    if method == "vmhwm":
        return proc_kb("/proc/self/status", "VmHWM") / 1024 - base
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base


def timed_steps(step, warmup: int, steps: int, device: torch.device):
    """Call ``step()`` (one training step returning its loss) ``warmup + steps`` times; return the
    seconds of each timed call and the last loss. Stops the benchmark on a non-finite loss."""
    import time

    import torch

    times, loss = [], None
    for i in range(warmup + steps):
        sync(device)
        t0 = time.perf_counter()
        loss = step()
        sync(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    if not torch.isfinite(loss):
        raise SystemExit(f"non-finite loss {loss.item()} during the benchmark")
    return times, loss
