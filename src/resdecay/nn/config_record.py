"""What resdecay did to a transformers / diffusers model, recorded in that model's own config, and
``restore``, which does it again to the model the library's ``from_pretrained`` gives back.

The rule: every way resdecay changes such a model -- ``decayify``, ``unet_skips``, both in either order,
``resdecay export --to hf-vitmae`` -- is written to ``model.config.resdecay`` (transformers: a config
attribute; diffusers: ``register_to_config``) in one versioned schema::

    {"version": 1, "steps": [
        {"op": "decayify", "on": "ViTMAEForPreTraining", "alpha_min": 0.6, "schedule": "linear", "branches": "both"},
        {"op": "unet_skips", "skip_sources": [3, 1], "decoder_start": "content_free"}]}

so the library's own ``save_pretrained`` writes it into config.json and its ``from_pretrained`` reads it back
(without acting on it: the decay is hooks, and the skips' ``resdecay_unet.`` weights are dropped as
unexpected keys). ``resdecay.interop.restore(model, folder)`` replays the steps in their order and loads
those weights. This module is the record (written by ``decayify`` and ``unet_skips``, read by ``restore``).

* ``decayify``: ``on`` is the class name of the module decayify was given (the model, or a part of it that
  shares its config: a ViTMAE's ``vit``), then the keys of its ``resdecay_spec``. A later decayify of the
  same module replaces its earlier step (it replaces every factor of that module).
* ``unet_skips`` (a ``ViTMAEForPreTraining``, once): skip sources and decoder start.
* ``note``: free text beside the steps (``export --to hf-vitmae`` says there what transformers does).

Also read, and written back in this schema by ``restore``: the sections earlier versions wrote,
``export --to hf-vitmae``'s ``{"alpha_min", "schedule", "decay_branches", "decoder_decay"}`` and
``unet_skips``' ``{"unet": {...}, "encoder": {...}}``. Anything else (a newer version, an unknown key,
step or module) is refused in one line. Nothing here imports transformers or diffusers.
"""

from __future__ import annotations

import copy
import gc
import sys
import threading
import warnings
from contextlib import contextmanager
from typing import Any, Mapping

import torch.nn as nn

from ..errors import UserError
from .adapters import option_choices
from .spec import check_spec, unwrap_compiled

VERSION = 1
KEY = "resdecay"
TOP_KEYS = ("version", "steps", "note")
STEP_KEYS = {"decayify": ("op", "on", "alpha_min", "schedule", "branches", "shortcut"),
             "unet_skips": ("op", "skip_sources", "decoder_start")}
LEGACY_EXPORT_KEYS = ("alpha_min", "schedule", "decay_branches", "decoder_decay", "note")
LEGACY_UNET_KEYS = ("unet", "encoder")
_LOCAL = threading.local()  # .replaying: restore is re-doing recorded steps (they are not recorded again)


class NotRecordedWarning(UserWarning):
    """decayify changed a part of a library model whose saved config it cannot reach."""


def library_of(model: nn.Module) -> str | None:
    """"transformers" / "diffusers" when ``model``'s own config is what that library's save_pretrained
    writes (a ``PreTrainedModel``; a diffusers ``ConfigMixin``), else None."""
    names = {f"{c.__module__.partition('.')[0]}.{c.__name__}" for c in type(model).__mro__}
    if "transformers.PreTrainedModel" in names and hasattr(model, "config"):
        return "transformers"
    if "diffusers.ConfigMixin" in names and hasattr(model, "register_to_config"):
        return "diffusers"
    return None


def read_section(model: nn.Module) -> Any:
    """The raw ``resdecay`` section of ``model``'s config (None when there is none)."""
    config = getattr(model, "config", None)
    if isinstance(config, Mapping):  # diffusers' FrozenDict
        return config.get(KEY)
    return getattr(config, KEY, None)


def write_section(model: nn.Module, steps: list[dict], note: str | None = None) -> None:
    section: dict[str, Any] = {"version": VERSION, "steps": [dict(s) for s in steps]}
    if note:
        section["note"] = note
    if library_of(model) == "diffusers":
        model.register_to_config(**{KEY: section})
    else:
        setattr(own_config(model), KEY, section)


def own_config(model: nn.Module):
    """``model.config``, first copied when another model shares the object, so that the record describes this
    model only. transformers keeps the config it is given: ``a = ViTMAEForPreTraining(c); b =
    ViTMAEForPreTraining(c)`` share ``c``, and a record written into it would make ``b`` save (and restore) a
    decay it never had. The copy goes to every module of this model's tree that holds the object (a ViTMAE's
    ``vit``, ``decoder``, embeddings ...: a part ``decayify`` was given shares it with its model); the other
    models keep the original. Who holds the object is asked of the garbage collector: the config does not know."""
    config = model.config
    mine = sum(1 for m in model.modules() if m.__dict__.get("config") is config)
    if sys.getrefcount(config) - 2 <= mine:  # no reference but this tree's (and this frame's two): nothing to scan
        return config
    holders = _holders(config)
    roots = [h for h in holders if any(m is model for m in h.modules())]  # model and the models it is a part of
    tree = max(roots, key=lambda h: sum(1 for _ in h.modules()), default=model)
    mine = {id(m) for m in tree.modules()}
    if all(id(h) in mine for h in holders):
        return config
    copied = copy.deepcopy(config)
    for h in holders:
        if id(h) in mine:
            h.config = copied
    return copied


def _holders(config: Any) -> list[nn.Module]:
    """The modules whose ``config`` attribute is ``config`` (an instance's attributes live in its ``__dict__``,
    or inline in the object itself on Python >= 3.11: either may be the referrer)."""
    refs = gc.get_referrers(config)
    found = {id(r): r for r in refs if isinstance(r, nn.Module) and r.__dict__.get("config") is config}
    dicts = [r for r in refs if isinstance(r, dict) and r.get("config") is config]
    owners = gc.get_referrers(*dicts) if dicts else []  # one pass over the heap for all of them
    found.update({id(o): o for o in owners if isinstance(o, nn.Module) and any(o.__dict__ is d for d in dicts)})
    return list(found.values())


# ----------------------------------------------------------------------------- reading the schema
def parse(section: Any, where: str) -> tuple[list[dict], str | None]:
    """(steps, note) of a ``resdecay`` section in this schema or an earlier one, checked, or one UserError line."""
    if not isinstance(section, Mapping):
        raise UserError(f"{where}: its 'resdecay' section is {type(section).__name__} {section!r:.60}, not a JSON object "
                        "as resdecay writes it")
    if "version" not in section:
        return _legacy_steps(section, where), section.get("note")
    version = section["version"]
    if type(version) is not int or version != VERSION:  # true == 1 in Python, not in the schema
        newer = isinstance(version, int) and not isinstance(version, bool) and version > VERSION
        raise UserError(f"{where}: its 'resdecay' section is schema version {version!r}; this resdecay reads version "
                        f"{VERSION}" + ("; upgrade resdecay to restore it" if newer else ""))
    unknown = sorted(set(section) - set(TOP_KEYS))
    if unknown or not isinstance(section.get("steps"), list) or not isinstance(section.get("note", ""), str):
        raise UserError(f"{where}: its 'resdecay' section has keys {sorted(section)}; version {VERSION} has "
                        f"{', '.join(TOP_KEYS)} (steps a list, note a string)")
    return [check_step(step, f"{where} step {i}") for i, step in enumerate(section["steps"])], section.get("note")


def check_step(step: Any, where: str) -> dict:
    """One step, its values checked (decayify's as ``check_spec`` checks a spec)."""
    op = step.get("op") if isinstance(step, Mapping) else None
    if not isinstance(op, str) or op not in STEP_KEYS:
        raise UserError(f"{where}: {step!r} is not a resdecay step (op must be one of {', '.join(STEP_KEYS)})")
    unknown = sorted(set(step) - set(STEP_KEYS[op]) - (set(option_choices()) if op == "decayify" else set()))
    if unknown:
        raise UserError(f"{where}: a {op} step with unknown key(s) {', '.join(unknown)}; it has {', '.join(STEP_KEYS[op])}")
    if op == "unet_skips":
        sources, start = step.get("skip_sources"), step.get("decoder_start")
        if not isinstance(sources, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in sources) \
                or start not in ("content_free", "encoder"):
            raise UserError(f"{where}: an unet_skips step needs skip_sources (a list of layer indices) and decoder_start "
                            f"('content_free' or 'encoder'), got {dict(step)!r}")
        return {"op": op, "skip_sources": list(sources), "decoder_start": start}
    if not isinstance(step.get("on"), str) or not step["on"]:
        raise UserError(f"{where}: a decayify step needs 'on', the class name of the module it decayed")
    spec = check_spec({k: v for k, v in step.items() if k not in ("op", "on")}, where)
    return {"op": op, "on": step["on"], **spec}


def _legacy_steps(section: Mapping, where: str) -> list[dict]:
    """The steps of a section written before the schema had a version."""
    if set(section) & set(LEGACY_UNET_KEYS):  # unet_skips: {"unet": {...}, "encoder": {...}}
        unknown = sorted(set(section) - set(LEGACY_UNET_KEYS))
        if unknown:
            raise UserError(f"{where}: its 'resdecay' section has unknown key(s) {', '.join(unknown)} beside "
                            f"{', '.join(LEGACY_UNET_KEYS)}")
        bad = next((k for k in LEGACY_UNET_KEYS if section.get(k) is not None and not isinstance(section[k], Mapping)),
                   None)
        if bad:
            raise UserError(f"{where}: its 'resdecay' section's {bad!r} is {section[bad]!r:.60}, not a JSON object")
        steps = []
        if section.get("encoder"):
            steps.append(check_step({"op": "decayify", "on": "ViTMAEModel", **section["encoder"]}, where))
        if section.get("unet"):
            steps.append(check_step({"op": "unet_skips", **section["unet"]}, where))
        return steps
    unknown = sorted(set(section) - set(LEGACY_EXPORT_KEYS))
    if unknown or "alpha_min" not in section:  # export --to hf-vitmae: the MAE's decay fields
        raise UserError(f"{where}: its 'resdecay' section has keys {sorted(section)} and no version; resdecay wrote "
                        f"either version {VERSION} ({', '.join(TOP_KEYS)}) or, before it, {', '.join(LEGACY_EXPORT_KEYS)}")
    decay = {"alpha_min": section["alpha_min"], "schedule": section.get("schedule", "linear"),
             "branches": section.get("decay_branches", "both")}
    if not isinstance(section.get("decoder_decay", False), bool):
        raise UserError(f"{where}: its 'resdecay' section's decoder_decay is {section['decoder_decay']!r}, not true/false")
    ons = ["ViTMAEModel", "ViTMAEDecoder"] if section.get("decoder_decay") else ["ViTMAEModel"]
    return [check_step({"op": "decayify", "on": on, **decay}, where) for on in ons]


# ----------------------------------------------------------------------------- recording
def recorder(model: nn.Module, op: str):
    """Before ``op`` changes ``model``: a function ``record(step)`` to call once it has (None when
    nothing is recorded: not a library model, or ``restore`` replaying). Checks the existing record
    first, so that a refusal leaves the model as it was."""
    if getattr(_LOCAL, "replaying", False):
        return None
    model = unwrap_compiled(model)
    if library_of(model) is None:
        if op == "decayify" and type(model).__module__.startswith(("transformers.", "diffusers.")):
            warnings.warn(f"decayify: {type(model).__name__} is a part of a {type(model).__module__.partition('.')[0]} "
                          "model without a config that its save_pretrained writes, so this decay is not recorded: "
                          "decayify the whole model or its base model (e.g. model.vit) instead, or save with "
                          "resdecay.save_decayified", NotRecordedWarning, stacklevel=3)
        return None
    where = f"{type(model).__name__}.config"

    def current() -> tuple[list[dict], str | None]:
        section = read_section(model)
        return parse(section, where) if section is not None else ([], None)

    steps, _ = current()  # refused here, before the change, when it cannot be read
    if op == "unet_skips" and any(s["op"] == "unet_skips" for s in steps):
        raise UserError(f"unet_skips: {where} records skips this model does not have (from_pretrained drops their "
                        "weights); bring them back with resdecay.interop.restore(model, folder)")

    def record(step: dict) -> None:
        steps, note = current()  # as it is now: the change may have recorded steps of its own (unet_skips' decayify)
        if step["op"] == "decayify":  # a later decayify of one module replaces every factor of the earlier one
            steps = [s for s in steps if not (s["op"] == "decayify" and s["on"] == step["on"])]
        write_section(model, [*steps, step], note)

    return record


@contextmanager
def replaying():
    _LOCAL.replaying = True
    try:
        yield
    finally:
        _LOCAL.replaying = False
