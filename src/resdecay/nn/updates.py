"""Residual updates: the branch a block adds, as a function of the stream x and the branch's output f.

The decay (paper eq. 3) changes the factor of x in ``x_{l+1} = alpha_l * x_l + beta_l * f_l(x_l)``; an *update*
changes what is added: ``x_{l+1} = alpha_l * x_l + beta_l * u(x_l, f_l(x_l))``. The one built in is the orthogonal
residual update (Oh et al., NeurIPS 2025): only the part of f orthogonal to x is added, so a block cannot rescale
the stream it is given, only turn it::

    u(x, f) = f - (<x, f> / (||x||^2 + eps)) x        (eps = 1e-6, the reference code's)

in three scopes of the inner product: per token over its channels (``orthogonal``, the reference's feature-wise
"channel" form on a ViT's (B, T, D) tokens), per image over all its tokens and channels (``orthogonal_global``, the
reference's "global" form), and per channel over the tokens (``orthogonal_tokens``). The projection's coefficient is
cast to x's dtype before it scales x, as the reference does for mixed precision.

An update is registered by name (``register_update``) and named by a shortcut formula (``register_shortcut(...,
update=NAME)``: ``model.shortcut=orthogonal``); ``residual_add`` applies it before the add, so every block built on
``residual_add`` and the residual-stream diagnostics (which read the add there) see the branch actually added.
"""

from __future__ import annotations

from typing import Callable

import torch

from ..errors import Registry, UserError, defined_at

Update = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]  # (x, f) -> what the add adds (before beta)

EPS = 1e-6  # the orthogonal update's epsilon: ||x||^2 + eps in the projection's denominator (reference code)

RESIDUAL_UPDATES: dict[str, Update] = {}
_UPDATES = Registry("residual update", "register_update", RESIDUAL_UPDATES, origin=lambda fn: f"by {defined_at(fn)}")


def register_update(name: str, replace: bool = False) -> Callable[[Update], Update]:
    """Register ``update(x, f) -> u`` under ``name`` (a decorator); a taken name is refused unless ``replace``."""
    def add(fn: Update) -> Update:
        _UPDATES.add(name, fn, replace)
        return fn
    return add


def unregister_update(name: str) -> Update:
    """Remove the update registered under ``name`` (``RegistryError`` if there is none); returns it."""
    return _UPDATES.remove(name)


def update_named(name: str | None) -> Update | None:
    """The registered update ``name`` (None: the branch as it is)."""
    return None if name is None else RESIDUAL_UPDATES[name]


def _orthogonal(x: torch.Tensor, f: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """f minus its projection on x, the inner products summed over ``dims``. Token streams (B, T, D) only: a 4-D
    tensor may be (B, C, H, W) or (B, H, W, C), and a projection over the wrong axis would run without a sign."""
    if x.dim() != 3:
        raise UserError(f"the orthogonal residual update is defined on (B, T, D) token streams; this add's stream has "
                        f"shape {tuple(x.shape)} (a feature map?): use a shortcut formula without an update here")
    dot = (x * f).sum(dims, keepdim=True)
    norm2 = (x * x).sum(dims, keepdim=True) + EPS
    return f - (dot / norm2).to(x.dtype) * x


@register_update("orthogonal")
def orthogonal(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Per token: each token's branch made orthogonal to that token's stream, over its channels (the last dim)."""
    return _orthogonal(x, f, (-1,))


@register_update("orthogonal_global")
def orthogonal_global(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Per image: the whole branch made orthogonal to the whole stream (every token and channel)."""
    return _orthogonal(x, f, tuple(range(1, x.dim())))


@register_update("orthogonal_tokens")
def orthogonal_tokens(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """Per channel: each channel's branch over the tokens made orthogonal to that channel of the stream."""
    return _orthogonal(x, f, (1,))
