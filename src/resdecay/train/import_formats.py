"""The formats a run's pretrained weights come in (``finetune --from``, ``pretrain --from``, ``import-weights
--format``): one registry, each entry saying how to recognise a file or folder of its kind, how to convert its
weights into resdecay's MAE, and whether they hold a decoder.

Built in: ``resdecay`` (the native checkpoint, registered by ``train/checkpoint.py``), then ``mae``, ``unet-mae``,
``timm-vit`` and ``hf-vitmae`` (``interop/foreign_formats.py``). A source of one's own is one
``register_import_format`` call in a ``--plugin`` file (docs/EXTENDING.md (g)); a taken name is refused unless
``replace=True``, as in every registry of the package (``resdecay.errors.Registry``). Detection tries the formats in
registration order, the first that recognises a source takes it.

The registry lives here, beside the native checkpoint, rather than in ``interop/``: ``load_checkpoint`` names the
format of a foreign file it is handed (and the import command that converts it), and ``train/`` imports nothing
from the layers above it. The conversion itself (``interop/import_weights.py``) runs above.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, get_args

from ..errors import Registry, RegistryError, UserError, defined_at, one_line

Stated = dict[str, tuple[Any, str]]  # model field -> (value, where the file says it)
UnstatedAlpha = Literal["plain", "ask", "assume plain"]  # what a source that states no alpha_min is (ImportFormat)
UNSTATED_ALPHA = get_args(UnstatedAlpha)


@dataclass(frozen=True)
class SourceFile:
    """A file or folder of pretrained weights, as a format's ``detect`` and ``convert`` see it.

    Args:
        path: the file or folder.
        read: ``read(path) -> contents`` for a file (``interop.checkpoint_io.read_weights_file``: ``torch.load``
            with ``weights_only=True``, or ``{"model": tensors, "metadata": ...}`` for safetensors); called once,
            on first use of ``contents``, so a format that looks only at the path reads nothing.
        given: the path as the user wrote it, for messages and records (default ``str(path)``).
    """

    path: Path
    read: Callable[[Path], Any] = field(repr=False, compare=False)
    given: str = ""

    def __post_init__(self):
        object.__setattr__(self, "path", Path(self.path))
        if not self.given:
            object.__setattr__(self, "given", str(self.path))

    @cached_property
    def contents(self) -> Any:
        """What the file holds (None for a folder)."""
        return None if self.path.is_dir() else self.read(self.path)

    @property
    def weights(self) -> Mapping:
        """The state_dict in the file: ``contents["model"]`` or ``["state_dict"]`` when it has one, else the
        contents themselves; empty for a folder or a file that holds no mapping."""
        blob = self.contents
        if not isinstance(blob, Mapping):
            return {}
        return next((blob[k] for k in ("model", "state_dict") if isinstance(blob.get(k), Mapping)), blob)

    @cached_property
    def keys(self) -> frozenset[str]:
        """The weights' names."""
        return frozenset(k for k in self.weights if isinstance(k, str))

    def has(self, prefix: str) -> bool:
        """Some weight's name starts with ``prefix``."""
        return any(k.startswith(prefix) for k in self.keys)


@dataclass(frozen=True)
class ConvertedWeights:
    """What a format's ``convert`` gives: resdecay's MAE as far as the source fixes it.

    Args:
        fields: the MAE config fields the weights fix (``img_size``, ``embed_dim``, ``depth``, ``decoder_depth``,
            ``skips`` ...); the rest comes from the import preset and its overrides.
        weights: the state_dict under resdecay's names (the whole MAE, or its encoder when ``has_decoder`` is False).
        stated: settings the file states beside its weights, with where (``alpha_min``, ``mask_ratio``, heads ...):
            they win over the preset, and a flag or override that contradicts one is refused.
        head: a classifier head (``{"num_classes", "pool", "weights"}``) when the source is a classifier.
        weights_file: the file whose sha256 a run records as its source (default: the path given).
    """

    fields: dict
    weights: dict
    stated: Stated = field(default_factory=dict)
    head: dict | None = None
    weights_file: Path | None = None


@dataclass(frozen=True)
class ImportFormat:
    """One kind of pretrained weights a run may start from.

    Args:
        name: the ``--format`` value.
        description: what a source of this kind is, in a few words ("facebookresearch/mae"): messages say
            "a {description} checkpoint".
        detect: ``detect(source: SourceFile) -> bool``: the source is of this kind. Keep it cheap and specific;
            formats are tried in registration order.
        convert: ``convert(source: SourceFile) -> ConvertedWeights``; None for resdecay's own checkpoint, which
            is read as it is.
        has_decoder: its sources hold an MAE decoder (``pretrain --from`` continues only those); without one an
            imported encoder gets a freshly initialised decoder.
        unstated_alpha: what a source that states no ``alpha_min`` is: ``plain`` (the format has no decay: alpha 1,
            an ``--alpha-min`` other than 1 refused), ``ask`` (``--alpha-min`` must say) or ``assume plain`` (alpha 1,
            with a warning unless ``--alpha-min`` says otherwise).
        alpha_source: where a file of this format states its decay, for the messages about one that does not.
        model_defaults: MAE settings the format implies where its files say nothing: ahead of the preset, behind
            a key=value override.
        check: ``check(model_config, weights, source)``, run once the config is resolved: refuse weights that the
            config cannot hold, in one line.
    """

    name: str
    description: str
    detect: Callable[[SourceFile], bool]
    convert: Callable[[SourceFile], ConvertedWeights] | None
    has_decoder: bool = True
    unstated_alpha: UnstatedAlpha = "assume plain"
    alpha_source: str = "alpha_min"
    model_defaults: Mapping[str, Any] = field(default_factory=dict)
    check: Callable[[Any, dict, str], None] | None = None

    @property
    def native(self) -> bool:
        """A resdecay checkpoint already: nothing to convert."""
        return self.convert is None


IMPORT_FORMATS: dict[str, ImportFormat] = {}  # by name, tried in registration order
_FORMATS = Registry("import format", "register_import_format", IMPORT_FORMATS, origin=lambda f: f"by {defined_at(f.detect)}")


def register_import_format(fmt: ImportFormat, replace: bool = False) -> ImportFormat:
    """Add a source format; a name that is taken is refused (``RegistryError``) unless ``replace=True``, and so is
    an entry that cannot work (a name that is no ``--format`` word, a ``detect`` or ``convert`` that is no function)."""
    if not isinstance(fmt, ImportFormat):
        raise RegistryError(f"register_import_format takes an ImportFormat(name, description, detect, convert), not "
                            f"{type(fmt).__name__}")
    if not isinstance(fmt.name, str) or not fmt.name or any(c.isspace() or c in "/\\:" for c in fmt.name):
        raise RegistryError(f"import format name {fmt.name!r} must be a word without spaces, ':' or slashes (it is "
                            "the --format value)")
    for what, ok in (("detect", callable(fmt.detect)), ("convert", fmt.convert is None or callable(fmt.convert)),
                     ("check", fmt.check is None or callable(fmt.check)),
                     ("description", isinstance(fmt.description, str) and fmt.description),
                     ("unstated_alpha", fmt.unstated_alpha in UNSTATED_ALPHA)):
        if not ok:
            want = {"description": "a non-empty string", "unstated_alpha": f"one of {', '.join(UNSTATED_ALPHA)}"}
            raise RegistryError(f"import format {fmt.name!r}: {what} must be {want.get(what, 'a function')}")
    return _FORMATS.add(fmt.name, fmt, replace)


def unregister_import_format(name: str) -> ImportFormat:
    """Remove the format registered under ``name`` (``RegistryError`` if there is none); returns it."""
    return _FORMATS.remove(name)


def import_format_names(native: bool = True) -> list[str]:
    """The registered ``--format`` values, in registration order (without resdecay's own unless ``native``)."""
    return [name for name, fmt in IMPORT_FORMATS.items() if native or not fmt.native]


def import_format(name: str, native: bool = True) -> ImportFormat:
    """The format registered as ``name``, or one line naming those there are (``native=False``: the ones that
    convert, as ``import-weights --format`` takes them)."""
    fmt = IMPORT_FORMATS.get(name)
    if fmt is None or (fmt.native and not native):
        raise UserError(f"--format {name!r} is unknown; choose one of {', '.join(import_format_names(native))}")
    return fmt


def detect_import_format(source: SourceFile, native: bool = True) -> ImportFormat | None:
    """The first registered format that recognises ``source`` (None if none does). A file that cannot be read is
    refused by the reader in one line."""
    for fmt in IMPORT_FORMATS.values():
        if (native or not fmt.native) and run_hook(fmt, "detect", source.given, source):
            return fmt
    return None


def run_hook(fmt: ImportFormat, hook: str, given: str, *args) -> Any:
    """``fmt``'s ``detect``, ``convert`` or ``check`` called with ``args``: what it raises beyond a ``UserError`` (a
    plugin's function tripping on a file it did not expect) is said in one line naming it and the source ``given``."""
    fn = getattr(fmt, hook)
    try:
        return fn(*args)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"import format {fmt.name!r}: its {hook} ({defined_at(fn)}) failed on {given}: "
                        f"{type(e).__name__}: {one_line(e)}") from None
