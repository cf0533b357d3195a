"""``resdecay pretrain``: train a preset through the one loop (``resdecay.train.train``) with the
online evaluation and its figures as hooks (``resdecay.viz.online_figures.online_hooks``)."""

from __future__ import annotations

import warnings

import yaml

from ..train import train
from ..train.config import RunConfig, load_config
from ..train.distributed import is_main_process
from ..viz.online_figures import online_hooks
from .check_data import check_data


def train_with_online_eval(cfg: RunConfig, **options) -> dict:
    """Deprecated: ``train(cfg, hooks=online_hooks(), **options)``, which every command that trains calls."""
    warnings.warn("train_with_online_eval(cfg, ...) is train(cfg, hooks=online_hooks(), ...) "
                  "(resdecay.train.train, resdecay.viz.online_figures.online_hooks)", DeprecationWarning, stacklevel=2)
    return train(cfg, hooks=online_hooks(), **options)


def run_pretrain(preset: str, overrides: list[str], resume: str | None = None, print_config: bool = False,
                 progress: bool = True, check: bool = False, overwrite: bool = False,
                 allow_changes: bool = False) -> dict | None:
    cfg = load_config(preset, overrides)
    if print_config:
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        return None
    if check and is_main_process():  # every unreadable file at once, before hours of training
        check_data(cfg.data, cfg.model.img_size, progress=progress, stop=cfg.data.on_bad_file == "stop")
    summary = train(cfg, hooks=online_hooks(), resume=resume, progress=progress, overwrite=overwrite,
                    allow_changes=allow_changes)
    # the loop wrote summary.json (rank 0); one "done" line, from rank 0, for a run that trained now
    if is_main_process() and summary.get("checkpoint") and not summary.get("already_finished"):
        print(f"done: {summary['steps']} steps, final loss {summary['final_loss']:.4f} (last log window), "
              f"{summary['train_time_s']:.0f}s; checkpoint {summary['checkpoint']}")
    return summary
