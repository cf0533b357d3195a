"""What a run's numbers depend on besides its config and seed.

Two runs with the same config and seed are bit-identical only on the same *numerics environment*: the
number of CPU threads (it changes how matmul and reduction kernels split their sums, so the float
rounding differs), the CPU kernels torch dispatches to (AVX2 vs AVX-512 paths of ATen, MKL and oneDNN
sum in different orders), and the torch / MKL / oneDNN builds. The differences start at the last bit and
training amplifies them; how much depends on the model (docs/RESULTS.md, "what a run depends on").
Every results.json and summary.json records this block so that a number can be traced to it.
"""

from __future__ import annotations

import os
import platform
import re

import torch


def _cpu_model() -> str:
    """The CPU's marketing name (``/proc/cpuinfo`` on Linux, ``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _build_versions() -> dict:
    """MKL and oneDNN versions as torch reports them (None when torch was built without them)."""
    text = torch.__config__.show()
    mkl = re.search(r"Math Kernel Library Version ([\w.\-]+)", text)
    dnn = re.search(r"MKL-DNN v([\w.]+)", text)
    return {"mkl": mkl.group(1) if mkl else None, "onednn": dnn.group(1) if dnn else None}


def numerics_environment() -> dict:
    """The settings a run's exact numbers depend on, as one JSON-ready dict.

    Returns:
        ``threads`` (torch intra-op threads in this process), ``cpu_capability`` (the ATen kernel set
        torch dispatched to: DEFAULT, AVX2, AVX512, ...; ``ATEN_CPU_CAPABILITY`` lowers it), ``cpu``,
        ``torch`` and its ``mkl`` / ``onednn`` versions, ``cuda`` / ``cudnn`` / ``gpu`` when a GPU is used,
        the deterministic-algorithms flag and the thread-related environment variables that were set.
    """
    env = {
        "threads": torch.get_num_threads(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "cpu": _cpu_model(),
        "torch": torch.__version__,
        **_build_versions(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "ATEN_CPU_CAPABILITY", "MKL_CBWR")
                if k in os.environ},
    }
    if torch.cuda.is_available():
        env.update(cuda=torch.version.cuda, cudnn=torch.backends.cudnn.version(), gpu=torch.cuda.get_device_name(0))
    return env
