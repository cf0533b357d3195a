"""huggingface_hub's model methods on resdecay's models: ``model.save_pretrained(folder)`` and
``model.push_to_hub("user/name")``, with ``PyTorchModelHubMixin``'s signatures.

Mixing ``PyTorchModelHubMixin`` itself in is impractical: it needs huggingface_hub (optional here)
at class creation, captures ``__init__`` arguments as its config (resdecay's config is the model's
whole build, see ``pretrained_config``) and writes config.json its own way. Instead the model's
class is swapped for a subclass that adds the two methods (same name and module, ``isinstance``
unchanged; pickling stores the original class). ``resdecay.from_pretrained``, ``create_model`` and
``load_model`` return such models.

For one release a model from ``from_pretrained`` still unpacks as the old ``(model, config)``
tuple, with a ``DeprecationWarning``; its config.json is ``model.resdecay_config``.
"""

from __future__ import annotations

import copy
import copyreg
import warnings
from typing import Callable

import torch.nn as nn

UNPACK_DEPRECATION = ("resdecay.from_pretrained returns the model now; its config.json is model.resdecay_config. "
                      "Unpacking `model, config = from_pretrained(...)` works until resdecay 0.2: write "
                      "`model = from_pretrained(...)` and `config = model.resdecay_config`")


def _unpack(self):
    warnings.warn(UNPACK_DEPRECATION, DeprecationWarning, stacklevel=2)
    yield self
    yield self.__dict__.get("resdecay_config")


def _reduce_ex(self, protocol):
    """Pickle as the original class (the generated one cannot be found by name)."""
    reduced = super(type(self), self).__reduce_ex__(protocol)
    if isinstance(reduced, tuple) and reduced and reduced[0] in (copyreg.__newobj__, copyreg._reconstructor):
        return (_rebuild, (type(self)._resdecay_base,), *reduced[2:])
    return reduced


def _rebuild(base: type):
    """An empty instance of ``base`` for pickle to fill (as ``copyreg.__newobj__`` makes one)."""
    return base.__new__(base)


def _deepcopy(self, memo):
    """A deep copy keeps the hub methods (pickling, above, stores the original class)."""
    cls = type(self)
    self.__class__ = cls._resdecay_base
    try:
        new = copy.deepcopy(self, memo)
    finally:
        self.__class__ = cls
    new.__class__ = cls
    return new


_CLASSES: dict[tuple[type, bool], type] = {}


def hub_class(base: type, unpackable: bool, save: Callable, push: Callable) -> type:
    """``base`` with the methods ``save_pretrained`` = ``save`` and ``push_to_hub`` = ``push`` (and the
    deprecated tuple unpacking); the methods come from ``interop.pretrained``, which imports this module."""
    key = (base, unpackable)
    if key not in _CLASSES:
        attrs = {"save_pretrained": save, "push_to_hub": push, "__reduce_ex__": _reduce_ex, "__deepcopy__": _deepcopy,
                 "_resdecay_base": base, "__module__": base.__module__, "__qualname__": base.__qualname__,
                 "__doc__": base.__doc__}
        if unpackable:
            attrs["__iter__"] = _unpack
        _CLASSES[key] = type(base.__name__, (base,), attrs)
    return _CLASSES[key]


def with_hub_methods(model: nn.Module, save: Callable, push: Callable, config: dict | None = None,
                     unpackable: bool = False) -> nn.Module:
    """``model`` (in place) with ``save_pretrained`` / ``push_to_hub`` methods and, given,
    ``model.resdecay_config``. A container module that iterates already (``nn.Sequential``) keeps
    its own iteration, so it never unpacks as a tuple.

    Args:
        model: a model resdecay built or loaded.
        config: its config.json (``from_pretrained``).
        unpackable: the deprecated ``model, config = from_pretrained(...)`` form keeps working.
        save, push: the methods (``interop.pretrained``'s).
    """
    base = getattr(type(model), "_resdecay_base", type(model))
    if any("save_pretrained" in vars(m) for m in base.__mro__):
        return model  # the class has its own hub methods: never shadow them
    model.__class__ = hub_class(base, unpackable and not hasattr(base, "__iter__"), save, push)
    if config is not None:
        model.resdecay_config = config
    return model
