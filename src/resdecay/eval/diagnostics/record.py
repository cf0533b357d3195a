"""Forward hooks that read the residual stream: the input x of each sub-block, its branch as the
block adds it (``beta * gate * f(x)``, read before any ``decayify`` correction), and each block's
output; and the two interventions the knock-out needs: a branch replaced by zeros (``f_l := 0``, so
the add gives ``alpha_l * x_l``) and blocks before the knocked-out one replayed from a recorded pass
instead of recomputed. Nothing in the model's code changes; every hook is removed on exit.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, Iterator

import torch
import torch.nn as nn

from .sites import Site

PairHook = Callable[[int, int, torch.Tensor, torch.Tensor], None]  # (block, sub-block, x, branch)


@dataclass
class Pass:
    """What one forward of the stream leaves behind, for a batch of B images.

    ``inputs[i]`` is the stream entering block i's first sub-block (B, T, D) (``inputs[0]`` is x_0, the
    stream after the patch and position embedding); ``branches[(i, j)]`` the branch that sub-block j
    of block i adds, scaled as the add scales it; ``outputs[i]`` the stream after block i (B, T, D);
    ``returned[i]`` block i's return value as it was (a tuple for some transformers layers).
    """

    inputs: dict[int, torch.Tensor] = field(default_factory=dict)
    branches: dict[tuple[int, int], torch.Tensor] = field(default_factory=dict)
    outputs: dict[int, torch.Tensor] = field(default_factory=dict)
    returned: dict[int, object] = field(default_factory=dict)


def first_tensor(value) -> torch.Tensor:
    """A module's output tensor (the first entry of a tuple output: attention weights follow it)."""
    return value[0] if isinstance(value, (tuple, list)) else value


def _zeros_like(value):
    if isinstance(value, tuple):
        return (torch.zeros_like(value[0]),) + tuple(value[1:])
    return torch.zeros_like(value)


class _State:
    """Per block: the sub-block now running (a branch module shared by both adds is told apart by the
    pre-norm that ran last), its input x, and the adaLN gates of this call."""

    def __init__(self, n: int):
        self.current = [0] * n
        self.x: list[torch.Tensor | None] = [None] * n
        self.gates: list[tuple | None] = [None] * n


def _pre_hook(state: _State, i: int, j: int, rec: Pass | None):
    def hook(module, args, kwargs):
        x = args[0] if args else next(iter(kwargs.values()))
        state.current[i], state.x[i] = j, x
        if rec is not None and j == 0:
            rec.inputs[i] = x
    return hook


def _branch_hook(site: Site, state: _State, i: int, rec: Pass | None, on_pair: PairHook | None, zero: frozenset):
    def hook(module, args, out):
        j = state.current[i]
        if rec is None and on_pair is None:  # a knock-out pass: only the zeroing
            return _zeros_like(out) if (i, j) in zero else None
        sub = site.subs[j]
        g = first_tensor(out)
        if sub.beta != 1.0:
            g = g * sub.beta
        if state.gates[i] is not None:
            g = state.gates[i][j].unsqueeze(1) * g  # adaLN-Zero: (B, D) gate on every token
        if rec is not None:
            rec.branches[(i, j)] = g
        if on_pair is not None:
            on_pair(i, j, state.x[i], g)
        return _zeros_like(out) if (i, j) in zero else None  # None keeps the output as it is
    return hook


def _gate_hook(site: Site, state: _State, i: int):
    def hook(module, args, out):
        state.gates[i] = site.gates(out)
    return hook


def _block_hook(i: int, rec: Pass | None, last: list | None, n: int):
    def hook(module, args, out):
        if rec is not None:
            rec.outputs[i], rec.returned[i] = first_tensor(out), out
        if last is not None and i == n - 1:
            last.append(first_tensor(out))
    return hook


@contextlib.contextmanager
def hooked(sites: list[Site], rec: Pass | None = None, on_pair: PairHook | None = None,
           zero: frozenset = frozenset(), last: list | None = None) -> Iterator[None]:
    """Hooks on every block of ``sites`` for the duration.

    Args:
        sites: the stream's blocks (``find_sites``).
        rec: a ``Pass`` that receives the stream of each forward (None: record nothing).
        on_pair: called with (block, sub-block, x, branch) as each branch is computed (the norm statistics).
        zero: (block, sub-block) pairs whose branch is replaced by zeros (the knock-out).
        last: a list that receives the last block's output of each forward.
    """
    state, handles = _State(len(sites)), []
    try:
        for i, site in enumerate(sites):
            seen: set[int] = set()
            for j, sub in enumerate(site.subs):
                handles.append(sub.pre.register_forward_pre_hook(_pre_hook(state, i, j, rec), with_kwargs=True))
                if id(sub.branch) not in seen:  # one hook on a branch module the two adds share
                    seen.add(id(sub.branch))
                    # prepend: read f(x) before decayify's correction hook turns it into alpha*x + f - x
                    handles.append(sub.branch.register_forward_hook(
                        _branch_hook(site, state, i, rec, on_pair, zero), prepend=True))
            if site.gate_module is not None:
                handles.append(site.gate_module.register_forward_hook(_gate_hook(site, state, i), prepend=True))
            handles.append(site.block.register_forward_hook(_block_hook(i, rec, last, len(sites))))
        yield
    finally:
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
