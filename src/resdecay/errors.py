"""Errors a user can fix. The CLI prints them as one line and exits with code 2.

Also the one convention of the package's registries (``Registry``): shortcut formulas
(``nn.residual.register_shortcut``), model families (``models.register_family``), metrics
(``eval.metrics.register_metric``), input sources (``eval.sources.register_source``), block adapters and
depth orders (``nn.adapters.register_adapter`` / ``register_depth_order``), ``--model`` formats
(``interop.foreign_model.register_model_format``) and the sources of pretrained weights
(``train.import_formats.register_import_format``).
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, Callable, Generic, Literal, TypeVar


class UserError(Exception):
    """Bad input (config, data, checkpoint, path): the message says what is wrong and the fix."""


class ConfigError(UserError, ValueError):
    """A preset, key or value that does not exist or is out of range. Also a ValueError, so code
    that builds a model from a hand-made config (``SiT(SiTConfig(depth=5))``) may catch either."""


class DataError(UserError):
    """A dataset path or file that cannot be used."""


class InputMismatch(DataError):
    """Images of another side or channel count than the model takes. ``key`` is "img_size" or "in_chans",
    ``data`` the images' value and ``model`` the model's: a command re-words the fix in its own options
    (``resdecay eval``: ``--resize``, ``--model-arg``) where the data pipeline's ``model.*`` overrides do not apply."""

    def __init__(self, message: str, key: str, data: int, model: int):
        super().__init__(message)
        self.key, self.data, self.model = key, data, model


class CheckpointError(UserError):
    """A checkpoint that cannot be resumed or loaded into this model."""


class RegistryError(ConfigError):
    """A registration refused: a name already taken (without ``replace=True``), a name to unregister
    that is not registered, or an entry that cannot work. The one error type of every registry;
    a ``ConfigError``, so also a ``UserError`` (one line, exit 2) and a ``ValueError``."""


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


# ----------------------------------------------------------------------------- the registries' convention
T = TypeVar("T")


class Registry(Generic[T]):
    """Entries by name in registration order, with the convention every registry of the package follows:

    * ``add(name, entry)`` refuses a name that is taken, in one line naming who holds it, unless
      ``replace=True``, which swaps the entry in place (it keeps its place in the order). The same
      definition registered again (``same(old, new)``: by default the same object) is no clash.
    * ``remove(name)`` takes an entry out and returns it; a name that is not registered is refused.
    * Every refusal is a ``RegistryError``.

    Args:
        kind: what an entry is, in messages ("model family").
        call: the function that registers one, in messages ("register_family").
        table: the dict the entries live in (a registry's public table, e.g. ``FAMILIES``); a new one if None.
        origin: ``origin(entry) -> str``: who holds a name, in the clash message ("by mylib.decay").
        same: ``same(old, new) -> bool``: ``new`` is ``old``'s definition registered again.
    """

    def __init__(self, kind: str, call: str, table: dict[str, T] | None = None, *,
                 origin: Callable[[T], str] | None = None, same: Callable[[T, T], bool] | None = None):
        self.kind, self.call = kind, call
        self.table: dict[str, T] = {} if table is None else table
        self.origin = origin
        self.same = same if same is not None else (lambda old, new: old is new)

    def check(self, name: str, entry: T, replace: bool = False) -> None:
        """Refuse ``name`` if another entry holds it and ``replace`` is False (``add`` checks this itself)."""
        if name in self.table and not replace and not self.same(self.table[name], entry):
            held = f" {self.origin(self.table[name])}" if self.origin is not None else ""
            raise RegistryError(f"{self.kind} {name!r} is already registered{held}; register yours under another name, "
                                f"or pass replace=True to {self.call} to replace it")

    def add(self, name: str, entry: T, replace: bool = False) -> T:
        """Register ``entry`` under ``name`` (see the class); returns ``entry``."""
        self.check(name, entry, replace)
        self.table[name] = entry
        return entry

    def remove(self, name: str) -> T:
        """Take ``name``'s entry out and return it."""
        if name not in self.table:
            known = ", ".join(map(str, self.table)) or "none"
            raise RegistryError(f"{self.kind} {name!r} is not registered, so it cannot be unregistered; registered: {known}")
        return self.table.pop(name)


def defined_at(fn: Any) -> str:
    """``module.qualname`` of a function or class: where a registered entry was defined, for messages."""
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"
