"""Checkpoints: the format, saving a run's state (atomically, pruned to the last k, optionally in the
background), restoring it on resume, and loading a trained model (``weights_only=True``).

A checkpoint is one ``torch.save``d dict of named parts (as torchtitan), marked ``format:
resdecay-checkpoint-v1``:

    model        the bare network's state_dict
    optimizer    the optimizer's state_dict
    scaler       the fp16 GradScaler's state_dict
    train_state  step, epoch, step_in_epoch, world_size, images (training-set size), and where
                 known train_time_s (summed over launches), final_loss and trackers (the W&B /
                 MLflow runs a resumed launch continues: train/log/tracking.py)
    rng          every rank's Python, NumPy, torch CPU and CUDA generator states
    loss_window  every rank's open log window (runlog.LossWindow), so a resumed run logs the
                 same rows as an uninterrupted one
    ema          the EMA weights, when train.ema_decay > 0
    aux          train.aux's state (train/aux_objective.py): REPA's projector weights, every rank's open
                 windows of the loss parts, the frozen encoder's seconds so far (never the encoder's
                 weights: the config names it)
    config       the fully resolved run config (alpha_min and schedule included), so the network
                 can be rebuilt without the preset

Only tensors and plain Python values: no pickled classes, so old files keep loading. Runs with
``train.parallel=fsdp2 | hsdp`` write the same parts as a DCP folder ``step_<step>/`` instead
(``sharded_checkpoint.py``); ``load_checkpoint`` reads either.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

import torch

from ..errors import CheckpointError
from ..io import atomic_save, first_sentence, safe_load
from ..models import FAMILIES, build_model, model_config_class
from . import distributed as dist_env
from . import sharded_checkpoint as sharded
from .config import RunConfig, from_dict
from .import_formats import ImportFormat, SourceFile, detect_import_format, register_import_format
from .parallel import is_sharded
from .rng_state import rng_state, set_rng_state
from .run.previous_run import HARMLESS, check_resume_changes, inexact_changes

FORMAT = "resdecay-checkpoint-v1"
_STEP_FILE = re.compile(r"^step_(\d{8,})(\.pt)?$")  # a file, or a DCP folder (sharded runs)


def checkpoint_path(ckpt_dir: Path, step: int) -> Path:
    return Path(ckpt_dir) / f"step_{step:08d}.pt"


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir()
             if (m := _STEP_FILE.match(p.name)) and (m.group(2) or sharded.is_dcp_folder(p))]
    return [p for _, p in sorted(found)]


def is_resdecay_source(source: SourceFile) -> bool:
    """A run folder (or its checkpoints/ folder) holding step_*.pt files, or a file with resdecay's format marker."""
    if source.contents is None:
        return bool(list_checkpoints(source.path / "checkpoints") or list_checkpoints(source.path)
                    or sharded.is_dcp_folder(source.path))
    return isinstance(source.contents, dict) and source.contents.get("format") == FORMAT


# the native source of finetune / pretrain --from, first in the registry: read as it is, nothing converted
register_import_format(ImportFormat("resdecay", "resdecay checkpoint", is_resdecay_source, convert=None))


def save_checkpoint(state: dict, ckpt_dir: Path, step: int, keep_last: int) -> Path:
    ckpt_dir = Path(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    path = checkpoint_path(ckpt_dir, step)
    good = list_checkpoints(ckpt_dir)
    keep = f"the last good checkpoint {good[-1]} is kept" if good else "no earlier checkpoint was written"
    # a full disk: one line naming the file and the space it needs; old files are pruned only after a good write
    atomic_save({"format": FORMAT, **state}, path, fix=f"{keep}; free some space there, then continue with --resume auto")
    for old in list_checkpoints(ckpt_dir)[:-keep_last]:
        old.unlink(missing_ok=True)
    return path


def load_checkpoint(path: str | Path) -> dict:
    """Load a resdecay checkpoint safely (``weights_only=True``) or raise one clear error."""
    path = Path(path)
    exported = exported_folder(path)
    if exported is not None:  # else "does not exist" (the folder) or "a facebookresearch/mae checkpoint" (its weights)
        raise CheckpointError(exported_message(path, exported))
    if sharded.is_dcp_folder(path):  # a sharded run's checkpoint: read whole, as the single file would hold it
        return checked(sharded.consolidate(path, sharded.read_meta(path, FORMAT)), path)
    if path.is_dir():  # a run folder: name the checkpoint file it holds
        newest = (list_checkpoints(path / "checkpoints") or list_checkpoints(path) or [None])[-1]
        hint = f"pass {newest}" if newest is not None else "it holds no checkpoints/step_*.pt"
        raise CheckpointError(f"{path} is a folder, not a checkpoint file; {hint}")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    ckpt = safe_load(path, CheckpointError, f"{path} is not a readable resdecay checkpoint ({{reason}})")
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        foreign = detect_import_format(SourceFile(path, lambda _: ckpt), native=False)
        if foreign is not None:
            raise CheckpointError(f"{path} looks like a {foreign.description} checkpoint, not a resdecay one; convert it "
                                  f"first: resdecay import-weights {path} --format {foreign.name} --preset PRESET --out "
                                  "imported.pt")
        raise CheckpointError(f"{path} is not a resdecay checkpoint (no '{FORMAT}' marker); "
                              "pass a file from <run>/checkpoints/")
    return checked(ckpt, path)


def checked(state: dict, path: Path) -> dict:
    """A loaded checkpoint (a file's, or a DCP folder's) with its config upgraded and its family's plugin loaded."""
    upgrade_config(state.get("config") or {})
    check_plugins(state, path)
    return state


def exported_message(path: Path, folder: Path) -> str:
    """Why ``path`` (an exported folder or its weights) is no training checkpoint, and the route that reads it:
    ``from_pretrained`` for resdecay's own ``export --to hf``; ``import-weights --format hf-vitmae`` for a
    transformers ViTMAE folder (``export --to hf-vitmae``, a hub download), which ``from_pretrained`` refuses."""
    try:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        model_type = None
    if model_type is None:
        return (f"{path} is a save_pretrained / `export --to hf` model (config.json + model.safetensors), not a training "
                f"checkpoint; load it with resdecay.from_pretrained('{folder}'), or pass the step_*.pt it was exported from")
    head = f"{path} is a transformers {model_type} model (config.json + model.safetensors), not a resdecay checkpoint"
    if model_type != "vit_mae":
        return f"{head}; resdecay reads transformers ViTMAE folders only (resdecay import-weights FOLDER --format hf-vitmae)"
    return (f"{head}; convert it first: resdecay import-weights {folder} --format hf-vitmae --preset PRESET --out "
            "imported.pt (the preset gives data and training settings; the sizes come from config.json), then "
            "resdecay eval imported.pt")


def exported_folder(path: Path) -> Path | None:
    """The huggingface_hub-layout folder ``path`` is, or whose ``model.safetensors`` it is; else None."""
    folder = path if path.is_dir() else path.parent
    if path.is_file() and path.name != "model.safetensors":
        return None
    return folder if (folder / "config.json").is_file() and (folder / "model.safetensors").is_file() else None


def upgrade_config(config: dict) -> None:
    """Fill in settings whose default changed after a checkpoint was written, with the value that
    checkpoint was trained under, so it rebuilds the same function (in place)."""
    model = config.get("model") or {}
    if model.get("family") == "sit":
        model.setdefault("gelu", "exact")  # SiT MLPs used exact GELU before the tanh default
        model.setdefault("zero_init", True)  # and zero-initialised skip Linears


def resolve_resume(resume: str | None, ckpt_dir: Path) -> Path | None:
    """``auto`` -> newest checkpoint in the run's folder (None if there is none yet)."""
    if not resume:
        return None
    if resume == "auto":
        found = list_checkpoints(ckpt_dir)
        return found[-1] if found else None
    path = Path(resume)
    if sharded.is_dcp_folder(path):
        return path
    if path.is_dir():
        found = list_checkpoints(path / "checkpoints") or list_checkpoints(path)
        if not found:
            raise CheckpointError(f"--resume {path}: the folder holds no step_*.pt checkpoint")
        return found[-1]
    if not path.is_file():
        raise CheckpointError(f"--resume {path}: no such checkpoint; use --resume auto or a step_*.pt file")
    return path


def load_resume(resume: str | None, ckpt_dir: Path, say=print) -> tuple[Path | None, dict | None]:
    """The checkpoint to resume from and its loaded state ((None, None) for a fresh start).

    ``--resume auto`` takes the newest checkpoint that loads: one truncated by a full disk or a
    crash of the machine (a kill cannot truncate one: writes are atomic) is skipped, named in one
    line, and the previous one is used. An explicit path must load, or it is one clear error.

    Args:
        resume: None, "auto", a checkpoint file or a run folder.
        ckpt_dir: the run's ``checkpoints`` folder (for "auto").
        say: prints the warning about a skipped file (rank 0's print).
    """
    path = resolve_resume(resume, ckpt_dir)
    if path is None:
        return None, None
    if resume != "auto":
        return path, resume_state(path)
    skipped = []
    for candidate in reversed(list_checkpoints(ckpt_dir)):
        try:
            state = resume_state(candidate)
        except PluginNeeded:  # readable: an older checkpoint would need the plugin too
            raise
        except CheckpointError as e:
            skipped.append((candidate, str(e)))
            continue
        for bad, why in skipped:
            say(f"warning: --resume auto skipped {bad.name}: {why}; resuming from the previous complete checkpoint {candidate}")
        return candidate, state
    raise CheckpointError(f"--resume auto: no checkpoint in {ckpt_dir} can be read (newest: {skipped[0][1]}); "
                          "start over with --overwrite, or pass --resume <a good step_*.pt>")


def resume_state(path: Path) -> dict:
    """A checkpoint file loaded whole, or a DCP folder's non-tensor parts (each rank reads its own shards later)."""
    return checked(sharded.read_meta(path, FORMAT), path) if sharded.is_dcp_folder(path) else load_checkpoint(path)


# model settings that change how a step is computed, not the function: a run may resume with them changed
SAME_FUNCTION = {"grad_checkpointing"}


def model_differences(saved: dict, current: dict) -> list[str]:
    """Model settings that differ between a checkpoint's config and this run's. A setting the
    checkpoint predates (a field added to the family since) counts as its default, the value the
    older code built with, as ``load_model`` rebuilds it."""
    defaults = field_defaults(model_config_class(current["family"])) if "family" in current else {}
    saved = {**{k: v for k, v in defaults.items() if k in current}, **saved}
    keys = sorted((set(saved) | set(current)) - SAME_FUNCTION)
    return [f"model.{k}: checkpoint {saved.get(k)!r} vs run {current.get(k)!r}" for k in keys if saved.get(k) != current.get(k)]


def field_defaults(config_class: type) -> dict:
    """``{field: default}`` of a config dataclass (fields without a default are left out)."""
    out = {}
    for f in dataclasses.fields(config_class):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


class PluginNeeded(CheckpointError):
    """A readable checkpoint whose model family only a plugin registers, and none loaded here does."""


def loaded_plugins() -> list[str]:
    """The ``--plugin`` files (or modules) this process loaded, as ``cli.plugins`` noted them; a checkpoint
    records them, so a model whose family a plugin adds can name the file it needs to load again."""
    module = sys.modules.get("resdecay.cli.plugins")  # not imported: a library user's process, no --plugin
    return list(vars(module).get("LOADED", [])) if module is not None else []


def check_plugins(state: dict, path) -> None:
    """A checkpoint whose model family is not registered here: one line naming the plugin it was trained
    with (checkpoints record the plugins loaded; older ones do not), not "model.family is unknown"."""
    family = (state.get("config") or {}).get("model", {}).get("family", "mae")
    if family in FAMILIES:
        return
    recorded = state.get("plugins") or []
    fix = (f"pass the plugin it was trained with: resdecay --plugin {' --plugin '.join(recorded)} ..." if recorded else
           "pass the plugin file that registers it: resdecay --plugin FILE.py ...")
    raise PluginNeeded(f"{path} is a model of family {family!r}, which a plugin adds and none loaded here registers; {fix}")


def load_model(path: str | Path, device: str | torch.device = "cpu", ema: bool = False, state: dict | None = None):
    """Rebuild the network a checkpoint describes (alpha_min and schedule from its config) and
    load its weights (``ema=True``: the EMA weights where the run kept them, as sampling wants).
    ``state``: the checkpoint already loaded with ``load_checkpoint`` (saves reading it twice).
    Returns (model in eval mode, RunConfig)."""
    state = load_checkpoint(path) if state is None else state
    cfg = from_dict(state["config"])
    model = build_model(cfg.model)
    try:
        model.load_state_dict(state["ema"] if ema and "ema" in state else state["model"])
    except RuntimeError as e:
        raise CheckpointError(f"{path}: weights do not fit the model its config describes ({first_sentence(str(e), 200)})") from None
    return model.to(device).eval(), cfg


# ----------------------------------------------------------------------------- a run's state
def save_training(run, progress: dict | None = None) -> Path:
    """Save ``run`` (``setup.Run``) at its step as ``<run>/checkpoints/step_<step>.pt``: every rank
    contributes its RNG state and open loss window, rank 0 writes the file, in the background when
    the run has a ``writer`` (``async_checkpoint.CheckpointWriter``: snapshot now, write later),
    else here, atomically.

    Args:
        run: the launch's state: config (stored whole), environment, bare model, optimizer, scaler,
            EMA, step, data (steps per epoch, training-set size), loss window.
        progress: train_time_s over all launches, final_loss and the tracker runs, kept in ``train_state``.
    """
    env, step, data = run.env, run.step, run.data
    aux = run.aux
    ranks = dist_env.gather_objects(env, (rng_state(), run.window.state() if run.window is not None else None,
                                          aux.window_state() if aux is not None else None))
    rngs = [r for r, _, _ in ranks]
    path = checkpoint_path(run.ckpt_dir, step)  # every rank returns it; rank 0 writes it
    state = None
    if env.is_main:
        state = {"scaler": run.scaler.state_dict(),
                 "train_state": {"step": step, "epoch": step // data.steps_per_epoch,
                                 "step_in_epoch": step % data.steps_per_epoch, "world_size": env.world_size,
                                 "images": len(data.samples), **(progress or {})},
                 "rng": rngs, "config": run.cfg.to_dict(), "plugins": loaded_plugins()}
        if run.window is not None:
            state["loss_window"] = [w for _, w, _ in ranks]
        if aux is not None:
            state["aux"] = aux.state([a for _, _, a in ranks])
    if is_sharded(run.raw):  # every rank writes its shards of the weights, optimizer and EMA
        tensors = sharded.sharded_state(run.raw, run.optimizer, run.ema.module if run.ema is not None else None)
        return sharded.save_sharded(path.with_suffix(""), tensors, state and {"format": FORMAT, **state}, env.is_main,
                                    run.cfg.train.keep_last)
    if env.is_main:
        state.update(model=run.raw.state_dict(), optimizer=run.optimizer.state_dict())
        if run.ema is not None:
            state["ema"] = run.ema.module.state_dict()
        if run.writer is not None:
            run.writer.submit(state, run.ckpt_dir, step, run.cfg.train.keep_last)
        else:
            save_checkpoint(state, run.ckpt_dir, step, run.cfg.train.keep_last)
    dist_env.barrier(env)
    return path


def restore_training(cfg: RunConfig, env, path: Path, raw, optimizer, scaler, say, images: int | None = None,
                     allow_changes: bool = False, state: dict | None = None, ema_module=None
                     ) -> tuple[int, dict | None, dict]:
    """Load a checkpoint of the same model into this run: weights, optimizer, scaler and this rank's
    RNG (a sharded run: its DCP folder, resharded to this run's ranks, the EMA into ``ema_module``).
    Refuses another model, and (unless ``allow_changes``) settings that would make the resumed
    run differ from an uninterrupted one.

    Returns (step, EMA weights or None, the run so far: ``setup.Run.so_far``)."""
    state = resume_state(path) if state is None else state
    check_resumable(cfg, env, path, state, say, images, allow_changes)
    if "sharded" in state:
        sharded.restore_sharded(Path(state["sharded"]), raw, optimizer, ema_module)
    else:
        raw.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    scaler.load_state_dict(state["scaler"])
    step = int(state["train_state"]["step"])
    rngs, windows = state["rng"], state.get("loss_window")
    if len(rngs) == env.world_size:
        set_rng_state(rngs[env.rank])
    else:
        say(f"note: checkpoint has RNG states of {len(rngs)} ranks, this run has {env.world_size}; reseeding")
        torch.manual_seed(cfg.train.seed + env.rank + step)
    ts = state["train_state"]
    progress = {"train_time_s": ts.get("train_time_s"), "final_loss": ts.get("final_loss"),
                "loss_window": windows[env.rank] if windows and len(windows) == env.world_size else None,
                "trackers": ts.get("trackers"), "aux": state.get("aux")}
    return step, state.get("ema"), progress


def check_resumable(cfg: RunConfig, env, path: Path, state: dict, say, images: int | None, allow_changes: bool) -> None:
    """Refuse a checkpoint of another model or, unless allowed, of inexact settings; note harmless
    changes (device, workers, logging, ...) and a training set that changed size."""
    sharded.check_same_layout(cfg.train.parallel, path, state)
    if not all(k in state for k in ("scaler", "train_state", "rng")) or not ("optimizer" in state or "sharded" in state):
        raise CheckpointError(f"{path} holds model weights only (written by import-weights or export), not a training "
                              f"run's checkpoint, so there is no optimizer state to resume; evaluate it (resdecay eval "
                              f"{path}), fine-tune from it (resdecay finetune {path}) or continue pretraining it as a new "
                              f"run (resdecay pretrain --preset PRESET --from {path})")
    saved_images = state["train_state"].get("images")
    if images is not None and saved_images is not None and saved_images != images:
        say(f"note: the training set has {images} images now but had {saved_images} when {path.name} was written; "
            "the data order from here on differs from the original run's")
    now = cfg.to_dict()
    diffs = model_differences(state["config"]["model"], now["model"])
    if diffs:
        raise CheckpointError(f"cannot resume from {path}: it is a different model ({'; '.join(diffs[:3])}); "
                              "use the checkpoint's settings or a new train.out_dir")
    changes = inexact_changes(state["config"], now, state["train_state"].get("world_size"), env.world_size)
    check_resume_changes(changes, allow_changes, path, say)
    for section in ("data", "train"):  # the harmless ones are only noted
        for k, v in now[section].items():
            if k in HARMLESS[section] and state["config"][section].get(k, v) != v:
                say(f"note: {section}.{k} changed since the checkpoint ({state['config'][section].get(k)!r} -> {v!r})")
