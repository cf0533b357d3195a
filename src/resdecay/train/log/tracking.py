"""Which experiment trackers a run logs to (``train.loggers``), and the fan-out that sends every
logged number, text and figure to each of them (``Trackers``). ``runlog.RunLog`` drives it during
training; ``log_to_run`` reopens a finished run's trackers to add evaluation numbers.

``train.loggers=[tensorboard,wandb,mlflow,csv]`` (default ``[tensorboard]``). A chosen back end whose
package is missing is one line naming the extra to install, before anything is created
(``check_installed``). Only rank 0 logs.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import importlib
import io
import json
import re
from pathlib import Path
from typing import Sequence

import numpy as np

from ...errors import UserError, one_line
from .remote_trackers import MlflowTracker, WandbTracker
from .trackers import CsvTracker, Group, TensorBoardTracker, Tracker

TRACKERS: dict[str, type[Tracker]] = {"tensorboard": TensorBoardTracker, "wandb": WandbTracker,
                                      "mlflow": MlflowTracker, "csv": CsvTracker}
# back end -> (the module it imports, how to install it); csv needs nothing
PACKAGES = {"tensorboard": ("tensorboard", "pip install tensorboard"),
            "wandb": ("wandb", "pip install -e '.[wandb]' (or pip install wandb)"),
            "mlflow": ("mlflow", "pip install -e '.[mlflow]' (or pip install mlflow)")}

_GROUP: contextvars.ContextVar[Group | None] = contextvars.ContextVar("resdecay_tracker_group", default=None)


def missing_package(name: str) -> str | None:
    """The install command for back end ``name`` when its package cannot be imported, else None."""
    if name not in PACKAGES:
        return None
    module, install = PACKAGES[name]
    try:
        importlib.import_module(module)
    except ImportError:
        return install
    return None


def check_installed(names: Sequence[str]) -> None:
    """Refuse, in one line, a chosen tracker whose package is not installed."""
    for name in names:
        install = missing_package(name)
        if install:
            raise UserError(f"train.loggers includes {name}, but the {PACKAGES[name][0]} package is not installed: "
                            f"{install}, or drop {name} from train.loggers")


@contextlib.contextmanager
def tracker_group(name: str, folder: Path):
    """Runs trained inside the block belong together (an ablation grid, all its seeds): one W&B
    group and MLflow experiment named ``name``, MLflow's default file store in ``folder``. An outer
    group wins, so ``ablate --seeds`` keeps every seed's variants in one group."""
    if _GROUP.get() is not None:
        yield
        return
    token = _GROUP.set(Group(name, Path(folder)))
    try:
        yield
    finally:
        _GROUP.reset(token)


class Trackers:
    """Every chosen back end behind one interface (``trackers.Tracker``'s, fanned out).

    Args:
        names: back ends from ``TRACKERS`` (repeats count once); [] logs nowhere (ranks > 0).
    """

    def __init__(self, names: Sequence[str]):
        self.trackers = [TRACKERS[n](_GROUP.get()) for n in dict.fromkeys(names)]
        self.refs: dict[str, dict] = {}  # back end -> its run's reference, kept in checkpoints

    def start(self, config: dict | None, run_dir: Path, resume: dict | None = None, resume_step: int | None = None) -> None:
        """Open each back end's run (``Tracker.start``); if one fails, those opened are closed again."""
        started = []
        try:
            for t in self.trackers:
                ref = t.start(config, Path(run_dir), (resume or {}).get(t.name), resume_step)
                started.append(t)
                if ref:
                    self.refs[t.name] = ref
        except BaseException:
            for t in started:
                t.finish(ok=False)
            raise

    @property
    def wants_images(self) -> bool:
        return any(t.name != "csv" for t in self.trackers)

    def log_scalars(self, step: int, values: dict[str, float]) -> None:
        if values:
            for t in self.trackers:
                t.log_scalars(step, values)

    def log_text(self, step: int, name: str, text: str) -> None:
        for t in self.trackers:
            t.log_text(step, name, text)

    def log_image(self, step: int, name: str, image) -> None:
        for t in self.trackers:
            t.log_image(step, name, image)

    def log_summary(self, values: dict[str, float], step: int | None = None) -> None:
        for t in self.trackers:
            t.log_summary(values, step)

    def finish(self, ok: bool = True) -> None:
        """Close every run; the first failure is raised after all were tried."""
        failure = None
        for t in self.trackers:
            try:
                t.finish(ok)
            except Exception as e:  # one back end failing to close must not leave the others open
                failure = failure or e
        self.trackers = []
        if failure is not None:
            raise failure


# ----------------------------------------------------------------------------- what is logged
def tag(key: str) -> str:
    """A log.jsonl key as a tracker tag: ``online_knn_top1`` -> ``online/knn_top1``, ``loss`` -> ``train/loss``."""
    return f"online/{key[7:]}" if key.startswith("online_") else f"train/{key}"


def block_tag(names: Sequence[str], i: int) -> str:
    """``encoder block 3`` -> ``block_rms/encoder_block_03`` (zero-padded: tools sort tags as text)."""
    name = names[i] if i < len(names) else f"block {i}"
    return "block_rms/" + re.sub(r"\d+", lambda m: f"{int(m.group()):02d}", name).replace(" ", "_")


def row_scalars(row: dict, block_names: Sequence[str] = ()) -> dict[str, float]:
    """The numbers of a log.jsonl row by tag; ``block_rms`` (a list) as one tag per block."""
    out = {}
    for key, value in row.items():
        if key == "step":
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            out[tag(key)] = value
        elif key == "block_rms" and isinstance(value, list):
            out.update({block_tag(block_names, i): v for i, v in enumerate(value)})
    return out


def row_texts(row: dict) -> dict[str, str]:
    """The cards of a log.jsonl row (dict values, e.g. ``online_protocol``) as JSON text by tag."""
    return {tag(k): json.dumps(v, indent=2) for k, v in row.items() if isinstance(v, dict)}


def alpha_table(alphas: list[tuple[str, tuple[float, ...]]]) -> str:
    """The shortcut factors per residual block as a Markdown table (``nn.decayify.alphas_of``)."""
    lines = ["| block | alpha (per residual add) |", "|---|---|"]
    return "\n".join(lines + [f"| {name} | {', '.join(f'{a:.4g}' for a in factors)} |" for name, factors in alphas])


def alpha_figure(alphas: list[tuple[str, tuple[float, ...]]]) -> bytes:
    """PNG: alpha of every residual add in network order, each block's first add labelled."""
    return _alpha_png(tuple((name, tuple(factors)) for name, factors in alphas))


@functools.lru_cache(maxsize=16)
def _alpha_png(alphas: tuple[tuple[str, tuple[float, ...]], ...]) -> bytes:
    """The figure's bytes, drawn once per schedule in a process (≈ 0.15 s of matplotlib, most of a small run's
    start): an ablate grid or a sweep trains the same schedule again."""
    from matplotlib.figure import Figure  # here, not at import: matplotlib costs every command a second

    values = [a for _, factors in alphas for a in factors]
    starts = np.cumsum([0] + [len(f) for _, f in alphas[:-1]])
    fig = Figure(figsize=(max(4.0, 0.25 * len(values) + 1.5), 3.2))
    ax = fig.add_subplot()
    ax.plot(range(len(values)), values, "o-", ms=3, lw=1)
    ax.set_xticks(starts, [name for name, _ in alphas], rotation=90, fontsize=6)
    ax.set(ylabel="alpha (identity weight)", title="shortcut factor per residual add", ylim=(0, 1.05 * max(values + [1.0])))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return buf.getvalue()


def log_to_run(run_dir: Path, config: dict, refs: dict | None, values: dict[str, float], step: int, say=print) -> None:
    """Numbers measured after training (evaluation) into the run's trackers, as its summary: its
    TensorBoard events, and the W&B / MLflow runs whose references its checkpoint keeps (a back end
    without one, csv, or one whose package is missing here is left out). A tracker that fails
    costs a note, never the evaluation.

    Args:
        run_dir: the training run's folder; config: its config (``train.loggers``); refs: the
        checkpoint's ``train_state["trackers"]``; values: the numbers by tag; step: the checkpoint's step.
    """
    refs = refs or {}
    names = [n for n in config.get("train", {}).get("loggers", ["tensorboard"])
             if (n == "tensorboard" or n in refs) and not missing_package(n)]
    if not names:
        return
    trackers = Trackers(names)
    try:
        trackers.start(None, run_dir, refs)
        trackers.log_summary(values, step)
        trackers.finish()
    except Exception as e:
        say(f"note: the evaluation was not logged to {', '.join(names)} ({type(e).__name__}: {one_line(e)})")
