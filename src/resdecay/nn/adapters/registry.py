"""The block-adapter registry: how ``decayify`` recognises a library's residual block and reaches its adds.

An adapter is a name, the block classes it takes, its number of residual adds, and three functions
(install the factors, read them back, zero-initialise the branches). Most blocks need only a
declaration of *roles*: for each sub-block, the module that first receives its input x (the
pre-norm) and the module whose output the block adds to x::

    from resdecay.nn.adapters import register_adapter, subblock_adapter

    register_adapter(subblock_adapter(
        "my library's Block", classes=("mylib.models:Block",),
        pairs=lambda b: [(b.norm1, b.drop1), (b.norm2, b.drop2)],
        zero=lambda b: (b.attn.proj, b.mlp.fc2)))

Classes are matched by name and module path (``"timm.models.vision_transformer:Block"``: that module or a package
below it; ``"timm.:Block"``, ending in a dot: anywhere in timm), or given as types: the library is never imported to
look for its blocks. Name the module: a bare name under a whole library takes every class of that name in it
(timm has fourteen classes named ``Block``).

The order adapters are tried in is explicit: an adapter's ``priority`` (higher first; resdecay's own
``Block`` has 10, the libraries' adapters and a user's the default 0), ties in registration order; the
first that matches a module takes it. To take a block some registered adapter also matches (a subclass
of a library's block), give yours a higher priority. A name that is taken is refused unless
``replace=True`` (``RegistryError``, as every registry of the package); ``unregister_adapter`` removes one.
"""

from __future__ import annotations

import difflib
import weakref
from dataclasses import dataclass, field
from typing import Callable

import torch.nn as nn

from ...errors import Registry
from ..residual import ShortcutScale
from . import hooks

Pairs = Callable[[nn.Module], list[tuple[nn.Module, nn.Module]]]
_ROLES_CHECKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # block -> its stated roles hold
_ROLES_CHECK: list = []  # the checker of stated roles against a block's graph (``roles_check.roles_hold``), once registered


def check_roles_with(checker: Callable[[nn.Module, list], bool | None]) -> None:
    """Register ``checker(block, pairs)`` -> True / False / None (cannot tell): what ``matches`` asks before an adapter
    whose roles are stated takes a block (roles_check.py registers its graph check; the registry does not import it)."""
    _ROLES_CHECK[:] = [checker]
    _ROLES_CHECKED.clear()
Factors = tuple[tuple[float, ...], tuple[float, ...]]


@dataclass(frozen=True)
class Role:
    """Where one residual add ``alpha * identity + beta * f`` can be read without changing the block (what the
    residual-stream diagnostics hook; paper eq. 3, identity = x_l).

    Args:
        pre: the module whose first input is the add's x (a pre-norm, or the block itself for a one-add block);
            None: the add is read where it is computed, at ``residual_add`` (resdecay's blocks, replaced forwards).
        branch_end: the module whose output is the branch f as the block adds it (before beta).
        identity: the module whose output is the identity path where that is not x itself (a projection
            shortcut: the stream changes width or resolution there, a new stage begins), else None.
    """

    pre: nn.Module | None = None
    branch_end: nn.Module | None = None
    identity: nn.Module | None = None


AT_RESIDUAL_ADD = Role()  # an add read at ``residual_add``


@dataclass(frozen=True)
class BlockAdapter:
    """How ``decayify`` reaches one kind of residual block.

    Args:
        name: shown in messages and in the coverage table ("timm ViT Block").
        classes: the block classes, as ``"module.prefix:ClassName"`` strings or as types.
        adds: residual adds per block (2 for attention + MLP blocks, 1 for ResNet / ConvNeXt blocks).
        install: ``install(block, alphas, betas)`` puts one factor per add into the block.
        factors: ``factors(block)`` reads back ``(alphas, betas)`` as the forward uses them.
        zero_init: ``zero_init(block)`` zeroes the last layer of every branch (the paper's init).
        accepts: a structural check beyond the class (an optional attribute the mechanism needs).
        priority: the match order: adapters with a higher priority are tried first (ties: registration order).
        mixed_adds: its blocks may share one schedule with blocks of another number of adds (a U-Net's one-add
            ResNet blocks between two-add transformer blocks): the schedule then runs over the adds in depth
            order. False (the default) keeps one add count per model: the others stay at alpha 1, named in a warning.
        options: keywords of ``decayify`` this adapter takes, ``{name: (choice, ...)}`` with the default first
            (an SD3 block's ``context_stream``); ``install`` receives them as keyword arguments.
        roles: ``roles(block)`` -> ``(pre, branch end)`` per add, the modules that receive x and whose output the
            block adds to x, when the adapter states them (``subblock_adapter``, the traced adapter's hooked blocks);
            checked against the block's traced graph before an explicit adapter takes a block (``adapter_for``).
        reads: ``reads(block)`` -> one ``Role`` per add, where the diagnostics read it; default: from ``roles``.
        forward: the replaced forward of a ``forward_adapter`` (it calls ``residual_add``): the diagnostics install
            it at the block's own factors while they read a block that ``decayify`` left at alpha 1.
        updates: ``updates(block)`` -> the residual update (``nn.updates``) each add applies, when the mechanism can
            carry one (then ``install`` takes ``update=NAME``); None: it adds the branch as it is, and ``decayify``
            refuses a formula with an update for these blocks.
    """

    name: str
    classes: tuple
    adds: int
    install: Callable[[nn.Module, tuple, tuple], None]
    factors: Callable[[nn.Module], Factors]
    zero_init: Callable[[nn.Module], None]
    accepts: Callable[[nn.Module], bool] = field(default=lambda block: True)
    priority: int = 0
    mixed_adds: bool = False
    options: dict = field(default_factory=dict)
    roles: Pairs | None = None
    reads: Callable[[nn.Module], list[Role]] | None = None
    forward: Callable | None = None
    updates: Callable[[nn.Module], tuple] | None = None

    def stream_roles(self, block: nn.Module) -> list[Role] | None:
        """Where each add of ``block`` is read (``Role``), or None when the adapter does not say."""
        if self.reads is not None:
            return self.reads(block)
        if self.roles is not None:
            return [Role(pre, post) for pre, post in self.roles(block)]
        return None

    def matches(self, module: nn.Module) -> bool:
        return class_matches(module, self.classes) and self.accepts(module) and self._roles_hold(module)

    def _roles_hold(self, module: nn.Module) -> bool:
        """The stated roles are the block's (``roles_check.roles_hold``, once per block object): a block whose adds are
        elsewhere (SAM's window partition between the branch end and the add) is left to the traced adapter."""
        if self.roles is None:
            return True
        if not _ROLES_CHECK:  # no checker registered (roles_check.py registers one when the package loads)
            return True
        if module not in _ROLES_CHECKED:
            _ROLES_CHECKED[module] = _ROLES_CHECK[0](module, self.roles(module)) is not False
        return _ROLES_CHECKED[module]

    def class_names(self) -> list[str]:
        return [c.__name__ if isinstance(c, type) else c.rpartition(":")[2] for c in self.classes]


def class_matches(module: nn.Module, classes: tuple) -> bool:
    """``module`` is an instance of one of ``classes`` (types, or ``"module.prefix:ClassName"`` strings matched by
    name and module prefix, so that the library is never imported to look)."""
    cls = type(module)
    for c in classes:
        if isinstance(c, type):
            if isinstance(module, c):
                return True
            continue
        prefix, _, name = c.rpartition(":")
        module = cls.__module__
        # a module path ("timm.models.vision_transformer") is that module or a package below it, never a sibling
        # sharing its start (timm.models.vision_transformer_sam's own Block); "timm." is any module of the package
        if cls.__name__ == name and (module.startswith(prefix) if prefix.endswith(".") else
                                     module == prefix or module.startswith(prefix + ".")):
            return True
    return False


def subblock_adapter(name: str, classes: tuple, pairs: Pairs, zero: Callable[[nn.Module], tuple], adds: int = 2,
                     accepts: Callable[[nn.Module], bool] = lambda block: True, priority: int = 0,
                     mixed_adds: bool = False) -> BlockAdapter:
    """An adapter for blocks that add ``x + out`` themselves (``hooks.correct_subblocks``).

    Args:
        pairs: ``pairs(block)`` -> one ``(pre, post)`` per add: ``pre`` receives the sub-block input x
            as its first argument, ``post`` outputs what the block adds to x. ``post`` may be shared.
        zero: ``zero(block)`` -> the last layer of each branch (zeroed by ``zero_init``).
        adds: the number of pairs (2 for attention + MLP).
        priority, mixed_adds: see ``BlockAdapter``.
    """
    return BlockAdapter(
        name, tuple(classes), adds,
        install=lambda block, a, b, update=None: hooks.correct_subblocks(block, pairs(block), a, b, update=update),
        factors=lambda block: hooks.subblock_factors(pairs(block)),
        zero_init=lambda block: hooks.zero_(*zero(block)), accepts=accepts, priority=priority, mixed_adds=mixed_adds,
        roles=pairs, updates=lambda block: hooks.subblock_updates(pairs(block)))


def shortcut_adapter(name: str, classes: tuple, shortcut: str, branch_end: Callable[[nn.Module], nn.Module],
                     zero: Callable[[nn.Module], tuple], accepts: Callable[[nn.Module], bool] = lambda block: True,
                     priority: int = 0, mixed_adds: bool = False) -> BlockAdapter:
    """An adapter for one-add blocks whose identity path is the attribute ``shortcut`` (a module or None).

    Args:
        branch_end: ``branch_end(block)`` -> the module whose output is the branch the block adds (beta).
        zero: ``zero(block)`` -> the layers to zero for the paper's init (a last norm's scale, a last conv).
        priority, mixed_adds: see ``BlockAdapter``.
    """
    def install(block, a, b):
        hooks.scale_shortcut(block, shortcut, a[0])
        hooks.scale_branch_end(block, branch_end(block), b[0])

    def factors(block):
        return (hooks.shortcut_factor(block, shortcut),), (float(branch_end(block).__dict__.get("resdecay_beta", 1.0)),)

    def reads(block):
        path = getattr(block, shortcut)
        plain = path is None or isinstance(path, (ShortcutScale, nn.Identity))  # the identity path is x itself
        return [Role(block, branch_end(block), None if plain else path)]

    return BlockAdapter(name, tuple(classes), 1, install, factors, lambda block: hooks.zero_(*zero(block)), accepts,
                        priority, mixed_adds, reads=reads)


def forward_adapter(name: str, classes: tuple, forward: Callable, adds: int, zero: Callable[[nn.Module], tuple],
                    accepts: Callable[[nn.Module], bool] = lambda block: True, priority: int = 0,
                    mixed_adds: bool = False, options: dict | None = None,
                    reads: Callable[[nn.Module], list[Role]] | None = None) -> BlockAdapter:
    """An adapter that replaces the block's forward (``hooks.replace_forward``); ``forward(block, ...)``
    reads ``block.resdecay_factors`` (set before the first call; absent means alpha = beta = 1) and, when
    the adapter declares ``options``, ``block.resdecay_options`` (the chosen values); each of its adds is a
    ``residual_add`` (where the diagnostics read it) unless ``reads`` says where else;
    ``priority``, ``mixed_adds``, ``options``: see ``BlockAdapter``."""
    def factors(block):
        return block.__dict__.get("resdecay_factors", ((1.0,) * adds, (1.0,) * adds))

    def install(block, a, b, **chosen):
        if any(v != 1.0 for v in (*a, *b)):
            hooks.replace_forward(block, forward, a, b)
            block.__dict__["resdecay_options"] = dict(chosen)

    return BlockAdapter(name, tuple(classes), adds, install, factors, lambda block: hooks.zero_(*zero(block)), accepts,
                        priority, mixed_adds, dict(options or {}), reads=reads or (lambda block: [AT_RESIDUAL_ADD] * adds),
                        forward=forward)


_ADAPTERS: dict[str, BlockAdapter] = {}  # by name, in registration order
_REGISTRY = Registry("block adapter", "register_adapter", _ADAPTERS,
                     origin=lambda a: f"for {', '.join(a.class_names())}")
_ORDER: list[BlockAdapter] = []  # _ADAPTERS in the order they are tried


def _reorder() -> None:
    _ORDER[:] = sorted(_ADAPTERS.values(), key=lambda a: -a.priority)  # a stable sort: ties keep registration order


def register_adapter(adapter: BlockAdapter, replace: bool = False) -> BlockAdapter:
    """Add ``adapter`` to the registry. A name that is taken is refused (``RegistryError``, one line)
    unless ``replace=True``, which puts ``adapter`` in the place of the one of that name. Adapters are
    tried by ``priority`` (higher first), ties in registration order; the first that matches a module takes it."""
    _REGISTRY.add(adapter.name, adapter, replace)
    _reorder()
    return adapter


def unregister_adapter(name: str) -> BlockAdapter:
    """Remove the adapter registered under ``name`` (``RegistryError`` if there is none); returns it."""
    adapter = _REGISTRY.remove(name)
    _reorder()
    return adapter


def adapters() -> list[BlockAdapter]:
    """Every registered adapter, in the order they are tried."""
    return list(_ORDER)


TRACED = "_resdecay_adapter"  # on a block the traced adapter took (``traced.py``): that block's own adapter
TRACED_SEEN: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # what read-only queries traced: off the model


def traced_adapter_of(module: nn.Module) -> BlockAdapter | None:
    """The traced adapter this block was given (``traced.keep_traced``): by ``decayify`` (kept on the block, so that
    a copy carries it), or by a read-only query such as ``alphas_of`` (kept beside the model, which such a query
    never changes)."""
    return module.__dict__.get(TRACED) or TRACED_SEEN.get(module)


def adapter_for(module: nn.Module) -> BlockAdapter | None:
    """The adapter that takes ``module``: the first registered one that matches, else the traced adapter it was given
    (``traced_adapter_of``), else None."""
    return next((a for a in _ORDER if a.matches(module)), None) or traced_adapter_of(module)


def library_of_class(c) -> str:
    """The top-level package a class (or a ``"module.prefix:Class"`` string) comes from: "timm", "transformers"."""
    module = c.__module__ if isinstance(c, type) else c.rpartition(":")[0]
    return module.partition(".")[0]


def nearest_supported(class_name: str, library: str | None = None, short: bool = False) -> str:
    """The supported block class whose name is closest to ``class_name`` (for an error message), among the
    adapters of ``library`` ("timm", "transformers", ...) when it has any, else among all: "Class (adapter name)",
    or "library Class" when ``short``."""
    every = [(n, library_of_class(c), a.name) for a in _ORDER for c, n in zip(a.classes, a.class_names(), strict=True)]
    names = {n: (lib, name) for n, lib, name in every if lib == library} or {n: (lib, name) for n, lib, name in every}
    close = difflib.get_close_matches(class_name, list(names), n=1, cutoff=0.0)
    if not close:
        return "none"
    lib, adapter = names[close[0]]
    return f"{lib} {close[0]}" if short else f"{close[0]} ({adapter})"
