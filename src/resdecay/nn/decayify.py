"""``decayify``: put decayed identity shortcuts into models people already have, by composition.

Supported residual blocks (found in ``model.modules()`` order, i.e. depth order):
    resdecay.nn.blocks.Block              its alpha_attn / alpha_mlp (and betas) are set
    timm VisionTransformer ``Block``      x + drop_path(ls(f(norm(x)))) per sub-block: a forward
                                          pre-hook on ``norm1``/``norm2`` keeps the sub-block input x
                                          and a forward hook on ``drop_path1``/``drop_path2`` returns
                                          ``residual_correction`` (branch - (1 - alpha) * x for beta 1),
                                          so the block's own add gives alpha*x + beta*branch
    torchvision ``BasicBlock`` / ``Bottleneck``
                                          the identity path (and the downsample path) is scaled:
                                          a forward hook on ``downsample``, or a parameter-free
                                          ``ShortcutScale`` put in its empty place; beta != 1 scales
                                          the branch's last BatchNorm output by a forward hook

The factors come from the shortcut formula registry (``shortcut``, default ``"decay"``) and every
form of the add is ``resdecay.nn.residual``'s. Formulas that train alpha are refused: a hook holds
fixed numbers.

No class is subclassed or swapped, no parameter is added or renamed: the state_dict keys are the
model's own, so pretrained weights load unchanged, and with alpha_min = 1 the hooks are not even
installed, so outputs are exactly the original model's. The settings are recorded on the model
as ``model.resdecay_spec`` (``resdecay.save_decayified`` stores it beside the weights and
``resdecay.load_decayified`` re-applies it). The spec is the *structure* only (alpha_min,
schedule, branches, and shortcut where it is not "decay"): ``zero_init`` is an initialisation
done once, when asked for, and is never recorded, so ``decayify(model, **model.resdecay_spec)`` on trained weights leaves them as they are.

Residual blocks of other kinds (a hybrid timm model's ResNet stem, timm's parallel blocks) are
left at alpha 1; ``decayify`` says so in one ``PartialDecayWarning`` naming them.
"""

from __future__ import annotations

import re
import threading
import warnings

import torch
import torch.nn as nn

from . import blocks as rd_blocks
from .residual import (ShortcutScale, check_shortcut, factors_of, residual_correction, scale_branch, scale_identity,
                       set_block_factors, shortcut_plan)
from ..errors import UserError

SUPPORTED = ("resdecay.nn.blocks.Block", "timm VisionTransformer Block", "torchvision BasicBlock", "torchvision Bottleneck")


def _kind(module: nn.Module) -> str | None:
    if isinstance(module, rd_blocks.Block):
        return "resdecay"
    cls = type(module)
    if cls.__name__ == "Block" and cls.__module__.startswith("timm.") and all(
            hasattr(module, n) for n in ("norm1", "drop_path1", "norm2", "drop_path2")):
        return "timm"
    if cls.__name__ in ("BasicBlock", "Bottleneck") and cls.__module__.startswith("torchvision.") and hasattr(module, "downsample"):
        return "resnet"
    return None


def residual_blocks(model: nn.Module) -> list[tuple[str, nn.Module, str]]:
    """(name, block, kind) of every supported residual block, in depth order."""
    return [(name, m, k) for name, m in model.named_modules() if (k := _kind(m)) is not None]


# The hooks are module-level functions that keep nothing themselves. Each reads its factor from
# the module it is called with (``module.resdecay_alpha`` / ``resdecay_beta``). The sub-block
# input x, which the norm's pre-hook sees and the drop_path's hook needs, is kept per *thread*
# (``_LOCAL``), under a key object that the norm and drop_path of one sub-block share
# (``_SLOT``): one model called from several threads at once (an inference server, a threaded
# data-parallel wrapper, whose replicas share their modules' attributes) never mixes the inputs
# of two calls (issue 23.7). A
# ``copy.deepcopy`` (EMA, torch.compile) gets new keys and its own alphas, so changing alpha on
# one never reaches the other. Nothing per call is stored on a module.
_SLOT = "_resdecay_slot"  # on a norm and its drop_path: the key of their pending input
_LOCAL = threading.local()


class _Slot:
    """The key that ties one sub-block's norm to its drop_path (an identity, nothing more)."""

    __slots__ = ()


def _pending() -> dict:
    """This thread's pending sub-block inputs, by slot (an entry lives from the norm to the add)."""
    table = getattr(_LOCAL, "pending", None)
    if table is None:
        table = _LOCAL.pending = {}
    return table


def _stash_input(norm: nn.Module, args: tuple) -> None:
    """Forward pre-hook on norm1/norm2: keep the sub-block input x for the residual add."""
    _pending()[norm.__dict__[_SLOT]] = args[0]


def _decayed_branch(drop_path: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
    """Forward hook on drop_path1/drop_path2: the correction form of the add, so that the block's
    ``x + out`` becomes ``alpha * x + beta * branch``."""
    x = _pending().pop(drop_path.__dict__[_SLOT])
    return residual_correction(x, out, drop_path.resdecay_alpha, drop_path.__dict__.get("resdecay_beta", 1.0))


def _scale_output(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
    """Forward hook on a ResNet block's downsample path: alpha * downsample(x)."""
    return scale_identity(out, module.resdecay_alpha)


def _scale_last_norm(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
    """Forward hook on a ResNet block's last BatchNorm (the branch's end): beta * branch."""
    return scale_branch(out, module.resdecay_beta)


def _refuse_script():
    raise UserError("torch.jit.script cannot compile decayify's forward hooks; use torch.compile or torch.export "
                    "on the decayified model, or script the model before decayify (alpha_min=1 installs no hooks)")


_HOOKS = (_stash_input, _decayed_branch, _scale_output, _scale_last_norm)


def _remove_hooks(block: nn.Module) -> None:
    for m in block.modules():
        for table in (m._forward_pre_hooks, m._forward_hooks):
            for key in [k for k, fn in table.items() if fn in _HOOKS]:
                del table[key]
        for name in (_SLOT, "resdecay_alpha", "resdecay_beta", "__prepare_scriptable__"):
            m.__dict__.pop(name, None)
    if isinstance(getattr(block, "downsample", None), ShortcutScale):
        block.downsample = None


def _timm_hooks(block: nn.Module, alphas: list[float], betas: list[float]) -> None:
    for norm, drop_path, a, b in zip((block.norm1, block.norm2), (block.drop_path1, block.drop_path2), alphas, betas):
        if a == 1.0 and b == 1.0:
            continue
        drop_path.resdecay_alpha = float(a)
        if b != 1.0:
            drop_path.resdecay_beta = float(b)
        norm.__dict__[_SLOT] = drop_path.__dict__[_SLOT] = _Slot()  # a plain attribute: state_dict keys unchanged
        norm.register_forward_pre_hook(_stash_input)
        drop_path.register_forward_hook(_decayed_branch)
        block.__dict__["__prepare_scriptable__"] = _refuse_script  # torch.jit.script calls it on every submodule


def _last_norm(block: nn.Module) -> nn.Module:
    return block.bn3 if hasattr(block, "bn3") else block.bn2  # Bottleneck / BasicBlock


def _resnet_shortcut(block: nn.Module, a: float, b: float) -> None:
    if b != 1.0:
        _last_norm(block).resdecay_beta = float(b)
        _last_norm(block).register_forward_hook(_scale_last_norm)
        block.__dict__["__prepare_scriptable__"] = _refuse_script
    if a == 1.0:
        return
    if block.downsample is None:
        block.downsample = ShortcutScale(a)  # identity = downsample(x) = a * x; no parameters
    else:
        block.downsample.resdecay_alpha = float(a)
        block.downsample.register_forward_hook(_scale_output)
        block.__dict__["__prepare_scriptable__"] = _refuse_script


def _zero_last_layer(block: nn.Module, kind: str) -> None:
    if kind == "resdecay":
        block.zero_init_branches()
    elif kind == "timm":
        for layer in (block.attn.proj, block.mlp.fc2):
            nn.init.zeros_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
    else:  # the last BatchNorm's scale, torchvision's zero_init_residual
        nn.init.zeros_(_last_norm(block).weight)


class PartialDecayWarning(UserWarning):
    """``decayify`` left residual blocks of a kind it does not support at alpha 1."""


# class names that say "residual block" (timm's ResNetV2 Bottleneck, ParallelScalingBlock, ...)
_LOOKS_RESIDUAL = re.compile(r"(Block|Bottleneck|ResBlock|ResidualBlock)\d*$")


def unsupported_blocks(model: nn.Module, found: list[tuple[str, nn.Module, str]]) -> list[tuple[str, str]]:
    """(name, class) of the outermost modules named like residual blocks that are neither supported
    blocks, nor inside one, nor containers of one: the blocks ``decayify`` leaves at alpha 1.

    Args:
        model: the model ``decayify`` was given.
        found: its supported blocks, as ``residual_blocks`` lists them.
    """
    done = [name for name, _, _ in found]
    out: list[tuple[str, str]] = []
    for name, m in model.named_modules():
        if not name or _kind(m) is not None or not _LOOKS_RESIDUAL.search(type(m).__name__):
            continue
        related = any(name == d or name.startswith(d + ".") or d.startswith(name + ".") for d in done)
        if not related and not any(name.startswith(o + ".") for o, _ in out):
            out.append((name, f"{type(m).__module__}.{type(m).__name__}"))
    return out


def _say_what_was_left(model: nn.Module, found: list, skipped: list[tuple[str, str]]) -> None:
    """One warning naming what was decayed and what was not (e.g. a hybrid ViT's ResNet stem)."""
    kinds = sorted({cls for _, cls in skipped})
    warnings.warn(f"decayify decayed {len(found)} block(s) of {type(model).__name__} ({found[0][0]} .. {found[-1][0]}) "
                  f"but left {len(skipped)} residual block(s) of a kind it does not support at alpha 1, first "
                  f"{skipped[0][0]} ({', '.join(kinds)}); the alpha schedule spans the decayed blocks only "
                  f"(alphas_of(model) lists them); supported: {', '.join(SUPPORTED)}", PartialDecayWarning, stacklevel=3)


def decayify(model: nn.Module, alpha_min: float, schedule: str = "linear", zero_init: bool = False,
             branches: str = "both", shortcut: str = "decay") -> nn.Module:
    """Scale the identity shortcut of every residual block of ``model`` (in place) by the factors
    of the shortcut formula ``shortcut`` (by default the decay: ``alpha_schedule``, from 1 at the
    first residual add to ``alpha_min`` at the last).

    Transformer blocks have two adds (attention, MLP), ResNet blocks one. Calling it again
    replaces the settings. ``model.resdecay_spec`` records the structure (alpha_min, schedule,
    branches, shortcut), so ``decayify(model, **model.resdecay_spec)`` rebuilds it and never touches weights.

    Args:
        model: a model holding supported residual blocks (see ``SUPPORTED``).
        alpha_min: the factor of the last residual add, in (0, 1]; 1 leaves the model exactly as it was.
        schedule: "linear", "paper", "cosine" or "constant" (see ``resdecay.schedule``).
        zero_init: zero the last layer of every branch *now* (the paper's init for a model about to be
            trained). Off unless asked for, and not recorded in the spec: loaded weights stay as they are.
        branches: "both", "attn" or "mlp": which sub-block of transformer blocks is decayed (Table 3b).
        shortcut: a registered formula with fixed factors (``resdecay.nn.residual``: decay, scaled_sum,
            scaled_branch, or one registered by the caller); recorded in the spec unless "decay".

    Returns:
        ``model``, decayified in place. Blocks of unsupported kinds beside supported ones stay at alpha 1
        and a ``PartialDecayWarning`` names them.
    """
    found = residual_blocks(model)
    skipped = unsupported_blocks(model, found)
    if not found:
        also = f" (its {skipped[0][1]} blocks are not supported)" if skipped else ""
        raise TypeError(f"decayify found no supported residual block in {type(model).__name__}{also}; "
                        f"supported: {', '.join(SUPPORTED)}")
    kinds = {k for _, _, k in found}
    if "resnet" in kinds and len(kinds) > 1:
        raise TypeError("decayify does not mix ResNet and transformer blocks in one model")
    adds = 1 if "resnet" in kinds else 2
    check_shortcut(shortcut, branches, adds, fixed_by="decayify (its hooks)", keys=("shortcut", "branches"))
    plan = shortcut_plan(len(found), alpha_min, schedule, branches, shortcut, adds)
    if skipped and bool((plan.alphas != 1.0).any() or (plan.betas != 1.0).any()):
        _say_what_was_left(model, found, skipped)
    for (name, block, kind), a, b in zip(found, plan.alphas.tolist(), plan.betas.tolist()):
        _remove_hooks(block)
        if kind == "resdecay":
            set_block_factors(block, *a, *b)
        elif kind == "timm":
            _timm_hooks(block, a, b)
        else:
            _resnet_shortcut(block, a[0], b[0])
        block.resdecay_alpha = tuple(a)
        if zero_init:
            _zero_last_layer(block, kind)
    # the structure only: zero_init is an action of this call, never something to re-apply (issue 23.3)
    model.resdecay_spec = {"alpha_min": float(alpha_min), "schedule": schedule, "branches": branches}
    if shortcut != "decay":  # specs written before formulas reached decayify have no key: decay
        model.resdecay_spec["shortcut"] = shortcut
    return model


def block_factors(block: nn.Module) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """(alphas, betas) a residual block uses now, read where its add reads them: the hooked modules
    of a timm or torchvision ResNet block (so a hand-changed ``resdecay_alpha`` shows), or a resdecay
    block's own attributes (``factors_of``: ``Block``, ``AdaLNBlock``). Transformer blocks give
    ``(attn, mlp)`` pairs, ResNet blocks one factor each."""
    kind = _kind(block)
    if kind == "timm":
        paths = (block.drop_path1, block.drop_path2)
        return (tuple(float(dp.__dict__.get("resdecay_alpha", 1.0)) for dp in paths),
                tuple(float(dp.__dict__.get("resdecay_beta", 1.0)) for dp in paths))
    if kind != "resnet":
        return factors_of(block)
    ds = block.downsample
    alpha = ds.alpha if isinstance(ds, ShortcutScale) else (1.0 if ds is None else ds.__dict__.get("resdecay_alpha", 1.0))
    return (float(alpha),), (float(_last_norm(block).__dict__.get("resdecay_beta", 1.0)),)


def alphas_of(model: nn.Module) -> list[tuple[str, tuple[float, ...]]]:
    """The shortcut factors in use, per residual block: ``[(name, (alpha_attn, alpha_mlp)), ...]``
    for transformer blocks, ``[(name, (alpha,)), ...]`` for ResNet blocks. Learnable factors are
    read as their current values."""
    return [(name, block_factors(block)[0]) for name, block, _ in residual_blocks(model)]
