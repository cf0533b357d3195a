"""Training logs: one JSON object per line (``log.jsonl``), sent on to the run's experiment
trackers (``tracking.py``: TensorBoard event files in ``tb/`` by default), plus the throughput numbers
they carry (images/s, peak memory, MFU)."""

from __future__ import annotations

import json
import re
import resource
import sys
from pathlib import Path
from typing import Sequence

import torch
import torch.distributed as dist

from .tracking import Trackers, alpha_figure, alpha_table, row_scalars, row_texts

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
    """Appends metric rows to ``log.jsonl`` and sends them to the run's experiment trackers
    (``train.loggers``: TensorBoard, W&B, MLflow, CSV; ``tracking.Trackers``). On resume, rows past
    the resumed step (written by the killed run after its last checkpoint) are dropped so curves
    continue without duplicates, and the trackers continue the runs the checkpoint names.

    Args:
        out_dir: the run folder.
        resume_step: the step a resumed launch continues from (None: a fresh start).
        enabled: False on ranks > 0 (only rank 0 logs).
        loggers: the tracker back ends (``train.loggers``).
        config: the run config (``RunConfig.to_dict()``) the trackers record.
        resume_refs: the checkpoint's tracker references (``train_state["trackers"]``).
        block_names: the residual blocks' names, for the ``block_rms/<block>`` tags.
    """

    def __init__(self, out_dir: Path, resume_step: int | None = None, enabled: bool = True,
                 loggers: Sequence[str] = ("tensorboard",), config: dict | None = None, resume_refs: dict | None = None,
                 block_names: Sequence[str] = ()):
        self.enabled = enabled
        self.path = Path(out_dir) / "log.jsonl"
        self.trackers = Trackers(loggers if enabled else [])
        self.block_names = list(block_names)
        self.texts: dict[str, str] = {}  # the last text logged per tag: a card is logged when it changes
        if not enabled:
            return
        if resume_step is not None and self.path.exists():
            keep = [ln for ln in self.path.read_text().splitlines() if ln.strip() and json.loads(ln).get("step", 0) <= resume_step]
            self.path.write_text("".join(k + "\n" for k in keep))
        elif resume_step is None and self.path.exists():
            self.path.unlink()
        self.trackers.start(config or {}, out_dir, resume_refs, resume_step)

    @property
    def refs(self) -> dict:
        """The tracker runs' references (W&B / MLflow run ids), for the checkpoint."""
        return self.trackers.refs

    @property
    def wants_images(self) -> bool:
        """Whether a chosen tracker shows figures (so that drawing them is worth it)."""
        return self.enabled and self.trackers.wants_images

    def write(self, row: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")
        self.trackers.log_scalars(row["step"], row_scalars(row, self.block_names))
        for name, text in row_texts(row).items():
            if self.texts.get(name) != text:
                self.trackers.log_text(row["step"], name, text)
                self.texts[name] = text

    def log_image(self, step: int, name: str, image) -> None:
        """A figure (PNG bytes or an image array) to the trackers that show figures."""
        if self.enabled:
            self.trackers.log_image(step, name, image)

    def describe_model(self, alphas: list[tuple[str, tuple[float, ...]]]) -> None:
        """The shortcut-factor schedule (``nn.decayify.alphas_of``) at step 0: a table (``alpha_table``)
        and a figure (``alpha_schedule``; distinct names: W&B keeps one value per name and step)."""
        if self.enabled:
            self.trackers.log_text(0, "alpha_table", alpha_table(alphas))
            if self.trackers.wants_images:
                self.trackers.log_image(0, "alpha_schedule", alpha_figure(alphas))

    def log_summary(self, values: dict[str, float], step: int | None = None) -> None:
        if self.enabled:
            self.trackers.log_summary(values, step)

    def close(self, ok: bool = True) -> None:
        """Close the trackers' runs (``ok=False``: the launch failed or was interrupted)."""
        self.trackers.finish(ok)


class LossWindow:
    """The training loss since the last log row: one device scalar per optimizer step, so the loop
    never waits for the device to read it.

    Log rows come at multiples of ``train.log_every`` and at the last step, never because of a
    checkpoint, and the open window is saved in every checkpoint (each rank's own) and restored on
    resume: the logged losses, the final loss among them, are the same whatever ``ckpt_every`` is
    and wherever a run was interrupted. Under torchrun a row holds the mean over all ranks
    (all-reduced at log steps only), as MAE and timm log it, not rank 0's share of the batch.

    Args:
        device: where the losses live (the training device).
    """

    def __init__(self, device: torch.device):
        self.device = device
        self.losses: list[torch.Tensor] = []
        self.nonfinite = torch.zeros((), dtype=torch.bool, device=device)

    def __len__(self) -> int:
        return len(self.losses)

    def add(self, step_loss: torch.Tensor) -> None:
        """One optimizer step's loss (this rank's, summed over its accumulated micro-batches)."""
        self.losses.append(step_loss)
        self.nonfinite |= ~torch.isfinite(step_loss)

    def diverged(self, env) -> bool:
        """Whether any rank saw a non-finite loss: a host sync (and a collective under torchrun)."""
        flag = self.nonfinite.float()
        if env.distributed:
            dist.all_reduce(flag)
        return bool(flag > 0)

    def close(self, env) -> tuple[float, bool]:
        """(the mean loss over the window's steps and all ranks, whether a rank saw a non-finite
        loss), and a new empty window. Every rank calls it at the same step (a collective)."""
        buf = torch.cat([torch.stack(self.losses).double(), self.nonfinite.double()[None]])
        if env.distributed:
            dist.all_reduce(buf)  # sums over ranks; the mean of equal-sized local means is the global mean
        host = buf.cpu()
        self.losses = []
        return float(host[:-1].mean()) / env.world_size, bool(host[-1] > 0)

    def state(self) -> torch.Tensor:
        """This rank's open window, for the checkpoint (float32 on the CPU: restored bit for bit)."""
        return torch.stack(self.losses).detach().cpu() if self.losses else torch.zeros(0)

    def load(self, values: torch.Tensor | None) -> None:
        """Continue the window a checkpoint saved (None: an older checkpoint; start empty)."""
        self.losses = list(values.to(self.device).unbind()) if values is not None else []


def read_log(out_dir: Path) -> list[dict]:
    path = Path(out_dir) / "log.jsonl"
    if not path.exists():
        return []
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()]
