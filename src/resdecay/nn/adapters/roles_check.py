"""An explicit adapter's stated roles checked against the block's traced graph (``registry.BlockAdapter.roles``):
registered with the registry when the package loads, so that ``adapter_for`` never lets an adapter hook the wrong
tensor (timm's SAM ViT: a window un-partition between the stated branch end and the add)."""

from __future__ import annotations

import operator

import torch.fx as fx
import torch.nn as nn

from .registry import check_roles_with
from .traced_graph import ResidualAdd, TraceRefused, residual_adds, same_value_root, trace


def roles_hold(block: nn.Module, pairs: list[tuple[nn.Module, nn.Module]]) -> bool | None:
    """Whether an explicit adapter's roles ``(pre, branch end)`` per add are the block's own, read from its traced
    graph (eval mode): one residual add per pair, add k's branch operand is a call of pair k's branch end (or its
    output's first element), and the first call of pair k's ``pre`` receives that add's stream (x itself). None when
    the trace cannot tell (fx cannot trace the forward, an add it cannot classify, a role inside a module it keeps
    whole, the block itself as the module receiving x: a scaled-shortcut adapter's): the adapter is then trusted."""
    if any(pre is block for pre, _ in pairs):
        return None
    try:
        graph = trace(block, training=False)
        adds = residual_adds(graph, block)
    except TraceRefused:
        return None
    return roles_in_graph(graph, adds, block, pairs)


def roles_in_graph(graph: fx.Graph, adds: list[ResidualAdd], block: nn.Module,
                   pairs: list[tuple[nn.Module, nn.Module]]) -> bool | None:
    """``roles_hold`` on a graph already traced (``adds``: its ``residual_adds``): also what the fused add
    (``fused.py``) asks of the graph whose adds it rewrites."""
    if any(pre is block for pre, _ in pairs):
        return None
    modules, by_name = dict(block.named_modules()), {n.name: n for n in graph.nodes}
    called = {id(modules[n.target]) for n in graph.nodes if n.op == "call_module"}
    if any(id(m) not in called for pair in pairs for m in pair):
        return None  # a role inside a module the trace keeps whole (transformers 4.x's ViTOutput holds an add)
    if len(adds) != len(pairs):
        return False
    for add, (pre, post) in zip(adds, pairs, strict=True):
        branch = by_name[add.branch]
        if branch.op == "call_function" and branch.target is operator.getitem and branch.args[1] == 0:
            branch = branch.args[0]  # ``attn(x)[0]``: a module returning (output, weights)
        if not isinstance(branch, fx.Node) or branch.op != "call_module" or modules[branch.target] is not post:
            return False
        stream = same_value_root(by_name[add.stream], modules)
        first = next((n for n in graph.nodes if n.op == "call_module" and modules[n.target] is pre), None)
        if first is None or not first.args or not isinstance(first.args[0], fx.Node) \
                or same_value_root(first.args[0], modules) is not stream:
            return False
    return True


check_roles_with(roles_hold)
