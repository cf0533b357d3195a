"""Reading the residual stream during a forward: the input x of each add, its branch as the block adds it
(``beta * f(x)``, read before any ``decayify`` correction), each block's output; and the two interventions the
knock-out needs: a branch replaced by zeros (``f_l := 0``, so the add gives ``alpha_l * x_l``) and blocks before
the knocked-out one replayed from a recorded pass instead of recomputed.

An add is read where its ``Role`` says (``sites.py``): by forward hooks on the module that receives x and the one
whose output is f (and on a projection shortcut's module), or at ``residual_add`` itself through its tap
(``nn.residual.ADD_TAPS``), which knows which block is running from the blocks' own pre-hooks. Feature maps are
recorded as tokens (``as_tokens``). Nothing in the model's code changes; every hook and tap is removed on exit.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.nn as nn

from ..errors import UserError
from ..nn.residual import ADD_TAPS, scale_branch
from ..nn.updates import update_named
from .sites import Site

PairHook = Callable[[int, int, torch.Tensor, torch.Tensor], None]  # (block, sub-block, x, branch)


def as_tokens(t: torch.Tensor, first: bool) -> torch.Tensor:
    """(B, T, D) from a stream tensor: token sequences as they are, a feature map's positions as tokens."""
    if t.dim() == 3:
        return t
    if t.dim() == 4:
        return t.flatten(2).transpose(1, 2) if first else t.flatten(1, 2)
    raise UserError(f"diagnostics read token sequences (B, T, D) and feature maps (B, C, H, W); a block's stream "
                    f"has shape {tuple(t.shape)}")


def grid_of(t: torch.Tensor, first: bool) -> tuple[int, int] | None:
    """The (rows, columns) of a feature map's positions; None for a token sequence."""
    if t.dim() != 4:
        return None
    return (t.shape[2], t.shape[3]) if first else (t.shape[1], t.shape[2])


@dataclass
class Pass:
    """What one forward of the stream leaves behind, for a batch of B images, every tensor as (B, T, D) tokens.

    ``inputs[i]`` is the stream entering block i's first add (``inputs[0]`` is x_0, the stream after the patch
    and position embedding); ``branches[(i, j)]`` the branch that add j of block i adds, scaled as the add scales
    it; ``outputs[i]`` the stream after block i; ``returned[i]`` block i's return value as it was (a tuple for
    some transformers layers); ``grids`` the (rows, columns) of a feature map's positions, per layer (0: x_0,
    i + 1: block i's output) where the stream is a map; ``order`` the blocks in the order they first ran.
    """

    inputs: dict[int, torch.Tensor] = field(default_factory=dict)
    branches: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)
    returned: dict[int, object] = field(default_factory=dict)
    grids: dict[int, tuple[int, int]] = field(default_factory=dict)
    order: list[int] = field(default_factory=list)

    def restricted(self, blocks: list[int]) -> Pass:
        """The pass of the blocks ``blocks`` alone, renumbered 0, 1, ... (one stage of a staged stream)."""
        new = {b: k for k, b in enumerate(blocks)}
        return Pass({new[i]: t for i, t in self.inputs.items() if i in new},
                    {(new[i], j): t for (i, j), t in self.branches.items() if i in new},
                    {new[i]: t for i, t in self.outputs.items() if i in new},
                    {new[i]: t for i, t in self.returned.items() if i in new})


def first_tensor(value) -> torch.Tensor:
    """A module's output tensor (the first entry of a tuple output: attention weights follow it)."""
    return value[0] if isinstance(value, (tuple, list)) else value


def _zeros_like(value):
    if isinstance(value, tuple):
        return (torch.zeros_like(value[0]),) + tuple(value[1:])
    return torch.zeros_like(value)


class _State:
    """Per block: the add now running (a branch module shared by both adds is told apart by the pre-norm that
    ran last), its input x, a projection shortcut's output, the (add, x, branch) pairs waiting for the block's
    end; the blocks running now (innermost last); feature maps already turned into tokens (by tensor)."""

    def __init__(self, sites: list[Site]):
        n = len(sites)
        self.sites = sites
        self.current = [0] * n
        self.x: list[torch.Tensor | None] = [None] * n
        self.raw_x: list[torch.Tensor | None] = [None] * n  # x as the block holds it (a residual update reads it)
        self.identity: list[torch.Tensor | None] = [None] * n
        self.pairs: list[list] = [[] for _ in range(n)]
        self.running: list[int] = []
        self.memo: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def tokens(self, i: int, t: torch.Tensor) -> torch.Tensor:
        """``t`` as tokens, the same tensor each time it is asked for (so that ``is`` still tells a block's input
        from the output of the block before it)."""
        if t.dim() == 3:
            return t
        hit = self.memo.get(id(t))
        if hit is None or hit[0] is not t:
            hit = self.memo[id(t)] = (t, as_tokens(t, self.sites[i].channels_first))
        return hit[1]

    def enter(self, i: int, rec: Pass | None, x: torch.Tensor | None) -> None:
        self.running.append(i)
        self.current[i] = -1 if self.sites[i].at_add else 0
        if rec is not None and i not in rec.order:
            rec.order.append(i)
            if i == 0 and x is not None:
                _keep_grid(rec, 0, x, self.sites[0].channels_first)

    def output(self, i: int, rec: Pass, t: torch.Tensor) -> None:
        """Block i's output ``t`` (its stream after the block) into ``rec``: as tokens, and its grid if a map."""
        rec.outputs[i] = self.tokens(i, t)
        _keep_grid(rec, i + 1, t, self.sites[i].channels_first)


def _keep_grid(rec: Pass, layer: int, t: torch.Tensor, first: bool) -> None:
    grid = grid_of(t, first)
    if grid is not None:
        rec.grids[layer] = grid


def _block_pre_hook(state: _State, i: int, rec: Pass | None):
    def hook(module, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()), None)
        state.enter(i, rec, x if isinstance(x, torch.Tensor) else None)
    return hook


def _pre_hook(state: _State, i: int, j: int, rec: Pass | None):
    def hook(module, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()))
        state.current[i], state.x[i], state.raw_x[i] = j, state.tokens(i, x), x
        if rec is not None and j == 0:
            rec.inputs[i] = state.x[i]
    return hook


def _branch_hook(site: Site, state: _State, i: int, rec: Pass | None, on_pair: PairHook | None, zero: frozenset):
    def hook(module, args, out):
        j = state.current[i]
        if rec is None and on_pair is None:  # a knock-out pass: only the zeroing
            return _zeros_like(out) if (i, j) in zero else None
        # a copy: the block may add x into this very tensor in place (torchvision's ``out += identity``)
        g = first_tensor(out).clone()
        update = update_named(site.subs[j].update)
        if update is not None:  # the branch the add adds: u(x, f), as the correction / fused add compute it
            g = update(state.raw_x[i], g)
        g = state.tokens(i, scale_branch(g, site.subs[j].beta))
        if rec is not None:
            rec.branches[(i, j)] = g
        if on_pair is not None:
            state.pairs[i].append((j, state.x[i], g))
        return _zeros_like(out) if (i, j) in zero else None  # None keeps the output as it is
    return hook


def _identity_hook(state: _State, i: int):
    def hook(module, args, out):
        state.identity[i] = state.tokens(i, first_tensor(out).clone())
    return hook


def _block_hook(site: Site, state: _State, i: int, rec: Pass | None, on_pair: PairHook | None, last: list | None,
                n: int):
    def hook(module, args, out):
        state.running.pop()
        if rec is not None:
            rec.returned[i] = out
            if not site.at_add:
                state.output(i, rec, first_tensor(out))
        for j, x, g in state.pairs[i]:  # a projection shortcut's output stands for x (it ran after the branch)
            on_pair(i, j, state.identity[i] if state.identity[i] is not None else x, g)
        state.pairs[i].clear()
        if last is not None and i == n - 1 and not site.at_add:
            last.append(state.tokens(i, first_tensor(out)))
    return hook


def _tap(state: _State, rec: Pass | None, on_pair: PairHook | None, zero: frozenset, last: list | None):
    """The ``residual_add`` tap: the add of the innermost running block whose adds are read there."""
    n = len(state.sites)

    def tap(x, branch, alpha, beta, add):
        i = state.running[-1] if state.running else None
        if i is None or not state.sites[i].at_add:
            return add(x, branch, alpha, beta)
        site, j = state.sites[i], state.current[i] + 1
        if j >= len(site.subs):
            raise UserError(f"diagnostics: {site.name} made more residual adds than the {len(site.subs)} its adapter "
                            f"({site.kind}) states")
        state.current[i] = j
        if rec is not None or on_pair is not None:
            xt, g = state.tokens(i, x), state.tokens(i, scale_branch(branch, beta))
            if rec is not None:
                rec.branches[(i, j)] = g
                if j == 0:
                    rec.inputs[i] = xt
            if on_pair is not None:
                on_pair(i, j, xt, g)
        out = add(x, torch.zeros_like(branch) if (i, j) in zero else branch, alpha, beta)
        if j == len(site.subs) - 1:
            if rec is not None:
                state.output(i, rec, out)
            if last is not None and i == n - 1:
                last.append(state.tokens(i, out))
        return out
    return tap


def _module_hooks(site: Site, state: _State, i: int, rec: Pass | None, on_pair: PairHook | None,
                  zero: frozenset) -> list:
    """The hooks reading a block's adds through its modules (pre-norm, branch end, projection shortcut)."""
    handles, seen = [], set()
    for j, sub in enumerate(site.subs):
        role = sub.role
        handles.append(role.pre.register_forward_pre_hook(_pre_hook(state, i, j, rec), with_kwargs=True))
        if id(role.branch_end) not in seen:  # one hook on a branch module the two adds share
            seen.add(id(role.branch_end))
            # prepend: read f(x) before decayify's correction hook turns it into alpha*x + f - x
            handles.append(role.branch_end.register_forward_hook(
                _branch_hook(site, state, i, rec, on_pair, zero), prepend=True))
        if role.identity is not None:  # prepend: before decayify's hook scales it by alpha
            handles.append(role.identity.register_forward_hook(_identity_hook(state, i), prepend=True))
    return handles


@contextlib.contextmanager
def hooked(sites: list[Site], rec: Pass | None = None, on_pair: PairHook | None = None,
           zero: frozenset = frozenset(), last: list | None = None) -> Iterator[None]:
    """Hooks (and the ``residual_add`` tap) on every block of ``sites`` for the duration.

    Args:
        sites: the stream's blocks (``find_sites``), with their forwards installed (``reading``).
        rec: a ``Pass`` that receives the stream of each forward (None: record nothing).
        on_pair: called with (block, add, x, branch) for each add (the norm statistics); x is a projection
            shortcut's output where the block has one.
        zero: (block, add) pairs whose branch is replaced by zeros (the knock-out).
        last: a list that receives the last block's output of each forward.
    """
    state, handles = _State(sites), []
    tap = _tap(state, rec, on_pair, zero, last)
    try:
        for i, site in enumerate(sites):
            handles.append(site.block.register_forward_pre_hook(_block_pre_hook(state, i, rec), with_kwargs=True))
            if not site.at_add:
                handles += _module_hooks(site, state, i, rec, on_pair, zero)
            handles.append(site.block.register_forward_hook(_block_hook(site, state, i, rec, on_pair, last, len(sites))))
        ADD_TAPS.append(tap)
        yield
    finally:
        if tap in ADD_TAPS:
            ADD_TAPS.remove(tap)
        for h in handles:
            h.remove()


_MISSING = object()


@contextlib.contextmanager
def replayed(sites: list[Site], rec: Pass, upto: int) -> Iterator[None]:
    """Blocks 0 .. upto-1 return what they returned in the recorded pass ``rec`` instead of running:
    a knock-out of block ``upto`` changes nothing before it, so only the blocks from it on are
    recomputed (about half the cost of a full forward per knock-out). The forward is set on the block
    instance and restored exactly afterwards (a decayified diffusers block keeps its replaced forward)."""
    saved: list[tuple[nn.Module, object]] = []
    try:
        for i in range(upto):
            block = sites[i].block
            saved.append((block, block.__dict__.get("forward", _MISSING)))
            block.__dict__["forward"] = lambda *args, _out=rec.returned[i], **kwargs: _out
        yield
    finally:
        for block, fwd in saved:
            if fwd is _MISSING:
                block.__dict__.pop("forward", None)
            else:
                block.__dict__["forward"] = fwd


def in_run_order(sites: list[Site], run: Callable[[torch.Tensor], object], images: torch.Tensor) -> list[Site]:
    """``sites`` in the order the forward ``run`` runs them on ``images`` (a U-Net's attention blocks are registered
    before the ResNet blocks they follow): what a path decomposition and a knock-out's replay assume."""
    rec = Pass()
    with hooked(sites, rec):
        run(images)
    ran = rec.order + [i for i in range(len(sites)) if i not in rec.order]
    return [sites[i] for i in ran]
