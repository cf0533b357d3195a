"""What a run's shortcut formula is, in words: the one description every label uses (the run header,
``summary.json``, ``eval.json``, ``compare``, ``ablate``, the plots, ``resdecay alpha --shortcut``).

``describe_shortcut("decay", 0.6, "linear")`` is ``"decay linear alpha_min 0.6"``, ``("decay", 1.0)``
is ``"plain"``, ``("scaled_sum", 0.6)`` is ``"scaled_sum"`` and a formula registered in a user's file
is ``"two_minus linear alpha_min 0.6 (plugin)"``. A knob is named only where the formula reads it:
whether it does is found by evaluating the formula with the knob changed (``ignored_knobs``), so a
plugin needs no declaration, and a knob set away from its neutral value but ignored gets one warning.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache

import torch

from ..errors import ConfigError
from ..schedule import SCHEDULES
from .branch_scale import describe_branch
from .residual import SHORTCUT_FORMULAS, ShortcutFormula, evaluate_formula

PROBE_DEPTH = 4  # deep enough for every schedule to differ from the others
PROBE_ALPHAS = (0.5, 0.8)  # two alpha_min values no schedule maps to the same table


def _differs(tables: list[tuple[torch.Tensor, torch.Tensor]]) -> bool:
    first = tables[0]
    return any(not (torch.equal(a, first[0]) and torch.equal(b, first[1])) for a, b in tables[1:])


@lru_cache(maxsize=None)
def _ignored(formula: ShortcutFormula, adds_per_block: int) -> tuple[str, ...]:
    try:
        table = {(a, s): evaluate_formula(formula, PROBE_DEPTH, a, s, adds_per_block) for a in PROBE_ALPHAS for s in SCHEDULES}
    except ConfigError:  # a formula that fails on the probe values: assume it reads both knobs
        return ()
    ignored = []
    if not any(_differs([table[(a, s)] for a in PROBE_ALPHAS]) for s in SCHEDULES):
        ignored.append("alpha_min")
    if not any(_differs([table[(a, s)] for s in SCHEDULES]) for a in PROBE_ALPHAS):
        ignored.append("schedule")
    return tuple(ignored)


def ignored_knobs(shortcut: str, adds_per_block: int = 2) -> tuple[str, ...]:
    """The knobs (``alpha_min``, ``schedule``) the registered formula ``shortcut`` does not read: its
    tables do not change when the knob does. () for a name not registered now."""
    formula = SHORTCUT_FORMULAS.get(shortcut)
    return () if formula is None else _ignored(formula, adds_per_block)


def is_plugin(shortcut: str) -> bool:
    """Whether ``shortcut`` was registered outside resdecay (a ``--plugin`` file or a user's module);
    True also for a name not registered now (a run made with a plugin that is not loaded)."""
    formula = SHORTCUT_FORMULAS.get(shortcut)
    return formula is None or not getattr(formula.factors, "__module__", "").startswith("resdecay.")


def describe_shortcut(shortcut: str = "decay", alpha_min: float = 1.0, schedule: str = "linear",
                      branches: str = "both", adds_per_block: int = 2) -> str:
    """A run's shortcut in words, naming only the knobs its formula reads (see the module docstring).

    Args:
        shortcut: the registered formula (``model.shortcut``).
        alpha_min, schedule: the decay knobs (``model.alpha_min``, ``model.schedule``).
        branches: ``model.decay_branches``; ``attn`` / ``mlp`` is said as ``on attn`` / ``on mlp``.
        adds_per_block: 2 for transformer blocks, 1 for ResNet blocks.
    """
    if shortcut == "decay" and float(alpha_min) == 1.0:
        return "plain"
    ignored = ignored_knobs(shortcut, adds_per_block)
    parts = [shortcut]
    if "schedule" not in ignored:
        parts.append(schedule)
    if "alpha_min" not in ignored:
        parts.append(f"alpha_min {float(alpha_min):g}")
    if branches != "both":
        parts.append(f"on {branches}")
    if is_plugin(shortcut):
        parts.append("(plugin)")
    return " ".join(parts)


def shortcut_settings(model_cfg) -> dict:
    """The shortcut settings of any family's config (a classifier's are its pretrained encoder's)."""
    cfg = model_cfg.encoder_config() if hasattr(model_cfg, "encoder_config") else model_cfg
    return {"shortcut": getattr(cfg, "shortcut", "decay"), "alpha_min": getattr(cfg, "alpha_min", 1.0),
            "schedule": getattr(cfg, "schedule", "linear"), "branches": getattr(cfg, "decay_branches", "both"),
            "adds_per_block": 1 if getattr(cfg, "family", "") == "resnet" else 2}


def describe_model(model_cfg, skips: bool | None = None) -> str:
    """``describe_shortcut`` of a model config, its branch gains and drops where set (``nn.branch_scale``:
    ``decay linear alpha_min 0.6 + layerscale 1e-05 + drop_identity 0.1``), ``, skips`` for a U-Net MAE's long
    skips (``skips``, default the config's own) and ``, hc x4 streams`` for hyper-connections (``nn.hyper``): the
    label of a run in tables and legends. A classifier's gains are its encoder's; its drops are fine-tuning's own,
    so none of the encoder's is named."""
    skips = getattr(model_cfg, "skips", None) if skips is None else skips
    if hasattr(model_cfg, "encoder_config"):
        cfg = model_cfg.encoder_config()
        branch = describe_branch(dataclasses.replace(cfg, drop_branch=0.0, drop_identity=0.0))
    else:
        cfg, branch = model_cfg, describe_branch(model_cfg)
    streams = getattr(cfg, "hyper_streams", 1)
    hyper = f", {getattr(cfg, 'hyper_variant', 'hc')} x{streams} streams" if streams > 1 else ""
    return describe_shortcut(**shortcut_settings(model_cfg)) + branch + (", skips" if skips else "") + hyper


def knob_warnings(shortcut: str, alpha_min: float, schedule: str, adds_per_block: int = 2,
                  keys: tuple[str, str, str] = ("model.shortcut", "model.alpha_min", "model.schedule")) -> list[str]:
    """One warning line when a knob is set away from its neutral value (alpha_min 1, the linear
    schedule) but the formula ignores it, e.g. ``model.alpha_min=0.6`` with ``scaled_sum``; else []."""
    skey, akey, schkey = keys
    ignored = ignored_knobs(shortcut, adds_per_block)
    unused = []
    if "alpha_min" in ignored and float(alpha_min) != 1.0:
        unused.append(f"{akey}={float(alpha_min):g}")
    if "schedule" in ignored and schedule != "linear":
        unused.append(f"{schkey}={schedule}")
    if not unused:
        return []
    return [f"warning: {' and '.join(unused)} {'has' if len(unused) == 1 else 'have'} no effect: {skey}={shortcut} "
            f"does not read {'it' if len(unused) == 1 else 'them'} (its factors are the same for every value)"]
