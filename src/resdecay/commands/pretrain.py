"""``resdecay pretrain``: train a preset through the one loop (``resdecay.train.train``) with the
online evaluation and its figures as hooks (``resdecay.viz.online_figures.online_hooks``); with
``--from SOURCE``, a fresh run that starts from a pretrained MAE's weights (``pretrain_from``)."""

from __future__ import annotations

import warnings
from pathlib import Path

import yaml

from ..errors import UserError
from ..train import train
from ..train.checkpoint import list_checkpoints
from ..train.config import RunConfig, load_config
from ..train.distributed import is_main_process
from ..train.run.summary import forget_stale_record, read_pretrained_record, remove_pretrained_record, write_summary
from ..viz.online_figures import online_hooks
from .aux_target import load_aux_target
from .check_data import check_data
from .pretrain_from import Source, resolve_source


def train_with_online_eval(cfg: RunConfig, **options) -> dict:
    """Deprecated: ``train(cfg, hooks=online_hooks(), **options)``, which every command that trains calls."""
    warnings.warn("train_with_online_eval(cfg, ...) is train(cfg, hooks=online_hooks(), ...) "
                  "(resdecay.train.train, resdecay.viz.online_figures.online_hooks)", DeprecationWarning, stacklevel=2)
    return train(cfg, hooks=online_hooks(), **options)


def run_pretrain(preset: str, overrides: list[str], resume: str | None = None, print_config: bool = False,
                 progress: bool = True, check: bool = False, overwrite: bool = False, allow_changes: bool = False,
                 source: str | None = None, fmt: str | None = None, import_preset: str | None = None,
                 alpha_min: float | None = None, import_overrides: list[str] | None = None) -> dict | None:
    """Train ``preset`` with ``overrides``; with ``source`` (``--from``), start a fresh run from its weights
    (``fmt``, ``import_preset``, ``alpha_min`` and ``import_overrides`` as ``resdecay finetune``'s)."""
    cfg = load_config(preset, overrides)
    start = None
    if source is not None:  # resolved and checked before anything is written
        start = resolve_source(source, preset, cfg, fmt, import_preset, alpha_min, import_overrides)
    elif fmt or import_preset or alpha_min is not None or import_overrides:
        raise UserError("--format, --import-preset, --alpha-min and --import-override say how to import --from SOURCE; "
                        "give --from SOURCE (or drop them)")
    if print_config:
        print(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        return None
    if check and is_main_process():  # every unreadable file at once, before hours of training
        check_data(cfg.data, cfg.model.img_size, progress=progress, stop=cfg.data.on_bad_file == "stop")
    aux_target = load_aux_target(cfg)  # REPA's frozen encoder: a bad one is one line before anything is written
    init = start.init if start is not None else forget_stale_record(cfg.out_dir)
    existed = cfg.out_dir.exists()
    try:
        summary = train(cfg, hooks=online_hooks(), resume=resume, progress=progress, overwrite=overwrite,
                        allow_changes=allow_changes, init=init, aux_target=aux_target)
    except BaseException:
        if start is not None and start.used and is_main_process():
            drop_failed_record(cfg.out_dir, existed)
        raise
    if is_main_process():
        summary = record_source(summary, start)
    # the loop wrote summary.json (rank 0); one "done" line, from rank 0, for a run that trained now
    if is_main_process() and summary.get("checkpoint") and not summary.get("already_finished"):
        print(f"done: {summary['steps']} steps, final loss {summary['final_loss']:.4f} (last log window), "
              f"{summary['train_time_s']:.0f}s; checkpoint {summary['checkpoint']}")
    return summary


def record_source(summary: dict, start: Source | None) -> dict:
    """summary.json's ``pretrained``: the source the run's weights started from (pretrained.json), whichever
    launch of the run this is; a finished run's summary is left as it was."""
    own = summary.get("resumed_from") or (summary.get("already_finished") and summary.get("checkpoint"))
    if start is not None and not start.used and own:
        print(f"note: --from {start.pretrained.path} was not loaded: the run resumed from its own checkpoint {own}")
    record = read_pretrained_record(Path(summary["out_dir"])) if summary.get("out_dir") else None
    if record is None or summary.get("already_finished"):
        return summary
    summary = {**summary, "pretrained": record}
    write_summary(Path(summary["out_dir"]), summary)
    return summary


def drop_failed_record(out_dir: Path, existed: bool) -> None:
    """A fresh start from --from that failed before its first log row or checkpoint: the loop removed what it
    created; remove the record too (and the folder, if this start created it and that leaves it empty)."""
    out = Path(out_dir)
    if (out / "log.jsonl").exists() or list_checkpoints(out / "checkpoints"):
        return
    remove_pretrained_record(out)
    if not existed and out.is_dir() and not any(out.iterdir()):
        out.rmdir()
