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

import inspect
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn as nn

from ..errors import CheckpointError, Registry, RegistryError, UserError, defined_at, one_line
from ..io import first_sentence
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
        kwargs: the constructor arguments given; inputs: the ``img_size`` / ``in_chans`` among them;
        settable_inputs: those a ``--model-arg`` can set (its format's ``settable_inputs``).
        random_weights: built with random weights (seed 0): a format that takes a weights file, given none.
            Nothing is downloaded, so ``timm:NAME`` alone is never the pretrained model.
    """

    model: nn.Module
    fresh: Callable[[], nn.Module]
    source: str
    weights: str | None
    conditioning: tuple = ()
    kwargs: dict = field(default_factory=dict)
    inputs: dict = field(default_factory=dict)
    settable_inputs: tuple[str, ...] = INPUTS
    random_weights: bool = False


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

    def create(args: dict) -> nn.Module:
        if lib == "timm":
            return module.create_model(name, pretrained=False, **args)
        import torchvision.models  # noqa: PLC0415  (torchvision's registry; imported with the spec that names it)

        return torchvision.models.get_model(name, weights=None, **args)

    def build() -> nn.Module:
        args = dict(kwargs)
        while True:
            try:
                return create(args)
            except TypeError as e:  # a timm CNN takes no img_size: the evaluators read it (load_foreign's inputs)
                refused = next((k for k in INPUTS if k in args and f"keyword argument '{k}'" in str(e)), None)
                if refused is None:
                    raise UserError(f"--model {lib}:{name}: {one_line(e)} (check the name and --model-arg)") from None
                del args[refused]
            except (RuntimeError, ValueError, KeyError) as e:
                raise UserError(f"--model {lib}:{name}: {one_line(e)} (check the name and --model-arg)") from None

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


WEIGHT_GLOBS = ("*.safetensors", "*.bin", "*.pt", "*.pth")  # the weight files a save_pretrained folder may hold
REMOTE_CODE = "trust_remote_code"  # transformers' opt-in to run a folder's own Python: --trust-remote-code only


def _folder_class(folder: Path, config: dict, trust_remote_code: bool) -> tuple[Any, Any]:
    """(library, model class) a save_pretrained folder names: diffusers' ``_class_name``, else transformers'
    ``architectures[0]`` (``AutoModel`` without one, as transformers loads it); one line for a name that is
    no model class of the installed library, or code of the folder's own that was not allowed to run."""
    diffusers = "_class_name" in config
    lib = _library("diffusers" if diffusers else "transformers")
    name = config["_class_name"] if diffusers else (config.get("architectures") or ["AutoModel"])[0]
    code = _remote_code(folder, config)
    if trust_remote_code:  # the auto class its auto_map names (AutoModel, AutoModelForImageClassification, ...)
        auto = next((getattr(lib, k) for k in config.get("auto_map") or {} if k != "AutoConfig" and hasattr(lib, k)), None)
        if not code or diffusers or auto is None:
            raise UserError(f"--trust-remote-code: {folder}/config.json names no transformers model code of its own "
                            "(no auto_map with a model class); drop the flag")
        return lib, auto
    cls = getattr(lib, name, None) if isinstance(name, str) else None
    if isinstance(cls, type) and issubclass(cls, nn.Module) or name == "AutoModel":
        return lib, cls
    if code:
        raise UserError(f"--model {folder}: {name} is the folder's own code ({', '.join(code)}), which resdecay runs "
                        "only with --trust-remote-code (read the file first: it runs with your permissions)")
    raise UserError(f"--model {folder}: config.json names {name!r}, which is not a model class of the installed "
                    f"{lib.__name__} {lib.__version__}; upgrade it, or fix {'_class_name' if diffusers else 'architectures'}")


def _remote_code(folder: Path, config: dict) -> list[str]:
    """The Python files of the folder that config.json's ``auto_map`` names (``"modeling_x.MyModel"`` -> modeling_x.py)."""
    auto_map = config.get("auto_map")
    refs = auto_map.values() if isinstance(auto_map, dict) else []
    names = {str(r).split("--")[-1].rpartition(".")[0] for r in refs if isinstance(r, str)}
    return sorted(str(folder / f"{n.replace('.', '/')}.py") for n in names if n)


def _unloadable(folder: Path, e: Exception) -> str:
    """Why ``from_pretrained(folder)`` failed, in the words ``--weights`` uses for the same file (resdecay's own
    readers: a pickle payload, a truncated safetensors file), else the library's first sentence."""
    for pattern in WEIGHT_GLOBS:
        for path in sorted(folder.glob(pattern)):
            try:
                read_weights_file(path)
            except CheckpointError as bad:
                return str(bad)
    return f"{folder}: {first_sentence(one_line(e))}"


def _from_folder(spec: str, weights: str | None, kwargs: dict) -> tuple[nn.Module, Callable]:
    """A transformers or diffusers save_pretrained folder; resdecay's recorded decay and skips restored."""
    folder = Path(spec)
    try:
        config = json.loads((folder / "config.json").read_text())
        if not isinstance(config, dict):
            raise ValueError(f"it holds a {type(config).__name__}, not a JSON object")
    except (OSError, ValueError) as e:
        raise UserError(f"--model {folder}: no readable config.json ({one_line(e)}); pass a save_pretrained folder") from None
    trust = bool(kwargs.pop(REMOTE_CODE, False))  # set by load_foreign for --trust-remote-code only
    lib, cls = _folder_class(folder, config, trust)
    diffusers = "_class_name" in config
    local = {} if diffusers else {"local_files_only": True, **({REMOTE_CODE: True} if trust else {})}
    if trust:
        print(f"warning: --trust-remote-code: running {', '.join(_remote_code(folder, config))} from {folder}")
    try:
        model = cls.from_pretrained(folder, **local, **kwargs)
    except Exception as e:  # noqa: BLE001  (the libraries raise OSError, pickle's, safetensors' and their own errors)
        raise CheckpointError(f"--model {_unloadable(folder, e)}") from None
    recorded = "resdecay" in config

    def fresh() -> nn.Module:  # the class from_pretrained gave (an AutoModel's concrete one), its config afresh
        if diffusers:
            base = cls.from_config(cls.load_config(folder), **kwargs)
        else:
            base = type(model)(lib.AutoConfig.from_pretrained(folder, **local, **kwargs))
        return restore(base, skip_weights=False) if recorded else base  # fresh skips too: nothing trained

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
        settable_inputs: which of ``img_size`` / ``in_chans`` a ``--model-arg`` sets for a model of this format
            (timm: both; torchvision: the side only, which its CNNs read at any size; a folder: neither, its config
            fixes them): what a refusal of images of another size or channel count suggests.
    """

    name: str
    load: Callable[[str, str | None, dict], tuple[nn.Module, Callable[[], nn.Module]]]
    written: str
    takes_weights: bool = False
    matches: Callable[[str], bool] | None = None
    settable_inputs: tuple[str, ...] = INPUTS

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
    if fmt.takes_weights and weights is not None and Path(weights).is_dir():
        inside = sorted(p.name for pattern in WEIGHT_GLOBS for p in Path(weights).glob(pattern))[:3]
        saved = (Path(weights) / "config.json").is_file()
        raise UserError(f"--weights {weights} is a folder" + (
            f", a save_pretrained one: measure it as --model {weights} (without --weights)" if saved else
            f"; pass the weights file of {spec} itself" + (f" (it holds {', '.join(inside)})" if inside else "")))
    if fmt.takes_weights and weights is not None and not Path(weights).is_file():
        raise UserError(f"--weights {weights} does not exist; pass the weights file of {spec}")
    if not fmt.takes_weights and weights is not None:
        takers = [f.written for f in MODEL_FORMATS.values() if f.takes_weights] or ["no registered format"]
        raise UserError(f"--weights applies to {_listed(takers, 'and')}; {spec} is {fmt.written}, which holds its own "
                        "weights: drop --weights")
    return fmt


register_model_format(ModelFormat("timm", _from_registry, "timm:NAME", takes_weights=True))
register_model_format(ModelFormat("torchvision", _from_registry, "torchvision:NAME", takes_weights=True,
                                  settable_inputs=("img_size",)))
register_model_format(ModelFormat("folder", _from_folder, "a save_pretrained folder (transformers or diffusers)",
                                  settable_inputs=(),
                                  matches=lambda spec: Path(spec).is_dir()))


def load_foreign(spec: str, weights: str | None = None, model_args: dict[str, Any] | None = None,
                 trust_remote_code: bool = False) -> ForeignModel:
    """The model ``spec`` names, with ``weights`` loaded, by the registered format that takes the spec (see
    the module docstring for the built-in ones).

    Args:
        spec: ``timm:NAME``, ``torchvision:NAME``, a transformers / diffusers folder, or a registered format's.
        weights: the weights file of a format that takes one (None: random weights, drawn with seed 0).
        model_args: constructor arguments, and ``timestep`` / ``class_label`` for a diffusion backbone.
        trust_remote_code: run the Python file a transformers folder's ``auto_map`` names (``--trust-remote-code``;
            never through ``model_args``).
    """
    args = dict(model_args or {})
    if REMOTE_CODE in args:
        raise UserError(f"--model-arg {REMOTE_CODE} is refused: running a folder's own Python is the explicit "
                        "--trust-remote-code flag (it names the file it runs)")
    cond = {k: args.pop(k) for k in CONDITIONING if k in args}
    fmt = model_format(spec, weights)
    if trust_remote_code:
        if fmt.name != "folder":
            raise UserError(f"--trust-remote-code applies to a transformers save_pretrained folder; {spec} is {fmt.written}")
        args[REMOTE_CODE] = True  # read (and removed) by _from_folder
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
    conditioning = _conditioning(spec, model, cond)
    return ForeignModel(model.eval(), fresh, spec, weights, conditioning, args, {k: args[k] for k in INPUTS if k in args},
                        fmt.settable_inputs, fmt.takes_weights and weights is None)


def _conditioning(spec: str, model: nn.Module, given: dict) -> tuple:
    """The fixed values a diffusion backbone is run with after x (a diffusers model: timestep 500, class 0 unless
    given), checked: a timestep is a number >= 0, a class label a whole number >= 0, and a model that takes none
    (a timm / transformers encoder, a forward of x alone) is refused rather than fed them where they mean something else."""
    for key, value in given.items():
        whole = isinstance(value, int) and not isinstance(value, bool)
        number = whole or isinstance(value, float) and math.isfinite(value)
        if not (whole if key == "class_label" else number) or value < 0:
            kind = "a class index (a whole number >= 0)" if key == "class_label" else "a diffusion time (a number >= 0)"
            raise UserError(f"--model-arg {key}={value!r} is not {kind}, e.g. --model-arg {key}="
                            f"{0 if key == 'class_label' else 500}")
    if type(model).__module__.startswith("diffusers."):
        return given.get("timestep", 500), given.get("class_label", 0)
    if not given:
        return ()
    library = type(model).__module__.partition(".")[0]
    try:
        takes = library not in ("timm", "transformers") and not hasattr(model, "forward_features")
        takes = takes and bool(inspect.signature(model.forward).bind(None, *given.values()))
    except (TypeError, ValueError):
        takes = False
    if not takes:
        raise UserError(f"--model-arg {' / '.join(given)} is the fixed conditioning of a diffusion backbone (a diffusers "
                        f"folder, or a model whose forward takes (x, t, y)); {spec} ({type(model).__name__}) takes none: "
                        "drop it")
    return tuple(given.values())
