"""A metric's own options: declared by the metric that reads them (``Metric.options``: a dataclass
instance of typed defaults, or a dict of defaults whose types are those of the values), set per
evaluation (``resdecay eval --metric-option NAME.KEY=VALUE``, repeatable; an ablate grid's
``eval: {metric_options: {NAME: {KEY: VALUE}}}``) and read by the metric's functions with
``settings.options_of(NAME)``.

Every value is checked (the metric exists, declares the key, the value has the key's type and lies in
the key's range) before a feature is extracted, wherever it comes from (``--metric-option``, the flags
that set the same options, ``EvalSettings``, ``MetricSettings``): a typo costs a second, not an
evaluation. A key's range is declared with its type, ``temperature: Annotated[float, Limit(above=0)]``;
every float option is finite besides (``nan`` and ``inf`` are refused). The metric registry declares each
metric's options here when it registers the metric, so that ``protocol.MetricSettings`` (below the
registry) can fill in a metric's defaults.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from ..errors import UserError

_DECLARED: dict[str, Any] = {}  # metric name -> its options' defaults (a dataclass instance or a dict)
SIMPLE = (bool, int, float, str)
NONE_WORDS = ("none", "null")
TRUE_WORDS, FALSE_WORDS = ("true", "1", "yes", "on"), ("false", "0", "no", "off")


# ----------------------------------------------------------------------------- ranges
@dataclasses.dataclass(frozen=True)
class Limit:
    """The values a numeric option takes, declared with its type: ``k: Annotated[int, Limit(least=1)]``,
    ``temperature: Annotated[float, Limit(above=0)]`` (``Annotated[int, Limit(least=2)] | None``: none, or
    at least 2). Every float option is also finite, with or without a limit.

    Args:
        above: the value must be greater than this; least: at least this; most: at most this (None: no bound).
    """

    above: float | None = None
    least: float | None = None
    most: float | None = None

    def holds(self, x: float) -> bool:
        return ((self.above is None or x > self.above) and (self.least is None or x >= self.least)
                and (self.most is None or x <= self.most))

    def words(self, integer: bool) -> str:
        """``a positive integer``, ``a positive finite number``, ``a number in [0, 1]``, ``an integer >= 2``."""
        noun = "integer" if integer else "finite number"
        if self.most is None and (self.above == 0 or (integer and self.least == 1)):
            return f"a positive {noun}"
        if self.most is None and self.least == 0:
            return f"a non-negative {noun}"
        low = f"({_num(self.above)}" if self.above is not None else f"[{_num(self.least)}" if self.least is not None else None
        if low is not None and self.most is not None:
            return f"{'an integer' if integer else 'a number'} in {low}, {_num(self.most)}]"
        bound = (f"> {_num(self.above)}" if self.above is not None else f">= {_num(self.least)}" if self.least is not None
                 else f"<= {_num(self.most)}")
        return f"{'an integer' if integer else 'a finite number'} {bound}"


def _num(x: float) -> str:
    """A bound as written: ``2``, ``4294967295``, ``0.5``."""
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


POSITIVE = Limit(above=0)  # a float > 0 (a temperature, a learning rate)
AT_LEAST_ONE = Limit(least=1)  # a count (neighbours, epochs, images)
NON_NEGATIVE = Limit(least=0)  # a seed, a margin
FRACTION = Limit(least=0, most=1)  # a decay, a share
SEED = Limit(least=0, most=2**32 - 1)  # what numpy and scikit-learn take


def limit_of(kind: Any) -> tuple[Any, Limit | None]:
    """``(the type without its Limit, the Limit)``: ``Annotated[int, Limit(least=1)] | None`` ->
    ``(int | None, Limit(least=1))``; a type without one -> ``(kind, None)``."""
    if typing.get_origin(kind) is Annotated:
        base, *extra = typing.get_args(kind)
        found = next((m for m in extra if isinstance(m, Limit)), None)
        inner, deeper = limit_of(base)
        return inner, found or deeper
    members = _members(kind)
    if len(members) == 1:
        return kind, None
    split = [limit_of(k) for k in members]
    found = next((lim for _, lim in split if lim is not None), None)
    return (typing.Union[tuple(k for k, _ in split)] if found else kind), found


# ----------------------------------------------------------------------------- declaring
def kinds(name: str, defaults: Any) -> dict[str, Any]:
    """``{key: type}`` of a metric's options; a key of a type a command line cannot write is refused.

    Args:
        name: the metric's name (for the message); defaults: its options (dataclass instance or dict).
    """
    if dataclasses.is_dataclass(defaults) and not isinstance(defaults, type):
        hints = typing.get_type_hints(type(defaults), include_extras=True)  # keeps each key's Limit
        found = {f.name: hints[f.name] for f in dataclasses.fields(defaults)}
    elif isinstance(defaults, Mapping):  # a None default takes text (or none)
        found = {k: (str | None) if v is None else type(v) for k, v in defaults.items()}
    else:
        raise UserError(f"metric {name!r}: options must be a dataclass instance or a dict of defaults, "
                        f"got {type(defaults).__name__}")
    for key, kind in found.items():
        bare, limit = limit_of(kind)
        if not all(k in SIMPLE or k is type(None) or typing.get_origin(k) is Literal for k in _members(bare)):
            raise UserError(f"metric {name!r}: option {key!r} has type {kind}; an option is a bool, int, float, str, "
                            "a Literal of choices, or one of these or None")
        if limit is not None and not {int, float} & set(_members(bare)):
            raise UserError(f"metric {name!r}: option {key!r} has a Limit but type {bare}; a Limit bounds an int or float")
    return found


def declare(name: str, defaults: Any) -> None:
    """Record a metric's options (None: it has none). Called by ``metrics.register_metric``."""
    if defaults is None:
        _DECLARED.pop(name, None)
        return
    values = defaults if isinstance(defaults, Mapping) else dataclasses.asdict(defaults)
    for key, kind in kinds(name, defaults).items():  # a default outside its own range is the metric's bug
        convert(values[key], kind, f"{name}.{key}", f"metric {name!r}: the default {name}.{key}={values[key]!r}")
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


def checked(given: Mapping[str, Mapping[str, Any]], known: Iterable[str],
            flags: Mapping[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """The options set for an evaluation, each value of its key's type and in its range; one line on the
    first bad one.

    Args:
        given: metric name -> {key: value}; a value is text (the command line) or already typed (a grid file).
        known: the registered metrics' names.
        flags: the values came from settings, not ``--metric-option``: ``NAME.KEY`` -> the flag that sets
            it (``knn.temperature`` -> ``--temperature``), which the message names; a key without a flag is
            named ``NAME.KEY=VALUE``.
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
            where = f"{name}.{key}"
            label = (f"--metric-option {where}={value}" if flags is None else
                     f"{flags[where]} {value}" if where in flags else f"{where}={value}")
            out.setdefault(name, {})[key] = convert(value, table[key], where, label)
    return out


def checked_declared(given: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """``checked`` for the metrics whose options are declared now (``MetricSettings``, below the registry:
    a name it does not know is left as given, the evaluator having refused unknown names already)."""
    out = {name: dict(keys) for name, keys in given.items()}
    names = [name for name in given if declared(name) is not None]
    out.update(checked({name: given[name] for name in names}, names, flags={}))
    return out


def check_option(name: str, key: str, value: Any, label: str) -> Any:
    """One declared option's value, typed and in its range, set outside an evaluation (a Python function's
    argument: ``knn_accuracy(temperature=...)``); ``label`` names what set it in the one-line message."""
    return convert(value, kinds(name, declared(name))[key], f"{name}.{key}", label)


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


def convert(value: Any, kind: Any, where: str, label: str | None = None) -> Any:
    """``value`` as an option of type ``kind`` in its range (``Limit``; a float is finite), or one line
    saying what the option takes.

    Args:
        value: text (the command line) or a typed value (a grid file); kind: the option's type;
        where: ``NAME.KEY``, for the message; label: what set it, for the message (default
        ``--metric-option NAME.KEY=VALUE``).
    """
    label = label or f"--metric-option {where}={value}"
    bare, limit = limit_of(kind)
    for k in sorted(_members(bare), key=_order):  # "none" is a choice where one is named so, else None
        try:
            typed = _one(value, k)
        except ValueError:
            continue
        if k is float and not math.isfinite(typed) or k in (int, float) and limit and not limit.holds(typed):
            range_words = limit.words(k is int) if limit else "a finite number"
            raise UserError(f"{label}: {where} must be {range_words}, got {value}")
        if k is int and not -2**63 <= typed < 2**63:  # beyond a C integer: a traceback deep in the metric
            raise UserError(f"{label}: {where} must be {limit.words(True) if limit else 'an integer'} below 2**63, "
                            f"got {value}")
        return typed
    raise UserError(f"{label}: {where} takes {_words(bare)}, got {value!r}")
