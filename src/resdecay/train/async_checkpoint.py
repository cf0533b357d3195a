"""Checkpoints written without stalling training: a write of a large model takes seconds that the
optimizer steps need not wait for.

``CheckpointWriter.submit`` snapshots the state to CPU memory (clones, so the next optimizer
step cannot change what is written), then one background thread writes it with
``checkpoint.save_checkpoint`` (temporary file, fsync, rename: still atomic) and prunes old
files. At most one write is in flight: the training loop waits only when it submits the next
checkpoint before the previous one is on disk. A failed write is raised in the training thread
at the next ``submit`` or at ``raise_if_failed`` (the end of the run).
"""

from __future__ import annotations

import threading
from pathlib import Path

import torch

from .checkpoint import save_checkpoint


def snapshot(obj):
    """A copy of nested dicts/lists/tuples whose tensors are detached CPU clones."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        return t.to("cpu", copy=True) if t.device.type != "cpu" else t.clone()
    if isinstance(obj, dict):
        return {k: snapshot(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [snapshot(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(snapshot(v) for v in obj)
    return obj


class CheckpointWriter:
    def __init__(self, background: bool = True):
        self.background = background
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    def submit(self, state: dict, ckpt_dir: Path, step: int, keep_last: int) -> None:
        self.wait()
        self.raise_if_failed()
        state = snapshot(state)  # on the training thread: the weights as of this step
        if not self.background:
            save_checkpoint(state, ckpt_dir, step, keep_last)
            return
        self._thread = threading.Thread(target=self._write, args=(state, ckpt_dir, step, keep_last),
                                        name=f"resdecay-checkpoint-{step}", daemon=False)
        self._thread.start()

    def _write(self, state, ckpt_dir, step, keep_last) -> None:
        try:
            save_checkpoint(state, ckpt_dir, step, keep_last)
        except BaseException as e:  # handed to the training thread
            self._error = e

    def wait(self) -> None:
        """Block until the write in flight (if any) is on disk."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def raise_if_failed(self) -> None:
        if self._error is not None:
            err, self._error = self._error, None
            raise err
