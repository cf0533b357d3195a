"""What ``resdecay eval`` measures: a resdecay checkpoint, or a model trained elsewhere.

Both are a ``Target``: it names its report and feature-cache folders, checks what can be checked before
the first feature is extracted (a bad second target must not cost the first one's evaluation), and opens
into the ``sources.Evaluation`` every source reads; ``suite.evaluate`` then measures either the same way.
A model trained elsewhere arrives built (``interop/foreign_model.load_foreign``: a timm / torchvision name
with a weights file, a transformers / diffusers folder) and is wrapped here in the model contract the
evaluators read (``foreign.ForeignEncoder``).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, runtime_checkable

import torch
import torch.nn as nn

from ..errors import DataError, InputMismatch, UserError, one_line
from ..io import file_sha256, first_sentence, run_dir_of
from ..stream.foreign import ForeignEncoder, ForeignRun
from ..train.distributed import resolve_device
from .inputs import check_data_path
from .sources import Evaluation
from .suite import EvalSettings, checked_checkpoint, described, evaluate, evaluate_checkpoint, measured_layers

DEFAULT_OUT = "runs/eval"  # where reports go without --out when there is no run folder (and the overlays)


@runtime_checkable
class Target(Protocol):
    """One thing ``resdecay eval`` measures.

    Args:
        name: how the command's result names it (the checkpoint file, the ``--model`` spec).
    """

    name: str

    def report_dir(self, out: str | None) -> Path:
        """Its report folder: under ``out`` (``--out``) or its default."""

    def cache_dir(self, report_dir: Path) -> Path:
        """Its feature cache when ``--cache-dir`` names none."""

    def check(self, s: EvalSettings) -> None:
        """Everything that can be refused before a feature is extracted (one line, exit 2)."""

    def evaluate(self, s: EvalSettings, report_dir: Path) -> dict | None:
        """Its report (``suite.evaluate``; None on the torchrun ranks that only help extract)."""


@dataclass(eq=False)  # hashed by identity: a key of the command's report folders
class CheckpointTarget:
    """A resdecay checkpoint (``<run>/checkpoints/step_*.pt``): reports in ``<run>/eval``, its cache beside them."""

    path: Path

    @property
    def name(self) -> str:
        return str(self.path)

    def report_dir(self, out: str | None) -> Path:
        run = run_dir_of(self.path)
        return Path(out) / run.name if out else run / "eval"

    def cache_dir(self, report_dir: Path) -> Path:
        return run_dir_of(self.path) / "eval" / "cache"

    def check(self, s: EvalSettings) -> None:
        library = saved_library(self.path)
        if library is not None:  # a folder of another library: measured as a model trained elsewhere
            convert = (f" (or convert it into a checkpoint: resdecay import-weights {self.path} --format hf-vitmae "
                       "--preset PRESET --out imported.pt)") if library == "transformers vit_mae" else ""
            raise UserError(f"{self.path} is a {library} save_pretrained folder, not a resdecay checkpoint; measure it "
                            f"as a model trained elsewhere: resdecay eval --model {self.path} --data NAME{convert}")
        checked_checkpoint(self.path, s)

    def evaluate(self, s: EvalSettings, report_dir: Path) -> dict | None:
        try:
            return evaluate_checkpoint(self.path, s, report_dir)  # its numbers also reach its run's trackers
        except InputMismatch as e:  # the checkpoint's model is fixed: only the images can change
            if e.key == "img_size":
                raise DataError(f"the images are {e.data}x{e.data} but {self.path} takes {e.model}x{e.model}: pass --resize "
                                f"to read them at {e.model}x{e.model}, or measure it on the data it was trained on") from None
            raise DataError(f"the images have {e.data} channel(s) but {self.path} takes {e.model}: measure it on "
                            f"images of {e.model} channel(s) (--data NAME)") from None


@runtime_checkable
class BuiltModel(Protocol):
    """A model trained elsewhere, built with its weights (``interop.foreign_model.ForeignModel``)."""

    model: nn.Module
    fresh: Callable[[], nn.Module]  # the same architecture and decay, freshly initialised
    source: str
    weights: str | None
    conditioning: tuple
    inputs: dict  # the img_size / in_chans given as --model-arg
    settable_inputs: tuple[str, ...]  # those a --model-arg can set for this model
    random_weights: bool  # built with random weights (seed 0): no weights file for a format that takes one


@dataclass(eq=False)
class ForeignTarget:
    """A model trained elsewhere: measured on the data set ``--data`` names (it has no run of its own), its
    report in ``<out>/<spec>``, its feature cache keyed by the weights file's SHA-256 (the spec's, for
    random weights)."""

    built: BuiltModel
    encoder: ForeignEncoder | None = None  # made by ``check``: its blocks found, its token grid probed
    fresh_checked: bool = False  # ``check`` built the random-init baseline once

    @property
    def name(self) -> str:
        return self.built.source

    def report_dir(self, out: str | None) -> Path:
        return Path(out or DEFAULT_OUT) / re.sub(r"[^A-Za-z0-9_.-]+", "-", self.name.strip("/")).strip("-")

    def cache_dir(self, report_dir: Path) -> Path:
        return report_dir / "cache"

    def check(self, s: EvalSettings) -> None:
        if s.noise_level is not None:
            raise UserError(f"--noise-level applies to resdecay diffusion checkpoints (uvit, sit); --model {self.name} "
                            "is read as an encoder (a diffusers backbone at a fixed timestep: --model-arg timestep=N)")
        if s.data is None:
            raise UserError(f"--model {self.name}: name the data set to measure it on with --data NAME (and --data-path DIR)")
        s.validate()
        check_data_path(s.data.name, s.data.path)
        if self.encoder is None:  # a model whose blocks no adapter reaches is refused here, in one line
            b = self.built
            self.encoder = ForeignEncoder(b.model, b.source, b.weights, b.inputs.get("img_size"), b.inputs.get("in_chans"),
                                          b.conditioning)
        if self.encoder.cfg.prefix_tokens == 0 and s.feature == "cls":
            raise UserError(f"{self.name} has no cls token: pass --feature mean or patch_mean")
        if s.baselines and not self.fresh_checked:  # built once now, so that it cannot fail after the extraction
            with torch.random.fork_rng():
                try:
                    self.built.fresh()
                except Exception as e:  # noqa: BLE001  (the library's own error, reported in one line)
                    raise UserError(f"--model {self.name}: its random-init baseline (the same architecture, freshly "
                                    f"initialised) cannot be built ({first_sentence(one_line(e))}); pass --no-baselines "
                                    "to measure it without the baselines") from None
            self.fresh_checked = True

    def evaluate(self, s: EvalSettings, report_dir: Path) -> dict | None:
        try:
            return evaluate(self.open(s, report_dir), s)
        except InputMismatch as e:
            raise DataError(self._input_fix(e, s.data.name)) from None

    def _input_fix(self, e: InputMismatch, data: str) -> str:
        """The fix of images the model does not take, in ``eval``'s own options: ``--resize``, or a
        ``--model-arg`` where its format lets one set the value (``ModelFormat.settable_inputs``)."""
        settable = e.key in self.built.settable_inputs
        if e.key == "img_size":
            arg = "" if not settable else (f", or --model-arg img_size={e.data} if it was built for {e.data}x{e.data} "
                                           "images (a ViT: with a patch_size that divides it)")
            return (f"{data} images are {e.data}x{e.data} but {self.name} takes "
                    f"{e.model}x{e.model}: pass --resize to read them at {e.model}x{e.model}{arg}")
        arg = f"pass --model-arg in_chans={e.data} if it was built for them, or " if settable else ""
        return (f"{data} images have {e.data} channel(s) but {self.name} takes {e.model}: {arg}measure it on images of "
                f"{e.model} channel(s) (--data NAME)")

    def open(self, s: EvalSettings, report_dir: Path) -> Evaluation:
        """Checked, and ready: what every source reads."""
        self.check(s)
        model, run = self.encoder, ForeignRun(self.encoder.cfg, s.data, build=self.built.fresh)
        weights, folder = self.built.weights, Path(self.name)
        if weights:
            sha = file_sha256(Path(weights))
        elif folder.is_dir():  # a save_pretrained folder holds its weights: saved again, its features are new
            sha = folder_sha256(folder)
        else:  # random weights, drawn with seed 0: the spec and its arguments name them
            sha = hashlib.sha256(json.dumps(run.to_dict()).encode()).hexdigest()
        # no downloads: timm:NAME without --weights is never timm's pretrained model, and the report says so
        label = f"{run.label}, random weights (seed 0: no --weights)" if self.built.random_weights else run.label
        device = resolve_device(s.device, "--device")
        ev = Evaluation(Path(weights) if weights else None, sha, {"train_state": {"step": None}, "config": run.to_dict()},
                        run, model.to(device).eval(), run.data, s, measured_layers(model, s.layer), device,
                        Path(report_dir), cache_dir=self.cache_dir(Path(report_dir)))
        return described(ev, label)


def folder_sha256(folder: Path) -> str:
    """One SHA-256 over a save_pretrained folder's files (names and contents; the cache key of its features), so
    that a model saved again into the same folder is extracted again rather than read from the cache."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and "cache" not in p.relative_to(folder).parts):
        digest.update(f"{path.relative_to(folder).as_posix()}\0{file_sha256(path)}\0".encode())
    return digest.hexdigest()


def saved_library(path: Path) -> str | None:
    """"diffusers", "transformers MODEL_TYPE" when ``path`` is a save_pretrained folder of that library (its
    config.json names a class: ``_class_name`` / ``architectures``, or a ``model_type``); None otherwise (a file,
    resdecay's own ``export --to hf`` folder: ``from_pretrained`` reads that one)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text()) if Path(path).is_dir() else None
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    if "_class_name" in config:
        return "diffusers"
    kind = config.get("model_type")
    return f"transformers {kind}" if isinstance(kind, str) and kind else None


def as_target(target: Target | BuiltModel | str | Path) -> Target:
    """A checkpoint path as its ``CheckpointTarget``, a built model (``load_foreign``'s) as its ``ForeignTarget``,
    a target as itself."""
    if isinstance(target, (str, Path)):
        return CheckpointTarget(Path(target))
    if isinstance(target, Target):
        return target
    if isinstance(target, BuiltModel):
        return ForeignTarget(target)
    raise TypeError(f"run_eval takes checkpoint paths, eval.targets Targets or load_foreign's models, not {type(target).__name__}")
