"""The structure ``decayify`` records on a model (``model.resdecay_spec``), checked wherever it is read back
(a weights file, a library config, an export), and the model inside a ``torch.compile`` wrapper."""

from __future__ import annotations

from typing import Any, Mapping

import torch.nn as nn

from ..errors import CheckpointError
from ..schedule import BRANCHES, SCHEDULES
from .adapters import option_choices
from .residual import shortcut_names

SPEC_KEYS = ("alpha_min", "schedule", "branches", "shortcut")  # shortcut: only where not "decay"
LEGACY_SPEC_KEYS = ("zero_init",)  # in older files; read and ignored (an init, not structure)



def check_spec(spec: Any, source: str) -> dict:
    """A ``resdecay_spec`` as ``decayify`` records it, checked, or a one-line CheckpointError.

    The result holds the structure only (alpha_min, schedule, branches), so ``decayify(model,
    **spec)`` never re-initialises loaded weights; the ``zero_init`` that older files carry is
    dropped (applying it would overwrite the loaded weights).

    Args:
        spec: the stored spec (a dict with alpha_min, schedule, branches).
        source: where it came from, for the error message.
    """
    if not isinstance(spec, Mapping):
        raise CheckpointError(f"{source}: resdecay_spec must be a dict like model.resdecay_spec, got {type(spec).__name__}")
    options = option_choices()  # an MM-DiT's context_stream, a U-Net's unet_depth: decayify's adapter keywords
    unknown = sorted(set(spec) - set(SPEC_KEYS) - set(LEGACY_SPEC_KEYS) - set(options))
    if unknown or "alpha_min" not in spec:
        raise CheckpointError(f"{source}: resdecay_spec has keys {sorted(spec)}; expected {', '.join(SPEC_KEYS)} "
                              "(alpha_min required), as decayify records them")
    a = spec["alpha_min"]
    if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 < a <= 1:
        raise CheckpointError(f"{source}: resdecay_spec alpha_min must lie in (0, 1], got {a!r}")
    out = {"alpha_min": float(a), "schedule": spec.get("schedule", "linear"), "branches": spec.get("branches", "both")}
    if out["schedule"] not in SCHEDULES or out["branches"] not in BRANCHES:
        raise CheckpointError(f"{source}: resdecay_spec schedule {out['schedule']!r} / branches {out['branches']!r} unknown; "
                              f"schedules: {', '.join(SCHEDULES)}; branches: {', '.join(BRANCHES)}")
    if spec.get("shortcut", "decay") != "decay":
        if spec["shortcut"] not in shortcut_names():
            raise CheckpointError(f"{source}: resdecay_spec shortcut {spec['shortcut']!r} is not a registered formula "
                                  f"({', '.join(shortcut_names())}); register it (resdecay.register_shortcut) before loading")
        out["shortcut"] = spec["shortcut"]
    for key in sorted(set(spec) & set(options)):
        if spec[key] not in options[key]:
            raise CheckpointError(f"{source}: resdecay_spec {key} {spec[key]!r} is unknown; choose one of "
                                  f"{', '.join(options[key])}")
        out[key] = spec[key]
    return out


COMPILED_PREFIX = "_orig_mod."  # torch.compile's wrapper puts the model under this name


def unwrap_compiled(model: nn.Module) -> nn.Module:
    """The model inside a ``torch.compile`` wrapper (it shares its parameters), else ``model``."""
    inner = model._modules.get("_orig_mod") if type(model).__name__ == "OptimizedModule" else None
    return inner if isinstance(inner, nn.Module) else model
