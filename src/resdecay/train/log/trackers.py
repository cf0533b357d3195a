"""Experiment trackers: the one interface the training loop, evaluation and ablate log through
(``Tracker``), and the two local back ends, TensorBoard (``<run>/tb``) and a CSV table
(``<run>/summary.csv``). Weights & Biases and MLflow are in ``remote_trackers.py``; the fan-out
that calls every chosen back end, and the choice by ``train.loggers``, are in ``tracking.py``.

Every back end gets the same names ("tags"): ``train/<key>`` and ``online/<key>`` for the columns
of ``log.jsonl`` (as TensorBoard always had them), ``block_rms/<block>`` for the per-block output
RMS, ``eval/<column>`` for evaluation numbers, ``summary/<key>`` for the end-of-run summary.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

from ...errors import UserError


@dataclass(frozen=True)
class Group:
    """Runs that belong together (the variants of one ablation grid): the W&B group and the MLflow
    experiment are named ``name``, and MLflow's default file store is shared in ``folder``."""
    name: str
    folder: Path


class Tracker(ABC):
    """One experiment tracker's run. Only rank 0 makes one (``tracking.Trackers``).

    A resumed training run continues the tracker run it started: ``start`` returns a small dict
    (the run's id and where it lives), the checkpoint keeps it, and the next launch passes it back
    as ``resume``. Back ends with nothing to find again (TensorBoard, CSV: files in the run folder)
    return None.
    """

    name: str = ""

    def __init__(self, group: Group | None = None):
        self.group = group

    def run_name(self, run_dir: Path) -> str:
        """The run folder's name, or its path inside the group's folder (``seed0/decay-both``)."""
        run_dir = Path(run_dir).resolve()
        if self.group and run_dir.is_relative_to(Path(self.group.folder).resolve()):
            return str(run_dir.relative_to(Path(self.group.folder).resolve()))
        return run_dir.name

    @abstractmethod
    def start(self, config: dict, run_dir: Path, resume: dict | None = None, resume_step: int | None = None) -> dict | None:
        """Open the run.

        Args:
            config: the resolved run config (``RunConfig.to_dict()``), logged as the run's config;
                None reopens a run only to add numbers (evaluation after training).
            run_dir: the run folder.
            resume: what ``start`` returned in the launch being resumed (None: a new tracker run).
            resume_step: the step a resumed launch continues from; what a killed launch logged past
                it is dropped where the back end can drop it (TensorBoard, CSV). None: fresh start.

        Returns:
            The reference to store in checkpoints, or None.
        """

    @abstractmethod
    def log_scalars(self, step: int, values: dict[str, float]) -> None:
        """Numbers at one step, named by tag (``train/loss``)."""

    def log_text(self, step: int, name: str, text: str) -> None:  # noqa: B027  (optional: a back end without it drops it)
        """A block of text (the config, a protocol card)."""

    def log_image(self, step: int, name: str, image) -> None:  # noqa: B027  (optional: a back end without it drops it)
        """A figure: PNG bytes, or an (H, W) / (H, W, 3|4) array (uint8, or floats in [0, 1])."""

    def log_summary(self, values: dict[str, float], step: int | None = None) -> None:  # noqa: B027  (optional: a back end without it drops it)
        """Final numbers of the run (summary, evaluation), shown beside the curves."""

    @abstractmethod
    def finish(self, ok: bool = True) -> None:
        """Close the run (``ok=False``: it failed or was interrupted)."""


def image_array(image) -> np.ndarray:
    """PNG bytes or an array -> an (H, W, 3) uint8 array, what every back end accepts."""
    if isinstance(image, (bytes, bytearray)):
        return np.asarray(Image.open(io.BytesIO(image)).convert("RGB"))
    arr = np.asarray(image)
    if arr.dtype != np.uint8:
        arr = (np.clip(arr.astype(np.float64), 0.0, 1.0) * 255).round().astype(np.uint8)
    if arr.ndim == 2:
        arr = np.repeat(arr[..., None], 3, axis=-1)
    return arr[..., :3]


def config_text(config: dict) -> str:
    """The config as YAML, indented four spaces: a preformatted block in TensorBoard's Markdown."""
    return "\n".join("    " + line for line in yaml.safe_dump(config, sort_keys=False).splitlines())


def after_the_last_event_file(folder: Path) -> None:
    """Wait, if need be, until a new event file in ``folder`` will sort after the ones there. Readers (TensorBoard,
    its EventAccumulator) replay a folder's files in name order, and a name is ``events.out.tfevents.<second>.<host>.
    <pid>.<counter>``: a file opened in the same second as the last one (a resume right after a kill, a second
    ``train`` in one process) can sort before it (pid 812 before 8495, counter 100 before 99), and a resume's purge of
    the killed launch's steps is then replayed first and purges nothing. At most a second; a later clock is left
    alone."""
    stamps = [int(parts[3]) for parts in (p.name.split(".") for p in folder.glob("events.out.tfevents.*"))
              if len(parts) > 3 and parts[3].isdigit()]
    delay = max(stamps, default=0) + 1 - time.time()
    if 0 < delay <= 1:
        time.sleep(delay)


class TensorBoardTracker(Tracker):
    """Event files in ``<run>/tb``: scalars, the config and text cards, figures. On resume, events
    past the resumed step (the killed launch's) are purged, so curves continue without duplicates."""

    name = "tensorboard"

    def start(self, config, run_dir, resume=None, resume_step=None):
        from torch.utils.tensorboard import SummaryWriter

        check_writable_folder(Path(run_dir) / "tb", "TensorBoard")
        # purge_step drops events at steps >= it: the resumed-from step's row stays in log.jsonl,
        # so it must stay in TensorBoard too (the two must agree); only later steps are the killed run's
        purge = None if resume_step is None else resume_step + 1
        if resume_step is not None:  # the purge must be replayed after the events it purges
            after_the_last_event_file(Path(run_dir) / "tb")
        self.writer = SummaryWriter(str(Path(run_dir) / "tb"), purge_step=purge)
        if resume_step is None and config is not None:
            self.writer.add_text("config", config_text(config), 0)
        return None

    def log_scalars(self, step, values):
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def log_text(self, step, name, text):
        self.writer.add_text(name, text, step)

    def log_image(self, step, name, image):
        self.writer.add_image(name, image_array(image), step, dataformats="HWC")

    def log_summary(self, values, step=None):
        self.log_scalars(step or 0, values)
        self.writer.add_text("summary", "    " + json.dumps(values, indent=2).replace("\n", "\n    "), step or 0)

    def finish(self, ok=True):
        self.writer.flush()
        self.writer.close()


class CsvTracker(Tracker):
    """``<run>/summary.csv``: one row per logged step, a column per tag (the union over the run,
    ``step`` first, then in order of first appearance). A training row and the online evaluation
    at the same step share one row. On resume, rows past the resumed step are dropped."""

    name = "csv"

    def start(self, config, run_dir, resume=None, resume_step=None):
        self.path = Path(run_dir) / "summary.csv"
        if self.path.is_dir():  # else an IsADirectoryError from deep in the csv writer
            raise UserError(f"{self.path} is a folder, so the csv logger cannot write its table there; move or delete "
                            "that folder, or drop csv from train.loggers")
        rows = read_csv(self.path) if resume_step is not None else []
        rows = [r for r in rows if float(r["step"]) <= resume_step] if rows else []
        self.columns = list(dict.fromkeys(k for r in rows for k in r)) or ["step"]
        self.last: dict | None = rows[-1] if rows else None
        self.last_at = 0  # byte offset where the last row starts (rewritten when the same step logs more)
        self._rewrite(rows)
        return None

    def log_scalars(self, step, values):
        row = {"step": step, **values}
        same_step = self.last is not None and float(self.last["step"]) == step
        if same_step:
            row = {**self.last, **row}
        if any(k not in self.columns for k in row):
            self.columns += [k for k in row if k not in self.columns]
            rows = read_csv(self.path)
            self._rewrite(rows[:-1] + [row] if same_step else rows + [row])
            return
        with open(self.path, "r+" if same_step else "a", newline="") as f:
            if same_step:
                f.seek(self.last_at)
                f.truncate()
            else:
                f.seek(0, io.SEEK_END)
                self.last_at = f.tell()
            csv.DictWriter(f, self.columns).writerow(row)
        self.last = row

    def _rewrite(self, rows: list[dict]) -> None:
        """The whole file under the current header (when a column first appears, or on start)."""
        with open(self.path, "w", newline="") as f:
            writer = csv.DictWriter(f, self.columns)
            writer.writeheader()
            for row in rows[:-1]:
                writer.writerow(row)
            self.last_at = f.tell()
            if rows:
                writer.writerow(rows[-1])
        self.last = rows[-1] if rows else None

    def finish(self, ok=True):
        pass


def check_writable_folder(folder: Path, what: str) -> None:
    """Create ``folder`` and a file in it now, or raise one line: TensorBoard's writer thread opens its
    event file later and would print its own 40-line traceback from that thread."""
    probe = Path(folder) / f".write-test-{os.getpid()}"
    try:
        Path(folder).mkdir(parents=True, exist_ok=True)
        with open(probe, "wb"):
            pass
        probe.unlink()
    except OSError as e:
        raise UserError(f"{what} cannot write to {folder} ({e.strerror or type(e).__name__}); make the run folder "
                        f"writable, or drop {what.lower()} from train.loggers") from None


def read_csv(path: Path) -> list[dict]:
    """The rows of a ``summary.csv`` (strings; empty cells left out); [] when there is none."""
    if not Path(path).exists():
        return []
    with open(path, newline="") as f:
        return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(f)]
