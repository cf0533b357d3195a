"""``resdecay pretrain``: train a preset; and ``train_with_online_eval``, the one training loop
(``resdecay.train.train``) with the online evaluators attached, which every command that trains
goes through (the train layer cannot import ``eval/`` itself)."""

from __future__ import annotations

import yaml

from ..eval.online import online_evaluator
from ..train.distributed import is_main_process
from .check_data import check_data
from ..train import train
from ..train.config import RunConfig, load_config


def train_with_online_eval(cfg: RunConfig, resume: str | None = None, progress: bool = True, on_epoch_end=None,
                           init=None, overwrite: bool = False, allow_changes: bool = False) -> dict:
    """``resdecay.train.train`` with ``train.online_eval_every`` served by ``eval.online``."""
    return train(cfg, resume=resume, progress=progress, on_epoch_end=on_epoch_end, init=init,
                 online_eval=online_evaluator, overwrite=overwrite, allow_changes=allow_changes)


def run_pretrain(preset: str, overrides: list[str], resume: str | None = None, print_config: bool = False,
                 progress: bool = True, check: bool = False, overwrite: bool = False,
                 allow_changes: bool = False) -> dict | None:
    cfg = load_config(preset, overrides)
    if print_config:
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        return None
    if check and is_main_process():  # every unreadable file at once, before hours of training
        check_data(cfg.data, cfg.model.img_size, progress=progress, stop=cfg.data.on_bad_file == "stop")
    summary = train_with_online_eval(cfg, resume=resume, progress=progress, overwrite=overwrite, allow_changes=allow_changes)
    # the loop wrote summary.json (rank 0); one "done" line, from rank 0, for a run that trained now
    if is_main_process() and summary.get("checkpoint") and not summary.get("already_finished"):
        print(f"done: {summary['steps']} steps, final loss {summary['final_loss']:.4f} (last log window), "
              f"{summary['train_time_s']:.0f}s; checkpoint {summary['checkpoint']}")
    return summary
