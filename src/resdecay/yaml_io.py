"""YAML as resdecay reads it: PyYAML's safe loader with YAML 1.2's number syntax for floats.

PyYAML implements YAML 1.1, whose float pattern needs a dot, so ``1e-3``, ``3e-4`` and ``1E-4``
load as *strings* and ``train.base_lr=1e-3`` was refused as "must be a number". ``Loader`` swaps
the float resolver for one that also reads exponents without a dot (and keeps ``.5``, ``5.``,
``1.5e-3``, ``.inf``, ``.nan``). Every place that reads presets, overrides or grids uses
``load`` so a value means the same thing wherever it is written.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from .errors import ConfigError

FLOAT_TAG = "tag:yaml.org,2002:float"

# YAML 1.1's float forms plus exponents without a dot (YAML 1.2 core schema) and an optional
# exponent sign; integers (no dot, no exponent) still resolve as ints.
_FLOAT = re.compile(r"""^(?:
     [-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
    |[-+]?\.[0-9_]+(?:[eE][-+]?[0-9]+)?
    |[-+]?[0-9][0-9_]*[eE][-+]?[0-9]+
    |[-+]?[0-9][0-9_]*(?::[0-5]?[0-9])+\.[0-9_]*
    |[-+]?\.(?:inf|Inf|INF)
    |\.(?:nan|NaN|NAN))$""", re.X)


class Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that reads ``1e-3`` as the float 0.001 (see the module docstring)."""


# Copy the resolver table (it is a class attribute shared with SafeLoader) without the
# YAML 1.1 float entry, then register ours for every character a float can start with.
Loader.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if tag != FLOAT_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
Loader.add_implicit_resolver(FLOAT_TAG, _FLOAT, list("-+0123456789."))


def is_float(text: str) -> bool:
    """Whether ``text`` is written as a float in YAML 1.2 (``1e-3``, ``.5``, ``5.``, ``-2.5E+3``).

    Args:
        text: the string to test.
    """
    return bool(_FLOAT.match(text.strip())) and ":" not in text  # sexagesimal 1:30.5 is YAML-only


def load(text: str) -> Any:
    """Parse one YAML document safely, with YAML 1.2 floats.

    Args:
        text: the YAML source (a preset, a grid file or one override value).

    Returns:
        The parsed value (dict, list, str, int, float, bool or None).
    """
    return yaml.load(text, Loader=Loader)


def load_document(text: str, where: str) -> Any:
    """``load`` for a whole file a user wrote (a preset, a grid): a syntax error or a refused tag
    becomes one ``ConfigError`` line naming the file, the line and the fix, not a parser traceback.

    Args:
        text: the file's YAML source.
        where: how to name the file in the error (its path or preset name).

    Returns:
        The parsed value.
    """
    try:
        return load(text)
    except yaml.YAMLError as e:
        raise ConfigError(describe_error(e, where)) from None


def describe_error(exc: yaml.YAMLError, where: str) -> str:
    """One line for a YAML error: where it is and what to do. A tag such as
    ``!!python/object/apply:os.system`` is named as refused: the safe loader builds plain values
    only, so such a file never runs code; it just cannot be a preset.

    Args:
        exc: the error PyYAML raised.
        where: how to name the file.
    """
    mark = getattr(exc, "problem_mark", None)
    at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = " ".join(str(getattr(exc, "problem", None) or exc).split())
    tag = re.search(r"constructor for the tag '([^']+)'", problem)
    if tag:
        name = tag.group(1).replace("tag:yaml.org,2002:", "!!")
        return (f"{where}: the tag {name}{at} is refused: resdecay reads YAML with the safe loader, which builds "
                "plain values only (numbers, strings, lists, mappings); remove the tag")
    context = getattr(exc, "context", None)
    during = f" ({' '.join(str(context).split())})" if context else ""
    return f"{where} is not valid YAML: {problem}{at}{during}; fix the file (presets are mappings like 'train: {{epochs: 5}}')"
