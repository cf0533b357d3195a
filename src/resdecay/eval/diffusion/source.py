"""The ``diffusion`` source: a diffusion model and labelled images to probe its blocks with at several
noise levels (the diffusion probe grid's best cell). The diffusion families' online tracking prepares it
on N train / N test images drawn once, class-balanced and seeded."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ..inputs import fixed_subsets
from ..metrics import DIFFUSION
from ..protocol import ONLINE_LEVELS
from ..sources import Evaluation, Prepared, Source

__all__ = ["DiffusionSet"]


@dataclass
class DiffusionSet:
    """What a ``diffusion`` metric reads: a diffusion model and labelled images to probe its blocks with."""

    model: torch.nn.Module
    train_set: Any
    test_set: Any
    levels: tuple[float, ...]


def _check(ev: Evaluation, metrics: list) -> None:
    if "subsets" not in ev.shared:  # the same images at every evaluation of the run
        ev.shared["subsets"] = fixed_subsets(ev.data, ev.cfg.model.img_size, ev.settings.size)


def _prepare(ev: Evaluation, metrics: list):
    bank, queries, _ = ev.shared["subsets"]
    yield Prepared(None, DiffusionSet(ev.model, bank, queries, ONLINE_LEVELS), {})


SOURCES = (Source(DIFFUSION, prepare=_prepare, check=_check),)  # registered by eval/__init__.py
