"""Training logs: one JSON object per line (``log.jsonl``) and the same scalars as TensorBoard
event files (``tb/``), plus the throughput numbers they carry (images/s, peak memory, MFU)."""

from __future__ import annotations

import json
import re
import resource
import sys
from pathlib import Path

import torch

# Dense bf16 tensor-core peak per GPU (vendor datasheets), for MFU as nanoGPT reports it.
# Matched in order against the device name as whole words; the first match wins.
PEAK_BF16_FLOPS = [("H100 PCIe", 756e12), ("H100", 989e12), ("H200", 989e12), ("A100", 312e12), ("L40S", 362e12),
                   ("A40", 149.7e12), ("A6000", 154.8e12), ("4090", 165.2e12), ("V100", 125e12)]


def peak_flops(device: torch.device) -> float | None:
    """Peak dense bf16 FLOP/s of a known GPU, else None (then MFU is not logged)."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in PEAK_BF16_FLOPS if re.search(rf"\b{re.escape(k)}\b", name)), None)


def peak_memory_mb(device: torch.device) -> float:
    """Peak GPU memory allocated by torch, or this process's lifetime peak resident memory on
    CPU (which therefore never goes down over a run)."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / 2**20 if sys.platform == "darwin" else rss / 1024


class RunLog:
    """Appends metric rows to ``log.jsonl`` and TensorBoard. On resume, rows past the resumed
    step (written by the killed run after its last checkpoint) are dropped so curves continue
    without duplicates."""

    def __init__(self, out_dir: Path, resume_step: int | None = None, enabled: bool = True):
        self.enabled = enabled
        self.path = Path(out_dir) / "log.jsonl"
        self.tb = None
        if not enabled:
            return
        if resume_step is not None and self.path.exists():
            keep = [ln for ln in self.path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= resume_step]
            self.path.write_text("".join(k + "\n" for k in keep))
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        try:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(Path(out_dir) / "tb"), purge_step=resume_step)
        except Exception:  # tensorboard not installed: the JSON log still has everything
            self.tb = None

    def write(self, row: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        if self.tb is not None:
            for k, v in row.items():
                if k != "step" and isinstance(v, (int, float)):
                    tag = f"online/{k[7:]}" if k.startswith("online_") else f"train/{k}"
                    self.tb.add_scalar(tag, v, row["step"])

    def close(self) -> None:
        if self.tb is not None:
            self.tb.flush()
            self.tb.close()


def read_log(out_dir: Path) -> list[dict]:
    path = Path(out_dir) / "log.jsonl"
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
