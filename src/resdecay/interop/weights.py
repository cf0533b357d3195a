"""Decayed models travel with their alphas: save / load beside the weights, strict loading (the
readers and ``load_strict`` are ``checkpoint_io.py``'s, shared by every format; they stay importable here).

``decayify`` adds no parameter, so a decayified model's ``state_dict`` is the original model's,
key for key, and loads into a plain model without complaint -- and without the decay. The
settings that rebuild the decay live in ``model.resdecay_spec``; ``save_decayified`` stores them
next to the weights::

    {"format": "resdecay-decayified-v1", "model": state_dict, "resdecay_spec": {...}}

and ``load_decayified`` re-applies ``decayify`` from them before loading. ``sd["model"]`` stays a
plain state_dict, so ``timm.create_model(...).load_state_dict(torch.load(path)["model"])`` works
(that model then runs without decay; resdecay's own loaders warn when a spec is left unused).

Every loader here refuses, in one line, weights that do not fit: missing or unexpected keys,
other shapes, a spec that is not one ``decayify`` wrote.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Mapping

import torch.nn as nn

from ..errors import CheckpointError
from ..io import atomic_save
from ..nn.decayify import decayify
from ..nn.spec import COMPILED_PREFIX, LEGACY_SPEC_KEYS, SPEC_KEYS, check_spec, unwrap_compiled  # noqa: F401  (public here before)
from .checkpoint_io import (  # noqa: F401  (the readers live in checkpoint_io.py, shared by every format; public here before)
    WEIGHT_SUFFIXES,
    load_strict,
    read_safetensors,
    read_weights_file,
    state_dict_of,
    without_compiled_prefix,
)
from .files import write_bytes_atomically

FORMAT = "resdecay-decayified-v1"


class SpecIgnoredWarning(UserWarning):
    """A checkpoint carries a ``resdecay_spec`` but the model it is loaded into is not decayified."""


def save_decayified(model: nn.Module, path: str | Path, extra: dict | None = None) -> Path:
    """Write a decayified model's weights with its ``resdecay_spec`` beside them (atomically).

    A ``.safetensors`` path is written as safetensors, the spec in its metadata (``extra`` values
    as JSON strings there), so the alphas travel with that format too.

    Args:
        model: a model ``decayify`` was applied to (it carries ``model.resdecay_spec``), or its
            ``torch.compile`` wrapper (the keys written are the model's own, without ``_orig_mod.``).
        path: the file to write (``torch.save`` format, loads with ``weights_only=True``; or ``.safetensors``).
        extra: more plain entries to store (e.g. ``{"epoch": 3}``); may not replace the above.

    Returns:
        The path written.
    """
    model = unwrap_compiled(model)
    spec = getattr(model, "resdecay_spec", None)
    if spec is None:
        raise CheckpointError(f"{type(model).__name__} is not decayified (no model.resdecay_spec); call "
                              "resdecay.decayify(model, ...) first, or save a plain model with torch.save")
    spec = check_spec(spec, "model.resdecay_spec")
    clash = sorted(set(extra or {}) & {"format", "model", "resdecay_spec"})
    if clash:
        raise CheckpointError(f"save_decayified: extra may not set {clash[0]!r}")
    path = Path(path)
    if path.suffix == ".safetensors":
        _save_safetensors(model, spec, extra or {}, path)
    else:
        atomic_save({**(extra or {}), "format": FORMAT, "model": model.state_dict(), "resdecay_spec": spec}, path)
    return path


def _save_safetensors(model: nn.Module, spec: dict, extra: dict, path: Path) -> None:
    """``save_decayified`` as safetensors: the spec (and ``extra``) as JSON in the metadata."""
    from safetensors.torch import save

    try:
        meta = {**{k: json.dumps(v) for k, v in extra.items()}, "format": FORMAT, "resdecay_spec": json.dumps(spec)}
    except TypeError as e:
        raise CheckpointError(f"save_decayified: extra must hold JSON values for a .safetensors file ({e})") from None
    state = {k: v.detach().to("cpu").contiguous().clone() for k, v in model.state_dict().items()}
    write_bytes_atomically(save(state, metadata=meta), path)


def load_decayified(path: str | Path, model: nn.Module) -> nn.Module:
    """Re-apply the stored decay to ``model`` (built as the saved one, e.g. the same timm
    architecture), then load the weights strictly. Returns ``model`` (in place).

    Args:
        path: a file written by ``save_decayified``.
        model: the target; its current decay settings, if any, are replaced by the stored ones.
    """
    blob = read_weights_file(path)
    if not isinstance(blob, Mapping) or "resdecay_spec" not in blob:
        raise CheckpointError(f"{path} carries no resdecay_spec, so its alphas are unknown; write it with "
                              "resdecay.save_decayified(model, path), or load a plain model with load_state_dict")
    spec = check_spec(blob["resdecay_spec"], str(path))  # structure only: a stored zero_init is dropped
    state = state_dict_of(blob, str(path))
    inner = unwrap_compiled(model)  # a compiled model: decayify and load the model inside (it shares the weights)
    decayify(inner, **spec)
    load_strict(inner, state, str(path))
    inner.resdecay_spec = spec
    return model


def load_weights(model: nn.Module, source: str | Path | Mapping) -> nn.Module:
    """Load weights strictly *without* applying any stored decay (the plain path).

    When the checkpoint carries a ``resdecay_spec`` and ``model`` is not decayified, the model
    will run without the decay it was trained with: this warns once (``SpecIgnoredWarning``);
    ``load_decayified`` is the loader that re-applies it.

    Args:
        model: the target module.
        source: a checkpoint path or an already loaded checkpoint dict / state_dict.
    """
    name = str(source) if isinstance(source, (str, Path)) else "checkpoint dict"
    blob = read_weights_file(source) if isinstance(source, (str, Path)) else source
    state = state_dict_of(blob, name)
    if isinstance(blob, Mapping) and "resdecay_spec" in blob and getattr(unwrap_compiled(model), "resdecay_spec", None) is None:
        spec = check_spec(blob["resdecay_spec"], name)
        warnings.warn(f"{name} was saved from a decayified model (alpha_min {spec['alpha_min']:g}, {spec['schedule']}) but "
                      f"{type(model).__name__} is not decayified, so it runs without the decay; use "
                      "resdecay.load_decayified(path, model)", SpecIgnoredWarning, stacklevel=2)
    load_strict(model, state, name)
    return model
