"""Models trained elsewhere, built for measurement (``resdecay eval --model SPEC [--weights FILE]``).

    timm:NAME          ``timm.create_model(NAME, pretrained=False, **model_args)``, then ``--weights`` (a
                       state_dict, a training checkpoint holding one under ``model`` / ``state_dict``,
                       safetensors, or a ``save_decayified`` file whose decay is re-applied first). The
                       head's size is read from the file (``num_classes`` 0 when it has no head).
    torchvision:NAME   ``torchvision.models.get_model(NAME, weights=None, **model_args)``, then ``--weights``
    FOLDER             a transformers ``save_pretrained`` folder (config.json's ``architectures``), or a
                       diffusers one (its ``_class_name``); a decay or U-Net skips that resdecay recorded in
                       config.json are restored (``hf_unet.restore``)

Each is a registered ``ModelFormat`` (``register_model_format``: a spec no built-in takes, e.g. an
``open_clip:NAME``, is one entry, refused on a name clash unless ``replace=True`` as every registry of the
package); ``load_foreign`` hands the spec to the first format that takes it. Nothing is downloaded: timm
and torchvision build from their code with random weights, folders load with ``local_files_only``. Without
``--weights`` the weights are drawn with seed 0 (the random-init baseline's). ``model_args``
(``--model-arg KEY=VALUE``) go to the constructor, except
``timestep`` and ``class_label``: the fixed conditioning a diffusion backbone is run with (default 500 and 0
for a diffusers model). Each failure is one line naming the spec and the fix.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from ..errors import CheckpointError, Registry, RegistryError, UserError, defined_at, one_line
from ..nn.decayify import decayify
from ..nn.spec import check_spec
from .checkpoint_io import load_strict, read_weights_file, state_dict_of
from .hf_unet import restore

CONDITIONING = ("timestep", "class_label")  # model_args that are run-time inputs, not constructor arguments
INPUTS = ("img_size", "in_chans")  # model_args the evaluators read too
HEADS = {"timm": ("head.weight", "num_classes"), "torchvision": ("fc.weight", "num_classes")}


@dataclass(eq=False)  # compared by identity: two loads of one spec are two models
class ForeignModel:
    """A model built from a spec, with what the evaluators need besides it.

    Args:
        model: the network, weights loaded (decayified when the file says so).
        fresh: builds the same architecture, with the same decay, freshly initialised (the random-init baseline).
        source: the spec as given; weights: the weights file, or None.
        conditioning: the fixed values a diffusion backbone is run with after x.
        kwargs: the constructor arguments given; inputs: the ``img_size`` / ``in_chans`` among them.
    """

    model: nn.Module
    fresh: Callable[[], nn.Module]
    source: str
    weights: str | None
    conditioning: tuple = ()
    kwargs: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)


def _library(name: str):
    try:
        return __import__(name)
    except ImportError:
        raise UserError(f"--model {name}:... needs the {name} package: pip install {name}") from None


def _decayed(build: Callable[[], nn.Module], spec: dict | None) -> Callable[[], nn.Module]:
    def fresh() -> nn.Module:
        model = build()
        if spec is not None:
            decayify(model, **spec)
            model.resdecay_spec = spec
        return model
    return fresh


def _from_registry(spec: str, weights: str | None, kwargs: dict) -> tuple[nn.Module, Callable]:
    """timm / torchvision: build by name (random weights), then the file's weights, its decay first."""
    lib, _, name = spec.partition(":")
    blob = read_weights_file(weights) if weights else None
    state = state_dict_of(blob, weights) if blob is not None else None
    head_key, head_arg = HEADS[lib]
    if state is not None and head_arg not in kwargs:
        kwargs = {**kwargs, head_arg: int(state[head_key].shape[0]) if head_key in state else 0}
    module = _library(lib)
    if lib == "torchvision":  # its constructors take no input size: the evaluators read it (ForeignEncoder)
        kwargs = {k: v for k, v in kwargs.items() if k not in INPUTS}

    def build() -> nn.Module:
        try:
            if lib == "timm":
                return module.create_model(name, pretrained=False, **kwargs)
            import torchvision.models  # noqa: PLC0415  (torchvision's registry; imported with the spec that names it)

            return torchvision.models.get_model(name, weights=None, **kwargs)
        except (RuntimeError, ValueError, TypeError, KeyError) as e:
            raise UserError(f"--model {lib}:{name}: {str(e).splitlines()[0]} (check the name and --model-arg)") from None

    spec = None
    if isinstance(blob, dict) and "resdecay_spec" in blob:
        spec = check_spec(blob["resdecay_spec"], str(weights))
    fresh = _decayed(build, spec)
    if state is None:  # random weights: drawn with seed 0, so that the feature cache's key (the spec) names them
        torch.manual_seed(0)
    model = fresh()
    if state is not None:
        load_strict(model, state, str(weights))
    return model, fresh


def _from_folder(spec: str, weights: str | None, kwargs: dict) -> tuple[nn.Module, Callable]:
    """A transformers or diffusers save_pretrained folder; resdecay's recorded decay restored."""
    folder = Path(spec)
    try:
        config = json.loads((folder / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"--model {folder}: no readable config.json ({e}); pass a save_pretrained folder") from None
    if "_class_name" in config:  # diffusers
        lib = _library("diffusers")
        cls = getattr(lib, config["_class_name"], None)
        load = lambda: cls.from_pretrained(folder, **kwargs)  # noqa: E731
        fresh_base = lambda: cls.from_config(cls.load_config(folder), **kwargs)  # noqa: E731
    else:
        lib = _library("transformers")
        arch = (config.get("architectures") or ["AutoModel"])[0]
        cls = getattr(lib, arch, None)
        load = lambda: cls.from_pretrained(folder, local_files_only=True, **kwargs)  # noqa: E731
        fresh_base = lambda: cls(lib.AutoConfig.from_pretrained(folder, local_files_only=True, **kwargs))  # noqa: E731
    if cls is None:
        raise UserError(f"--model {folder}: {config.get('_class_name') or arch} is not a class of the installed "
                        f"{lib.__name__} {lib.__version__}; upgrade it")
    recorded = "resdecay" in config

    def fresh() -> nn.Module:
        model = fresh_base()
        return restore(model) if recorded else model

    try:
        model = load()
    except (OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"--model {folder}: {str(e).splitlines()[0]}") from None
    return (restore(model, folder) if recorded else model), fresh


@dataclass(frozen=True)
class ModelFormat:
    """One way of naming a model trained elsewhere (``--model SPEC``).

    Args:
        name: the registry's key; by default also the spec's prefix (``timm`` takes ``timm:NAME``).
        load: ``load(spec, weights, model_args) -> (model, fresh)``: the model with its weights (a recorded
            decay re-applied), and a function of no arguments that builds the same architecture with the
            same decay, freshly initialised (the random-init baseline).
        written: how a spec of this format is written, for the refusal of a spec no format takes.
        takes_weights: ``--weights FILE`` applies (a folder holds its own weights).
        matches: ``matches(spec) -> bool``; None: the spec starts with ``name:``.
    """

    name: str
    load: Callable[[str, str | None, dict], tuple[nn.Module, Callable[[], nn.Module]]]
    written: str
    takes_weights: bool = False
    matches: Callable[[str], bool] | None = None

    def takes(self, spec: str) -> bool:
        return self.matches(spec) if self.matches is not None else spec.startswith(f"{self.name}:")


MODEL_FORMATS: dict[str, ModelFormat] = {}  # by name, tried in registration order
_FORMATS = Registry("model format", "register_model_format", MODEL_FORMATS, origin=lambda f: f"by {defined_at(f.load)}")


def register_model_format(fmt: ModelFormat, replace: bool = False) -> ModelFormat:
    """Add a ``--model`` format; a name that is taken is refused (``RegistryError``) unless ``replace=True``, and
    so is an entry that cannot work (a name that is no spec prefix, a ``load`` that is no function)."""
    if not isinstance(fmt, ModelFormat):
        raise RegistryError(f"register_model_format takes a ModelFormat(name, load, written), not {type(fmt).__name__}")
    if not isinstance(fmt.name, str) or not fmt.name or any(c in fmt.name for c in ": /\\"):
        raise RegistryError(f"model format name {fmt.name!r} must be a word without ':', spaces or slashes (it is "
                            "the spec's prefix, as timm in timm:NAME)")
    for field_name, ok in (("load", callable(fmt.load)), ("written", isinstance(fmt.written, str) and fmt.written),
                           ("matches", fmt.matches is None or callable(fmt.matches))):
        if not ok:
            raise RegistryError(f"model format {fmt.name!r}: {field_name} must be "
                                f"{'a non-empty string' if field_name == 'written' else 'a function'}")
    return _FORMATS.add(fmt.name, fmt, replace)


def unregister_model_format(name: str) -> ModelFormat:
    """Remove the format registered under ``name`` (``RegistryError`` if there is none); returns it."""
    return _FORMATS.remove(name)


def _listed(items: list[str], word: str) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} {word} {items[-1]}"


def model_format(spec: str, weights: str | None) -> ModelFormat:
    """The first registered format that takes ``spec``, with ``weights`` checked against it (one line otherwise)."""
    fmt = next((f for f in MODEL_FORMATS.values() if f.takes(spec)), None)
    if fmt is None:
        written = [f.written for f in MODEL_FORMATS.values()] or ["a registered format (none is registered)"]
        raise UserError(f"--model {spec!r} is neither {_listed(written, 'nor')} (a format of your own is one --plugin "
                        "file: docs/EXTENDING.md (f))")
    if fmt.takes_weights and weights is not None and not Path(weights).is_file():
        raise UserError(f"--weights {weights} does not exist; pass the weights file of {spec}")
    if not fmt.takes_weights and weights is not None:
        takers = [f.written for f in MODEL_FORMATS.values() if f.takes_weights] or ["no registered format"]
        raise UserError(f"--weights applies to {_listed(takers, 'and')}; {spec} is {fmt.written}, which holds its own "
                        "weights: drop --weights")
    return fmt


register_model_format(ModelFormat("timm", _from_registry, "timm:NAME", takes_weights=True))
register_model_format(ModelFormat("torchvision", _from_registry, "torchvision:NAME", takes_weights=True))
register_model_format(ModelFormat("folder", _from_folder, "a save_pretrained folder (transformers or diffusers)",
                                  matches=lambda spec: Path(spec).is_dir()))


def load_foreign(spec: str, weights: str | None = None, model_args: dict[str, Any] | None = None) -> ForeignModel:
    """The model ``spec`` names, with ``weights`` loaded, by the registered format that takes the spec (see
    the module docstring for the built-in ones).

    Args:
        spec: ``timm:NAME``, ``torchvision:NAME``, a transformers / diffusers folder, or a registered format's.
        weights: the weights file of a format that takes one (None: random weights, drawn with seed 0).
        model_args: constructor arguments, and ``timestep`` / ``class_label`` for a diffusion backbone.
    """
    args = dict(model_args or {})
    cond = {k: args.pop(k) for k in CONDITIONING if k in args}
    fmt = model_format(spec, weights)
    try:
        built = fmt.load(spec, weights, args)
    except UserError:
        raise
    except (TypeError, ValueError, RuntimeError, KeyError) as e:  # e.g. a constructor refusing a --model-arg
        raise UserError(f"--model {spec}: {one_line(e)} (the {fmt.name} format, {defined_at(fmt.load)}; check the "
                        "name and --model-arg)") from None
    if not (isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], nn.Module) and callable(built[1])):
        raise UserError(f"--model {spec}: the {fmt.name} format's load ({defined_at(fmt.load)}) returned "
                        f"{type(built).__name__}, not (model, fresh): an nn.Module and a function that builds it afresh")
    model, fresh = built
    diffusers = type(model).__module__.startswith("diffusers.")
    conditioning = (cond.get("timestep", 500), cond.get("class_label", 0)) if diffusers else tuple(cond.values())
    return ForeignModel(model.eval(), fresh, spec, weights, conditioning, args, {k: args[k] for k in INPUTS if k in args})
