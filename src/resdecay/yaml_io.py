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
