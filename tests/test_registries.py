"""The package's registries (shortcut formulas, model families, metrics, block adapters, --model formats, import
formats) follow one
convention (docs/EXTENDING.md, "One convention for every registry"): a taken name is refused in one
line unless ``replace=True``, which swaps the entry in place; each has an ``unregister_*``; every refusal is
a ``RegistryError`` (a ``UserError``: the CLI prints one line, exit 2). Adapters are tried by priority."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.nn as nn

from helpers import assert_one_line_error, run
from resdecay import alphas_of, decayify
from resdecay.errors import ConfigError, RegistryError, UserError, one_line
from resdecay.eval.metrics import Metric, get_metric, register_metric, registered, unregister_metric
from resdecay.interop import IMPORT_FORMATS, ImportFormat, register_import_format, unregister_import_format
from resdecay.interop.foreign_model import MODEL_FORMATS, ModelFormat, register_model_format, unregister_model_format
from resdecay.models import FAMILIES, ModelConfig
from resdecay.models.registry import register_family, unregister_family
from resdecay.nn.adapters import (
    BlockAdapter,
    adapter_for,
    adapters,
    register_adapter,
    subblock_adapter,
    unregister_adapter,
)
from resdecay.nn.blocks import Block
from resdecay.nn.residual import SHORTCUT_FORMULAS, register_shortcut, shortcut_names, unregister_shortcut
from resdecay.nn.updates import RESIDUAL_UPDATES, register_update, unregister_update


# ----------------------------------------------------------------------------- one case per registry
class MyBlock(nn.Module):  # x + drop(attn(norm(x))), then x + drop(mlp(norm2(x))): docs/plug-and-play.md's block
    def __init__(self, d: int = 8):
        super().__init__()
        self.norm, self.attn, self.norm2, self.mlp = nn.LayerNorm(d), nn.Linear(d, d), nn.LayerNorm(d), nn.Linear(d, d)
        self.drop = nn.Dropout(0.0)

    def forward(self, x):
        x = x + self.drop(self.attn(self.norm(x)))
        return x + self.drop(self.mlp(self.norm2(x)))


def my_adapter(name: str, priority: int = 0, classes: tuple = (MyBlock,)) -> BlockAdapter:
    return subblock_adapter(name, classes=classes, pairs=lambda b: [(b.norm, b.drop), (b.norm2, b.drop)],
                            zero=lambda b: (b.attn, b.mlp), priority=priority)


def _formula(name: str, replace: bool = False):
    def formula(depth, alpha_min, schedule, adds_per_block):
        return 1.0, 1.0
    register_shortcut(name, replace=replace)(formula)
    return formula


def _update(name: str, replace: bool = False):
    def update(x, f):
        return f
    register_update(name, replace=replace)(update)
    return update


def _config_of(name: str) -> type:
    """A valid config for a family registered under ``name`` (its ``family`` default is the name)."""
    return dataclass(frozen=True)(type("Config", (ModelConfig,), {"__annotations__": {"family": "str"}, "family": name}))


def _family(name: str, replace: bool = False):
    def build(cfg):
        return nn.Identity()
    register_family(name, config=_config_of(name), objective=lambda m, x, y: x.sum(), build=build, replace=replace)
    return build


def _metric(name: str, replace: bool = False):
    return register_metric(Metric(name=name, compute=lambda inputs, s: [], protocol=lambda s: {}, headline="v"),
                           replace=replace)


def _adapter(name: str, replace: bool = False):
    return register_adapter(my_adapter(name), replace=replace)


def _model_format(name: str, replace: bool = False):
    return register_model_format(ModelFormat(name, lambda spec, weights, args: (nn.Identity(), nn.Identity),
                                             f"{name}:NAME"), replace=replace)


def _import_format(name: str, replace: bool = False):
    return register_import_format(ImportFormat(name, "scratch source", lambda source: False, lambda source: None),
                                  replace=replace)


@dataclass(frozen=True)
class Case:
    builtin: str  # a name the package registers
    scratch: str  # a name this test registers
    make: Callable[..., Any]  # make(name, replace=False): registers a fresh entry, returns what identifies it
    again: Callable[[str, Any], None]  # again(name, made): registers the very same definition again
    current: Callable[[str], Any]  # what identifies the entry registered under a name (None: none)
    names: Callable[[], list[str]]  # registered names, in the registry's order
    unregister: Callable[[str], Any]


CASES = {
    "formula": Case("decay", "scratch_formula", _formula, lambda n, fn: register_shortcut(n)(fn),
                    lambda n: SHORTCUT_FORMULAS[n].factors if n in SHORTCUT_FORMULAS else None,
                    lambda: list(shortcut_names()), unregister_shortcut),
    "update": Case("orthogonal", "scratch_update", _update, lambda n, fn: register_update(n)(fn), RESIDUAL_UPDATES.get,
                   lambda: list(RESIDUAL_UPDATES), unregister_update),
    "family": Case("mae", "scratch_family", _family,
                   lambda n, build: register_family(n, config=_config_of(n), objective=lambda m, x, y: x.sum(), build=build),
                   lambda n: FAMILIES[n].build if n in FAMILIES else None, lambda: list(FAMILIES), unregister_family),
    "metric": Case("knn", "scratch_metric", _metric, lambda n, m: register_metric(m), get_metric,
                   lambda: [m.name for m in registered()], unregister_metric),
    "adapter": Case("timm VisionTransformer Block", "scratch adapter", _adapter, lambda n, a: register_adapter(a),
                    lambda n: next((a for a in adapters() if a.name == n), None), lambda: [a.name for a in adapters()],
                    unregister_adapter),
    "model_format": Case("timm", "scratch_format", _model_format, lambda n, f: register_model_format(f),
                         MODEL_FORMATS.get, lambda: list(MODEL_FORMATS), unregister_model_format),
    "import_format": Case("mae", "scratch_import", _import_format, lambda n, f: register_import_format(f),
                          IMPORT_FORMATS.get, lambda: list(IMPORT_FORMATS), unregister_import_format),
}


@pytest.fixture(params=sorted(CASES))
def case(request):
    c = CASES[request.param]
    yield c
    if c.current(c.scratch) is not None:  # a failed test leaves no entry behind for the others
        c.unregister(c.scratch)


# ----------------------------------------------------------------------------- the convention
def test_a_taken_name_is_refused_in_one_line(case):
    held = case.current(case.builtin)
    assert held is not None
    with pytest.raises(RegistryError) as e:
        case.make(case.builtin)
    message = str(e.value)
    assert type(e.value) is RegistryError and one_line(e.value) == message and "\n" not in message
    assert f"{case.builtin!r} is already registered" in message and "register yours under another name" in message
    assert "pass replace=True to register_" in message
    assert case.current(case.builtin) is held  # the built-in is still there, untouched


def test_replace_true_swaps_the_entry_in_its_place(case):
    first = case.make(case.scratch)
    place = case.names().index(case.scratch)
    case.again(case.scratch, first)  # the very same definition again is no clash
    assert case.current(case.scratch) is first
    with pytest.raises(RegistryError, match="already registered"):
        case.make(case.scratch)
    assert case.current(case.scratch) is first
    second = case.make(case.scratch, replace=True)
    assert second is not first and case.current(case.scratch) is second
    assert case.names().index(case.scratch) == place  # replaced where it stood, not moved to the end


def test_unregister_removes_an_entry_and_refuses_an_unknown_name(case):
    made = case.make(case.scratch)
    before = case.names()
    case.unregister(case.scratch)
    assert case.current(case.scratch) is None and case.names() == [n for n in before if n != case.scratch]
    with pytest.raises(RegistryError) as e:
        case.unregister(case.scratch)
    assert f"{case.scratch!r} is not registered" in str(e.value) and "\n" not in str(e.value)
    case.again(case.scratch, made)  # and the name is free again
    assert case.current(case.scratch) is made


def test_every_registry_raises_the_one_error_type():
    types = set()
    for c in CASES.values():
        with pytest.raises(UserError) as e:
            c.make(c.builtin)
        types.add(type(e.value))
    assert types == {RegistryError}
    # one line and exit 2 on the command line (a UserError); a ConfigError and a ValueError, as the formula and
    # family registries raised before
    assert issubclass(RegistryError, UserError) and issubclass(RegistryError, ConfigError)
    assert issubclass(RegistryError, ValueError)


# the same clash, registered by a plugin the command line loads: one line, exit 2
PLUGINS = {
    "formula": '''
        from resdecay.nn.residual import register_shortcut

        @register_shortcut("decay")
        def mine(depth, alpha_min, schedule, adds_per_block):
            return 1.0, 1.0
    ''',
    "family": '''
        from resdecay.models import MAEConfig, register_family
        register_family("mae", config=MAEConfig, objective=lambda m, x, y: x.sum(), build=lambda cfg: None)
    ''',
    "metric": '''
        from resdecay.eval.metrics import Metric, register_metric
        register_metric(Metric(name="knn", compute=lambda i, s: [], protocol=lambda s: {}, headline="top1"))
    ''',
    "adapter": '''
        from resdecay.nn.adapters import register_adapter, subblock_adapter
        register_adapter(subblock_adapter("timm VisionTransformer Block", classes=("mylib:Block",),
                                          pairs=lambda b: [], zero=lambda b: ()))
    ''',
    "model_format": '''
        from resdecay.interop.foreign_model import ModelFormat, register_model_format
        register_model_format(ModelFormat("timm", lambda spec, weights, args: None, "timm:NAME"))
    ''',
    "import_format": '''
        from resdecay.interop import ImportFormat, register_import_format
        register_import_format(ImportFormat("mae", "my MAE", lambda source: False, None))
    ''',
}


@pytest.mark.parametrize("registry", sorted(PLUGINS))
def test_a_plugin_that_takes_a_name_is_one_line_on_the_command_line(registry, capsys, tmp_path):
    path = tmp_path / f"clash_{registry}.py"
    path.write_text(textwrap.dedent(PLUGINS[registry]))
    modules = set(sys.modules)
    try:
        code, _, err = run(capsys, "--plugin", path, "presets")
    finally:
        for name in set(sys.modules) - modules:
            if name.startswith("resdecay_plugin_"):
                del sys.modules[name]
    assert_one_line_error(code, err, str(path), "is already registered", "replace=True")


# ----------------------------------------------------------------------------- adapter match order
@pytest.fixture
def scratch_adapters():
    """Adapters a test registers are gone afterwards."""
    before = {a.name for a in adapters()}
    yield
    for a in adapters():
        if a.name not in before:
            unregister_adapter(a.name)


def _refusing(name: str, priority: int) -> BlockAdapter:
    """An adapter for MyBlock that fails if decayify ever uses it."""
    def install(block, alphas, betas):
        raise AssertionError(f"{name} was used")
    return BlockAdapter(name, (MyBlock,), 2, install, lambda b: ((1.0, 1.0), (1.0, 1.0)), lambda b: None,
                        priority=priority)


def test_priority_decides_which_of_two_adapters_takes_a_block(scratch_adapters):
    block = MyBlock()
    low = register_adapter(_refusing("low", priority=0))
    assert adapter_for(block) is low
    high = register_adapter(my_adapter("high", priority=1))  # registered later, tried first
    tie = register_adapter(_refusing("tie", priority=1))  # the same priority, registered later: tried after "high"
    assert adapter_for(block) is high
    order = [a.name for a in adapters()]
    assert order.index("high") < order.index("tie") < order.index("low")
    model = decayify(nn.Sequential(MyBlock(), MyBlock()).eval(), alpha_min=0.5)  # "high" installs the factors
    assert [a for _, a in alphas_of(model)] == [pytest.approx((1.0, 5 / 6)), pytest.approx((2 / 3, 0.5))]
    unregister_adapter("high")
    assert adapter_for(block) is tie  # now the first of priority 1
    unregister_adapter("tie")
    assert adapter_for(block) is low


def test_the_order_is_by_priority_not_by_imports(scratch_adapters):
    tried = adapters()
    assert tried[0].name == "resdecay.nn.blocks.Block" and tried[0].priority == 10
    assert all(a.priority == 0 for a in tried[1:])
    assert [a.priority for a in tried] == sorted((a.priority for a in tried), reverse=True)
    # a user's subclass of resdecay's Block: the built-in takes it, unless the user's adapter outranks it
    sub = type("MyResBlock", (Block,), {})(8, 2)
    assert adapter_for(sub).name == "resdecay.nn.blocks.Block"
    register_adapter(BlockAdapter("my Block subclass", (type(sub),), 2, lambda b, a, c: None,
                                  lambda b: ((1.0, 1.0), (1.0, 1.0)), lambda b: None))
    assert adapter_for(sub).name == "resdecay.nn.blocks.Block"  # priority 0: tried after the built-in
    register_adapter(BlockAdapter("my Block subclass", (type(sub),), 2, lambda b, a, c: None,
                                  lambda b: ((1.0, 1.0), (1.0, 1.0)), lambda b: None, priority=11), replace=True)
    assert adapter_for(sub).name == "my Block subclass"
    assert adapter_for(Block(8, 2)).name == "resdecay.nn.blocks.Block"  # the built-in still takes its own class
    assert torch.is_tensor(sub(torch.randn(1, 3, 8)))
