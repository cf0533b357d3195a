"""Where a model's residual adds are: the blocks of one residual stream and, for each of their
sub-blocks (attention, MLP), the module that first receives the sub-block's input x and the module
whose output is its branch f, so that forward hooks can read x_l and f_l(x_l) of
``x_{l+1} = alpha_l * x_l + beta_l * f_l(x_l)`` without a change to the model's code.

Blocks are found as ``decayify`` finds them (``nn.decayify.residual_blocks``, the adapter registry),
plus resdecay's adaLN-Zero blocks (SiT, which ``decayify`` never needs). The sub-block roles come from
the adapters themselves: for a block whose adapter hooks its adds (timm, transformers, torchvision
and any block kind a user registers with ``subblock_adapter``), the adapter's own ``install`` is run
on a *copy* of the block and the modules it marked are read back, so there is no second table of
roles to keep in step. resdecay's blocks and diffusers' DiT block, whose adds the adapters do not
hook, have their roles written here. Anything else is refused in one line.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn as nn

from ...errors import UserError
from ...nn.adapters import adapter_for
from ...nn.adapters import hooks as adapter_hooks
from ...nn.blocks import Block
from ...nn.conditioning import AdaLNBlock
from ...nn.decayify import COVERAGE, block_factors, residual_blocks

Gates = Callable[[object], tuple]  # the output of a block's modulation module -> one (B, D) gate per sub-block


@dataclass
class SubBlock:
    """One residual add ``x <- alpha * x + beta * gate * raw``.

    Args:
        name: ``<block name>.<role>`` ("blocks.3.attn"), or ``.add<j>`` where the role is not known.
        pre: the module that receives the sub-block's input x as its first argument (a pre-norm).
        branch: the module whose output (``raw``) the block adds, read *before* any decayify correction.
        alpha: the identity factor the block's add uses.
        beta: the branch factor (Table 3b's variants; 1 for the method).
    """

    name: str
    pre: nn.Module
    branch: nn.Module
    alpha: float
    beta: float


@dataclass
class Site:
    """One residual block of the stream: its sub-blocks in the order its forward runs them.

    Args:
        name: the block's module name in the model.
        block: the block.
        kind: the adapter's name (or resdecay's class) that located it.
        subs: the sub-blocks, attention first.
        gate_module: where an adaLN-Zero gate is computed (its output is read by ``gates``), or None.
        gates: ``gates(output of gate_module)`` -> one (B, D) gate per sub-block.
    """

    name: str
    block: nn.Module
    kind: str
    subs: list[SubBlock]
    gate_module: nn.Module | None = None
    gates: Gates | None = field(default=None, repr=False)


def _adaln_gates(out: torch.Tensor) -> tuple:
    """resdecay's AdaLNBlock: shift, scale, gate (attention), shift, scale, gate (MLP)."""
    chunks = out.chunk(6, dim=1)
    return chunks[2], chunks[5]


def _dit_gates(out) -> tuple:
    """diffusers' AdaLayerNormZero returns (h, gate_msa, shift_mlp, scale_mlp, gate_mlp)."""
    return out[1], out[4]


def _own_roles(block: nn.Module) -> tuple[list[tuple[str, nn.Module, nn.Module]], nn.Module | None, Gates | None] | None:
    """Roles of the blocks whose adds no adapter hooks: resdecay's (their forward is ``residual_add``)
    and diffusers' BasicTransformerBlock with adaLN-Zero or a plain LayerNorm and no cross-attention
    (DiT; the adapter replaces its forward whole). None for any other block."""
    if isinstance(block, (Block, AdaLNBlock)):
        roles = [("attn", block.norm1, block.attn), ("mlp", block.norm2, block.mlp)]
        return (roles, block.adaLN_modulation, _adaln_gates) if isinstance(block, AdaLNBlock) else (roles, None, None)
    cls = type(block)
    if cls.__name__ == "BasicTransformerBlock" and cls.__module__.startswith("diffusers."):
        kind = getattr(block, "norm_type", None)
        if kind not in ("ada_norm_zero", "layer_norm") or getattr(block, "attn2", None) is not None:
            return None
        roles = [("attn", block.norm1, block.attn1), ("mlp", block.norm3, block.ff)]
        return (roles, block.norm1, _dit_gates) if kind == "ada_norm_zero" else (roles, None, None)
    return None


def _stated_roles(block: nn.Module) -> list[tuple[str, nn.Module, nn.Module]] | None:
    """(role, pre, post) of a block whose adapter states its roles (``BlockAdapter.roles``: subblock adapters and the
    traced adapter's hooked blocks); the others are probed (``_probed_roles``)."""
    adapter = adapter_for(block)
    if adapter is None or adapter.roles is None:
        return None
    pairs = adapter.roles(block)
    role = ("attn", "mlp") if len(pairs) == 2 else tuple(f"add{j}" for j in range(len(pairs)))
    return [(role[j], pre, post) for j, (pre, post) in enumerate(pairs)]


def _probed_roles(block: nn.Module) -> list[tuple[str, nn.Module, nn.Module]] | None:
    """(role, pre, post) of a block whose adapter hooks its adds: the adapter installs distinct marker
    factors on a copy of the block, and the modules it marked (the pre-norm that keeps x, the module
    whose output is corrected) are found again in the original by name. None when it marks nothing."""
    adapter = adapter_for(block)
    if adapter is None:
        return None
    twin = copy.deepcopy(block)
    adapter_hooks.remove(twin)
    marks = tuple(0.25 + 0.5 * k / max(adapter.adds - 1, 1) for k in range(adapter.adds))  # distinct, none 1
    adapter.install(twin, marks, (1.0,) * adapter.adds)
    pres: dict[int, tuple[str, object]] = {}
    posts: dict[int, str] = {}
    for name, m in twin.named_modules():
        slot, owner = m.__dict__.get(adapter_hooks.SLOT), m.__dict__.get(adapter_hooks.OWNER)
        if owner is not None:
            pres[marks.index(owner.__dict__["resdecay_alpha"])] = (name, slot)
        elif slot is not None:
            posts[id(slot)] = name
    if len(pres) != adapter.adds or any(id(slot) not in posts for _, slot in pres.values()):
        return None
    role = ("attn", "mlp") if adapter.adds == 2 else tuple(f"add{j}" for j in range(adapter.adds))
    return [(role[j], block.get_submodule(pres[j][0]), block.get_submodule(posts[id(pres[j][1])]))
            for j in range(adapter.adds)]


def site_of(name: str, block: nn.Module) -> Site | None:
    """The ``Site`` of one residual block, or None when neither the adapters nor resdecay reach its branches."""
    own = _own_roles(block)
    roles, gate_module, gates = own if own is not None else (_stated_roles(block) or _probed_roles(block), None, None)
    if roles is None:
        return None
    alphas, betas = block_factors(block)
    subs = [SubBlock(f"{name}.{role}", pre, post, float(a), float(b))
            for (role, pre, post), a, b in zip(roles, alphas, betas, strict=True)]
    adapter = adapter_for(block)
    kind = adapter.name if adapter is not None else f"{type(block).__module__}.{type(block).__name__}"
    return Site(name, block, kind, subs, gate_module, gates)


def _candidates(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Every residual block decayify finds, and resdecay's adaLN-Zero blocks, in module order."""
    found = {id(m): (n, m) for n, m, _ in residual_blocks(model)}
    for n, m in model.named_modules():
        if isinstance(m, AdaLNBlock):
            found.setdefault(id(m), (n, m))
    order = {id(m): i for i, (_, m) in enumerate(model.named_modules())}
    return sorted(found.values(), key=lambda nm: order[id(nm[1])])


def stream_blocks(model: nn.Module, container: str | None = None) -> list[tuple[str, nn.Module]]:
    """(name, block) of the residual stream's blocks, in depth order: the blocks held by one container
    (the first one that holds a block, e.g. ``blocks`` or ``vit.layers``; an MAE's decoder blocks are
    another stream). What the evaluators read from a model trained elsewhere (``eval/foreign.py``).

    Args:
        model: the network.
        container: the module name of the container to take (``"decoder_blocks"``); default the first.

    Raises:
        UserError: no residual block that the adapters reach, or no container of that name.
    """
    blocks = _candidates(model)
    if not blocks:
        raise UserError(f"found no residual block in {type(model).__name__} that resdecay's adapters reach; {COVERAGE}")
    parents = [n.rpartition(".")[0] for n, _ in blocks]
    chosen = parents[0] if container is None else container
    if chosen not in parents:
        raise UserError(f"no residual blocks in a container named {container!r}; the model's are "
                        f"{', '.join(sorted(set(p or '(top level)' for p in parents)))}")
    return [nb for nb, parent in zip(blocks, parents, strict=True) if parent == chosen]


def find_sites(model: nn.Module, container: str | None = None) -> list[Site]:
    """The ``Site`` of every block of the residual stream (``stream_blocks``), in depth order.

    Raises:
        UserError: no residual block that the adapters reach, or one whose branches they cannot.
    """
    sites = []
    for name, block in stream_blocks(model, container):
        site = site_of(name, block)
        if site is None:
            raise UserError(f"diagnostics cannot reach the branches of {name} ({type(block).__module__}."
                            f"{type(block).__name__}): its adapter replaces the forward or scales a shortcut "
                            "module; supported for diagnostics: transformer blocks whose adds decayify hooks, "
                            "resdecay's blocks and diffusers' DiT blocks")
        sites.append(site)
    return sites


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
