"""Options several subcommands share, declared once as argparse parent parsers; their choices come
from the registries (datasets, devices) so the CLI cannot drift from the library."""

from __future__ import annotations

import argparse

from ..data import DATASETS

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
