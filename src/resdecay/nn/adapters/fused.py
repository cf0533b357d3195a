"""The fused add: the cheapest way into a block whose roles are stated and whose forward torch.fx can trace.

The correction hooks (``hooks.correct_subblocks``) leave the library's forward alone and hand its ``x + out`` an
``out = beta * f - (1 - alpha) * x``: a pre-hook and two more elementwise ops per add, forward and backward
(benchmarks/hook_cost.py: about 4 % of an eager ViT-S on a CPU). Where the block's own forward can be traced, the
add itself is rewritten instead: the block's forward becomes the code fx generates from its traced graph, in which
each residual add ``x + f`` of paper eq. 3 (x_{l+1} = alpha_l * x_l + f_l(x_l)) is ONE
``residual_add(x, f, alpha, beta)`` = ``torch.add(beta * f, x, alpha=alpha)`` (a single fused kernel for beta = 1),
and everything else (dropout, drop_path, layer scale, their order) is the library's, call for call.

What makes that safe (``fuse`` returns False, and the hooks are installed, whenever one of these fails):

* every argument after the stream (``attn_mask``, ``is_causal``, a transformers layer's ``**kwargs``) is, in the
  forward's source, only ever a plain argument of a call of one of the block's submodules (``_passed_through``):
  the trace keeps it symbolic and the generated forward hands it on as the library does, for any value, and no
  branch of the block's own code can depend on it (fx would silently take ``if mask is None`` one way). The
  generated forward has the library's parameters and defaults; ``*args`` and keyword-only ones are not traced;
* fx traces the forward (with every submodule a leaf, inside the library's decorators, which are kept: ``_rewrap``),
  once per training mode, and its residual adds are the adapter's stated roles (``roles_check.roles_in_graph``);
* every attribute the code reads is the block's own (fx's tensor constants are not), and no one replaced the
  block's forward before.

As in the traced adapter's replaced forward, a plain attribute the block's own forward branches on (a flag set at
construction) is read once, when ``decayify`` traces it; ``self.training`` is read at call time (one code per mode).

The factors stay where the hooks keep them (``resdecay_alpha`` / ``resdecay_beta`` on each sub-block's owner
module, ``hooks.subblock_factors`` reads them back) and are read at call time, so a factor set by hand shows in
the next forward. The forward is a ``FusedForward`` in the block's ``__dict__`` (a deepcopy's is the copy's; a pickled
model generates it again), adds no submodule and no state_dict key, and ``hooks.remove`` takes it away.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import inspect
import itertools
import linecache
import re
import textwrap
import types

import torch.fx as fx
import torch.nn as nn

from ..residual import residual_add
from ..updates import update_named
from . import hooks
from .registry import adapter_for
from .roles_check import roles_in_graph
from .traced_graph import TraceRefused, _Leaves, residual_adds

SPLAT = "_resdecay_splat_kwargs"  # the one key of the **kwargs stand-in: `SPLAT = kwargs` in the code becomes `**kwargs`
_ENABLED = [True]
_CODES = itertools.count()
_COMPILED: dict = {}  # (source, its globals) -> the function: one per distinct generated forward


@contextlib.contextmanager
def hooks_only():
    """Within this block ``decayify`` installs the correction hooks even where an add could be fused (what the
    benchmark and the tests set the fused add against)."""
    before, _ENABLED[0] = _ENABLED[0], False
    try:
        yield
    finally:
        _ENABLED[0] = before


class _Splat:
    """What a traced forward receives as its ``**kwargs``: a mapping with one key whose value is the ``**kwargs``
    placeholder, so that ``module(h, **kwargs)`` records ``SPLAT=kwargs`` in the call. Anything else done with
    it (``kwargs.get``, ``if kwargs``) fails the trace: only a pass-through is proved."""

    __slots__ = ("proxy",)

    def __init__(self, proxy):
        self.proxy = proxy

    def keys(self):
        return (SPLAT,)

    def __getitem__(self, key):
        return self.proxy


class _Tracer(_Leaves):
    """Every submodule a leaf (``traced_graph._Leaves``), the library's forward traced inside its decorators, the
    arguments after the stream placeholders, and ``**kwargs`` a ``_Splat``."""

    def create_args_for_root(self, root_fn, is_module, concrete_args=None):
        root_fn = inspect.unwrap(root_fn)  # the library's own forward, inside its decorators (see ``_rewrap``)
        fn, args = super().create_args_for_root(root_fn, is_module, None)
        params = list(inspect.signature(root_fn).parameters.values())[1:]  # after self
        return fn, [*args[:-1], _Splat(args[-1])] if params[-1].kind is params[-1].VAR_KEYWORD else args


def _extras(block: nn.Module) -> list[inspect.Parameter] | None:
    """The forward's parameters after the stream (positional-or-keyword ones, then maybe ``**kwargs``), or None for
    a signature the generated forward would not keep (no stream, ``*args``, keyword-only parameters)."""
    params = list(inspect.signature(inspect.unwrap(type(block).forward)).parameters.values())[1:]  # after self
    named = params[1:-1] if params and params[-1].kind is params[-1].VAR_KEYWORD else params[1:]
    if not params or any(p.kind is not p.POSITIONAL_OR_KEYWORD for p in [params[0], *named]):
        return None
    return params[1:]


def _passed_through(block: nn.Module, extras: list[inspect.Parameter]) -> bool:
    """Every use of an argument after the stream in the forward's source is a plain argument of a call of one of
    the block's own submodules (``self.attn(h, attn_mask=attn_mask)``, ``self.attention(h, **kwargs)``): no branch
    of the block can depend on it, and a submodule, a leaf of the trace, gets it as the library gives it. This is
    what lets the trace keep those arguments symbolic (fx would silently take ``if mask is None`` one way)."""
    splat = {p.name: p.kind is p.VAR_KEYWORD for p in extras}  # name -> passed as ``**name`` only
    if not splat:
        return True
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(type(block).forward))))
    except (OSError, TypeError, SyntaxError):
        return False
    body = [n for stmt in tree.body[0].body for n in ast.walk(stmt)]  # not the decorators
    passed = set()
    for call in body:
        callee = getattr(call, "func", None)
        if not (isinstance(call, ast.Call) and isinstance(callee, ast.Attribute) and isinstance(callee.value, ast.Name)
                and callee.value.id == "self" and callee.attr in block._modules):
            continue
        passed |= {id(a) for a in call.args if isinstance(a, ast.Name) and a.id in splat and not splat[a.id]}
        passed |= {id(k.value) for k in call.keywords if isinstance(k.value, ast.Name) and k.value.id in splat
                   and (k.arg is None) == splat[k.value.id]}
    return all(id(n) in passed for n in body if isinstance(n, ast.Name) and n.id in splat)


def _trace(block: nn.Module, training: bool) -> fx.Graph | None:
    """The graph of the block's forward (None where fx cannot trace it); the block is left as it was."""
    before, mode = set(block.__dict__), block.training
    block.training = training
    try:
        return _Tracer().trace(block)
    except Exception:  # noqa: BLE001  (whatever fx met in a library's forward: the hooks then)
        return None
    finally:
        block.training = mode
        for key in set(block.__dict__) - before:  # ``_tensor_constant0``: a tensor made in forward
            del block.__dict__[key]


def _shape(graph: fx.Graph) -> list:
    """The graph as comparable tuples (to tell whether both training modes trace alike)."""
    index, out = {}, []
    for n in graph.nodes:
        index[n] = ("node", len(out))
        out.append((n.op, n.target, fx.node.map_arg((n.args, n.kwargs), lambda a: index[a])))
    return out


def _proved_graphs(block: nn.Module, pairs: list) -> dict | None:
    """Per training mode, (graph, its residual adds) of the forward, when the arguments after the stream pass
    through and the adds are the stated roles; else None."""
    extras = _extras(block)
    if extras is None or not _passed_through(block, extras):
        return None
    graphs = {}
    for training in (False, True):
        graph = _trace(block, training)
        if graph is None or any(n.op == "get_attr" and not _has_attr(block, n.target) for n in graph.nodes):
            return None
        try:
            adds = residual_adds(graph, block)
        except TraceRefused:
            return None
        if roles_in_graph(graph, adds, block, pairs) is not True:
            return None
        graphs[training] = (graph, adds)
    return graphs


def _has_attr(block: nn.Module, path: str) -> bool:
    try:
        obj = block
        for part in path.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        return False
    return True


def fused_add(x, branch, owner: nn.Module):
    """One residual add of a fused forward: ``alpha * x + beta * branch`` with the factors ``owner`` holds now
    (``hooks.correct_subblocks`` put them there; a sub-block left at 1 holds none: the plain add)."""
    factors = owner.__dict__
    return residual_add(x, branch, factors.get("resdecay_alpha", 1.0), factors.get("resdecay_beta", 1.0),
                        update_named(factors.get("resdecay_update")))


def _code(graph: fx.Graph, adds, owners: list[str], label: str):
    """The forward fx generates from ``graph`` with add k rewritten to ``fused_add(x, f, <owner k>)``."""
    g = fx.Graph()
    env: dict = {}
    for node in graph.nodes:
        env[node] = g.node_copy(node, lambda n: env[n])
    by_name = {n.name: env[n] for n in graph.nodes}
    for add, owner in zip(adds, owners, strict=True):
        node = by_name[add.node]
        with g.inserting_before(node):
            new = g.call_function(fused_add, (by_name[add.stream], by_name[add.branch], g.get_attr(owner)))
        node.replace_all_uses_with(new)
        g.erase_node(node)
        by_name[add.node] = new  # the next add's stream operand
    code = g.python_code(root_module="self")
    src = re.sub(rf"\b{SPLAT} = (\w+)", r"**\1", code.src)
    key = (src, tuple(sorted((name, id(value)) for name, value in code.globals.items())))
    if key not in _COMPILED:  # the blocks of a stack share one code (it reaches their modules through self)
        filename = f"<resdecay fused {label} #{next(_CODES)}>"
        linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)  # readable tracebacks
        namespace = dict(code.globals)
        exec(compile(src, filename, "exec"), namespace)  # noqa: S102  (fx's own generated code, as GraphModule does)
        _COMPILED[key] = namespace["forward"]
    return _COMPILED[key]


def _forward(block: nn.Module, graphs: dict, owners: list[str]):
    """``forward(self, ...)``: the code of ``self.training``'s mode (one function where both modes trace alike)."""
    label = type(block).__name__
    if _shape(graphs[False][0]) == _shape(graphs[True][0]):
        return _code(*graphs[False], owners, label)
    codes = {mode: _code(graph, adds, owners, f"{label} {'train' if mode else 'eval'}")
             for mode, (graph, adds) in graphs.items()}

    def forward(self, *args, **kwargs):
        return codes[self.training](self, *args, **kwargs)

    return forward


def _rewrap(wrapper, forward):
    """The class's forward ``wrapper`` (the library's forward under decorators, e.g. transformers' gradient
    checkpointing, which wraps every layer's forward) around ``forward`` instead of the library's: at each level the
    same code, with the one closure cell that holds the next inner function holding its replacement, so that what
    each decorator does is kept. None where such a cell is not found (a decorator not known to call it alone)."""
    inner = getattr(wrapper, "__wrapped__", None)
    if inner is None:
        return forward
    if not isinstance(wrapper, types.FunctionType):
        return None
    hits = [i for i, c in enumerate(wrapper.__closure__ or ()) if _holds(c, inner)]
    replacement = _rewrap(inner, forward) if len(hits) == 1 else None
    if replacement is None:
        return None
    closure = tuple(types.CellType(replacement) if i == hits[0] else c for i, c in enumerate(wrapper.__closure__))
    out = types.FunctionType(wrapper.__code__, wrapper.__globals__, wrapper.__name__, wrapper.__defaults__, closure)
    out.__kwdefaults__, out.__wrapped__ = wrapper.__kwdefaults__, replacement
    return out


def _holds(cell, value) -> bool:
    try:
        return cell.cell_contents is value
    except ValueError:  # an empty cell
        return False


def _fused_code(block: nn.Module, pairs: list, owners: list[nn.Module]):
    """``forward(self, ...)``, the library's decorators around the generated code, or None where not proved."""
    paths = {id(m): name for name, m in block.named_modules()}
    if any(id(o) not in paths or o is block for o in owners):
        return None
    if _rewrap(type(block).forward, _fused_code) is None:  # a decorator whose call of the forward cannot be redirected
        return None
    graphs = _proved_graphs(block, pairs)
    if graphs is None:
        return None
    return _rewrap(type(block).forward, _forward(block, graphs, [paths[id(o)] for o in owners]))


class FusedForward:
    """``block.forward`` where its adds are fused: the generated code called with the block. An object, not a bound
    method of the generated function, so that ``copy.deepcopy`` (EMA) gives the copy its own, and a pickled model
    (``torch.save(model)``) keeps it: generated code is not pickled, but proved and generated again on the first
    call after loading (a bound method would unpickle as the class's forward: the library's add, the decay lost)."""

    _resdecay_forward = True  # what ``hooks.remove`` takes away
    _resdecay_fused = True  # what a reader that does not import this module (a description of the block) looks for

    def __init__(self, block: nn.Module, code=None):
        self.block, self.code = block, code

    def __call__(self, *args, **kwargs):
        if self.code is None:
            self.code = _regenerate(self.block)
        return self.code(self.block, *args, **kwargs)

    def __deepcopy__(self, memo):
        return FusedForward(copy.deepcopy(self.block, memo), self.code)

    def __reduce__(self):
        return FusedForward, (self.block,)


def _regenerate(block: nn.Module):
    """The fused code of an unpickled block, from its adapter's roles and the factors it carries."""
    adapter = adapter_for(block)
    pairs = adapter.roles(block) if adapter is not None and adapter.roles is not None else None
    code = _fused_code(block, pairs, hooks._owners(pairs)) if pairs else None
    if code is None:
        raise RuntimeError(f"{type(block).__name__}: its fused residual adds cannot be proved again in this process "
                           "(another library version?); decayify the model again")
    return code


def fuse(block: nn.Module, pairs: list[tuple[nn.Module, nn.Module]], owners: list[nn.Module]) -> bool:
    """Replace ``block``'s forward by its fused form if that is proved (see the module's notes); False: untouched.

    Args:
        block: the block; ``pairs``: its stated ``(pre, branch end)`` per add; ``owners``: per add, the module whose
            ``resdecay_alpha`` / ``resdecay_beta`` that add reads (``hooks._owners``).
    """
    if not _ENABLED[0] or "forward" in block.__dict__:  # a forward someone else replaced: theirs runs, with the hooks
        return False
    code = _fused_code(block, pairs, owners)
    if code is None:
        return False
    block.forward = FusedForward(block, code)
    return True


def is_fused(block: nn.Module) -> bool:
    """``block``'s adds are reached by the fused add (not by the hooks, nor left as the library's)."""
    return isinstance(block.__dict__.get("forward"), FusedForward)


hooks.install_faster_with(fuse)
