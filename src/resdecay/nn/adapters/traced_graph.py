"""What the traced adapter proves about a block: its forward traced by torch.fx and its residual adds found.

The block's forward is traced once per training mode with every submodule a leaf, so the graph is the
block's own forward at top level (``self.norm1(x)`` is one ``call_module`` node, never its insides). The
arguments after the stream are fixed at their defaults (``concrete_args``): what is proved is the call with
the stream alone, as a model's stack calls its blocks.

A *residual add* is an ``add`` (``operator.add``, ``torch.add``, ``Tensor.add``) of the *stream* (the block's
input, or the value of the previous residual add; seen also through shape-only views of it and ``nn.Identity``)
and a term computed from the stream: the ``x_l + f_l(x_l)`` of paper eq. 3, whose x gets alpha_l. Every
other add that touches the stream is refused, with the reason (``TraceRefused``), rather than guessed at: an
in-place add (``add_``, ``+=``), the stream added to itself, to a constant, to a term not computed from it
(a parallel branch beside an earlier one), to a scaled stream (``gate * x``), or an earlier value of the
stream. An add that does not touch the stream (``attn_out + mlp_out`` inside a branch) is the branch's own.
"""

from __future__ import annotations

import inspect
import io
import linecache
import operator
import os
import sys
import tokenize
from dataclasses import dataclass

import torch
import torch.fx as fx
import torch.nn as nn

_TORCH = os.path.dirname(torch.__file__) + os.sep

ADD_FUNCTIONS = (operator.add, torch.add)
INPLACE_FUNCTIONS = (operator.iadd, operator.isub, operator.imul, operator.itruediv)
SUB_FUNCTIONS = (operator.sub, torch.sub)
SCALE_FUNCTIONS = (operator.mul, torch.mul, operator.truediv, torch.div)
# views of the stream: alpha * view(x) = view(alpha * x), so the identity path may pass through them
VIEW_METHODS = frozenset({"view", "reshape", "flatten", "unflatten", "permute", "transpose", "contiguous", "squeeze",
                          "unsqueeze", "view_as", "reshape_as"})
VIEW_FUNCTIONS = (torch.reshape, torch.flatten, torch.permute, torch.transpose, torch.squeeze, torch.unsqueeze)
# the same values (not only a view): a module that first receives one of these receives x itself
SAME_VALUE_METHODS = frozenset({"contiguous"})
SHAPE_ATTRS = ("shape", "ndim", "dtype", "device")
SHAPE_METHODS = frozenset({"size", "dim", "numel"})


class TraceRefused(Exception):
    """The traced adapter cannot prove a block's residual adds. ``str()`` is one line naming the block class
    and why; ``kind`` is "trace" (tracing failed), "none" (no residual add: a container), or "add" (an add it
    cannot classify)."""

    def __init__(self, class_name: str, reason: str, kind: str = "add"):
        super().__init__(f"{class_name}: {reason}")
        self.class_name, self.reason, self.kind = class_name, reason, kind


@dataclass(frozen=True)
class ResidualAdd:
    """One residual add of a traced graph, by node name: ``node = stream + branch`` (either order)."""

    node: str
    stream: str
    branch: str


class _Leaves(fx.Tracer):
    """Every submodule is a leaf: the graph is the traced module's own forward, one node per module call."""

    def __init__(self, autowrap_functions: tuple = ()):
        super().__init__(autowrap_functions=autowrap_functions)

    def create_node(self, *args, **kwargs) -> fx.Node:
        """Each node with the line of source that made it (``node.meta["resdecay_line"]``): the innermost frame
        outside torch, which tells ``x += f`` (traced as a plain add) from ``x = x + f``. Cheaper than fx's
        ``record_stack_traces``, which keeps every frame."""
        node = super().create_node(*args, **kwargs)
        frame = sys._getframe(1)
        while frame is not None and (frame.f_code.co_filename.startswith(_TORCH) or frame.f_code.co_filename == __file__):
            frame = frame.f_back
        if frame is not None:
            node.meta["resdecay_line"] = (frame.f_code.co_filename, frame.f_lineno)
        return node

    def is_leaf_module(self, m: nn.Module, module_qualified_name: str) -> bool:
        return True


def concrete_arguments(block: nn.Module) -> tuple[str, dict]:
    """(the stream's parameter name, the other parameters at their defaults) of ``type(block).forward``.

    Args:
        block: the module whose forward is traced.
    """
    name = type(block).__name__
    params = list(inspect.signature(type(block).forward).parameters.values())[1:]  # after self
    if not params or params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
        raise TraceRefused(name, "its forward takes no positional input to trace as the stream", "trace")
    fixed = {}
    for p in params[1:]:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TraceRefused(name, f"its forward takes {'*' if p.kind == p.VAR_POSITIONAL else '**'}{p.name}, "
                                     "which a trace cannot fix", "trace")
        if p.default is p.empty or not isinstance(p.default, (type(None), bool, int, float, str)):
            raise TraceRefused(name, f"its forward needs argument {p.name} beside the stream", "trace")
        fixed[p.name] = p.default
    return params[0].name, fixed


def _library_functions() -> tuple:
    """The functions a library already imported marks as not traceable (timm's ``register_notrace_function``):
    its own tracer keeps them whole, and so does this one on a second try. Nothing is imported to look."""
    fx_helpers = sys.modules.get("timm.layers._fx")
    return tuple(fx_helpers.get_notrace_functions()) if fx_helpers is not None else ()


def trace(block: nn.Module, training: bool) -> fx.Graph:
    """The graph of ``type(block).forward`` in the given training mode (``self.training`` is read while tracing,
    e.g. a dropout rate); the block is left exactly as it was (fx's tensor constants are taken off it again)."""
    name = type(block).__name__
    _, fixed = concrete_arguments(block)
    before, mode = set(block.__dict__), block.training
    block.training = training
    try:
        try:
            return _Leaves().trace(block, concrete_args=fixed)
        except Exception as first:  # noqa: BLE001  (any failure of the plain trace: try the library's own list)
            wrap = _library_functions()
            if not wrap:
                raise first
            return _Leaves(wrap).trace(block, concrete_args=fixed)
    except fx.proxy.TraceError as e:
        if "control flow" in str(e):
            raise TraceRefused(name, "data-dependent control flow in its forward (torch.fx cannot trace a branch on "
                                     "a tensor's value)", "trace") from None
        raise TraceRefused(name, f"torch.fx cannot trace its forward ({_first_line(e)})", "trace") from None
    except TraceRefused:
        raise
    except Exception as e:  # noqa: BLE001  (whatever fx met in a library's forward is one line, not a traceback)
        raise TraceRefused(name, f"torch.fx cannot trace its forward ({type(e).__name__}: {_first_line(e)})",
                           "trace") from None
    finally:
        block.training = mode
        for key in set(block.__dict__) - before:  # ``_tensor_constant0``: a tensor made in forward
            del block.__dict__[key]


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:160]


def _add_operands(node: fx.Node) -> tuple | None:
    """The two operands of an out-of-place add node, or None when the node is no add. An add with a scale
    (``torch.add(x, f, alpha=2)``) or an ``out=`` is returned as ``("scaled", ...)``."""
    if node.op == "call_function" and node.target in ADD_FUNCTIONS or node.op == "call_method" and node.target == "add":
        args = list(node.args) + [node.kwargs[k] for k in ("input", "other") if k in node.kwargs]
        if len(args) != 2 or any(k in node.kwargs for k in ("alpha", "out")):
            return ("scaled", *args[:2])
        return tuple(args)
    return None


def _is_inplace(node: fx.Node) -> bool:
    if node.op == "call_function":
        return node.target in INPLACE_FUNCTIONS
    return node.op == "call_method" and node.target.endswith("_") and not node.target.startswith("__")


def _is_view(node: fx.Node, modules: dict) -> bool:
    """A shape-only view or an identity: the stream passes through it unscaled."""
    if node.op == "call_method":
        return node.target in VIEW_METHODS
    if node.op == "call_function":
        return node.target in VIEW_FUNCTIONS
    return node.op == "call_module" and type(modules.get(node.target)) is nn.Identity


def same_value_root(node: fx.Node, modules: dict) -> fx.Node:
    """The node whose value ``node`` is (through ``nn.Identity`` and ``.contiguous()``), for finding the module
    that receives x itself."""
    while isinstance(node, fx.Node) and node.args and isinstance(node.args[0], fx.Node) and (
            node.op == "call_module" and type(modules.get(node.target)) is nn.Identity
            or node.op == "call_method" and node.target in SAME_VALUE_METHODS):
        node = node.args[0]
    return node


def _source_line(node: fx.Node) -> str:
    """The line of the block's source that made ``node``, or "" (the trailing ``\\`` of a continued line cut)."""
    where = node.meta.get("resdecay_line")
    return linecache.getline(*where).strip().rstrip("\\").strip() if where else ""


def _where(node: fx.Node) -> str:
    line = _source_line(node)
    return f"`{line}`" if line else f"node {node.name}"


def _written_in_place(node: fx.Node) -> bool:
    """The source line of ``node`` is an augmented add (``x += f``): fx traces it as a plain add, but the block
    writes into a tensor in place there."""
    line = _source_line(node)
    try:
        return any(t.type == tokenize.OP and t.string == "+=" for t in tokenize.generate_tokens(io.StringIO(line).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return "+=" in line


def _in(value, group: set) -> bool:
    return isinstance(value, fx.Node) and value in group


def _descendants(node: fx.Node) -> set:
    seen, stack = set(), [node]
    while stack:
        for user in stack.pop().users:
            if user not in seen:
                seen.add(user)
                stack.append(user)
    return seen


def residual_adds(graph: fx.Graph, block: nn.Module) -> list[ResidualAdd]:
    """Every residual add of ``graph`` (the traced forward of ``block``), in order; ``TraceRefused`` for an add
    that touches the stream but cannot be classified, and for a graph with none."""
    cls, modules = type(block).__name__, dict(block.named_modules())
    nodes = list(graph.nodes)
    base = next(n for n in nodes if n.op == "placeholder")
    forms, earlier, found = {base}, set(), []
    meta, streamed, detour = shape_nodes(nodes), _descendants(base), None

    def refuse(node: fx.Node, why: str):
        raise TraceRefused(cls, f"{why} at {_where(node)}", "add")

    for node in nodes:
        if node.op in ("placeholder", "output", "get_attr"):
            continue
        inputs = list(node.all_input_nodes)
        if _is_inplace(node) and any(a in forms or a in earlier for a in inputs):
            refuse(node, f"an in-place {node.target if isinstance(node.target, str) else node.target.__name__} "
                         "on the stream")
        if _is_view(node, modules) and node.args and _in(node.args[0], forms):
            forms.add(node)
            continue
        if node.op in ("call_function", "call_method") and (node.target in SUB_FUNCTIONS or node.target == "sub") \
                and any(a in forms for a in inputs):
            refuse(node, "a subtraction on the stream")
        ops = _add_operands(node)
        if ops is None:
            continue
        if ops[0] == "scaled":
            if any(a in forms or a in earlier for a in inputs):
                refuse(node, "an add of the stream with a scale or out= argument")
            continue
        a, b = ops
        if _in(a, earlier) or _in(b, earlier):
            refuse(node, "an add of an earlier value of the stream")
        if _in(a, forms) or _in(b, forms):
            if _in(a, forms) and _in(b, forms):
                refuse(node, "an add of the stream to itself")
            stream, branch = (a, b) if _in(a, forms) else (b, a)
            if not isinstance(branch, fx.Node) or branch in meta:
                refuse(node, "an add of a constant to the stream")
            if branch not in streamed:
                refuse(node, "an add of a term not computed from the stream (a parallel branch or a bias)")
            if _written_in_place(node):
                refuse(node, "an in-place add (+=) on the stream")
            found.append(ResidualAdd(node.name, stream.name, branch.name))
            earlier |= forms
            base, forms, streamed = node, {node}, _descendants(node)
            continue
        _check_off_stream_add(node, a, b, forms, streamed, meta, refuse)
        if not found and detour is None:
            detour = next((o for o in (a, b) if isinstance(o, fx.Node) and o not in meta
                           and any(i in forms for i in o.all_input_nodes)), None)
    if not found and detour is not None:  # ``downsample(x) + f(x)``, ``res_scale(x) + f(x)``
        raise TraceRefused(cls, f"no add of the stream itself: its identity path goes through {_where(detour)} "
                                "(a projection or a scale)", "add")
    if not found:
        raise TraceRefused(cls, "no residual add (x + f(x)) in its forward", "none")
    return found


def shape_nodes(nodes: list) -> set:
    """Nodes computed from shapes only (``x.shape``, ``x.size(1)``, their arithmetic): never a tensor add."""
    meta: set = set()
    for n in nodes:
        inputs = n.all_input_nodes
        if (n.op == "call_function" and n.target is getattr and len(n.args) > 1 and n.args[1] in SHAPE_ATTRS
                or n.op == "call_method" and n.target in SHAPE_METHODS
                or inputs and n.op == "call_function" and all(i in meta for i in inputs)):
            meta.add(n)
    return meta


def _check_off_stream_add(node, a, b, forms: set, streamed: set, meta: set, refuse) -> None:
    """An add neither of whose operands is the stream is the branch's own, unless it hides an identity path:
    a scaled stream (``gate * x + f(x)``), or ``y + f(y)`` for a y computed from the stream (a post-norm block's
    ``norm(x + f(x))`` then ``+ g(...)``: an add whose x is not the stream)."""
    if not (isinstance(a, fx.Node) and isinstance(b, fx.Node)) or a in meta or b in meta:
        return
    for operand in (a, b):
            if isinstance(operand, fx.Node) and operand.op in ("call_function", "call_method") and (
                    operand.target in SCALE_FUNCTIONS or operand.target in ("mul", "div")) and any(
                    i in forms for i in operand.all_input_nodes):
                refuse(node, "an add of a scaled stream (gate * x): its identity path already carries a factor")
    for y, f in ((a, b), (b, a)):
        if y in streamed and f in _descendants(y):
            refuse(node, "an add y + f(y) whose y is computed from the stream but is not the stream (a norm or "
                         "another layer between the adds)")
