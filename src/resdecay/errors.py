"""Errors a user can fix. The CLI prints them as one line and exits with code 2."""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Literal


class UserError(Exception):
    """Bad input (config, data, checkpoint, path): the message says what is wrong and the fix."""


class ConfigError(UserError, ValueError):
    """A preset, key or value that does not exist or is out of range. Also a ValueError, so code
    that builds a model from a hand-made config (``SiT(SiTConfig(depth=5))``) may catch either."""


class DataError(UserError):
    """A dataset path or file that cannot be used."""


class CheckpointError(UserError):
    """A checkpoint that cannot be resumed or loaded into this model."""


class TrainingDiverged(Exception):
    """The loss became non-finite; the last good checkpoint is kept. CLI exit code 3."""


def one_line(exc: BaseException) -> str:
    """The user-facing line of an error, also when it was re-raised by a DataLoader worker.

    DataLoader workers re-raise ``SomeError(msg)`` in the main process with the worker's whole
    traceback in the message; the original message is its last non-empty line.
    """
    text = str(exc).strip()
    if "Traceback (most recent call last)" in text:
        last = [ln for ln in text.splitlines() if ln.strip()][-1]
        text = last.split(": ", 1)[1] if ": " in last else last
    return " ".join(text.split())


# ----------------------------------------------------------------------------- config checks
def check_choice(value: Any, choices: tuple, key: str) -> Any:
    """``value`` if it is one of ``choices``, else a ConfigError naming every valid one."""
    if value not in choices:
        raise ConfigError(f"{key} {value!r} is unknown; choose one of {', '.join(map(str, choices))}")
    return value


def check_fields(cfg: Any, section: str, positive: tuple[str, ...] = ()) -> None:
    """The one checker of config dataclasses: every ``Literal`` field holds one of its choices and
    every field named in ``positive`` is an integer >= 1. Errors name the key and the fix."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        if typing.get_origin(hints[f.name]) is Literal:
            check_choice(getattr(cfg, f.name), typing.get_args(hints[f.name]), f"{section}.{f.name}")
    for name in positive:
        if getattr(cfg, name) < 1:
            raise ConfigError(f"{section}.{name} must be a positive integer, got {getattr(cfg, name)}")
