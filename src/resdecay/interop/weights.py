"""Decayed models travel with their alphas: save / load beside the weights, strict loading.

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
from typing import Any, Mapping

import torch
import torch.nn as nn

from ..errors import CheckpointError
from ..io import atomic_save, safe_load
from ..nn.decayify import decayify
from ..nn.spec import COMPILED_PREFIX, LEGACY_SPEC_KEYS, SPEC_KEYS, check_spec, unwrap_compiled  # noqa: F401  (public here before)
from .files import write_bytes_atomically

FORMAT = "resdecay-decayified-v1"
class SpecIgnoredWarning(UserWarning):
    """A checkpoint carries a ``resdecay_spec`` but the model it is loaded into is not decayified."""


WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors")


def read_weights_file(path: str | Path) -> Any:
    """The contents of a weights file on CPU, or a one-line CheckpointError: ``torch.load(path,
    weights_only=True)``, or for ``.safetensors`` ``{"model": tensors, "metadata": {...}}`` (with
    ``resdecay_spec`` parsed from the metadata where ``resdecay export`` stored it).

    Args:
        path: a ``.pt`` / ``.pth`` / ``.safetensors`` file.
    """
    path = Path(path)
    if path.is_dir():
        inside = sorted(p.name for p in path.iterdir() if p.suffix in WEIGHT_SUFFIXES)[:3]
        hint = f" (it holds {', '.join(inside)})" if inside else f" (it holds no {' / '.join(WEIGHT_SUFFIXES)} file)"
        raise CheckpointError(f"{path} is a folder; pass the checkpoint file itself, a .pt / .pth / .safetensors file{hint}")
    if not path.is_file():
        raise CheckpointError(f"{path} does not exist; pass a checkpoint file")
    if path.suffix == ".safetensors":
        return read_safetensors(path)
    return safe_load(path, CheckpointError, f"{path} is not a readable weights file ({{reason}})")


def read_safetensors(path: Path) -> dict:
    """``{"model": tensors, "metadata": {...}}`` of a safetensors file (it holds no code to run);
    ``resdecay_spec`` beside them when the metadata carries one."""
    from safetensors import safe_open
    from safetensors.torch import load_file

    try:
        with safe_open(str(path), framework="pt") as f:
            meta = dict(f.metadata() or {})
        state = load_file(str(path))
    except Exception as e:
        raise CheckpointError(f"{path} is not a readable safetensors file ({' '.join(str(e).split())[:120]})") from None
    blob: dict[str, Any] = {"model": state, "metadata": meta}
    if "resdecay_spec" in meta:
        try:
            blob["resdecay_spec"] = json.loads(meta["resdecay_spec"])
        except ValueError as e:
            raise CheckpointError(f"{path}: its resdecay_spec metadata is not JSON ({e}); export it again") from None
    return blob


def state_dict_of(obj: Any, source: str) -> dict[str, torch.Tensor]:
    """The state_dict inside a loaded checkpoint: ``obj["model"]``, ``obj["state_dict"]`` or ``obj``.

    Args:
        obj: what ``torch.load`` returned.
        source: where it came from, for the error message.
    """
    if isinstance(obj, Mapping):
        for key in ("model", "state_dict"):
            if isinstance(obj.get(key), Mapping):
                obj = obj[key]
                break
        if obj and all(isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
            return dict(obj)
    raise CheckpointError(f"{source} holds no state_dict (expected a dict of tensors, or one under 'model')")


def without_compiled_prefix(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` with the ``_orig_mod.`` of a compiled model's ``state_dict`` taken off (files written from
    ``torch.compile(model).state_dict()``); other states as they are."""
    if state and all(k.startswith(COMPILED_PREFIX) for k in state):
        return {k[len(COMPILED_PREFIX):]: v for k, v in state.items()}
    return dict(state)


def load_strict(model: nn.Module, state: Mapping[str, torch.Tensor], source: str) -> None:
    """``model.load_state_dict(state)`` that names the first mismatch in one line. A ``torch.compile``
    wrapper on either side (the model, or ``_orig_mod.`` keys in the file) is looked through.

    Args:
        model: the target module.
        state: the weights (keys as ``model.state_dict()``).
        source: where they came from, for the error message.

    Raises:
        CheckpointError: missing keys, unexpected keys, or a tensor of another shape.
    """
    model, state = unwrap_compiled(model), without_compiled_prefix(state)
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k} {tuple(state[k].shape)} vs model {tuple(v.shape)}" for k, v in own.items()
              if k in state and tuple(state[k].shape) != tuple(v.shape)]
    problems = []
    if missing:
        problems.append(f"{len(missing)} missing key(s) (first {missing[0]})")
    if unexpected:
        problems.append(f"{len(unexpected)} unexpected key(s) (first {unexpected[0]})")
    if shapes:
        problems.append(f"{len(shapes)} shape mismatch(es) (first {shapes[0]})")
    if problems:
        raise CheckpointError(f"{source} does not fit {type(model).__name__}: {'; '.join(problems)}; "
                              "build the model with the checkpoint's dimensions")
    model.load_state_dict(state, strict=True)


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
