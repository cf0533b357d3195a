"""Reading the pickles of datasets (CIFAR's python batches) without letting them run code.

``pickle.load`` calls whatever callable a file names (``os.system``, ``exec``, ...), so a
downloaded or shared "CIFAR batch" could run anything as the user who trains on it. The
unpickler here admits only the globals the real files need to rebuild their contents:

    dicts, lists, tuples, str, bytes, ints, floats   (pickle opcodes, no global needed)
    numpy arrays and dtypes                          ``numpy.core.multiarray._reconstruct``,
                                                     ``numpy.ndarray``, ``numpy.dtype``
    numpy scalars (labels stored as numpy ints)      ``numpy.core.multiarray.scalar``
    arrays written with pickle protocol 5            ``numpy.core.numeric._frombuffer``
    bytes written by Python 3 at protocol <= 2       ``_codecs.encode(text, "latin1")``

each also under NumPy 2's ``numpy._core`` spelling. Anything else is refused, before it is
called, with one line naming the file.
"""

from __future__ import annotations

import codecs
import importlib
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from .errors import DataError


class Refused(pickle.UnpicklingError):
    """The file names a global (or a feature) that plain data does not need."""


def _numpy_attr(module: str, name: str) -> Any:
    """``module.name`` from NumPy's private core package, whichever spelling this NumPy has
    (importing ``numpy.core`` on NumPy 2 warns, so ``numpy._core`` is tried first)."""
    for prefix in ("numpy._core", "numpy.core"):
        try:
            return getattr(importlib.import_module(f"{prefix}.{module}"), name)
        except (ImportError, AttributeError):
            continue
    raise AttributeError(f"numpy has no {module}.{name}")


def _latin1_encode(text: str, encoding: str = "utf-8") -> bytes:
    """Python 3 pickles bytes at protocols <= 2 as ``_codecs.encode(text, "latin1")``; only that
    conversion is allowed (another codec name is refused rather than looked up)."""
    if encoding != "latin1" or not isinstance(text, str):
        raise Refused(f"it calls _codecs.encode with encoding {encoding!r}")
    return codecs.encode(text, "latin1")


def _allowed() -> dict[tuple[str, str], Any]:
    table: dict[tuple[str, str], Any] = {("numpy", "ndarray"): np.ndarray, ("numpy", "dtype"): np.dtype,
                                         ("_codecs", "encode"): _latin1_encode}
    for module, name in (("multiarray", "_reconstruct"), ("multiarray", "scalar"), ("numeric", "_frombuffer")):
        obj = _numpy_attr(module, name)
        for prefix in ("numpy.core", "numpy._core"):
            table[(f"{prefix}.{module}", name)] = obj
    return table


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler whose ``find_class`` admits only the globals of plain array data."""

    def __init__(self, file, **kwargs):
        super().__init__(file, **kwargs)
        self._table = _allowed()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._table[(module, name)]
        except KeyError:
            raise Refused(f"it references {module}.{name}") from None

    def persistent_load(self, pid: Any) -> Any:
        raise Refused("it uses persistent ids")


def load_data_pickle(path: str | Path, what: str = "dataset file") -> Any:
    """Unpickle ``path`` admitting only plain data (see the module docstring).

    Args:
        path: the pickle file to read.
        what: what the file should be, for the error message (e.g. "cifar10 batch").

    Returns:
        The unpickled object (for CIFAR: a dict of a uint8 array and a label list).

    Raises:
        DataError: one line naming the file, when it cannot be read or names anything else.
    """
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            # latin1: CIFAR's files were written by Python 2, whose str is bytes
            return RestrictedUnpickler(fh, encoding="latin1").load()
    except Refused as e:
        reason = " ".join(str(e).split())
        raise DataError(f"refusing to load {path} as a {what}: {reason}, which plain data never needs (a pickle "
                        "can run code); use the original file from the dataset's official archive") from None
    except Exception as e:  # truncated or not a pickle at all
        reason = " ".join(f"{type(e).__name__}: {e}".split())[:160]
        raise DataError(f"cannot read {path} as a {what} ({reason})") from None
