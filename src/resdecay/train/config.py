"""Typed run configuration: YAML presets plus ``key=value`` overrides, checked up front.

A run is three sections: ``model`` (the family's config, e.g. ``MAEConfig``), ``data``
(``DataConfig``) and ``train`` (``TrainConfig``). A preset may start from another with
``base: <preset>`` and change a few keys (the ``-plain`` baselines do this).

Overrides name a field as ``section.field=value`` or, where the field name is unique,
``field=value`` (``alpha_min=0.7``); values are parsed as YAML (``true``, ``0.7``, ``[1, 3]``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import re
import types
import typing
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml

from .. import yaml_io
from ..data import DataConfig
from ..errors import ConfigError, UserError, check_choice, check_fields
from ..models import FAMILIES, model_config_class
from .aux_objective import AuxKind, check_aux_model, check_aux_settings

Device = Literal["auto", "cpu", "cuda"]
Logger = Literal["tensorboard", "wandb", "mlflow", "csv"]  # train/log/tracking.py's back ends


@dataclass
class TrainConfig:
    epochs: int = 800
    warmup_epochs: float = 40  # linear warmup, then half-cycle cosine to min_lr, per iteration
    batch_size: int = 64  # per device; effective batch = batch_size * accum_steps * world size
    accum_steps: int = 1  # gradient accumulation micro-batches per optimizer step
    base_lr: float = 1.5e-4  # lr = base_lr * effective_batch / 256 (MAE's rule)
    lr: float | None = None  # absolute lr; overrides the base_lr rule when set
    min_lr: float = 0.0
    lr_schedule: Literal["cosine", "constant"] = "cosine"  # cosine (half-cycle to min_lr after warmup, MAE) | constant (DiT, SiT, U-ViT)
    ema_decay: float = 0.0  # EMA of the weights kept in checkpoints and used for sampling (0 = off; DiT 0.9999)
    ema_warmup: bool = False  # timm's EMA warmup (decay grows with the step): for short runs
    weight_decay: float = 0.05  # not applied to biases and 1-D parameters (norms, tokens' scales)
    beta1: float = 0.9
    beta2: float = 0.95
    optimizer: Literal["adamw", "lars", "sgd"] = "adamw"  # adamw | lars (timm's LARS, for MAE's linear probe) | sgd (momentum 0.9, ResNets)
    grad_clip: float | None = None  # max global grad norm; None = off (MAE pretraining)
    seed: int = 0
    device: Device = "auto"  # auto | cpu | cuda
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"  # auto (bf16 on GPU, fp32 on CPU) | bf16 | fp16 | fp32
    compile: bool = False  # torch.compile the model (under fsdp2 / hsdp: each block, before it is sharded)
    # how the ranks share the model (train/parallel.py, docs/training.md "Past DDP")
    parallel: Literal["ddp", "fsdp2", "hsdp"] = "ddp"  # ddp (replicas) | fsdp2 (sharded) | hsdp (sharded per node)
    reshard_after_forward: bool = True  # fsdp2 / hsdp: free gathered block weights after the forward (less memory)
    hsdp_nodes: int | None = None  # hsdp: the nodes replicated across; None: WORLD_SIZE / LOCAL_WORLD_SIZE (torchrun)
    noise_scope: Literal["rank", "global"] = "rank"  # rank: each process draws its own masks / noise | global: drawn
    # for the effective batch and split, so the losses do not depend on the process count (nn/noise.py)
    ckpt_every: int = 500  # optimizer steps between checkpoints (and one at the end)
    keep_last: int = 2  # checkpoints kept on disk
    log_every: int = 10  # optimizer steps between log lines
    out_dir: str | None = None  # default: runs/<preset>
    threads: int | None = None  # torch CPU threads; None = torch's default
    online_eval_every: int = 0  # epochs between online kNN / probe / effective rank (diffusion: proxy FID + probe grid; 0 = off)
    online_eval_size: int = 2000  # fixed labelled subset (first N train and test images) for it; diffusion: also N samples
    norm_growth_warn: float = 20.0  # warn once when a block's output token RMS grows this many times within
    norm_growth_window: int = 5     # ... this many log steps (train/stability.py); 0 = no warning, RMS still logged
    loggers: list[Logger] = field(default_factory=lambda: ["tensorboard"])  # experiment trackers: tensorboard | wandb | mlflow | csv
    # auxiliary objective of the diffusion families beside the denoising loss (train/aux_objective.py, docs/diffusion.md)
    aux: AuxKind = "none"  # none | repa (align a block to a frozen encoder, Yu et al. 2025) | dispersive (Wang & He 2025)
    aux_weight: float | None = None  # its weight; None: REPA's 0.5 (repa), Disperse-Loss's 0.25 (dispersive)
    aux_layer: int | None = None  # 0-based block index (negative: from the end); None: block depth//3 - 1 (repa), the last (dispersive)
    aux_proj_dim: int = 2048  # REPA's projector width (build_mlp's projector_dim)
    aux_target: str | None = None  # REPA's frozen encoder: timm:NAME | torchvision:NAME | a transformers folder | a resdecay MAE checkpoint
    aux_target_weights: str | None = None  # its weights file (timm: / torchvision:; "random": seed 0's, on purpose)
    aux_target_args: dict = field(default_factory=dict)  # its constructor arguments, as eval's --model-arg ({img_size: 32, depth: 4})
    aux_tau: float = 1.0  # dispersive temperature: D_ij = ||h_i - h_j||^2 / (features x tau)

    def validate(self) -> None:
        check_fields(self, "train", positive=("epochs", "batch_size", "accum_steps", "ckpt_every", "keep_last", "log_every"))
        for f in dataclasses.fields(self):  # .nan passes every `<= 0` test below, .inf reaches the optimizer
            value = getattr(self, f.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"train.{f.name} must be a finite number, got {value}")
        if bad := [n for n in self.loggers if n not in typing.get_args(Logger)]:
            raise ConfigError(f"train.loggers: {bad[0]!r} is unknown; choose from {', '.join(typing.get_args(Logger))}")
        if not 0 <= self.seed < 2**32:  # numpy's and torch's seeds (else their ValueError / "Overflow" mid-setup)
            raise ConfigError(f"train.seed must be an integer in [0, 2**32), got {self.seed}; pick e.g. train.seed=0")
        if self.threads is not None and self.threads < 1:
            raise ConfigError(f"train.threads must be a positive integer (or null for torch's default), got {self.threads}")
        if self.norm_growth_warn < 0 or self.norm_growth_window < 1:
            raise ConfigError("train.norm_growth_warn must be >= 0 (0 = off) and train.norm_growth_window >= 1")
        if self.online_eval_every < 0 or self.online_eval_size < 2:
            raise ConfigError("train.online_eval_every must be >= 0 and train.online_eval_size >= 2")
        if self.warmup_epochs < 0:
            raise ConfigError(f"train.warmup_epochs must be >= 0, got {self.warmup_epochs}")
        if self.base_lr <= 0 or (self.lr is not None and self.lr <= 0):
            raise ConfigError("train.base_lr (and train.lr when set) must be positive")
        if not 0.0 <= self.ema_decay < 1.0:
            raise ConfigError(f"train.ema_decay must lie in [0, 1) (0 = no EMA), got {self.ema_decay}")
        check_aux_settings(self)
        if self.hsdp_nodes is not None and self.hsdp_nodes < 1:
            raise ConfigError(f"train.hsdp_nodes must be a positive integer (or null: from the launcher), got {self.hsdp_nodes}")
        if self.parallel != "ddp" and self.aux != "none":
            raise ConfigError(f"train.aux={self.aux} keeps its projector and windows outside the sharded model, which "
                              f"train.parallel={self.parallel} does not checkpoint yet; use train.parallel=ddp with it")


@dataclass
class RunConfig:
    preset: str
    model: Any
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def to_dict(self) -> dict:
        return {"preset": self.preset, "model": asdict(self.model), "data": asdict(self.data), "train": asdict(self.train)}

    default_dir: str | None = field(default=None, compare=False, repr=False)  # runs/<preset>_<overrides> (load_config)

    @property
    def out_dir(self) -> Path:
        return Path(self.train.out_dir or self.default_dir or f"runs/{self.preset}")

    def validate(self) -> None:
        try:
            self.model.validate()
        except ValueError as e:
            raise ConfigError(str(e)) from None
        self.data.validate()
        self.train.validate()
        check_aux_model(self)


# ----------------------------------------------------------------------------- presets
def shortcut_tag(alpha_min: float, skips: bool | None) -> str:
    """How a run is named in tables and legends: 'plain' (alpha 1, no skips) or 'alpha_min 0.6, skips'.
    skips=None means unknown (a summary from an older run): only alpha_min is shown."""
    if alpha_min == 1.0 and skips is False:
        return "plain"
    return f"alpha_min {alpha_min:g}{', skips' if skips else ''}"


def _preset_dir():
    return resources.files("resdecay") / "presets"


def preset_text(name: str) -> str:
    """The YAML text of a shipped preset."""
    return (_preset_dir() / f"{name}.yaml").read_text()


def list_presets() -> list[str]:
    return sorted(p.name[:-5] for p in _preset_dir().iterdir() if p.name.endswith(".yaml"))


def _read_preset(name: str, seen: tuple = ()) -> dict:
    path = Path(name)
    if path.suffix in (".yaml", ".yml") and path.exists():
        text, where = path.read_text(), f"preset file {path}"
    else:
        file = _preset_dir() / f"{name}.yaml"
        if not file.is_file():
            raise ConfigError(f"preset {name!r} does not exist; valid presets: {', '.join(list_presets())} "
                              "(or a path to a .yaml file)")
        text, where = file.read_text(), f"preset {name!r}"
    raw = yaml_io.load_document(text, where) or {}  # YAML 1.2 floats: 1e-3 is a number
    check_preset_shape(raw, where)
    base = raw.pop("base", None)
    if base is None:
        return raw
    if base in seen:
        raise ConfigError(f"preset {name!r} inherits from itself through {base!r}")
    merged = _read_preset(base, seen + (name,))
    for section, values in raw.items():
        merged.setdefault(section, {}).update(values or {})
    return merged


def check_preset_shape(raw, where: str) -> None:
    """A preset is a mapping of sections (``model``, ``data``, ``train``), each a mapping of settings,
    plus an optional ``base``; anything else is one line instead of an AttributeError later."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must be a mapping of sections (model:, data:, train:), got {type(raw).__name__} "
                          f"{str(raw)[:40]!r}; write it like 'train: {{epochs: 5}}'")
    for section, values in raw.items():
        if section != "base" and values is not None and not isinstance(values, dict):
            raise ConfigError(f"{where}: section {section!r} must be a mapping of settings, got {values!r:.40}; "
                              f"write it like '{section}: {{key: value}}'")


def _section_classes(family: str) -> dict[str, type]:
    return {"model": model_config_class(family), "data": DataConfig, "train": TrainConfig}


def _check_type(value: Any, hint: Any, key: str) -> Any:
    """Coerce ``value`` to the dataclass field type ``hint`` or raise a one-line ConfigError;
    ``Literal`` fields name every valid choice."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return check_choice(value, args, key)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for a in args:
            if a is type(None):
                continue
            try:
                return _check_type(value, a, key)
            except ConfigError as e:
                errors.append(str(e))
        raise ConfigError(errors[0] if errors else f"{key} has an invalid value {value!r}")
    if origin is list:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list like {list_example(key, args, value)}, got {value!r}")
        return [_check_type(v, args[0], key) for v in value] if args else list(value)
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be true or false, got {value!r}")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key} must be an integer, got {value!r}")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str) and yaml_io.is_float(value):  # '1e-3' quoted, or read by a YAML 1.1 loader
            return float(value.replace("_", ""))
        raise ConfigError(f"{key} must be a number, got {value!r}")
    if hint is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key} must be a string, got {value!r}")
    return value  # dict / Any


def checked_values(cls: type, values: dict, section: str, names: list[str] | None = None) -> dict:
    """``values`` (setting -> value) for the dataclass ``cls``, each coerced to its field's type, or one line naming
    the key and the fix; ``names``: the settings that may be given (default: every field)."""
    hints = typing.get_type_hints(cls)
    names = names or [f.name for f in dataclasses.fields(cls)]
    unknown = [k for k in values if k not in names]
    if unknown:
        raise ConfigError(f"{section}.{unknown[0]} is not a setting; valid {section} keys: {', '.join(names)}")
    return {k: _check_type(v, hints[k], f"{section}.{k}") for k, v in values.items()}


def _build_section(cls: type, values: dict, section: str):
    return cls(**checked_values(cls, values, section))


def parse_value(raw: str) -> Any:
    """The value of a command line's ``key=value`` as YAML reads it (1e-3, .5, 5. are floats; [a, b] a list), or the
    text itself where it is no YAML; empty: None."""
    try:
        return yaml_io.load(raw) if raw.strip() else None
    except yaml.YAMLError:
        return raw


def parse_overrides(pairs: list[str], family: str) -> dict[str, dict]:
    """``["alpha_min=0.7", "train.epochs=5"]`` -> ``{"model": {...}, "train": {...}}``."""
    sections = {s: {f.name for f in dataclasses.fields(c)} for s, c in _section_classes(family).items()}
    out: dict[str, dict] = {}
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"override {pair!r} is not key=value (for example alpha_min=0.7 or train.epochs=5)")
        key, raw = pair.split("=", 1)
        key = key.strip().replace("-", "_")
        if "." in key:
            section, name = key.split(".", 1)
            if section not in sections:
                raise ConfigError(f"{key!r}: section {section!r} does not exist; use model., data. or train.")
            if name not in sections[section]:
                raise ConfigError(f"{key!r} is not a setting; valid {section} keys: {', '.join(sorted(sections[section]))}")
        else:
            owners = [s for s, names in sections.items() if key in names]
            if not owners:
                valid = sorted(f"{s}.{n}" for s, names in sections.items() for n in names)
                raise ConfigError(f"{key!r} is not a setting; valid keys: {', '.join(valid)}")
            if len(owners) > 1:
                raise ConfigError(f"{key!r} is ambiguous; write one of {', '.join(f'{s}.{key}' for s in owners)}")
            section, name = owners[0], key
        out.setdefault(section, {})[name] = parse_value(raw)
    return out


def check_family(family: str) -> None:
    """A registered model family, or one line naming the plugin fix (a plugin's family is unknown until loaded)."""
    if family not in FAMILIES:
        raise ConfigError(f"model.family {family!r} is unknown (registered: {', '.join(sorted(FAMILIES))}); a family "
                          "added by a plugin needs that plugin: resdecay --plugin FILE.py ...")


def list_example(key: str, args: tuple, value: Any) -> str:
    """An example list for ``key`` made of its own item type (``[tensorboard,csv]``), not a generic ``[1, 3]``."""
    item = args[0] if args else int
    if typing.get_origin(item) is Literal:
        choices = typing.get_args(item)
        one = value if value in choices else choices[0]
        return f"[{','.join(map(str, choices[:2]))}] ({key}=[{one}] for one)"
    return "[0.5, 1.0]" if item is float else "[a, b]" if item is str else "[1, 3]"


def from_dict(d: dict, preset: str = "custom") -> RunConfig:
    model = dict(d.get("model") or {})
    family = model.get("family", "mae")
    check_family(family)
    unknown = set(d) - {"model", "data", "train", "preset"}
    if unknown:
        raise ConfigError(f"config section {sorted(unknown)[0]!r} does not exist; use model, data and train")
    classes = _section_classes(family)
    cfg = RunConfig(
        preset=d.get("preset", preset),
        model=_build_section(classes["model"], model, "model"),
        data=_build_section(DataConfig, dict(d.get("data") or {}), "data"),
        train=_build_section(TrainConfig, dict(d.get("train") or {}), "train"),
    )
    cfg.validate()
    return cfg


def load_config(preset: str, overrides: list[str] | None = None) -> RunConfig:
    """Resolve a preset (name or YAML path) and overrides into a checked RunConfig."""
    raw = _read_preset(preset)
    family = (raw.get("model") or {}).get("family", "mae")
    check_family(family)
    try:
        extra = parse_overrides(overrides or [], family)
    except KeyError as e:  # its message, not the KeyError's repr (quotes around it)
        raise UserError(e.args[0] if e.args else str(e)) from None
    for section, values in extra.items():
        raw.setdefault(section, {}).update(values)
    name = Path(preset).stem if preset.endswith((".yaml", ".yml")) else preset
    cfg = from_dict(raw, preset=name)
    cfg.default_dir = default_out_dir(name, extra)  # used when train.out_dir is not set
    return cfg


# Overrides that change where or how fast a run goes, not what it computes: not part of its folder name.
_NOT_IN_NAME = {"train.device", "train.threads", "train.log_every", "train.ckpt_every", "train.keep_last",
                "train.compile", "train.parallel", "train.reshard_after_forward", "train.hsdp_nodes", "data.num_workers", "data.path", "train.out_dir",
                "train.norm_growth_warn", "train.norm_growth_window", "train.loggers"}


def default_out_dir(preset: str, overrides: dict[str, dict]) -> str:
    """``runs/<preset>``, plus the overridden settings, so that a sweep over alpha_min (or anything
    else that changes the result) gets one folder per setting instead of overwriting itself:
    ``runs/mae-tiny-fmnist_alpha_min-0.7_epochs-50``."""
    parts = []
    for section, values in overrides.items():
        for key, value in values.items():
            if f"{section}.{key}" in _NOT_IN_NAME:
                continue
            text = ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
            parts.append(f"{key}-{re.sub(r'[^A-Za-z0-9.,+-]+', '', text)}")
    name = "_".join([preset, *parts])
    if len(name) > 100:  # keep paths short; the hash keeps distinct settings apart
        name = f"{name[:80]}_{hashlib.sha256(name.encode()).hexdigest()[:10]}"
    return f"runs/{name}"


def suggested_heads(width: int) -> int:
    """A number of heads for ``width`` channels: a divisor of it (so at least 1), nearest to 64-wide heads."""
    return min((h for h in range(1, width + 1) if width % h == 0), key=lambda h: (abs(h - width / 64), h))


def import_config(preset: str, fixed: dict, where: dict, defaults: dict, given: dict[str, dict]) -> RunConfig:
    """The run config of imported weights (``import-weights``, ``--from``): the MAE preset, then the format's
    defaults, the user's overrides and what the weights and the file fix (``fixed``; an override that contradicts
    one is refused, naming ``where`` it comes from)."""
    raw = _read_preset(preset)
    family = (raw.get("model") or {}).get("family", "mae")
    if family != "mae":
        raise UserError(f"--preset must be an MAE preset (its heads, data and training settings), not family {family!r}")
    for key, value in given.get("model", {}).items():
        if key in fixed and value != fixed[key]:
            raise UserError(f"{where.get(key, 'the weights')} set model.{key} = {fixed[key]} for this import; "
                            f"drop the override model.{key}={value}")
    preset_model = raw.get("model") or {}
    # weights do not show the number of heads: the preset's is only trusted at the preset's width
    for width, heads in (("embed_dim", "num_heads"), ("decoder_embed_dim", "decoder_num_heads")):
        if (width in fixed and fixed[width] != preset_model.get(width) and heads not in given.get("model", {})
                and heads not in fixed):
            n = suggested_heads(fixed[width])
            raise UserError(f"the weights have {width} {fixed[width]} but preset {preset!r} has {preset_model.get(width)}, so its "
                            f"{heads} may not be theirs; give model.{heads}=N (e.g. {n}: {fixed[width] // n}-wide heads)")
    raw["model"] = {**preset_model, **defaults, **given.get("model", {}), **fixed}
    for section, values in given.items():
        if section != "model":
            raw.setdefault(section, {}).update(values)
    return from_dict(raw, preset=Path(preset).stem if preset.endswith((".yaml", ".yml")) else preset)
