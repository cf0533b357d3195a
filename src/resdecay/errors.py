"""Errors a user can fix. The CLI prints them as one line and exits with code 2."""

from __future__ import annotations


class UserError(Exception):
    """Bad input (config, data, checkpoint, path): the message says what is wrong and the fix."""


class ConfigError(UserError):
    """A preset, key or value that does not exist or is out of range."""


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
