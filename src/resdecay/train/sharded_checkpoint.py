"""Sharded checkpoints of ``train.parallel=fsdp2 | hsdp`` runs: a ``torch.distributed.checkpoint`` (DCP)
folder per step, written by every rank at once and readable on any number of ranks (DCP reshards on load:
save on 4, resume on 2), as torchtitan and dinov3 keep theirs.

    checkpoints/step_00000020/      one checkpoint: a folder instead of step_00000020.pt
        .metadata                   DCP's index: every tensor's global shape and where its pieces are
        __<rank>_0.distcp           each rank's shards of model, optimizer (and ema) state
        run_state.pt                 the rest of the checkpoint format, written by rank 0 (train/checkpoint.py's
                                    train_state, rng, loss_window, scaler, config, plugins, the format marker)

Atomic like the single files: everything is written into ``.step_00000020.tmp`` and renamed once every rank
has finished, so a kill leaves a hidden folder that ``--resume auto`` never sees (and the next save clears).
``consolidate`` reads a folder back into the single-file format every other command reads (``eval``,
``export``, ``finetune --from``), and ``resdecay checkpoint consolidate`` writes it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import torch.distributed as dist

from ..errors import CheckpointError
from ..io import atomic_save, first_sentence, safe_load

SIDE = "run_state.pt"  # the non-tensor parts, beside DCP's files


def _dcp():
    """torch.distributed.checkpoint, imported on first use: it takes ≈ 0.6 s, and every command imports this module
    through train/checkpoint.py, sharded run or not."""
    import torch.distributed.checkpoint as dcp

    return dcp


def is_dcp_folder(path: Path) -> bool:
    path = Path(path)
    return path.is_dir() and (path / ".metadata").is_file() and (path / SIDE).is_file()


def tmp_folder(folder: Path) -> Path:
    return folder.parent / f".{folder.name}.tmp"


def sharded_state(model, optimizer=None, ema_module=None) -> dict:
    """The sharded tensors of a run (DTensor shards, keyed by parameter names, as DCP saves and loads them)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state = {"model": get_model_state_dict(model)}
    if optimizer is not None:
        state["optimizer"] = get_optimizer_state_dict(model, optimizer)
    if ema_module is not None:
        state["ema"] = get_model_state_dict(ema_module)
    return state


def save_sharded(folder: Path, tensors: dict, meta: dict | None, is_main: bool, keep_last: int) -> Path:
    """Every rank writes its shards of ``tensors`` into ``folder`` (collective); rank 0 adds ``meta``
    (its ``run_state.pt``), renames the finished folder into place and prunes to the last ``keep_last``."""
    folder = Path(folder)
    tmp = tmp_folder(folder)
    if is_main:
        folder.parent.mkdir(parents=True, exist_ok=True)
        for stale in folder.parent.glob(".step_*.tmp"):  # a killed save's leftovers
            shutil.rmtree(stale, ignore_errors=True)
    _barrier()
    _dcp().save(tensors, checkpoint_id=tmp)
    if is_main:
        atomic_save(meta, tmp / SIDE)
        if folder.exists():
            shutil.rmtree(folder)
        os.replace(tmp, folder)
        done = sorted(p for p in folder.parent.glob("step_*") if is_dcp_folder(p))
        for old in done[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    _barrier()
    return folder


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def check_complete(folder: Path) -> None:
    """Every shard file DCP's index names is there and long enough: a truncated or missing shard is one
    line here, not a deserialisation error from inside DCP halfway through loading."""
    try:
        metadata = _dcp().FileSystemReader(str(folder)).read_metadata()
    except Exception as e:
        raise CheckpointError(f"{folder}: DCP's index .metadata cannot be read ({first_sentence(str(e), 120)})") from None
    need: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        need[info.relative_path] = max(need.get(info.relative_path, 0), info.offset + info.length)
    for name, size in sorted(need.items()):
        have = (folder / name).stat().st_size if (folder / name).is_file() else None
        if have is None or have < size:
            what = "is missing" if have is None else f"holds {have} of its {size} bytes (truncated)"
            raise CheckpointError(f"{folder} is incomplete: shard {name} {what}; resume from an earlier checkpoint "
                                  "(--resume auto skips it) or copy the folder again")


def read_meta(folder: Path, marker: str) -> dict:
    """The folder's ``run_state.pt`` (checked complete, with the format ``marker``); ``sharded`` names the folder."""
    folder = Path(folder)
    check_complete(folder)
    meta = safe_load(folder / SIDE, CheckpointError, f"{folder / SIDE} is not readable ({{reason}})")
    if not isinstance(meta, dict) or meta.get("format") != marker:
        raise CheckpointError(f"{folder} is a DCP folder, but not a resdecay checkpoint (no '{marker}' marker in {SIDE})")
    return {**meta, "sharded": str(folder)}


def restore_sharded(folder: Path, model, optimizer, ema_module=None) -> None:
    """Load a DCP folder into a sharded model, its optimizer and EMA, resharding to this run's ranks."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    state = sharded_state(model, optimizer, ema_module)
    try:
        _dcp().load(state, checkpoint_id=str(folder))
    except Exception as e:  # DCP raises CheckpointException listing every rank's failure
        raise CheckpointError(f"{folder} does not fit this model ({first_sentence(str(e), 200)}); resume it with the "
                              "settings it was trained with, or start a new train.out_dir") from None
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optimizer"])
    if ema_module is not None and "ema" in state:
        set_model_state_dict(ema_module, state["ema"])


def consolidate(folder: Path, meta: dict) -> dict:
    """The single-file checkpoint a DCP folder holds: whole tensors, read on one process without a
    process group, the optimizer state re-keyed from parameter names to the positions
    ``torch.optim.Optimizer.load_state_dict`` expects (the order of the parameter groups)."""
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    full: dict = {}
    _load_state_dict(full, storage_reader=_dcp().FileSystemReader(str(folder)), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    out = {k: v for k, v in meta.items() if k != "sharded"}
    out["model"] = full["model"]
    if "ema" in full:
        out["ema"] = full["ema"]
    if "optimizer" in full:
        out["optimizer"] = positional_optimizer_state(full["optimizer"])
    return out


def positional_optimizer_state(named: dict) -> dict:
    """``get_optimizer_state_dict``'s name-keyed state -> ``optimizer.state_dict()``'s position-keyed one."""
    order = [name for group in named["param_groups"] for name in group["params"]]
    index = {name: i for i, name in enumerate(order)}
    groups = [{**group, "params": [index[n] for n in group["params"]]} for group in named["param_groups"]]
    return {"state": {index[n]: s for n, s in named["state"].items()}, "param_groups": groups}


def save_consolidated(folder: Path, meta: dict, out: Path) -> Path:
    """Write ``consolidate(folder)`` as one file (atomically): what ``resdecay checkpoint consolidate`` does."""
    atomic_save(consolidate(folder, meta), Path(out))
    return Path(out)


def check_same_layout(parallel: str, path: Path, state: dict) -> None:
    """A sharded run resumes DCP folders, a DDP run single files: mixing them is one line naming the way across."""
    was_sharded = "sharded" in state
    if was_sharded and parallel == "ddp":
        one = Path(path).parent.parent / f"{Path(path).name}.pt"
        raise CheckpointError(f"{path} is a sharded (DCP) checkpoint, but train.parallel=ddp resumes single files; resume "
                              f"with train.parallel=fsdp2 (or hsdp), or convert it first: resdecay checkpoint consolidate "
                              f"{path} --out {one}, then --resume {one}")
    if not was_sharded and parallel != "ddp" and "optimizer" in state:
        raise CheckpointError(f"{path} is a single-file (DDP) checkpoint, but train.parallel={parallel} resumes sharded "
                              "DCP folders; resume it with train.parallel=ddp, or start the sharded run over "
                              "(--from it with resdecay pretrain to keep the weights)")


__all__ = ["SIDE", "check_complete", "consolidate", "is_dcp_folder", "read_meta", "check_same_layout", "restore_sharded", "save_consolidated",
           "save_sharded", "sharded_state"]
