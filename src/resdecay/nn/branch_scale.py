"""Branch-side scaling and stochastic depth of a two-add block, in one place: the gain that multiplies a branch
before ``residual_add`` adds it, and the paths a training step drops (``model.branch_scale``,
``model.layerscale_init``, ``model.drop_branch``, ``model.drop_identity``). With every add's formula
(``model.shortcut``: decay, orthogonal, ...) a block's add becomes::

    x_{l+1} = (keep_id / (1 - p_id)) * alpha * x  +  beta * u(x, (keep_br / (1 - p_br)) * gamma * f(x))

keep_id, keep_br ~ Bernoulli(1 - p) per sample, drawn in training only (eval: no drop, no rescale, as timm's
DropPath). The gain and the branch drop act on the branch the block computed (after adaLN's gate in
``AdaLNBlock``), before the formula's update u: an update that keeps the added term orthogonal to x
(``nn.updates``) still does so with a per-channel gain. The identity drop scales alpha, the factor of x's
term, so u still reads the stream itself. Every setting at its identity value leaves the block's arithmetic
untouched: ``none`` adds no module weights and no multiply, and a drop of 0 draws nothing.

Gains (``model.branch_scale``), as their papers define them:

``layerscale`` (Touvron et al., CaiT, ICCV 2021)
    a learned per-channel vector per add, initialised to epsilon (``model.layerscale_init``: 1e-5 as timm's
    default, 0.1 for shallow models). timm's ``LayerScale`` under timm's names ``ls1.gamma`` / ``ls2.gamma``,
    so timm-style checkpoints map key for key.
``skipinit`` (De & Smith, NeurIPS 2020)
    a learned scalar at the end of each residual branch, initialised to 0: one per add (``ls1.gamma``,
    ``ls2.gamma``, shape (1,)). The paper uses it *instead of* normalisation; here the pre-LN LayerNorms stay,
    so only its multiplier is taken.
``rezero`` (Bachlechner et al., 2020)
    one learned scalar per *block*, initialised to 0, shared by both adds: the reference code's
    ``resweight`` multiplies the attention and the feed-forward branch of a layer alike. Held as
    ``ls1.gamma`` (shape (1,)), which ``ls2`` reads. ReZero also removes the LayerNorms; here they stay.

A gain that starts at 0 is the block's zero start, so the architecture's own zero start steps aside: a
zero gain on a zeroed last layer (``model.zero_init``) or a zero adaLN gate (SiT) would give neither
factor a gradient, and the branch would never train (``starts_silent``).

Stochastic depth, each probability rising linearly with depth from 0 at the first block to the setting at
the last (timm's ``dpr = torch.linspace(0, drop_path_rate, depth)``; ``depth_rates``):

``drop_branch``
    the branch dropped per sample (Huang et al. 2016; timm's ``DropPath``), kept branches scaled by 1/(1-p).
``drop_identity``
    the shortcut dropped per sample instead, kept ones scaled by 1/(1-p): the stochastic alternative to the
    decay (Zhang et al., arXiv 2404.10947) -- the identity's weight stays 1 in expectation, but a block cannot
    rely on the input reaching it.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn as nn

from ..errors import ConfigError

BranchScale = Literal["none", "rezero", "layerscale", "skipinit"]
SILENT_START = ("rezero", "skipinit")  # gains initialised to 0: the branch starts silent through the gain


def depth_rates(rate: float, depth: int) -> list[float]:
    """Per-block probabilities rising linearly from 0 (first block) to ``rate`` (last), as timm's
    ``torch.linspace(0, drop_path_rate, depth)`` (here in float64, so the last block gets ``rate`` itself)."""
    return [rate * (i / max(depth - 1, 1)) for i in range(depth)]


def drop_path_module(rate: float) -> nn.Module:
    """timm's DropPath for ``rate > 0``, else the identity. timm is imported here, not at module level:
    ``import timm`` loads all of timm's models and data code (about 2 s of every command's start-up),
    and only runs with stochastic depth use it."""
    if rate <= 0:
        return nn.Identity()
    from timm.layers import DropPath

    return DropPath(rate)


class DropIdentity(nn.Module):
    """Stochastic depth on the shortcut: in training, ``alpha`` becomes a per-sample factor
    ``alpha * keep / (1 - p)`` (keep ~ Bernoulli(1 - p), shape (B, 1, ..., 1)), drawn as timm's ``drop_path``
    draws DropPath's mask; in eval, or at p = 0, ``alpha`` is returned as it is (a float stays a float, so
    ``residual_add`` keeps its fused kernel and the plain add stays bit-exact)."""

    def __init__(self, p: float = 0.0):
        super().__init__()
        self.p = float(p)
        if self.p > 0:  # timm only where it is used (see drop_path_module)
            from timm.layers import drop_path

            self.draw = drop_path

    def forward(self, alpha: float | torch.Tensor, x: torch.Tensor) -> float | torch.Tensor:
        if not self.training or self.p == 0.0:
            return alpha
        keep = self.draw(x.new_ones((x.shape[0],) + (1,) * (x.dim() - 1)), self.p, training=True)  # 0 or 1/(1-p)
        return keep * alpha

    def extra_repr(self) -> str:
        return f"p={self.p:g}"


class TiedGain(nn.Module):
    """ReZero's second add: the block's one gain, read from the first add's ``LayerScale`` (held outside
    ``_modules``, so the state_dict has it once, as ``ls1.gamma``)."""

    def __init__(self, source: nn.Module):
        super().__init__()
        object.__setattr__(self, "source", source)  # not a submodule: no second state_dict entry

    def forward(self, branch: torch.Tensor) -> torch.Tensor:
        return branch * self.source.gamma

    def extra_repr(self) -> str:
        return "tied to ls1 (ReZero: one gain per block)"


def branch_gains(kind: str, dim: int, layerscale_init: float = 1e-5) -> tuple[nn.Module, nn.Module]:
    """``(ls1, ls2)``: the gains of a block's attention and MLP branch for ``model.branch_scale=kind``."""
    if kind == "none":
        return nn.Identity(), nn.Identity()
    from timm.layers import LayerScale  # imported here as DropPath is: only these settings need timm

    if kind == "layerscale":
        return LayerScale(dim, layerscale_init), LayerScale(dim, layerscale_init)
    if kind == "skipinit":
        return LayerScale(1, 0.0), LayerScale(1, 0.0)
    if kind == "rezero":
        ls1 = LayerScale(1, 0.0)
        return ls1, TiedGain(ls1)
    raise ConfigError(f"branch_scale {kind!r} is unknown; choose one of {', '.join(BranchScale.__args__)}")


def set_branch_scale(block: nn.Module, dim: int, branch_scale: str = "none", layerscale_init: float = 1e-5,
                     drop_branch: float = 0.0, drop_identity: float = 0.0) -> None:
    """Put a two-add block's gains and drops where its forward reads them: ``ls1`` / ``ls2`` (gains),
    ``drop_path`` (the branch's drop, timm's name) and ``drop_identity`` (the shortcut's drop).

    Args:
        block: a ``Block`` or ``AdaLNBlock``.
        dim: the block's width (a LayerScale vector's length).
        branch_scale: none | rezero | layerscale | skipinit (the module docstring).
        layerscale_init: LayerScale's epsilon.
        drop_branch, drop_identity: this block's drop probabilities (``depth_rates`` of the settings).
    """
    block.branch_scale = branch_scale
    block.ls1, block.ls2 = branch_gains(branch_scale, dim, layerscale_init)
    block.drop_path = drop_path_module(drop_branch)
    block.drop_identity = DropIdentity(drop_identity)


def starts_silent(block: nn.Module) -> bool:
    """Whether the block's gain starts at 0 (rezero, skipinit), so that its zero start is the gain's."""
    return getattr(block, "branch_scale", "none") in SILENT_START


# ----------------------------------------------------------------------------- the model settings
def branch_settings(cfg) -> dict:
    """The four settings of a model config; a config written before they existed has their defaults."""
    return {"branch_scale": getattr(cfg, "branch_scale", "none"),
            "layerscale_init": getattr(cfg, "layerscale_init", 1e-5),
            "drop_branch": getattr(cfg, "drop_branch", 0.0), "drop_identity": getattr(cfg, "drop_identity", 0.0)}


def check_branch_settings(cfg, section: str = "model") -> None:
    """One-line ConfigErrors for the settings' values (``branch_scale``'s choices are ``check_fields``')."""
    s = branch_settings(cfg)
    for key in ("drop_branch", "drop_identity"):
        p = s[key]
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
            raise ConfigError(f"{section}.{key} must be a probability in [0, 1) (the last block's; 1 would drop "
                              f"every sample's {'branch' if key == 'drop_branch' else 'shortcut'}), got {p!r}")
    eps = s["layerscale_init"]
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise ConfigError(f"{section}.layerscale_init must be a positive finite number (LayerScale's initial gain, "
                          f"e.g. 1e-5 or 0.1), got {eps!r}")


def branch_block_kwargs(cfg, depth: int, enabled: bool = True) -> list[dict]:
    """Per block of a stack of ``depth``, the keyword arguments of ``Block`` / ``AdaLNBlock`` for the config's
    settings, the drops rising linearly with depth over this stack. ``enabled=False`` (an MAE decoder
    without ``decoder_decay``): plain blocks."""
    s = branch_settings(cfg) if enabled else branch_settings(None)
    rates = zip(depth_rates(s["drop_branch"], depth), depth_rates(s["drop_identity"], depth), strict=True)
    return [dict(branch_scale=s["branch_scale"], layerscale_init=s["layerscale_init"], drop_path=p_br, drop_identity=p_id)
            for p_br, p_id in rates]


def describe_branch(cfg) -> str:
    """The settings in words for a run's label, ``""`` at their defaults, e.g.
    ``" + layerscale 1e-05 + drop_identity 0.1"``."""
    s = branch_settings(cfg)
    parts = []
    if s["branch_scale"] == "layerscale":
        parts.append(f"layerscale {float(s['layerscale_init']):g}")
    elif s["branch_scale"] != "none":
        parts.append(s["branch_scale"])
    parts += [f"{key} {float(s[key]):g}" for key in ("drop_branch", "drop_identity") if s[key]]
    return "".join(f" + {p}" for p in parts)
