"""Weights from elsewhere into resdecay's MAE, by one conversion for every format of the import-format registry
(``train/import_formats.py``; the foreign ones built in: ``foreign_formats.py``): ``resdecay import-weights``
writes the result as a resdecay checkpoint that ``load_model``, ``resdecay eval`` and ``resdecay finetune``
accept (``import_weights``); ``finetune --from`` and ``pretrain --from`` import in memory (``load_pretrained``,
which also reads resdecay's own checkpoints and run folders, and detects the format when ``--format`` is not given).

Dimensions (width, depth, patch, image size, MLP ratio, decoder) come from the weights; what the
file states beside them (alpha, schedule, mask ratio, loss, the number of heads: see
``file_meta``) from the file; the rest (heads the file does not state, data, training) from
``--preset`` and ``key=value`` overrides. A flag or override that contradicts the file, and every
mismatch, is refused in one line.

This module is the dispatcher over the formats, which stand side by side and import only the shared
``checkpoint_io.py`` / ``files.py``: ``foreign_vit.py`` (the weights of ``mae``, ``unet-mae``, ``timm-vit``) with
``file_meta.py`` (what those files state), and ``hf_vitmae.py`` (``hf-vitmae``).
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import CheckpointError, UserError, one_line
from ..io import atomic_save, file_sha256
from ..models import ClassifierConfig, build_model
from ..train.checkpoint import FORMAT, exported_folder, exported_message, list_checkpoints, load_checkpoint, load_model
from ..train.config import RunConfig, import_config, parse_overrides
from ..train.distributed import is_main_process
from ..train.import_formats import (
    IMPORT_FORMATS,
    ConvertedWeights,
    ImportFormat,
    SourceFile,
    Stated,
    detect_import_format,
    import_format,
    import_format_names,
    run_hook,
)
from ..train.sharded_checkpoint import is_dcp_folder
from .checkpoint_io import load_strict, read_weights_file
from .file_meta import check_against_weights, describe
from .files import check_out_file, make_parent, unwritable


class AlphaUnknownWarning(UserWarning):
    """A file states no alpha and its format takes it as plain (a timm ViT): wrong if it was decayified."""


def _alpha_flag(flag: float | None, override: object) -> tuple[float | None, str]:
    """The alpha the user gave, as ``--alpha-min`` or as ``model.alpha_min=`` (the same setting), and
    how they gave it."""
    if override is not None and flag is not None and override != flag:
        raise UserError(f"--alpha-min {flag:g} and model.alpha_min={override} disagree; give one")
    if override is not None and (isinstance(override, bool) or not isinstance(override, (int, float))):
        raise UserError(f"model.alpha_min must be a number in (0, 1], got {override!r}")
    return (flag, "--alpha-min") if flag is not None else (override, "model.alpha_min")


def _alpha_settings(form: ImportFormat, alpha_min: float | None, stated: Stated, source: str,
                    flag: str = "--alpha-min") -> dict:
    """alpha_min for the imported model when the file does not state it, as its format says (``unstated_alpha``),
    from the flag; a flag that contradicts the file is refused (taking it would write a model other than the file's)."""
    if alpha_min is not None and not 0 < alpha_min <= 1:
        raise UserError(f"{flag} must lie in (0, 1], got {alpha_min}")
    if "alpha_min" in stated:
        value, where = stated["alpha_min"]
        if alpha_min is not None and alpha_min != value:
            raise UserError(f"{source} stores alpha_min {value:g} but {flag} is {alpha_min:g}; drop {flag}: "
                            f"the file's value ({where}) is the one its model was trained with")
        return {}
    if form.unstated_alpha == "plain":
        if alpha_min not in (None, 1.0):
            decayed = [f.name for f in IMPORT_FORMATS.values() if not f.native and f.unstated_alpha != "plain"]
            raise UserError(f"--alpha-min applies to --format {' or '.join(decayed) or 'none registered'} (so does "
                            f"model.alpha_min); a {form.description} checkpoint is a plain (alpha 1) model")
        return {"alpha_min": 1.0}
    if form.unstated_alpha == "ask" and alpha_min is None:
        raise UserError(f"--format {form.name} needs --alpha-min for {source}: it carries no {form.alpha_source}, "
                        "e.g. --alpha-min 0.6")
    if alpha_min is None:  # plain, unless it was decayified and saved without saying so
        warnings.warn(f"{source} states no alpha (no {form.alpha_source}), so it was imported as a plain alpha 1 model; "
                      "if it was decayified, import it again with --alpha-min A (and model.schedule=... as it was "
                      "trained); --alpha-min 1 says it is plain and silences this", AlphaUnknownWarning, stacklevel=4)
        return {"alpha_min": 1.0}
    return {"alpha_min": float(alpha_min)}


@dataclass(frozen=True)
class ImportedModel:
    """A source converted in memory."""
    config: RunConfig
    model: torch.nn.Module  # with the imported weights
    record: dict  # ``imported_from``: path, format, decoder (imported or new), what the file stated
    weights_file: Path  # the file a run records (sha256) as its source


def import_weights(src: str | Path, fmt: str, preset: str, out: str | Path, alpha_min: float | None = None,
                   overrides: list[str] | None = None) -> Path:
    """Convert a foreign checkpoint into a resdecay checkpoint.

    Args:
        src: the foreign checkpoint (``torch.save`` format; read with ``weights_only=True``), or
            for ``hf-vitmae`` a transformers folder (or its weights file beside its config.json).
        fmt: a registered import format that converts (``import_format_names(native=False)``: ``mae``,
            ``unet-mae``, ``timm-vit``, ``hf-vitmae`` and a plugin's).
        preset: a resdecay MAE preset for what the weights do not say (heads, data, training).
        out: the resdecay checkpoint to write.
        alpha_min: the decay of the source model, for a file that does not state it (a unet-mae
            file without ``args``); one that contradicts the file is refused.
        overrides: ``key=value`` settings applied to the preset (e.g. ``model.num_heads=6``).

    Returns:
        The path written; ``resdecay.checkpoint.load_model(out)`` rebuilds the model.
    """
    import_format(fmt, native=False)  # an unknown --format is said before anything else
    out = check_out_file(out)  # an unwritable --out is said before any work
    imported = import_in_memory(src, fmt, preset, alpha_min, overrides)
    make_parent(out)
    try:
        atomic_save(imported_state(imported), out)
    except OSError as e:
        if isinstance(e, UserError):  # a full disk, already said in one line by resdecay.io
            raise
        raise unwritable(out, e) from None
    load_model(out)  # the written file must rebuild; fail here, not in a later eval
    return out


def imported_state(imported: ImportedModel) -> dict:
    """The resdecay checkpoint (weights only, step 0) that ``import_weights`` writes."""
    return {"format": FORMAT, "model": imported.model.state_dict(), "config": imported.config.to_dict(),
            "train_state": {"step": 0, "epoch": 0, "step_in_epoch": 0}, "imported_from": imported.record}


def import_in_memory(src: str | Path, fmt: str, preset: str, alpha_min: float | None = None,
                     overrides: list[str] | None = None) -> ImportedModel:
    """``import_weights`` without writing a file (``finetune --from`` / ``pretrain --from`` import in memory)."""
    return converted_model(src, import_format(fmt, native=False), preset, alpha_min, overrides)


def converted_model(src: str | Path, form: ImportFormat, preset: str, alpha_min: float | None = None,
                    overrides: list[str] | None = None) -> ImportedModel:
    """``import_in_memory`` with the format already looked up."""
    source = SourceFile(Path(src), read_weights_file, str(src))
    converted = run_hook(form, "convert", source.given, source)
    if not isinstance(converted, ConvertedWeights):
        raise UserError(f"import format {form.name!r}: convert returned a {type(converted).__name__}, not ConvertedWeights")
    name, stated, weights, head = source.given, converted.stated, converted.weights, converted.head
    check_against_weights(stated, converted.fields, name)
    given = parse_overrides(overrides or [], "mae")
    flag, how = _alpha_flag(alpha_min, given.get("model", {}).get("alpha_min"))
    alpha = _alpha_settings(form, flag, stated, name, how)
    fixed = {**converted.fields, **{k: v for k, (v, _) in stated.items()}, **alpha}
    where = {k: f"{name}'s {w}" for k, (_, w) in stated.items()}
    if alpha:
        where["alpha_min"] = how if flag is not None else f"--format {form.name} (no alpha in the file: 1)"
    cfg = import_config(preset, fixed, where, {"zero_init": False, **form.model_defaults}, given)
    if form.check is not None:
        run_hook(form, "check", name, cfg.model, weights, name)
    fresh_decoder = not form.has_decoder and head is None  # encoder only: an MAE whose decoder starts fresh
    if head is not None:
        cfg.model = ClassifierConfig(encoder=dataclasses.asdict(cfg.model), num_classes=head["num_classes"],
                                     head="ln_linear", pool=head["pool"], pretrained=name)
        weights = {**weights, **head["weights"]}
        cfg.validate()
    model = build_model(cfg.model)
    if fresh_decoder:  # keep the new decoder, load the whole encoder strictly
        own = model.state_dict()
        extra = sorted(set(weights) - set(own))
        if extra:
            raise CheckpointError(f"{name} does not fit {type(model).__name__}: unexpected key {extra[0]}")
        weights = {**{k: v for k, v in own.items() if not k.startswith(_ENCODER)}, **weights}
    load_strict(model, weights, name)
    record = {"path": name, "format": form.name, "decoder": "new" if fresh_decoder else "imported",
              "stated_by_file": describe(stated)}
    return ImportedModel(cfg, model, record, converted.weights_file or source.path)


_ENCODER = ("cls_token", "pos_embed", "patch_embed.", "blocks.", "norm.")


# ----------------------------------------------------------------------------- finetune / pretrain --from
@dataclass(frozen=True)
class Pretrained:
    """The pretrained model a run starts from: a resdecay checkpoint's state (imported in memory for a
    foreign format) and where it came from."""
    path: Path  # the file or folder the user named (for a resdecay run folder: its newest checkpoint)
    format: str  # a registered import format's name
    state: dict  # a resdecay checkpoint's contents
    weights_file: Path  # the file whose sha256 is recorded
    native: bool = False  # a resdecay checkpoint, read as it is

    def record(self) -> dict:
        """What summary.json, pretrained.json and eval.json say about it (sha256: one read of the file)."""
        out = {"path": str(self.path), "format": self.format, "sha256": file_sha256(self.weights_file),
               "sha256_of": self.weights_file.name}
        if "imported_from" in self.state:
            out["stated_by_file"] = self.state["imported_from"].get("stated_by_file", {})
        return out


def source_format(path: Path) -> ImportFormat:
    """The registered format of ``path`` (a file or folder), or one line saying it cannot be told."""
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist")
    found = detect_import_format(SourceFile(path, read_weights_file))
    if found is not None:
        return found
    exported = exported_folder(path)
    if exported is not None:  # a save_pretrained folder (or its weights) no format takes: the route that reads it
        raise CheckpointError(exported_message(path, exported))
    what = "a folder without step_*.pt checkpoints" if path.is_dir() else "not a resdecay checkpoint"
    raise CheckpointError(f"cannot tell the format of {path} ({what}, and no registered format recognises it); "
                          f"give --format, one of {', '.join(import_format_names())}")


def load_pretrained(source: str | Path, fmt: str | None = None, import_preset: str | None = None,
                    alpha_min: float | None = None, import_overrides: list[str] | None = None) -> Pretrained:
    """The pretrained model ``source`` holds, in ``fmt`` (default: detected), imported in memory
    when it is not a resdecay checkpoint (``import_preset``, ``alpha_min`` and ``import_overrides``
    as ``resdecay import-weights``' ``--preset``, ``--alpha-min`` and key=value)."""
    path = Path(source)
    return pretrained_from(path, import_format(fmt) if fmt is not None else source_format(path), import_preset,
                           alpha_min, import_overrides)


def pretrained_from(path: Path, form: ImportFormat, import_preset: str | None = None, alpha_min: float | None = None,
                    import_overrides: list[str] | None = None) -> Pretrained:
    """``load_pretrained`` with the format already known (looked up or detected)."""
    if form.native:
        given = [f for f, v in (("--import-preset", import_preset), ("--alpha-min", alpha_min),
                                ("--import-override", import_overrides)) if v]
        if given:
            raise UserError(f"{given[0]} applies to imports; {path} is a resdecay checkpoint, whose config says it all")
        ckpt = path
        if path.is_dir() and not is_dcp_folder(path):  # a run folder (a sharded checkpoint is a folder too)
            found = list_checkpoints(path / "checkpoints") or list_checkpoints(path)
            if not found:
                raise CheckpointError(f"{path} holds no step_*.pt checkpoint; pass a resdecay run folder or checkpoint")
            ckpt = found[-1]
        return Pretrained(ckpt, form.name, load_checkpoint(ckpt), ckpt, native=True)
    if import_preset is None:
        raise UserError(f"{path} is a {form.description} checkpoint: name the MAE preset for what its weights do not say "
                        "(heads, data), e.g. --import-preset mae-b16-plain for an ImageNet ViT-B/16")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        imported = converted_model(path, form, import_preset, alpha_min, import_overrides)
    for w in caught:  # import-weights' warnings, one line each, as that command prints them
        if is_main_process():
            print(f"warning: {one_line(w.message)}")
    if not imported.weights_file.is_file():  # a plugin's folder format must say which file it read
        raise UserError(f"import format {form.name!r}: {imported.weights_file} is no file; its convert must name the "
                        "weights file it read (ConvertedWeights.weights_file), whose sha256 records the source")
    return Pretrained(path, form.name, imported_state(imported), imported.weights_file)
