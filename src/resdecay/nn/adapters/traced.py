"""The traced adapter: ``decayify`` for residual blocks no explicit adapter names, tried after the explicit ones.

Each candidate block is traced by torch.fx (``traced_graph``: its own forward, every submodule a leaf) and its
residual adds found; what cannot be proved is refused in one line (``TraceRefused``). The adapter is built per
block *instance* (``traced_adapter``), since flags such as ``downsample is None`` differ between instances,
and it reaches the adds through the mechanisms of ``hooks``, so the state_dict keys never change and
alpha = 1 installs nothing:

* every add's branch ends in a module called once, and a module called once receives x first: the
  correction hooks (``hooks.correct_subblocks``, pre = that module, post = the branch's last module): the
  library's own forward runs;
* otherwise (a branch computed inline, ``gate * attn(x)``): the forward is replaced (``hooks.replace_forward``)
  by the code fx generates from the traced graph, each residual add rewritten to
  ``residual_add(x, f, alpha, beta)`` (paper eq. 3: x_{l+1} = alpha_l * x_l + f_l(x_l)). That code reaches
  submodules and parameters as attributes of ``self``, so it runs on the block itself: no GraphModule, no new
  state_dict key, and a ``copy.deepcopy`` binds the copy's forward to the copy. One code per training mode
  (a dropout rate read from ``self.training`` is fixed while tracing).

What is proved is the call with the stream alone (the other arguments at their defaults, as a model's stack
calls its blocks): another call is refused at call time rather than run unproved.

Which modules are candidates (``candidates``): the repeated modules of a stack (the children of an
``nn.ModuleList`` / ``nn.Sequential`` holding two or more modules of one class, and the children of such
repeated containers: ConvMixer's ``Residual`` inside each ``Sequential``), and modules whose class is named like
a residual block; never torch.nn's own layers, outermost first, leaving out modules an explicit adapter takes,
modules inside one, and modules holding one.
"""

from __future__ import annotations

import copy
import itertools
import linecache
import operator
import re
from dataclasses import dataclass
from typing import Iterator

import torch
import torch.fx as fx
import torch.nn as nn
import torch.nn.functional as F

from ..residual import residual_add
from ..updates import update_named
from . import hooks
from .registry import AT_RESIDUAL_ADD, TRACED, TRACED_SEEN, BlockAdapter, traced_adapter_of
from .traced_graph import (
    VIEW_FUNCTIONS,
    VIEW_METHODS,
    ResidualAdd,
    TraceRefused,
    concrete_arguments,
    residual_adds,
    same_value_root,
    shape_nodes,
    trace,
)

__all__ = ["TraceRefused", "candidates", "trace_blocks", "traced_adapter"]

# class names that say "residual block" (the same words decayify's PartialDecayWarning looks for)
LOOKS_RESIDUAL = re.compile(r"(Block|Bottleneck|ResBlock|ResidualBlock)\d*$")
_CODES = itertools.count()


# ----------------------------------------------------------------------------- the plan: hooks or a replaced forward
@dataclass(frozen=True)
class TracedPlan:
    """What the traced adapter installs on one block.

    Args:
        class_name: the block's class, for messages.
        adds: its number of residual adds.
        pairs: ``(pre, post)`` module paths per add when every add's branch ends in a module called once and a
            module called once receives x first (``hooks.correct_subblocks``); None: the forward is replaced.
        graphs: per training mode, ``(graph, adds)``: the traced forward and its ``ResidualAdd``s.
        ends: per add, the paths of the modules whose last layer ``zero_init`` zeroes (empty: none is known).
    """

    class_name: str
    adds: int
    pairs: tuple | None
    graphs: dict
    ends: tuple


def _called(graph: fx.Graph, modules: dict) -> dict[int, list[fx.Node]]:
    """The call_module nodes of each module object (a module registered under two names is one object)."""
    calls: dict[int, list[fx.Node]] = {}
    for n in graph.nodes:
        if n.op == "call_module":
            calls.setdefault(id(modules[n.target]), []).append(n)
    return calls


def hook_pairs(graph: fx.Graph, adds: list[ResidualAdd], block: nn.Module) -> tuple | None:
    """``(pre, post)`` module paths per add, or None when one add cannot be reached by the hooks.

    The hooks keep x when ``pre`` is called and correct ``post``'s output; that is the add's
    ``alpha * x + beta * branch`` exactly when ``post``'s output is the branch operand and goes nowhere else,
    ``pre`` receives the add's stream value itself as its first argument before ``post`` runs, each is called
    once, and neither sits inside another module the forward calls (which could call it again).
    """
    modules = dict(block.named_modules())
    by_name = {n.name: n for n in graph.nodes}
    order = {n: i for i, n in enumerate(graph.nodes)}
    calls = _called(graph, modules)
    inner = set()
    for node_list in calls.values():
        m = modules[node_list[0].target]
        inner |= {id(d) for d in m.modules() if d is not m}
    pairs = []
    for add in adds:
        post, stream = by_name[add.branch], same_value_root(by_name[add.stream], modules)
        if post.op != "call_module" or len(post.users) != 1 or len(calls[id(modules[post.target])]) != 1:
            return None
        pre = next((n for n in graph.nodes if n.op == "call_module" and order[n] <= order[post] and n.args
                    and isinstance(n.args[0], fx.Node) and same_value_root(n.args[0], modules) is stream), None)
        if pre is None or len(calls[id(modules[pre.target])]) != 1:
            return None
        if id(modules[pre.target]) in inner or id(modules[post.target]) in inner:
            return None
        pairs.append((pre.target, post.target))
    return tuple(pairs)


# ops whose output is zero when their tensor inputs are (and the reshapes, ``VIEW_METHODS``); any other op
# (sigmoid, softmax, exp, an unknown function) is not known to map zero to zero
_ZERO_KEEPING = {operator.add, torch.add, operator.sub, torch.sub, operator.neg, operator.getitem, torch.cat,
                 torch.stack, torch.sum, torch.mean, torch.chunk, torch.split, torch.unbind, torch.relu, F.relu, F.gelu,
                 F.silu, F.dropout, F.pad, *VIEW_FUNCTIONS}
_ZERO_KEEPING_METHODS = {"add", "sub", "neg", "sum", "mean", "chunk", "split", "unbind", "relu", "expand", *VIEW_METHODS}
_NOT_ZERO_KEEPING = (nn.Sigmoid, nn.Hardsigmoid, nn.Softmax, nn.Softmin, nn.Softplus, nn.LogSigmoid, nn.LogSoftmax)


def _last_layer(module: nn.Module) -> nn.Module | None:
    """The last registered layer with a ``weight`` in ``module`` (a branch's output Linear / Conv, or a last
    norm, as timm's ``zero_init_last`` zeroes a ResNet branch's last BatchNorm)."""
    found = None
    for m in module.modules():
        if isinstance(getattr(m, "weight", None), nn.Parameter):
            found = m
    return found


def _zero_paths(node, modules: dict, meta: set, stops: set) -> list[str] | None:
    """The modules whose last layer, zeroed, makes ``node`` zero (the paper's zero-initialised branch), or None
    when that cannot be shown: the nearest layer on every operand of a sum, on one factor of a product,
    through reshapes and zero-keeping ops only."""
    if not isinstance(node, fx.Node) or node.op in ("placeholder", "get_attr") or node in stops:
        return None
    if node.op == "call_module":
        module = modules[node.target]
        if _last_layer(module) is not None:
            return [node.target]
        if isinstance(module, _NOT_ZERO_KEEPING) or not node.args:
            return None
        return _zero_paths(node.args[0], modules, meta, stops)  # dropout, drop_path, identity, an activation
    factors = {operator.mul: 2, torch.mul: 2, "mul": 2, operator.matmul: 2, torch.matmul: 2, operator.truediv: 1,
               torch.div: 1, "div": 1}
    if node.target in factors:  # a product is zero when one factor is
        for operand in node.args[:factors[node.target]]:
            found = _zero_paths(operand, modules, meta, stops)
            if found:
                return found
        return None
    if node.target not in _ZERO_KEEPING and node.target not in _ZERO_KEEPING_METHODS:
        return None
    tensors = [i for i in node.all_input_nodes if i not in meta]
    parts = [_zero_paths(i, modules, meta, stops) for i in tensors]
    return None if not parts or any(p is None for p in parts) else [q for p in parts for q in p]


def plan_block(block: nn.Module) -> TracedPlan:
    """Trace ``block`` in eval and train mode and decide how its adds are reached (``TraceRefused`` if not).

    Args:
        block: the module (left as it was).
    """
    cls, modules = type(block).__name__, dict(block.named_modules())
    graphs = {}
    for training in (False, True):
        graph = trace(block, training)
        graphs[training] = (graph, residual_adds(graph, block))
    if len(graphs[False][1]) != len(graphs[True][1]):
        raise TraceRefused(cls, "its residual adds differ between train and eval mode", "add")
    pairs = [hook_pairs(graph, adds, block) for graph, adds in graphs.values()]
    graph, adds = graphs[False]
    by_name = {n.name: n for n in graph.nodes}
    meta, stops = shape_nodes(list(graph.nodes)), {by_name[a.node] for a in adds} | {by_name[a.stream] for a in adds}
    ends = tuple(tuple(dict.fromkeys(_zero_paths(by_name[a.branch], modules, meta, stops) or ())) for a in adds)
    return TracedPlan(cls, len(adds), pairs[0] if pairs[0] is not None and pairs[0] == pairs[1] else None,
                      graphs, ends)


# ----------------------------------------------------------------------------- the two ways in
def _traced_add(x, branch, factors, update: str | None, k: int):
    """The k-th residual add of a replaced forward: ``alpha_k * x + beta_k * u(x, branch)``, the factors read from
    ``block.resdecay_factors`` and the update's name from ``block.resdecay_update`` at call time (a factor changed
    by hand shows in the next forward)."""
    alphas, betas = factors
    return residual_add(x, branch, alphas[k], betas[k], update_named(update))


def _compile(graph: fx.Graph, adds, names: list[str], label: str):
    """The forward fx generates from ``graph`` with each residual add rewritten to ``_traced_add``; the
    placeholders keep the forward's own parameter names, so the caller's keywords still fit."""
    g = copy.deepcopy(graph)
    by_name = {n.name: n for n in g.nodes}
    places = [n for n in g.nodes if n.op == "placeholder"]
    for node, name in zip(places, names, strict=True):
        node.target = name
    with g.inserting_after(places[-1]):
        factors = g.get_attr("resdecay_factors")
        update = g.get_attr("resdecay_update")
    for k, add in enumerate(adds):
        node = by_name[add.node]
        with g.inserting_before(node):
            new = g.call_function(_traced_add, (by_name[add.stream], by_name[add.branch], factors, update, k))
        node.replace_all_uses_with(new)
        g.erase_node(node)
        by_name[add.node] = new  # the next add's stream operand
    code = g.python_code(root_module="self")
    filename = f"<resdecay traced {label} #{next(_CODES)}>"
    linecache.cache[filename] = (len(code.src), None, code.src.splitlines(True), filename)  # readable tracebacks
    namespace = dict(code.globals)
    exec(compile(code.src, filename, "exec"), namespace)  # noqa: S102  (fx's own generated code, as GraphModule does)
    return namespace["forward"]


def _replaced_forward(block: nn.Module, plan: TracedPlan):
    """``forward(self, ...)`` running the traced code of ``self.training``'s mode (a plain function, bound by
    ``hooks.replace_forward``: a deepcopy's forward is the copy's)."""
    stream, fixed = concrete_arguments(block)
    names = [stream, *fixed]
    codes = {mode: _compile(graph, adds, names, f"{plan.class_name} {'train' if mode else 'eval'}")
             for mode, (graph, adds) in plan.graphs.items()}

    def forward(self, *args, **kwargs):
        return codes[self.training](self, *args, **kwargs)

    return forward


def traced_adapter(block: nn.Module) -> BlockAdapter:
    """The adapter of one block instance, from its traced forward; ``TraceRefused`` (one line) if its adds
    cannot be proved. Its name is ``"traced <ClassName>"``, so ``residual_blocks`` and the coverage say the
    block was reached by tracing.

    Args:
        block: the module (left as it was: tracing installs nothing).
    """
    plan = plan_block(block)
    stream, fixed = concrete_arguments(block)
    # the closures below hold module paths and numbers only (never the block, nor the graphs): they serve any
    # copy of the block, e.g. a deepcopy's or an EMA's
    cls, adds, paths, ends = plan.class_name, plan.adds, plan.pairs, plan.ends
    ones = ((1.0,) * adds, (1.0,) * adds)

    def zero_init(b: nn.Module) -> None:
        for k, layers in enumerate(ends):
            if not layers:
                raise ValueError(f"{cls}: zero_init cannot show which layer makes residual add {k}'s branch zero "
                                 "(the traced adapter zeroes the last layer of each branch, through zero-keeping "
                                 "ops only)")
            hooks.zero_(*(_last_layer(b.get_submodule(p)) for p in layers))

    if paths is not None:
        def pairs(b: nn.Module) -> list:
            return [(b.get_submodule(pre), b.get_submodule(post)) for pre, post in paths]

        guard = hooks.call_guard(cls, stream, fixed)

        def install(b: nn.Module, alphas, betas, update: str | None = None, **options) -> None:
            hooks.unguard(b)
            hooks.correct_subblocks(b, pairs(b), alphas, betas, fuse=False, update=update)  # the library's forward runs
            if fixed and (update is not None or any(v != 1.0 for v in (*alphas, *betas))):
                b.register_forward_pre_hook(guard, with_kwargs=True)

        return BlockAdapter(f"traced {cls}", (type(block),), adds, install=install,
                            factors=lambda b: hooks.subblock_factors(pairs(b)), zero_init=zero_init, mixed_adds=True,
                            roles=pairs, updates=lambda b: hooks.subblock_updates(pairs(b)))

    forward = _replaced_forward(block, plan)
    del plan  # the generated code is all the forward needs

    def install_forward(b: nn.Module, alphas, betas, update: str | None = None, **options) -> None:
        if update is not None or any(v != 1.0 for v in (*alphas, *betas)):  # else the library's forward, untouched
            hooks.replace_forward(b, forward, alphas, betas, update)

    return BlockAdapter(f"traced {cls}", (type(block),), adds, install=install_forward,
                        factors=lambda b: b.__dict__.get("resdecay_factors", ones), zero_init=zero_init, mixed_adds=True,
                        reads=lambda b: [AT_RESIDUAL_ADD] * adds, forward=forward,
                        updates=lambda b: (b.__dict__.get("resdecay_update"),) * adds)


# ----------------------------------------------------------------------------- which modules are candidates
def _is_torch_layer(m: nn.Module) -> bool:
    return type(m).__module__.startswith("torch.nn.")


def _repeated(parent: nn.Module, child: nn.Module) -> bool:
    """``child`` is one of two or more modules of one class in the container ``parent``."""
    return isinstance(parent, (nn.ModuleList, nn.Sequential)) and sum(type(c) is type(child) for c in parent) >= 2


def candidates(model: nn.Module, taken: list[str]) -> Iterator[tuple[str, nn.Module, bool]]:
    """(name, module, named like a residual block) of each module the traced adapter tries, outermost first.

    Args:
        model: the model.
        taken: the names of the blocks explicit adapters take (neither they, nor modules inside them, nor
            modules holding them are candidates).
    """
    members: set[int] = set()  # containers repeated in a stack: their children count as repeated too
    parents = {id(child): m for m in model.modules() for child in m.children()}
    for name, m in model.named_modules():
        parent = parents.get(id(m))
        repeated = parent is not None and (_repeated(parent, m) or id(parent) in members)
        if repeated and isinstance(m, (nn.ModuleList, nn.Sequential)):
            members.add(id(m))
        if any(name == t or name.startswith(t + ".") or t.startswith(name + ".") or name == "" for t in taken):
            continue
        looks = bool(LOOKS_RESIDUAL.search(type(m).__name__))
        if not _is_torch_layer(m) and (repeated or looks):
            yield name, m, looks


def keep_traced(module: nn.Module, adapter: BlockAdapter, on_block: bool) -> None:
    """Remember the traced adapter of ``module`` (``registry.traced_adapter_of`` finds it): on the block (``decayify``,
    which changes the model anyway) or beside it (a read-only query)."""
    if on_block:
        module.__dict__[TRACED] = adapter
    else:
        TRACED_SEEN[module] = adapter


def trace_blocks(model: nn.Module, taken: list, on_blocks: bool = True) -> tuple[list, list]:
    """The blocks the traced adapter takes and those it refuses, in ``model.modules()`` order; each block it has
    traced, now or before (one of ``taken``, the ``(name, block, adapter)`` the registered adapters found), is kept
    (``keep_traced``, on the block when ``on_blocks``).

    Returns:
        ``(found, refused)``: found is ``[(name, block, adapter)]``; refused is ``[(name, class, reason)]`` for
        the candidates left at alpha 1 that hold no found block (a refused stage around traced blocks is their
        container, not a block) and are blocks by their add (or by name, where no residual add was found).
    """
    for _, block, adapter in taken:
        if adapter is block.__dict__.get(TRACED) or adapter is TRACED_SEEN.get(block):  # traced by an earlier call
            keep_traced(block, adapter, on_blocks)
    found: list = []
    refused: list = []
    for name, m, looks in candidates(model, [name for name, _, _ in taken]):
        if any(name.startswith(f + ".") for f, _, _ in found):
            continue
        kept = traced_adapter_of(m)  # traced before (an earlier decayify or query): the same instance, the same proof
        try:
            found.append((name, m, kept if kept is not None else traced_adapter(m)))
        except TraceRefused as e:
            if e.kind != "none" or looks:
                refused.append((name, f"{type(m).__module__}.{type(m).__name__}", str(e)))
    refused = [r for r in refused if not any(f.startswith(r[0] + ".") or r[0] == "" for f, _, _ in found)
               and not any(r[0].startswith(o[0] + ".") for o in refused)]
    for _, block, adapter in found:
        keep_traced(block, adapter, on_blocks)
    return found, refused
