"""The order of depth of models whose blocks do not run in ``model.modules()`` order.

``decayify`` schedules alpha over the residual adds in depth order, which for a plain stack is the order the
blocks are registered in. A U-Net registers its blocks down, up, mid (diffusers) although its forward runs
down, mid, up; a two-stream model may keep its streams in separate lists. A ``DepthOrder`` says, for a model
class, which of its blocks are on the schedule and in which order, and which stay at alpha 1 — and may take
``decayify`` keywords that choose between readings of the paper (``{name: (choice, ...)}``, default first).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch.nn as nn

from ...errors import Registry
from .registry import class_matches

Found = list  # [(name, block, adapter name)], as decayify's residual_blocks lists them


@dataclass(frozen=True)
class DepthOrder:
    """How ``decayify`` orders the blocks of one kind of model.

    Args:
        name: shown in messages ("diffusers UNet2DModel: down, mid, up").
        classes: the model classes, as ``"module.prefix:ClassName"`` strings or as types.
        order: ``order(model, found, options)`` -> ``(scheduled, plain)``: the blocks on the schedule in depth
            order, and those kept at alpha 1 (both lists of ``found``'s entries).
        options: the ``decayify`` keywords it takes, ``{name: (choice, ...)}`` with the default first.
    """

    name: str
    classes: tuple
    order: Callable[[nn.Module, Found, dict], tuple[Found, Found]]
    options: dict = field(default_factory=dict)

    def matches(self, model: nn.Module) -> bool:
        return class_matches(model, self.classes)


_ORDERS: dict[str, DepthOrder] = {}
_REGISTRY = Registry("depth order", "register_depth_order", _ORDERS, origin=lambda o: f"for {o.classes}")


def register_depth_order(order: DepthOrder, replace: bool = False) -> DepthOrder:
    """Add ``order`` (a name that is taken is refused unless ``replace=True``, as every registry of the package)."""
    _REGISTRY.add(order.name, order, replace)
    return order


def unregister_depth_order(name: str) -> DepthOrder:
    """Remove the depth order registered under ``name``; returns it."""
    return _REGISTRY.remove(name)


def depth_orders() -> list[DepthOrder]:
    """Every registered depth order, in registration order."""
    return list(_ORDERS.values())


def depth_order_for(model: nn.Module) -> DepthOrder | None:
    """The depth order registered for ``model``'s class, or None (``model.modules()`` order)."""
    return next((o for o in _ORDERS.values() if o.matches(model)), None)
