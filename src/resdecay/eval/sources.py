"""The evaluation's input sources: each kind of input a metric reads is one registered ``Source``.

A metric (``metrics.py``) says *what* it computes and which kind of input it reads (``applies_to``);
a source says *how that input is made* from a checkpoint: ``features`` (pooled features of a labelled
train and test split), ``layers`` (every block's test features), ``blocks`` (per-block norm
statistics), ``segmentation`` (patch tokens and label maps), ``samples`` and ``diffusion`` (online
tracking of the diffusion families). ``resdecay eval`` is then one loop (``suite.evaluate_checkpoint``):
for each selected metric's source, ``check`` every input before anything is extracted, ``prepare`` the
model's inputs layer by layer, measure, then the same over the source's ``baseline`` inputs (raw pixels
and the run's randomly initialised encoder).

A new input kind is therefore one file: a dataclass for the input, a ``prepare`` (and, if a baseline
makes sense, a ``baseline``), ``register_source(kind, prepare=...)``, and metrics registered with
``applies_to=kind`` (docs/EXTENDING.md shows one on per-token pixel reconstructions).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..errors import Registry, RegistryError, defined_at

FEATURES, LAYERS, BLOCKS, SAMPLES, DIFFUSION, SEGMENTATION = ("features", "layers", "blocks", "samples", "diffusion",
                                                              "segmentation")  # the built-in kinds
BASELINES = ("pixels", "random-init")  # the reference inputs every source may offer, in report order


@dataclass
class Evaluation:
    """One checkpoint's evaluation, as every source sees it: checked, loaded, ready to extract.

    Args:
        checkpoint: the checkpoint file; sha: its SHA-256 (the feature caches' key); state: its contents.
        cfg: its ``RunConfig``; model: the encoder in eval mode on ``device``; data: the evaluation's data.
        settings: the ``suite.EvalSettings``; layers: the blocks measured (every block for the profile).
        report_dir: the report folder (lists of replaced unreadable images go there).
        side: the image side when there is no model (the raw pixels of a data set alone); else the model's.
        notes: what sources add to the report besides rows (``cache``, ``bad_files``), in the order added.
        shared: what two sources share within one evaluation (the features ``layers`` reuses).
        cache_dir: the feature cache's folder when ``--cache-dir`` names none (``<run>/eval/cache``; a
            foreign model's ``<report>/cache``).
        about: what was evaluated, the report's first keys (``suite.described``; empty without a model).
        inputs_card: how the model reads the images beyond the data (a diffusion checkpoint's noise level): in every
            split's card, so in every result's protocol card and every feature cache's key.
    """

    checkpoint: Path | None
    sha: str | None
    state: dict
    cfg: Any
    model: torch.nn.Module
    data: Any
    settings: Any
    layers: list[int]
    device: torch.device
    report_dir: Path
    notes: dict = field(default_factory=dict)
    shared: dict = field(default_factory=dict)
    side: int | None = None
    cache_dir: Path | None = None
    about: dict = field(default_factory=dict)
    inputs_card: dict = field(default_factory=dict)

    @property
    def img_size(self) -> int:
        """The side images are read at: the model's input side (``side`` without a model)."""
        return self.cfg.model.img_size if self.cfg is not None else self.side

    @property
    def profile(self) -> bool:
        """The per-layer profile (``--layer all``) rather than one block."""
        return self.settings.layer == "all"


@dataclass
class Prepared:
    """One input ready to measure.

    Args:
        layer: the block it is of (None for raw pixels); inputs: what the metrics' ``compute`` reads.
        card: the evaluator's part of every protocol card (data, split sizes, norm, checkpoint).
            ``inputs`` may be a function of no arguments, called only when the input is measured.
        rows_cache: a JSON file holding this input's rows under this protocol, reused when present and
            written after measuring (the raw-pixel rows: a grid of runs measures the pixels once);
            cache_key: what the file was keyed on, kept in it.
    """

    layer: int | None
    inputs: Any
    card: dict
    rows_cache: Path | None = None
    cache_key: Any = None


Prepare = Callable[[Evaluation, list], Iterable[Prepared]]


@dataclass(frozen=True)
class Source:
    """How one kind of input is made from an evaluation.

    Args:
        kind: the input kind (a metric's ``applies_to``).
        prepare: ``prepare(evaluation, metrics)`` yields the model's ``Prepared`` inputs, layer by layer.
        baseline: ``baseline(evaluation, metrics, name)`` yields the same for ``name`` in ``BASELINES``
            (nothing for a baseline it has no counterpart of); None: no baselines.
        check: ``check(evaluation, metrics)``: refuse what cannot work before anything is extracted (a k
            larger than the bank, a data set without label maps); None: nothing to check.
        rows: False when the source's numbers are profile columns only (the blocks' norm statistics),
            not rows of ``eval.json``.
        every_rank: under torchrun, every rank runs ``prepare`` (its extraction is split and gathered);
            False: rank 0 alone prepares.
        profile_only: the source runs in the per-layer profile only.
    """

    kind: str
    prepare: Prepare
    baseline: Callable[[Evaluation, list, str], Iterable[Prepared]] | None = None
    check: Callable[[Evaluation, list], None] | None = None
    rows: bool = True
    every_rank: bool = True
    profile_only: bool = False


_SOURCES: Registry[Source] = Registry("input source", "register_source",
                                      origin=lambda s: f"by {defined_at(s.prepare)}",
                                      same=lambda old, new: defined_at(old.prepare) == defined_at(new.prepare))


def register_source(kind: str | Source, *, prepare: Prepare | None = None, baseline=None, check=None, rows: bool = True,
                    every_rank: bool = True, profile_only: bool = False, replace: bool = False) -> Source:
    """Register how inputs of ``kind`` are made (see ``Source`` for the arguments; or pass a ``Source``);
    returns the source. A kind that is taken is refused in one line (``RegistryError``) unless ``replace=True``."""
    source = kind if isinstance(kind, Source) else Source(kind, prepare, baseline, check, rows, every_rank, profile_only)
    if not isinstance(source.kind, str) or not source.kind.isidentifier() or source.kind != source.kind.lower():
        raise RegistryError(f"input kind {source.kind!r} must be a lower-case name (it is a metric's applies_to)")
    if not callable(source.prepare):
        raise RegistryError(f"input kind {source.kind!r}: prepare must be a function (evaluation, metrics) -> inputs")
    return _SOURCES.add(source.kind, source, replace)


def unregister_source(kind: str) -> Source:
    """Remove a source (tests and notebooks that registered one for a while)."""
    return _SOURCES.remove(kind)


def get_source(kind: str) -> Source | None:
    """The source of an input kind, or None."""
    return _SOURCES.table.get(kind)


def source_kinds() -> tuple[str, ...]:
    """The registered input kinds, in registration order (the order ``resdecay eval`` measures them)."""
    return tuple(_SOURCES.table)


__all__ = ["BASELINES", "BLOCKS", "DIFFUSION", "FEATURES", "LAYERS", "SAMPLES", "SEGMENTATION", "Evaluation", "Prepared", "Source", "get_source",
           "register_source", "source_kinds", "unregister_source"]
