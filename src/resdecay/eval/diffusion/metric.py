"""The diffusion probe's best cell (``diffusion``): the best linear-probe top-1 over blocks x noise levels
of a diffusion model; the diffusion families' online tracking reports it."""

from __future__ import annotations

from ..display import Display
from ..metrics import DIFFUSION, Metric, Result
from ..protocol import FAST_RECIPE, MetricSettings
from .probe import probe_grid
from .source import DiffusionSet


def _best_probe_cell(x: DiffusionSet, s: MetricSettings) -> list[Result]:
    best = probe_grid(x.model, x.train_set, x.test_set, levels=x.levels, device=s.device, progress=False)["best"]
    return [Result("mean", {"top1": best["top1"]}, card={"levels": list(x.levels)},
                   extra={"probe_best_cell": {"block": best["layer"], "noise": best["level"]}})]


DIFFUSION_PROBE = Metric(
    name="diffusion_probe", compute=_best_probe_cell, protocol=lambda s: {"probe": FAST_RECIPE.card()}, headline="top1",
    applies_to=DIFFUSION, where=frozenset({"online"}),
    display=Display("best probe cell", describe=lambda p: f"fast probe, best of blocks x noise levels {p['levels']}",
                    column="probe_best_top1", titles={"probe_best_top1": "best probe cell top-1 (block x noise level)"}))

METRICS = (DIFFUSION_PROBE,)  # registered by eval/__init__.py, in this order
