"""``resdecay checkpoint consolidate FOLDER --out FILE.pt``: a sharded run's DCP checkpoint
(``train.parallel=fsdp2 | hsdp``, ``<run>/checkpoints/step_N/``) written as the single file a DDP run
writes (whole weights, optimizer, EMA and the run's state), on one process, without a process group.

Every command that reads checkpoints (``eval``, ``export``, ``finetune``, ``pretrain --from``, ``sample``)
also reads the folder itself; the file is for tools outside resdecay, for copying one file, and for
continuing the run under DDP (``--resume FILE.pt`` with ``train.parallel=ddp``). The command's parser is
``cli/checkpoint.py``.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import CheckpointError, UserError
from ..train.checkpoint import FORMAT
from ..train.sharded_checkpoint import is_dcp_folder, read_meta, save_consolidated


def run_consolidate(folder: str, out: str, overwrite: bool = False) -> Path:
    src, dst = Path(folder), Path(out)
    if not is_dcp_folder(src):
        hint = ("it is already a single file" if src.is_file() else
                "a sharded checkpoint is a folder <run>/checkpoints/step_N/ holding .metadata and run_state.pt")
        raise CheckpointError(f"{src} is not a sharded (DCP) resdecay checkpoint: {hint}")
    if dst.exists() and not overwrite:
        raise UserError(f"{dst} exists; choose another --out or pass --overwrite")
    if dst.suffix != ".pt":
        raise UserError(f"--out {dst}: name the single file FILE.pt (resume and --resume auto look for step_*.pt)")
    meta = read_meta(src, FORMAT)
    save_consolidated(src, meta, dst)
    step = meta.get("train_state", {}).get("step")
    print(f"wrote {dst}: the whole checkpoint of step {step} from {src} "
          f"({meta.get('train_state', {}).get('world_size')} ranks' shards)")
    return dst
