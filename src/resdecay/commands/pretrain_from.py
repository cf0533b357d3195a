"""``resdecay pretrain --preset P --from SOURCE``: continue MAE pretraining from a pretrained model.

SOURCE is what ``resdecay finetune --from`` takes, resolved by the same code (``interop.import_weights``'
``source_format`` and ``load_pretrained``) among the import-format registry's sources whose weights hold an MAE
decoder: a resdecay MAE checkpoint or run folder, facebookresearch/mae's or the authors' U-Net MAE pretraining
``.pth``, a Hugging Face ViTMAE folder or a plugin's, the foreign ones imported in memory as
``resdecay import-weights`` does (``--import-preset`` defaults to P). The run is preset P with its overrides and
a fresh run (step 0, a new optimizer and lr schedule) whose model starts from every weight of SOURCE, encoder and
decoder. A source without a decoder (a timm ViT, a fine-tuned classifier) or whose weights do not fit P's model is
refused in one line, naming the settings that would fit. Settings that change the model's function but not its
weights (alpha_min, mask ratio, loss, heads) may differ from the source's, e.g. to decay the official MAE's
shortcuts while continuing it; one note names them. The source is recorded in ``<run>/pretrained.json``
(``train.run.summary``) and in summary.json's ``pretrained``; ``--resume`` continues the run's own checkpoints (the
source is read, and checked, but only a fresh start loads it).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from ..errors import ConfigError, UserError, one_line
from ..interop.import_weights import Pretrained, pretrained_from, source_format
from ..models import build_model, model_config_class
from ..train.checkpoint import field_defaults
from ..train.config import RunConfig
from ..train.distributed import is_main_process
from ..train.import_formats import IMPORT_FORMATS, ImportFormat, import_format
from ..train.run.summary import write_pretrained_record

IGNORED = {"family", "zero_init", "grad_checkpointing"}  # initialisation and memory: no effect on loaded weights
HEADS = {"embed_dim": "num_heads", "decoder_embed_dim": "decoder_num_heads"}


def accepted_sources() -> str:
    """What pretrain --from continues, as the registry has it: resdecay's MAE, and every format with a decoder."""
    own = "a resdecay MAE checkpoint or run folder"
    foreign = [f.description for f in IMPORT_FORMATS.values() if f.has_decoder and not f.native]
    if not foreign:
        return own
    listed = foreign[0] if len(foreign) == 1 else f"{', '.join(foreign[:-1])} or {foreign[-1]}"
    return f"{own}, or a {listed} checkpoint"


@dataclass
class Source:
    """The pretrained model a pretraining run continues, once resolved and checked against the run's model."""
    pretrained: Pretrained
    out_dir: Path  # the run folder, where the record goes
    weights: dict | None  # the state_dict the run's model starts from (dropped once loaded)
    used: bool = False  # loaded: this launch was a fresh start

    def record(self) -> dict:
        """What pretrained.json and summary.json say: finetune's record, the source run's step and preset."""
        state, own = self.pretrained.state, self.pretrained.native
        return {**self.pretrained.record(), "step": state["train_state"]["step"] if own else None,
                "preset": state["config"].get("preset") if own else None}

    def init(self, model: torch.nn.Module) -> None:
        """``train(init=...)``: on a fresh start only, every weight of the source into the run's model."""
        try:  # strict: keys and shapes were checked in resolve_source
            model.load_state_dict(self.weights)
        except RuntimeError as e:
            raise UserError(f"{self.pretrained.path}'s weights do not fit this run's model: {one_line(e)}") from None
        self.weights, self.used = None, True
        if is_main_process():
            record = self.record()
            write_pretrained_record(self.out_dir, record)
            kind = (f"resdecay checkpoint, step {record['step']} of its run" if self.pretrained.native
                    else import_format(record["format"]).description)
            print(f"continuing pretraining from {record['path']} ({kind}): encoder and decoder weights loaded; this "
                  "run starts at step 0 with a new optimizer")


def resolve_source(source: str, preset: str, cfg: RunConfig, fmt: str | None = None, import_preset: str | None = None,
                   alpha_min: float | None = None, import_overrides: list[str] | None = None) -> Source:
    """``source`` resolved as ``finetune --from`` resolves it, checked to hold an MAE decoder and to fit the model
    of ``cfg`` (preset ``preset`` and its overrides); a note names the settings in which the run differs."""
    if cfg.model.family != "mae":
        raise UserError(f"pretrain --from continues an MAE's pretraining; preset {preset!r} trains a {cfg.model.family!r} "
                        "model (give an MAE preset, e.g. mae-b16)")
    path = Path(source)
    form = import_format(fmt) if fmt is not None else source_format(path)
    if not form.native and import_preset is None:  # what the file does not say (heads, data): the run's preset
        import_preset = preset
    pretrained = pretrained_from(path, form, import_preset, alpha_min, import_overrides)
    state = pretrained.state
    check_decoder(source, state, form)
    check_fits(source, preset, state["model"], state["config"]["model"], cfg.model)
    changed = differences(state["config"]["model"], cfg.model)
    if changed and is_main_process():
        print(f"note: {source} was trained with {settings(changed, 0)}; this run uses {settings(changed, 1)} (preset "
              f"{preset} and its overrides); give the former to continue it unchanged")
    return Source(pretrained, cfg.out_dir, state["model"])


def check_decoder(source: str, state: dict, form: ImportFormat) -> None:
    """Refuse a source that is not an MAE with its own decoder (one line, naming what is accepted)."""
    family = state["config"]["model"].get("family", "mae")
    if family != "mae":
        origin = state["config"]["model"].get("pretrained") if form.native else None  # a finetune run's start
        also = f"; it was fine-tuned from {origin}: continue that one" if origin else ""
        raise UserError(f"{source} holds a {family!r} model, not an MAE with its decoder; pretrain --from continues "
                        f"{accepted_sources()}{also}")
    imported = state.get("imported_from") or {}
    if imported.get("decoder") == "new":  # imported now, or by import-weights into the resdecay file given
        kind = IMPORT_FORMATS.get(imported.get("format"))
        what = kind.description if kind is not None else imported.get("format", form.name)
        raise UserError(f"{source} has no MAE decoder (a {what} encoder: import-weights gives it a new one); pretrain "
                        f"--from needs the source's decoder too: give {accepted_sources()}, or fine-tune this encoder "
                        f"with resdecay finetune --from {source}")


def shapes_of(model_cfg) -> dict[str, tuple]:
    """The state_dict shapes of the model ``model_cfg`` builds (on the CPU, leaving the RNG as it was; the meta
    device would import torch._dynamo, seconds, for its random initialisation)."""
    with torch.random.fork_rng(devices=[]):
        model = build_model(model_cfg)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_fits(source: str, preset: str, weights: dict, source_model: dict, run_model) -> None:
    """Refuse weights whose keys or shapes are not those of the run's model, naming the settings that fit them."""
    if not differences(source_model, run_model):  # the source's own model: its weights fit it by construction
        return
    want = shapes_of(run_model)
    have = {k: tuple(v.shape) for k, v in weights.items()}
    problems = ([f"{k} {have[k]} in the source, {want[k]} in this model" for k in want if k in have and have[k] != want[k]]
                + [f"the source has no {k}" for k in want if k not in have]
                + [f"this model has no {k}" for k in have if k not in want])
    if not problems:
        return
    fix = fitting_settings(source_model, run_model, want)
    advice = (f"give {' '.join(f'model.{k}={value_text(v)}' for k, v in fix.items())} (the source's)" if fix
              else "give the settings the source was trained with")
    raise UserError(f"{source}'s weights do not fit preset {preset}'s model ({len(problems)} weights differ, e.g. "
                    f"{problems[0]}); {advice}, or the preset it was trained with")


def fitting_settings(source_model: dict, run_model, want: dict) -> dict:
    """The source's values of the model settings that differ from the run's and change its weights' shapes
    (with the heads of a width among them)."""
    changed = differences(source_model, run_model)
    fix = {}
    for key, (theirs, _) in changed.items():
        try:
            shaped = shapes_of(dataclasses.replace(run_model, **{key: theirs})) != want
        except (ValueError, TypeError, ConfigError):  # not a model on its own (e.g. a width its heads do not divide)
            shaped = True
        if shaped:
            fix[key] = theirs
    fix.update({h: changed[h][0] for w, h in HEADS.items() if w in fix and h in changed})
    return fix


def differences(source_model: dict, run_model) -> dict[str, tuple]:
    """{setting: (the source's value, the run's)} of the model settings that differ (a setting the source's config
    predates counts as its default, as ``load_model`` rebuilds it)."""
    ours = dataclasses.asdict(run_model)
    theirs = {**field_defaults(model_config_class(ours["family"])), **source_model}
    return {k: (theirs[k], v) for k, v in ours.items() if k not in IGNORED and k in theirs and theirs[k] != v}


def value_text(value) -> str:
    """A setting as a key=value override spells it."""
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def settings(changed: dict, which: int) -> str:
    return " ".join(f"model.{k}={value_text(pair[which])}" for k, pair in changed.items())
