"""Options several subcommands share, declared once as argparse parent parsers; their choices come
from the registries (datasets, devices) so the CLI cannot drift from the library. ``--format`` is checked
against the import-format registry when the command runs, not frozen as argparse choices, so a format
registered after the parser is built is taken too (an unknown one: one line, exit 2)."""

from __future__ import annotations

import argparse
import json

from ..data import DATASETS
from ..errors import UserError
from ..train.import_formats import import_format_names

DEVICES = ("auto", "cpu", "cuda")


def progress_option() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    return p


def device_option() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--device", default="auto", choices=DEVICES, help="auto | cpu | cuda")
    return p


def data_options(default_help: str = "dataset (default: the checkpoint's)") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--data", default=None, choices=DATASETS, help=default_help)
    p.add_argument("--data-path", default=None, help="dataset folder")
    return p


def run_folder_options(resume_help: str = "auto (newest checkpoint in the run folder) or a checkpoint path") -> argparse.ArgumentParser:
    """What to do with a run folder that already holds a run (train/run/previous_run.py)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--out", default=None, metavar="DIR",
                   help="run folder (the same as train.out_dir=DIR; default runs/<preset>_<overridden settings>)")
    p.add_argument("--resume", default=None, help=resume_help)
    p.add_argument("--overwrite", action="store_true", help="start over in a folder that holds a run (deletes that run's files)")
    p.add_argument("--allow-changes", action="store_true",
                   help="resume although batch / data / seed / lr / processes changed (no longer exact)")
    return p


def source_options(source_help: str, import_preset_help: str) -> argparse.ArgumentParser:
    """``--from SOURCE`` and how a foreign source is imported: ``finetune --from`` and ``pretrain --from``
    (both resolved by ``interop.import_weights.load_pretrained``)."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--from", dest="source", default=None, metavar="SOURCE", help=source_help)
    formats = ", ".join(import_format_names()).replace("%", "%%")  # argparse formats help with %
    p.add_argument("--format", default=None, help=f"the source's format, one of {formats} (default: detected)")
    p.add_argument("--import-preset", default=None, help=import_preset_help)
    p.add_argument("--alpha-min", type=float, default=None, help="for an imported unet-mae file without args: its alpha_min")
    p.add_argument("--import-override", action="append", default=[], metavar="key=value",
                   help="for an imported model: import-weights' key=value (repeatable), e.g. model.num_heads=12")
    return p


def run_overrides(args: argparse.Namespace) -> list[str]:
    """The key=value overrides of a command parsed with ``run_folder_options``, ``--out DIR`` added as
    ``train.out_dir=DIR`` (what `resdecay pretrain` and `resdecay submit pretrain` both resolve)."""
    if args.out is None:
        return list(args.overrides)
    if any(o.split("=", 1)[0] in ("train.out_dir", "out_dir") for o in args.overrides):
        raise UserError("give the run folder once: --out DIR or train.out_dir=DIR, not both")
    return [*args.overrides, f"train.out_dir={json.dumps(args.out)}"]  # JSON quoting: a YAML string whatever the path
