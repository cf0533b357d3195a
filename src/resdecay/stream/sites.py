"""Where a model's residual adds are: the blocks of its residual stream and, for each of their adds, where
x_l and f_l(x_l) of ``x_{l+1} = alpha_l * x_l + beta_l * f_l(x_l)`` can be read without a change to the
model's code (paper eq. 3).

Blocks are found as ``decayify`` finds them (``nn.decayify.block_adapters``: each with its adapter), plus
resdecay's adaLN-Zero blocks (SiT, which ``decayify`` never needs). Where each add is read is the adapter's
own statement (``BlockAdapter.stream_roles``, one ``Role`` per add): a pre-norm that receives x and the module
whose output is f (the hooked blocks of timm, transformers, torchvision), the block itself and its branch's
last module (a ResNet / ConvNeXt block, with its projection shortcut where it has one), or the add itself at
``residual_add`` (resdecay's blocks, every replaced forward: diffusers' DiT, PixArt, SD3, Flux, a traced
block). There is no second table of roles here. A block whose adapter states nothing is refused in one line.

Which layout a feature-map block takes, (B, C, H, W) (a conv block) or (B, H, W, C) (Swin), is read off its first
layer (``channels_first``); ``record.py`` reads both as tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable

import torch.nn as nn

from ..errors import UserError
from ..nn.adapters import AT_RESIDUAL_ADD, BlockAdapter, Role
from ..nn.conditioning import AdaLNBlock
from ..nn.decayify import COVERAGE, block_adapters
from ..nn.hyper import refuse_streams
from ..nn.residual import factors_of


@dataclass
class SubBlock:
    """One residual add ``x <- alpha * identity + beta * f``.

    Args:
        name: ``<block name>.<role>`` ("blocks.3.attn"), or ``.add<j>`` where the block has other than two adds.
        role: where the add is read (``Role``: modules to hook, or ``AT_RESIDUAL_ADD``).
        alpha: the identity factor the block's add uses.
        beta: the branch factor (Table 3b's variants; 1 for the method).
        update: the residual update the add applies to the branch (``nn.updates``), or None.
    """

    name: str
    role: Role
    alpha: float
    beta: float
    update: str | None = None


@dataclass
class Site:
    """One residual block of the stream: its adds in the order its forward runs them.

    Args:
        name: the block's module name in the model.
        block: the block.
        kind: the adapter's name (or resdecay's class) that located it.
        subs: the adds, attention first.
        forward: the adapter's replaced forward, to install while the adds are read at ``residual_add`` of a block
            ``decayify`` left at alpha 1 (it installs nothing there); None when nothing needs installing.
        channels_first: a feature-map block takes (B, C, H, W) maps (else (B, H, W, C); token blocks: unused).
    """

    name: str
    block: nn.Module
    kind: str
    subs: list[SubBlock]
    forward: Callable | None = None
    channels_first: bool = True

    @property
    def at_add(self) -> bool:
        """Its adds are read at ``residual_add`` (not by module hooks)."""
        return self.subs[0].role.pre is None


_CHANNELS_FIRST = (nn.Conv1d, nn.Conv2d, nn.BatchNorm2d, nn.GroupNorm)


def channels_first(block: nn.Module) -> bool:
    """Whether a block of feature maps takes them as (B, C, H, W): its first layer (in registration order) is a
    convolution, a BatchNorm2d / GroupNorm or a ``*2d`` norm (timm's LayerNorm2d), not a Linear / LayerNorm."""
    for m in block.modules():
        if isinstance(m, _CHANNELS_FIRST) or (isinstance(m, nn.LayerNorm) and type(m).__name__.endswith("2d")):
            return True
        if isinstance(m, (nn.Linear, nn.LayerNorm)):
            return False
    return True


def _roles(block: nn.Module, adapter: BlockAdapter | None) -> tuple[list[Role], str, Callable | None] | None:
    """(one ``Role`` per add, the kind, the forward to install while reading) of a block, or None."""
    if isinstance(block, AdaLNBlock):  # resdecay's adaLN-Zero block: its forward is residual_add
        return [AT_RESIDUAL_ADD] * 2, f"{type(block).__module__}.{type(block).__name__}", None
    roles = adapter.stream_roles(block) if adapter is not None else None
    if not roles:
        return None
    installed = "forward" in block.__dict__  # decayify replaced it (alpha != 1): it reads at residual_add already
    forward = adapter.forward if roles[0].pre is None and not installed else None
    return roles, adapter.name, forward


def site_of(name: str, block: nn.Module, adapter: BlockAdapter | None) -> Site | None:
    """The ``Site`` of one residual block (its adapter: the one the block search found), or None when the adapter
    does not say where its adds are."""
    found = _roles(block, adapter)
    if found is None:
        return None
    roles, kind, forward = found
    alphas, betas = adapter.factors(block) if adapter is not None else factors_of(block)
    tags = ("attn", "mlp") if len(roles) == 2 else tuple(f"add{j}" for j in range(len(roles)))
    if adapter is not None:
        updates = adapter.updates(block) if adapter.updates is not None else (None,) * len(roles)
    else:  # resdecay's adaLN-Zero block: its own attribute
        updates = (getattr(block, "update", None),) * len(roles)
    subs = [SubBlock(f"{name}.{tag}", role, float(a), float(b), u)
            for tag, role, a, b, u in zip(tags, roles, alphas, betas, updates, strict=True)]
    return Site(name, block, kind, subs, forward, channels_first(block))


def _candidates(model: nn.Module) -> list[tuple[str, nn.Module, BlockAdapter | None]]:
    """(name, block, adapter) of every residual block decayify finds, and resdecay's adaLN-Zero blocks (no adapter),
    in module order."""
    refuse_streams(model, "the residual-stream reader")
    found = {id(m): (n, m, a) for n, m, a in block_adapters(model)}
    for n, m in model.named_modules():
        if isinstance(m, AdaLNBlock):
            found.setdefault(id(m), (n, m, None))
    order = {id(m): i for i, (_, m) in enumerate(model.named_modules())}
    return sorted(found.values(), key=lambda nm: order[id(nm[1])])


def _stage_pattern(container: str) -> str:
    """A container's name with its numbers as ``#``: the stages of one stream share it (``layers.#.blocks`` for
    Swin's, ``layer#`` for a ResNet's, ``stages.#.blocks`` for ConvNeXt's), an MAE's decoder does not."""
    return re.sub(r"\d+", "#", container)


def stream_blocks(model: nn.Module, container: str | None = None) -> list[tuple[str, nn.Module]]:
    """(name, block) of the residual stream's blocks (``stream``)."""
    return [(name, block) for name, block, _ in stream(model, container)]


def stream(model: nn.Module, container: str | None = None) -> list[tuple[str, nn.Module, BlockAdapter | None]]:
    """(name, block, adapter) of the residual stream's blocks, in module order: the blocks of every stage of the first
    container that holds a block (``blocks``, ``vit.layers``, or ``layers.0.blocks`` with ``layers.1.blocks``
    ...: containers whose names differ only in their numbers are stages of one stream; an MAE's decoder blocks
    are another stream). What the evaluators read from a model trained elsewhere (``foreign.py``).

    Args:
        model: the network.
        container: the container to take (``"decoder_blocks"``, or a stage pattern ``"down_blocks.#.resnets"``);
            ``"all"``: every block the adapters reach (a U-Net's down, middle and up blocks); default the first.

    Raises:
        UserError: no residual block that the adapters reach, or no container of that name.
    """
    blocks = _candidates(model)
    if not blocks:
        raise UserError(f"found no residual block in {type(model).__name__} that resdecay's adapters reach; {COVERAGE}")
    if container == "all":
        return blocks
    parents = [n.rpartition(".")[0] for n, _, _ in blocks]
    patterns = [_stage_pattern(p) for p in parents]
    chosen = patterns[0] if container is None else _stage_pattern(container)
    if chosen not in patterns:
        raise UserError(f"no residual blocks in a container named {container!r}; the model's are "
                        f"{', '.join(sorted(set(p or '(top level)' for p in patterns)))}, or 'all'")
    exact = container is not None and container in parents  # one stage named exactly: that stage alone
    return [nb for nb, parent, pattern in zip(blocks, parents, patterns, strict=True)
            if (parent == container if exact else pattern == chosen)]


def sites_of(model: nn.Module, blocks: list[nn.Module]) -> list[Site]:
    """The ``Site`` of each of ``blocks`` (a model contract's ``blocks``), in their order.

    Raises:
        UserError: a block the adapters do not reach, or whose adapter does not say where its adds are.
    """
    found = {id(m): (n, m, a) for n, m, a in _candidates(model)}
    missing = [type(b).__name__ for b in blocks if id(b) not in found]
    if missing:
        raise UserError(f"found no adapter for the block {missing[0]} of {type(model).__name__}; {COVERAGE}")
    return [_site(*found[id(b)]) for b in blocks]


def _site(name: str, block: nn.Module, adapter: BlockAdapter | None) -> Site:
    site = site_of(name, block, adapter)
    if site is None:
        raise UserError(f"the stream reader cannot read the adds of {name} ({type(block).__module__}."
                        f"{type(block).__name__}): its adapter states no roles; give it reads= (Role per add, "
                        "docs/EXTENDING.md)")
    return site


def find_sites(model: nn.Module, container: str | None = None) -> list[Site]:
    """The ``Site`` of every block of the residual stream (``stream_blocks``), in module order.

    Raises:
        UserError: no residual block that the adapters reach, or one whose adapter does not say where its adds are.
    """
    return [_site(*entry) for entry in stream(model, container)]


def patch_size_of(model: nn.Module) -> tuple[int, int] | None:
    """The model's patch size (height, width): its config's ``patch_size`` (transformers, diffusers,
    resdecay's ``cfg``) or the first module's ``patch_size`` attribute (timm's / resdecay's PatchEmbed)."""
    for cfg in (getattr(model, "config", None), getattr(model, "cfg", None)):
        p = getattr(cfg, "patch_size", None)
        if p is not None:
            return _pair(p)
    for m in model.modules():
        p = getattr(m, "patch_size", None)
        if isinstance(p, (int, tuple, list)):
            return _pair(p)
    return None


def _pair(p) -> tuple[int, int]:
    return (int(p), int(p)) if isinstance(p, int) else (int(p[0]), int(p[1]))
