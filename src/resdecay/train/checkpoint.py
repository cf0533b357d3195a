"""Checkpoints: written atomically, pruned to the last k, loaded with ``weights_only=True``.

A checkpoint holds named parts (as torchtitan): ``model``, ``optimizer``, ``scaler``,
``train_state`` (step, epoch, position in the epoch), ``rng`` (every rank's Python, NumPy,
torch CPU and CUDA generator states) and ``config`` (the fully resolved run config, alpha_min
and schedule included, so the network can be rebuilt without the preset).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import numpy as np
import torch

from ..errors import CheckpointError
from ..io import atomic_save, first_sentence, safe_load
from ..models import build_model
from .config import from_dict

FORMAT = "resdecay-checkpoint-v1"
_STEP_FILE = re.compile(r"^step_(\d{8,})\.pt$")


def rng_state() -> dict:
    """This process's random generator states, in types ``weights_only`` loading accepts."""
    np_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"keys": torch.from_numpy(np_state[1].astype(np.int64)), "pos": int(np_state[2]),
                  "has_gauss": int(np_state[3]), "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state(("MT19937", n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def checkpoint_path(ckpt_dir: Path, step: int) -> Path:
    return Path(ckpt_dir) / f"step_{step:08d}.pt"


def list_checkpoints(ckpt_dir: Path) -> list[Path]:
    ckpt_dir = Path(ckpt_dir)
    if not ckpt_dir.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := _STEP_FILE.match(p.name))]
    return [p for _, p in sorted(found)]


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
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    ckpt = safe_load(path, CheckpointError, f"{path} is not a readable resdecay checkpoint ({{reason}})")
    if not isinstance(ckpt, dict) or ckpt.get("format") != FORMAT:
        foreign = foreign_format(ckpt)
        if foreign:
            raise CheckpointError(f"{path} looks like a {foreign[1]} checkpoint, not a resdecay one; convert it first: "
                                  f"resdecay import-weights {path} --format {foreign[0]} --preset PRESET --out imported.pt")
        raise CheckpointError(f"{path} is not a resdecay checkpoint (no '{FORMAT}' marker); "
                              "pass a file from <run>/checkpoints/")
    upgrade_config(ckpt.get("config") or {})
    return ckpt


def foreign_format(obj) -> tuple[str, str] | None:
    """(``import-weights --format``, description) when ``obj`` holds a ViT state_dict in a known
    foreign key layout: the authors' U-Net MAE, facebookresearch/mae, or timm."""
    if not isinstance(obj, dict):
        return None
    weights = next((obj[k] for k in ("model", "state_dict") if isinstance(obj.get(k), dict)), obj)
    keys = {k for k in weights if isinstance(k, str)}
    if not any(k.startswith("blocks.0.") for k in keys):
        return None
    if any(k.startswith("skip.") for k in keys):
        return "unet-mae", "U-Net MAE (the authors' key layout; alpha_min from the file's args.min_decay, or --alpha-min when it has no args)"
    if any(k.startswith("decoder_") for k in keys):
        return "mae", "facebookresearch/mae pretraining"
    return "timm-vit", "timm ViT"


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
        return path, load_checkpoint(path)
    skipped = []
    for candidate in reversed(list_checkpoints(ckpt_dir)):
        try:
            state = load_checkpoint(candidate)
        except CheckpointError as e:
            skipped.append((candidate, str(e)))
            continue
        for bad, why in skipped:
            say(f"warning: --resume auto skipped {bad.name}: {why}; resuming from the previous complete checkpoint {candidate}")
        return candidate, state
    raise CheckpointError(f"--resume auto: no checkpoint in {ckpt_dir} can be read (newest: {skipped[0][1]}); "
                          "start over with --overwrite, or pass --resume <a good step_*.pt>")


def model_differences(saved: dict, current: dict) -> list[str]:
    """Model settings that differ between a checkpoint's config and this run's."""
    keys = sorted(set(saved) | set(current))
    return [f"model.{k}: checkpoint {saved.get(k)!r} vs run {current.get(k)!r}" for k in keys if saved.get(k) != current.get(k)]


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
