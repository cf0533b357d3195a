"""The three ways an adapter reaches a library block's residual add, without subclassing the block,
adding a parameter or renaming a state_dict key.

``correct_subblock``  (most transformer blocks)
    The block computes ``x + out`` itself. A forward pre-hook on a module that receives the sub-block
    input x first (the pre-norm) keeps x; a forward hook on the module whose output the block adds
    (drop_path, dropout, layer scale, the MLP) returns ``residual_correction(x, out, alpha, beta)``,
    so the block's own add gives ``alpha * x + beta * branch`` (paper eq. 3 with beta = 1).
    The hooked output module may be *shared* by the sub-blocks (HF ViT's one ``dropout``, CaiT's
    and DINOv2's one ``drop_path``): each sub-block's pre-norm leaves its x in the slot they share
    and the shared module takes it on its next call. The correction comes *after* dropout, so it is
    exact at any dropout rate. Where the block's forward traces and its roles are proved there, the
    cheaper fused add (``fused.py``: the add itself rewritten to one ``torch.add(f, x, alpha=alpha)``)
    takes the place of these hooks, with the factors kept on the same modules.
``scale_shortcut``    (ResNet / ConvNeXt blocks)
    The identity path is a module of its own (``downsample``, ``shortcut``) or an empty place: a
    forward hook scales its output by alpha, or a parameter-free ``ShortcutScale`` fills the place.
``replace_forward``   (blocks whose add is inline with a gate, e.g. adaLN-Zero)
    The block's forward is replaced by a function of the adapter that is the library's forward with
    alpha in the add; at alpha = 1 it must equal the library's (each adapter's test checks that).

Factors are read at call time from the module that owns a sub-block (its output module when that is
not shared, else its pre-norm), as ``resdecay_alpha`` / ``resdecay_beta``: a factor changed by hand
shows in the next forward and in ``alphas_of``. The pending inputs are kept per *thread* under a key
object (the slot) that the modules of one block share: one model called from several threads never
mixes two calls' inputs, and a ``copy.deepcopy`` (EMA, torch.compile) gets its own slots.

``call_guard``        (the traced adapter's hooked blocks)
    A pre-hook refusing a call with another value for an argument the trace fixed; ``unguard`` takes it off.
``describe``          what is installed on a block, per mechanism (the coverage table reads it, never private state).
``thread_state``      (hooks that hand tensors to each other within one forward)
    The same per-thread table for other hook sets: a state dict per key object, e.g. the encoder->decoder
    skips of ``resdecay.interop.hf_unet`` (forward hooks on encoder layers keep their outputs, a pre-hook
    on the decoder keeps ``ids_restore``, pre-hooks on decoder layers fuse them).
"""

from __future__ import annotations

import threading
import types
from typing import Callable

import torch
import torch.nn as nn

from ...errors import UserError
from ..residual import ShortcutScale, residual_correction, scale_branch, scale_identity
from ..updates import update_named

SLOT = "_resdecay_slot"  # on the modules of one hooked sub-block: the key of their pending input
OWNER = "_resdecay_owner"  # on a pre-norm: the module that holds its sub-block's factors
_LOCAL = threading.local()


class _Slot:
    """The key that ties a sub-block's pre-norm to its output module (an identity, nothing more)."""

    __slots__ = ()


def _pending() -> dict:
    table = getattr(_LOCAL, "pending", None)
    if table is None:
        table = _LOCAL.pending = {}
    return table


def thread_state(key: object, fresh: Callable[[], dict]) -> dict:
    """The calling thread's state under ``key`` (an identity object its hooks share; ``fresh()`` makes it on
    the thread's first use): what the hooks of one call hand to each other, never another thread's."""
    table = getattr(_LOCAL, "states", None)
    if table is None:
        table = _LOCAL.states = {}
    state = table.get(key)
    if state is None:
        state = table[key] = fresh()
    return state


def _stash_input(pre: nn.Module, args: tuple, kwargs: dict) -> None:
    """Forward pre-hook on a sub-block's first module: keep (x, the factors' owner) for the add."""
    x = args[0] if args else next(iter(kwargs.values()))
    _pending()[pre.__dict__[SLOT]] = (x, pre.__dict__[OWNER])


def _correct_output(post: nn.Module, args: tuple, out):
    """Forward hook on the module the block adds to x: the correction form of the add."""
    entry = _pending().pop(post.__dict__[SLOT], None)
    if entry is None:  # a sub-block left at alpha 1 that shares this module
        return out
    x, owner = entry
    factors = owner.__dict__
    alpha, beta = factors.get("resdecay_alpha", 1.0), factors.get("resdecay_beta", 1.0)
    update = update_named(factors.get("resdecay_update"))
    if isinstance(out, tuple):  # an attention module returning (output, weights)
        return (residual_correction(x, out[0], alpha, beta, update),) + out[1:]
    return residual_correction(x, out, alpha, beta, update)


def _scale_output(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
    return scale_identity(out, module.resdecay_alpha)


def _scale_branch_end(module: nn.Module, args: tuple, out: torch.Tensor) -> torch.Tensor:
    return scale_branch(out, module.resdecay_beta)


def _refuse_script():
    raise UserError("torch.jit.script cannot compile decayify's forward hooks; use torch.compile or torch.export "
                    "on the decayified model, or script the model before decayify (alpha_min=1 installs no hooks)")


HOOKS = (_stash_input, _correct_output, _scale_output, _scale_branch_end)


def _no_script(block: nn.Module) -> None:
    block.__dict__["__prepare_scriptable__"] = _refuse_script  # torch.jit.script calls it on every submodule


def _owners(pairs: list[tuple[nn.Module, nn.Module]]) -> list[nn.Module]:
    """The module holding each sub-block's factors: its output module, or its pre-norm where the output
    module is shared by several sub-blocks."""
    posts = [post for _, post in pairs]
    return [pre if sum(p is post for p in posts) > 1 else post for pre, post in pairs]


_FASTER: list = []  # the cheaper mechanism ``correct_subblocks`` tries first, once registered (``fused.py``)


def install_faster_with(fuse: Callable[[nn.Module, list, list], bool]) -> None:
    """Register ``fuse(block, pairs, owners)`` -> True when it installed a cheaper way to the same adds than the hooks
    (``fused.py``: one fused add per add in a traced forward; hooks.py does not import it)."""
    _FASTER[:] = [fuse]


def correct_subblocks(block: nn.Module, pairs: list[tuple[nn.Module, nn.Module]], alphas, betas,
                      fuse: bool = True, update: str | None = None) -> None:
    """Reach each (pre, post) pair of ``block``: ``pre`` receives the sub-block input x first, ``post``
    outputs what the block adds to x. Pairs may share ``post``. Sub-blocks at (1, 1) without an ``update`` (a
    registered residual update's name, ``nn.updates``) read no factor. The fused add where
    ``install_faster_with``'s function proves it (``fused.py``) unless ``fuse`` is False, else the hooks."""
    owners, active = _owners(pairs), []
    for (pre, post), owner, a, b in zip(pairs, owners, alphas, betas, strict=True):
        if a == 1.0 and b == 1.0 and update is None:
            continue
        owner.__dict__["resdecay_alpha"] = float(a)  # plain attributes: state_dict keys unchanged
        if b != 1.0:
            owner.__dict__["resdecay_beta"] = float(b)
        if update is not None:  # the name (deepcopy / pickle keep it); the hook looks the function up
            owner.__dict__["resdecay_update"] = update
        active.append((pre, post, owner))
    if not active:
        return
    _no_script(block)
    if fuse and _FASTER and _FASTER[0](block, pairs, owners):
        return
    slots: dict[int, _Slot] = {}
    for pre, post, owner in active:
        slot = slots.setdefault(id(post), _Slot())
        pre.__dict__[SLOT] = post.__dict__[SLOT] = slot
        pre.__dict__[OWNER] = owner
        pre.register_forward_pre_hook(_stash_input, with_kwargs=True)
        if not any(fn is _correct_output for fn in post._forward_hooks.values()):
            post.register_forward_hook(_correct_output)


def subblock_updates(pairs: list[tuple[nn.Module, nn.Module]]) -> tuple[str | None, ...]:
    """The residual update ``correct_subblocks`` installed per sub-block (None: the branch as it is)."""
    return tuple(o.__dict__.get("resdecay_update") for o in _owners(pairs))


def subblock_factors(pairs: list[tuple[nn.Module, nn.Module]]) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """The factors ``correct_subblocks`` installed (1 where a sub-block has no hook)."""
    owners = _owners(pairs)
    return (tuple(float(o.__dict__.get("resdecay_alpha", 1.0)) for o in owners),
            tuple(float(o.__dict__.get("resdecay_beta", 1.0)) for o in owners))


def scale_shortcut(block: nn.Module, attr: str, alpha: float) -> None:
    """alpha times the identity path ``block.<attr>``: a hook on it, or ``ShortcutScale`` in its empty place."""
    if alpha == 1.0:
        return
    path = getattr(block, attr)
    if path is None:
        setattr(block, attr, ShortcutScale(alpha))  # identity = path(x) = alpha * x; no parameters
        return
    path.__dict__["resdecay_alpha"] = float(alpha)
    path.register_forward_hook(_scale_output)
    _no_script(block)


def shortcut_factor(block: nn.Module, attr: str) -> float:
    path = getattr(block, attr)
    if isinstance(path, ShortcutScale):
        return float(path.alpha)
    return 1.0 if path is None else float(path.__dict__.get("resdecay_alpha", 1.0))


def scale_branch_end(block: nn.Module, end: nn.Module, beta: float) -> None:
    """beta times a one-add block's branch, at the module whose output the block adds."""
    if beta == 1.0:
        return
    end.__dict__["resdecay_beta"] = float(beta)
    end.register_forward_hook(_scale_branch_end)
    _no_script(block)


def replace_forward(block: nn.Module, forward: Callable, alphas, betas, update: str | None = None) -> None:
    """``block.forward`` becomes ``forward(block, *args, **kwargs)``, which reads ``block.resdecay_factors`` (and
    ``block.resdecay_update``, a residual update's name, where the forward applies one: the traced adapter's).
    A bound method (not a closure), so that ``copy.deepcopy`` binds the copy's forward to the copy."""
    block.__dict__["resdecay_factors"] = (tuple(float(a) for a in alphas), tuple(float(b) for b in betas))
    block.__dict__["resdecay_update"] = update
    forward._resdecay_forward = True  # what ``remove`` takes away, and nothing else
    block.forward = types.MethodType(forward, block)


def call_guard(class_name: str, stream: str, fixed: dict):
    """A forward pre-hook refusing a call that gives another value to an argument the trace fixed (the traced
    adapter's hooks were proved for the call with the stream alone)."""
    names = list(fixed)

    def guard(module, args, kwargs):
        given = dict(zip(names, args[1:], strict=False))
        given.update({k: v for k, v in kwargs.items() if k != stream})
        for name, value in given.items():
            default = fixed.get(name)
            if not (value is default or type(value) is type(default) and value == default):
                raise TypeError(f"{class_name}: decayify traced its residual adds for a call with {stream} alone "
                                f"({name}={default!r}); this call gives {name}={type(value).__name__}, which was not "
                                "traced: register an adapter for the block (docs/EXTENDING.md)")

    guard._resdecay_traced_guard = True
    return guard


def unguard(block: nn.Module) -> None:
    """Take the traced adapter's argument check off ``block`` (``hooks.remove`` takes the rest)."""
    for key in [k for k, fn in block._forward_pre_hooks.items() if getattr(fn, "_resdecay_traced_guard", False)]:
        del block._forward_pre_hooks[key]
        block._forward_pre_hooks_with_kwargs.pop(key, None)


def remove(block: nn.Module) -> None:
    """Undo every mechanism above on ``block`` (a second ``decayify`` replaces the settings)."""
    for m in block.modules():
        for table in (m._forward_pre_hooks, m._forward_hooks):
            for key in [k for k, fn in table.items() if fn in HOOKS]:
                del table[key]
                m._forward_pre_hooks_with_kwargs.pop(key, None)
        for name in (SLOT, OWNER, "resdecay_alpha", "resdecay_beta", "resdecay_update", "resdecay_factors", "resdecay_options",
                     "__prepare_scriptable__"):
            m.__dict__.pop(name, None)
        fwd = m.__dict__.get("forward")  # a replaced forward (a bound method) or a fused one (``fused.FusedForward``)
        if getattr(getattr(fwd, "__func__", fwd), "_resdecay_forward", False):
            del m.__dict__["forward"]
        for name, child in list(m.named_children()):
            if isinstance(child, ShortcutScale):
                setattr(m, name, None)


def zero_(*layers: nn.Module | None) -> None:
    """Zero the weight (and bias) of each layer given: the last layer of a branch (paper §3)."""
    for layer in layers:
        if layer is None:
            continue
        nn.init.zeros_(layer.weight)
        if getattr(layer, "bias", None) is not None:
            nn.init.zeros_(layer.bias)


def last_linear(module: nn.Module) -> nn.Module | None:
    """The last ``nn.Linear`` / 1x1-or-larger ``nn.Conv2d`` registered in ``module`` (a branch's output layer)."""
    found = None
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            found = m
    return found


def describe(block: nn.Module) -> dict[str, list[str]]:
    """What the mechanisms above installed on ``block``, per mechanism, the modules it sits on (the coverage
    table's "how the add is reached")."""
    forward = block.__dict__.get("forward")
    if getattr(forward, "_resdecay_fused", False):  # the add rewritten in a traced forward (``fused.py``)
        return {"fused add, factors on": [f"`{n}`" for n, m in block.named_modules()
                                          if m is not block and "resdecay_alpha" in m.__dict__]}
    if isinstance(forward, types.MethodType):
        return {"replaced forward": []}
    found: dict[str, list[str]] = {}
    for name, m in block.named_modules():
        kinds = [("pre-hook on", OWNER in m.__dict__),
                 ("correction on", any(fn is _correct_output for fn in m._forward_hooks.values())),
                 ("scaled:", any(fn is _scale_output for fn in m._forward_hooks.values())),
                 ("`ShortcutScale` in the empty", isinstance(m, ShortcutScale))]
        for kind, present in kinds:
            if present:
                found.setdefault(kind, []).append(f"`{name}`")
    return found
