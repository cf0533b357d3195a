"""``config.json`` of a ``save_pretrained`` folder: what rebuilds the model and its shortcut factors.

Two kinds of model are shared:

    resdecay      a model of a registered family (``model.cfg``): ``family`` and ``model`` (every
                  field of its config, alpha_min, schedule, shortcut, decay_branches, skips ...
                  included) rebuild it with ``build_model``; the run's ``preset`` / ``data`` /
                  ``train`` sections ride along when known
    decayified    a timm or torchvision model ``resdecay.decayify`` was applied to: ``resdecay_architecture``
                  (library, registered name, the keyword arguments it was created with) rebuilds
                  it and ``resdecay_spec`` re-applies the decay

Both carry ``alpha``: the decay settings, ``alpha_eff`` and every block's factors as the saved
model used them. ``from_pretrained`` compares the factors of the model it rebuilt with these, so a
folder whose alphas cannot be reproduced (an edited config, a schedule that changed between
versions) is refused in one line instead of loading as a different function.

``architecture`` holds a string that names no timm model (``timm_guard``): timm's own hub loaders
(``timm.create_model("local-dir:FOLDER")`` / ``"hf-hub:user/name"``) read that key as a timm model
name, and refuse such a folder in their own words, ``Unknown model (resdecay:mae ...: load it with
resdecay.from_pretrained)``. Loading it as a timm model would drop the decay without a word.
Folders saved before keep their architecture dict under ``architecture`` and still load.
"""

from __future__ import annotations

import dataclasses
import json
import math
from typing import Any

import torch
import torch.nn as nn

from .._version import __version__
from ..errors import CheckpointError, UserError
from ..models import FAMILIES, ModelConfig, build_model
from ..nn.decayify import alphas_of, decayify
from ..nn.spec import check_spec
from ..schedule import effective_decay
from ..train.checkpoint import upgrade_config
from ..train.config import RunConfig, from_dict

FORMAT = "resdecay-pretrained-v1"
KINDS = ("resdecay", "decayified")
# the model settings that decide the shortcut factors (where a family has them)
ALPHA_FIELDS = ("alpha_min", "schedule", "shortcut", "decay_branches", "decoder_decay", "skips", "skip_sources")
LIBRARIES = ("timm", "torchvision")
SAVE_FIX = "save it again with resdecay.save_pretrained (or resdecay export --to hf)"


# ----------------------------------------------------------------------------- describing a model
def family_config(model: nn.Module) -> ModelConfig | None:
    """The config of the registered family ``model`` was built from, or None for a foreign model.

    Models keep their config as an attribute, not always ``model.cfg``: a classifier's ``cfg`` is
    its encoder's MAE config and its own is ``head_cfg``. The config whose family builds exactly
    this model's class wins.
    """
    found = [c for c in vars(model).values() if isinstance(c, ModelConfig) and dataclasses.is_dataclass(c)
             and getattr(c, "family", None) in FAMILIES and type(c) is FAMILIES[c.family].config]
    # the class itself: a model with hub methods (hub_model.py) is an instance of a generated subclass
    cls = getattr(type(model), "_resdecay_base", type(model))
    exact = [c for c in found if FAMILIES[c.family].build is cls]
    return (exact or found or [None])[0]


def alpha_settings(cfg: ModelConfig) -> dict:
    """The decay settings of a model config (a classifier's are its encoder's)."""
    src = cfg.encoder_config() if callable(getattr(cfg, "encoder_config", None)) else cfg
    return {k: getattr(src, k) for k in ALPHA_FIELDS if hasattr(src, k)}


def alpha_section(model: nn.Module, settings: dict) -> dict:
    """``settings`` with ``alpha_eff`` and every residual block's factors as ``model`` uses them.

    ``alpha_eff`` is the product of every factor of ``model.alphas`` (the encoder / backbone table,
    what a run's summary reports) where the model has one, else of every factor ``alphas_of`` finds.
    """
    factors = [[name, [float(a) for a in fs]] for name, fs in alphas_of(model)]
    table = getattr(model, "alphas", None)
    if isinstance(table, torch.Tensor):
        eff = effective_decay(table.detach())
    else:
        eff = math.prod(a for _, fs in factors for a in fs)
    return {**settings, "alpha_eff": eff, "factors": factors}


def describe_resdecay(model: nn.Module, cfg: ModelConfig, run: RunConfig | None) -> dict:
    """config.json of a registered family's model (``cfg``: its ``family_config``; ``run``: the run
    it came from, or None)."""
    if run is not None and dataclasses.asdict(run.model) != dataclasses.asdict(cfg):
        diff = next(k for k, v in dataclasses.asdict(cfg).items() if dataclasses.asdict(run.model).get(k) != v)
        raise UserError(f"the run's config describes another model (model.{diff}: run {getattr(run.model, diff, None)!r} vs "
                        f"model {getattr(cfg, diff)!r}); pass the run_dir / config the model came from")
    out = {**_header("resdecay", cfg.family), "family": cfg.family, "model": dataclasses.asdict(cfg)}
    spec = getattr(model, "resdecay_spec", None)  # decayify applied on top of the family's own decay
    if spec is not None:
        spec = check_spec(spec, "model.resdecay_spec")
        out["resdecay_spec"] = spec
    out["alpha"] = alpha_section(model, {**alpha_settings(cfg), **({"decayify": spec} if spec else {})})
    if run is not None:
        out.update({"preset": run.preset, "data": dataclasses.asdict(run.data), "train": dataclasses.asdict(run.train)})
    return out


def describe_decayified(model: nn.Module, architecture: str | None, model_kwargs: dict | None) -> dict:
    """config.json of a decayified timm / torchvision model; its architecture is checked to rebuild it."""
    spec = getattr(model, "resdecay_spec", None)
    if spec is None:
        raise UserError(f"{type(model).__name__} is neither a resdecay model (no model.cfg of a registered family) nor "
                        "decayified (no model.resdecay_spec); call resdecay.decayify(model, alpha_min=...) first")
    spec = check_spec(spec, "model.resdecay_spec")
    arch = architecture_of(model, architecture, model_kwargs)
    settings = {"alpha_min": spec["alpha_min"], "schedule": spec["schedule"], "shortcut": spec.get("shortcut", "decay"),
                "decay_branches": spec["branches"]}
    return {**_header("decayified", f"{arch['library']}/{arch['name']}"), "resdecay_architecture": arch, "resdecay_spec": spec,
            "alpha": alpha_section(model, settings)}


def timm_guard(what: str) -> str:
    """config.json's ``architecture``: no timm model name, so timm's loaders refuse the folder readably."""
    return f"resdecay:{what} (a resdecay model, not a timm one: load it with resdecay.from_pretrained)"


def _header(kind: str, what: str) -> dict:
    return {"format": FORMAT, "library_name": "resdecay", "resdecay_version": __version__, "kind": kind,
            "architecture": timm_guard(what)}


def architecture_dict(config: dict) -> dict | None:
    """The (library, name, kwargs) that rebuild a decayified model: ``resdecay_architecture``, or the
    ``architecture`` dict of a folder saved before it moved there."""
    arch = config.get("resdecay_architecture", config.get("architecture"))
    return arch if isinstance(arch, dict) else None


def architecture_of(model: nn.Module, name: str | None, kwargs: dict | None) -> dict:
    """``{"library", "name", "kwargs"}`` that rebuild ``model``'s architecture, checked by building it
    on the meta device (no memory) and comparing every weight's name and shape.

    Args:
        model: a timm or torchvision model.
        name: its registered name (default: timm's ``pretrained_cfg["architecture"]``, or what
            ``from_pretrained`` / ``load_exported`` recorded on the model).
        kwargs: the keyword arguments it was created with (default: the recorded ones, or none).
    """
    stored = getattr(model, "resdecay_architecture", None) or {}
    module = type(model).__module__
    library = next((lib for lib in LIBRARIES if module.startswith(lib + ".")), None)
    if library is None and module.startswith(("transformers.", "diffusers.")):
        raise UserError(f"resdecay.save_pretrained rebuilds timm and torchvision models by name; a {type(model).__name__} "
                        f"saves with its own model.save_pretrained(folder), whose config.json keeps the decay "
                        "(config.resdecay): reload it with from_pretrained, then resdecay.interop.restore(model, folder)")
    if library is None:
        raise UserError(f"save_pretrained rebuilds timm and torchvision models by name; a {module}.{type(model).__name__} "
                        "cannot be rebuilt from config.json: save its weights with resdecay.save_decayified(model, path)")
    if library == "timm":
        name = name or stored.get("name") or (getattr(model, "pretrained_cfg", None) or {}).get("architecture")
    else:
        name = name or stored.get("name")
    if not name:
        raise UserError(f"which {library} model is this {type(model).__name__}? pass architecture='resnet18' (its name in "
                        f"{library}'s registry) to save_pretrained")
    kwargs = dict(stored.get("kwargs", {}) if kwargs is None else kwargs)
    try:
        json.dumps(kwargs, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise UserError(f"model_kwargs must be JSON values (numbers, strings, lists) to travel in config.json ({e})") from None
    arch = {"library": library, "name": name, "kwargs": kwargs}
    with torch.device("meta"):
        built = build_architecture(arch, "save_pretrained")
    problem = shape_mismatch(built.state_dict(), model.state_dict())
    if problem:
        made_by = "timm.create_model" if library == "timm" else "torchvision.models.get_model"
        raise UserError(f"{library} {name!r} with model_kwargs {kwargs} does not build this model ({problem}); pass "
                        f"architecture= and model_kwargs= as given to {made_by}")
    return arch


def shape_mismatch(want: dict, have: dict) -> str | None:
    """The first difference in names or shapes between two state_dicts, in words (None: they agree)."""
    for k in want:
        if k not in have:
            return f"the model has no {k}"
        if tuple(want[k].shape) != tuple(have[k].shape):
            return f"{k} is {tuple(have[k].shape)}, not {tuple(want[k].shape)}"
    extra = next((k for k in have if k not in want), None)
    return f"the model has {extra}, which the architecture lacks" if extra else None


def build_architecture(arch: dict, source: str) -> nn.Module:
    """A fresh timm / torchvision model (no pretrained weights are downloaded)."""
    library, name, kwargs = arch.get("library"), arch.get("name"), arch.get("kwargs") or {}
    try:
        if library == "timm":
            import timm

            return timm.create_model(name, pretrained=False, **kwargs)
        if library == "torchvision":
            import torchvision

            return torchvision.models.get_model(name, weights=None, **kwargs)
    except Exception as e:  # an unknown name or keyword: one line, whatever the library raised
        raise CheckpointError(f"{source}: {library} cannot build {name!r} with {kwargs} "
                              f"({type(e).__name__}: {' '.join(str(e).split())[:120]})") from None
    raise CheckpointError(f"{source}: architecture library {library!r} is unknown; resdecay rebuilds {', '.join(LIBRARIES)} models")


# ----------------------------------------------------------------------------- rebuilding from config.json
def check_config(config: Any, source: str) -> dict:
    """A config.json that ``save_pretrained`` wrote and that states the alphas, or a one-line error."""
    if not isinstance(config, dict) or config.get("format") != FORMAT:
        raise CheckpointError(f"{source} was not written by resdecay.save_pretrained (no \"format\": \"{FORMAT}\"); "
                              "pass a folder written by resdecay.save_pretrained or resdecay export --to hf")
    if config.get("kind") not in KINDS:
        raise CheckpointError(f"{source}: kind {config.get('kind')!r} is not one of {', '.join(KINDS)}; {SAVE_FIX}")
    alpha = config.get("alpha")
    if not isinstance(alpha, dict) or not isinstance(alpha.get("factors"), list):
        raise CheckpointError(f"{source} carries no alpha section, so the model's shortcut factors are unknown; {SAVE_FIX}")
    if config["kind"] == "decayified" and "resdecay_spec" not in config:
        raise CheckpointError(f"{source} carries no resdecay_spec, so the decay of its {(architecture_dict(config) or {}).get('name', 'model')} "
                              f"is unknown; {SAVE_FIX}")
    return config


def run_config_of(config: dict, source: str) -> RunConfig:
    """The RunConfig a resdecay-kind config.json describes (default data / train sections where the
    folder was saved without its run)."""
    family = config.get("family")
    if family not in FAMILIES:
        raise CheckpointError(f"{source}: model family {family!r} is not registered here ({', '.join(sorted(FAMILIES))}); "
                              "import the file that registers it first (resdecay --plugin FILE.py)")
    raw = {"preset": config.get("preset", "pretrained"), "model": dict(config.get("model") or {}),
           "data": config.get("data") or {}, "train": config.get("train") or {}}
    upgrade_config(raw)
    try:
        return from_dict(raw)
    except UserError as e:
        raise CheckpointError(f"{source}: {e}") from None


def build_from_config(config: dict, source: str) -> tuple[nn.Module, RunConfig | None]:
    """The model config.json describes, decay applied, weights not yet loaded (and its RunConfig,
    None for a decayified model)."""
    if config["kind"] == "resdecay":
        run = run_config_of(config, source)
        model = build_model(run.model)
        if "resdecay_spec" in config:
            decayify(model, **check_spec(config["resdecay_spec"], source))
        return model, run
    spec = check_spec(config["resdecay_spec"], source)
    arch = architecture_dict(config)
    if arch is None:
        raise CheckpointError(f"{source} carries no architecture (library, name, kwargs), so the model cannot be rebuilt; {SAVE_FIX}")
    model = build_architecture(arch, source)
    decayify(model, **spec)
    model.resdecay_architecture = arch  # so save_pretrained of the loaded model needs no arguments
    return model, None


def check_factors(model: nn.Module, config: dict, source: str) -> None:
    """Refuse a model whose shortcut factors differ from the ones the folder was saved with."""
    saved = config["alpha"]["factors"]
    got = alpha_section(model, {})["factors"]
    if len(got) != len(saved):
        raise CheckpointError(f"{source}: the rebuilt model has {len(got)} residual blocks but config.json lists factors of "
                              f"{len(saved)}; the file was edited or comes from another model, {SAVE_FIX}")
    for (name, fs), want in zip(got, saved, strict=True):
        if [name, fs] != list(want):
            raise CheckpointError(f"{source}: the rebuilt {name} uses shortcut factors {fs} but config.json lists {want}; "
                                  "the file was edited or the schedule changed since resdecay "
                                  f"{config.get('resdecay_version', '?')}: {SAVE_FIX}")


# ----------------------------------------------------------------------------- config.json against the weights
# what builds the model and its factors: a difference in any of these loads a different function
MODEL_KEYS = ("kind", "family", "model", "architecture", "resdecay_architecture", "resdecay_spec", "alpha")


def _first_difference(a: Any, b: Any, path: str) -> tuple[str, Any, Any] | None:
    """The first place two JSON values differ, as (dotted path, a's value, b's value)."""
    if isinstance(a, dict) and isinstance(b, dict):
        for k in [*a, *(k for k in b if k not in a)]:
            found = _first_difference(a.get(k), b.get(k), f"{path}.{k}" if path else k)
            if found:
                return found
        return None
    return None if a == b else (path, a, b)


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_weights_metadata(config: dict, meta: dict, folder: str, config_name: str, weights_name: str) -> None:
    """Refuse a folder whose config.json and whose weights' own metadata (``resdecay_config``, which
    save_pretrained writes into model.safetensors) describe different models, naming the first
    setting that differs. Weights without that metadata have nothing to contradict.

    Args:
        config: config.json, already checked by ``check_config``.
        meta: the safetensors metadata of the weights.
        folder: the folder, for the message.
        config_name, weights_name: the two files' names.
    """
    if "resdecay_config" not in meta:
        return
    try:
        stated = json.loads(meta["resdecay_config"])
    except ValueError as e:
        raise CheckpointError(f"{folder}: the resdecay_config metadata of {weights_name} is not JSON ({e}); {SAVE_FIX}") from None
    if not isinstance(stated, dict):
        raise CheckpointError(f"{folder}: the resdecay_config metadata of {weights_name} is not a JSON object; {SAVE_FIX}")
    ours = {k: config.get(k) for k in MODEL_KEYS}
    theirs = {k: stated.get(k) for k in MODEL_KEYS}
    if "resdecay_spec" in meta:  # the bare file's own spec (load_decayified reads it) must agree too
        try:
            theirs["resdecay_spec"] = json.loads(meta["resdecay_spec"])
        except ValueError:
            pass  # read_safetensors already refused it
    diff = _first_difference(json.loads(json.dumps(ours)), theirs, "")
    if diff is not None:
        where, said, meta_said = diff
        raise CheckpointError(f"{folder}: {config_name} says {where} = {_short(said)} but the metadata of {weights_name} "
                              f"says {_short(meta_said)}; the two files come from different saves (or one was edited): "
                              f"{SAVE_FIX}")
