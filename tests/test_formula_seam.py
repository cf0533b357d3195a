"""A shortcut formula written as a newcomer writes it (issue 30): it runs even though the trainer builds
models on the meta device, a formula that fails is one line naming it and its file, and every run
says which formula it used."""

from __future__ import annotations

import sys
import textwrap

import pytest

from resdecay.nn import residual
from resdecay.nn.residual import factors_of
from resdecay.train import checkpoint as ckpt

from conftest import TINY
from test_cli import assert_one_line_error, run

FAST = ["train.epochs=1", "train.warmup_epochs=0", "train.threads=1", "--no-progress"]

# torch.arange without device=: under torch.device("meta") this used to make a tensor with no values
RAMP = '''
import torch
from resdecay.nn.residual import register_shortcut


@register_shortcut("ramp")
def ramp(depth, alpha_min, schedule, adds_per_block):
    k = torch.arange(depth * adds_per_block).reshape(depth, adds_per_block)  # int64, default device
    return 1.0 - (1.0 - alpha_min) * k / (depth * adds_per_block - 1), torch.ones(depth, 1)
'''


@pytest.fixture
def formulas_restored():
    """What a plugin registers (its formula, its module) is gone after the test."""
    formulas, modules = dict(residual.SHORTCUT_FORMULAS), set(sys.modules)
    yield
    residual.SHORTCUT_FORMULAS.clear()
    residual.SHORTCUT_FORMULAS.update(formulas)
    for name in set(sys.modules) - modules:
        if name.startswith("resdecay_plugin_"):
            del sys.modules[name]


def plugin(tmp_path, name: str, source: str):
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def test_a_formula_without_device_trains_through_pretrain(capsys, tmp_path, formulas_restored):
    path = plugin(tmp_path, "ramp.py", RAMP)
    out_dir = tmp_path / "run"
    code, out, err = run(capsys, "--plugin", str(path), "pretrain", "--preset", "mae-tiny-digits",
                         "model.shortcut=ramp", "model.alpha_min=0.5", *TINY, *FAST, f"train.out_dir={out_dir}")
    assert code == 0, err
    model, cfg = ckpt.load_model(ckpt.list_checkpoints(out_dir / "checkpoints")[-1])
    assert cfg.model.shortcut == "ramp"
    adds = [a for block in model.blocks for a in factors_of(block).alphas]
    n = len(adds)
    assert adds == pytest.approx([1.0 - 0.5 * k / (n - 1) for k in range(n)])
    assert all(isinstance(a, float) for a in adds)  # plain floats, not int / meta tensors


def test_a_formula_that_raises_is_one_line_naming_it_and_its_file(capsys, tmp_path, formulas_restored):
    path = plugin(tmp_path, "wrong.py", '''
        from resdecay.nn.residual import register_shortcut


        @register_shortcut("wrong")
        def wrong(depth, alpha_min, schedule, adds_per_block):
            return {"alphas": 1.0}["betas"], 1.0
    ''')
    code, _, err = run(capsys, "--plugin", str(path), "pretrain", "--preset", "mae-tiny-digits", "model.shortcut=wrong",
                       *TINY, *FAST, f"train.out_dir={tmp_path / 'run'}")
    assert_one_line_error(code, err, "shortcut formula 'wrong'", str(path), "KeyError", "fix the formula")
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_a_formula_of_the_wrong_shape_is_one_line(capsys, tmp_path, formulas_restored):
    path = plugin(tmp_path, "long.py", '''
        from resdecay.nn.residual import register_shortcut


        @register_shortcut("too_long")
        def too_long(depth, alpha_min, schedule, adds_per_block):
            return [1.0] * (depth + 1), 1.0
    ''')
    code, _, err = run(capsys, "--plugin", str(path), "pretrain", "--preset", "mae-tiny-digits",
                       "model.shortcut=too_long", *TINY, *FAST, f"train.out_dir={tmp_path / 'run'}")
    assert_one_line_error(code, err, "'too_long'", str(path), "shape (5,)", "expected (4, 2)")
