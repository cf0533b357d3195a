"""A metric's own options: declared by the metric that reads them (``Metric.options``: a dataclass
instance of typed defaults, or a dict of defaults whose types are those of the values), set per
evaluation (``resdecay eval --metric-option NAME.KEY=VALUE``, repeatable; an ablate grid's
``eval: {metric_options: {NAME: {KEY: VALUE}}}``) and read by the metric's functions with
``settings.options_of(NAME)``.

Every value is checked (the metric exists, declares the key, the value has the key's type) before
a feature is extracted: a typo costs a second, not an evaluation. The metric registry declares each
metric's options here when it registers the metric, so that ``protocol.MetricSettings`` (below the
registry) can fill in a metric's defaults.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from ..errors import UserError

_DECLARED: dict[str, Any] = {}  # metric name -> its options' defaults (a dataclass instance or a dict)
SIMPLE = (bool, int, float, str)
NONE_WORDS = ("none", "null")
TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


# ----------------------------------------------------------------------------- declaring
def kinds(name: str, defaults: Any) -> dict[str, Any]:
    """``{key: type}`` of a metric's options; a key of a type a command line cannot write is refused.

    Args:
        name: the metric's name (for the message); defaults: its options (dataclass instance or dict).
    """
    if dataclasses.is_dataclass(defaults) and not isinstance(defaults, type):
        hints = typing.get_type_hints(type(defaults))
        found = {f.name: hints[f.name] for f in dataclasses.fields(defaults)}
    elif isinstance(defaults, Mapping):  # a None default takes text (or none)
        found = {k: (str | None) if v is None else type(v) for k, v in defaults.items()}
    else:
        raise UserError(f"metric {name!r}: options must be a dataclass instance or a dict of defaults, "
                        f"got {type(defaults).__name__}")
    for key, kind in found.items():
        if not all(k in SIMPLE or k is type(None) or typing.get_origin(k) is Literal for k in _members(kind)):
            raise UserError(f"metric {name!r}: option {key!r} has type {kind}; an option is a bool, int, float, str, "
                            "a Literal of choices, or one of these or None")
    return found


def declare(name: str, defaults: Any) -> None:
    """Record a metric's options (None: it has none). Called by ``metrics.register_metric``."""
    if defaults is None:
        _DECLARED.pop(name, None)
        return
    kinds(name, defaults)
    _DECLARED[name] = defaults


def forget(name: str) -> None:
    """Drop a metric's options (``metrics.unregister_metric``)."""
    _DECLARED.pop(name, None)


def declared(name: str) -> Any:
    """A metric's declared options (None: none declared)."""
    return _DECLARED.get(name)


# ----------------------------------------------------------------------------- setting
def parse_assignments(items: Iterable[str], flag: str = "--metric-option") -> dict[str, dict[str, str]]:
    """``["knn.k=10", "cka.reference=1"]`` -> ``{"knn": {"k": "10"}, "cka": {"reference": "1"}}``
    (the values stay text until ``checked`` gives them their types)."""
    out: dict[str, dict[str, str]] = {}
    for item in items:
        target, eq, value = item.partition("=")
        name, dot, key = target.strip().partition(".")
        if not eq or not dot or not name or not key:
            raise UserError(f"{flag} {item!r} is not NAME.KEY=VALUE (e.g. {flag} knn.k=10)")
        out.setdefault(name, {})[key.strip()] = value.strip()
    return out


def checked(given: Mapping[str, Mapping[str, Any]], known: Iterable[str]) -> dict[str, dict[str, Any]]:
    """The options set for an evaluation, each value of its key's type; one line on the first bad one.

    Args:
        given: metric name -> {key: value}; a value is text (the command line) or already typed (a grid file).
        known: the registered metrics' names.
    """
    known = list(known)
    out: dict[str, dict[str, Any]] = {}
    for name, keys in given.items():
        if name not in known:
            raise UserError(f"--metric-option {name}.*: no metric named {name!r}; the metrics are {', '.join(known)}")
        defaults = declared(name)
        table = kinds(name, defaults) if defaults is not None else {}
        for key, value in keys.items():
            if key not in table:
                have = f"its options are {', '.join(table)}" if table else "it has no options"
                raise UserError(f"--metric-option {name}.{key}: metric {name!r} has no option {key!r}; {have}")
            out.setdefault(name, {})[key] = convert(value, table[key], f"{name}.{key}")
    return out


def resolve(name: str, given: Mapping[str, Any]) -> Any:
    """A metric's options for one evaluation: its declared defaults with ``given``'s (typed) values."""
    defaults = declared(name)
    if defaults is None:
        return dict(given)
    if isinstance(defaults, Mapping):
        return {**defaults, **given}
    return dataclasses.replace(defaults, **given) if given else defaults


# ----------------------------------------------------------------------------- one value
def _members(kind: Any) -> tuple:
    """The alternatives of a union type (``int | None`` -> (int, NoneType)); a plain type alone."""
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        return typing.get_args(kind)
    return (kind,)


def _words(kind: Any) -> str:
    """What an option of type ``kind`` takes, in words ("an integer (or none: the default)")."""
    names, choices = [], []
    for k in _members(kind):
        if typing.get_origin(k) is Literal:
            choices += [str(c).lower() for c in typing.get_args(k)]
            names.append("one of " + ", ".join(map(str, typing.get_args(k))))
        elif k is not type(None):
            names.append({bool: "true or false", int: "an integer", float: "a number", str: "text"}[k])
    unset = type(None) in _members(kind) and "none" not in choices  # where "none" is a choice, it reads as that
    return " or ".join(names) + (" (or none: the default)" if unset else "")


def _order(k: Any) -> int:
    """Which reading of a text is tried first: choices and numbers, then none, then plain text."""
    return 2 if k is str else 1 if k is type(None) else 0


def _one(value: Any, k: Any) -> Any:
    """``value`` as type ``k``; raises ValueError when it is not one."""
    text = value.strip().lower() if isinstance(value, str) else None
    if k is type(None):
        if value is None or text in NONE_WORDS:
            return None
    elif typing.get_origin(k) is Literal:
        for choice in typing.get_args(k):
            if value == choice or (text is not None and str(choice).lower() == text):
                return choice
    elif k is bool:
        if isinstance(value, bool):
            return value
        if text in TRUE_WORDS or text in FALSE_WORDS:
            return text in TRUE_WORDS
    elif k is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if text is not None:
            return int(text)
    elif k is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if text is not None:
            return float(text)
    elif k is str and isinstance(value, str):
        return value
    raise ValueError(value)


def convert(value: Any, kind: Any, where: str) -> Any:
    """``value`` as an option of type ``kind``, or one line saying what the option takes.

    Args:
        value: text (the command line) or a typed value (a grid file); kind: the option's type;
        where: ``NAME.KEY``, for the message.
    """
    for k in sorted(_members(kind), key=_order):  # "none" is a choice where one is named so, else None
        try:
            return _one(value, k)
        except ValueError:
            continue
    raise UserError(f"--metric-option {where}={value}: {where} takes {_words(kind)}, got {value!r}")
