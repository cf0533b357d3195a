"""Floats written as 1e-3, 3e-4, 1E-4, .5 or 5. are numbers in overrides, presets and grids (issue 13, bug 1)."""

import pytest

from helpers import run
from resdecay import yaml_io
from resdecay.commands.ablate import load_grid
from resdecay.train.config import load_config

FORMS = {"1e-3": 1e-3, "3e-4": 3e-4, "1E-4": 1e-4, ".5": 0.5, "5.": 5.0, "-2.5E+3": -2500.0, "1.5e-3": 1.5e-3}


@pytest.mark.parametrize("text,value", FORMS.items())
def test_loader_reads_every_float_form(text, value):
    assert yaml_io.load(text) == pytest.approx(value) and isinstance(yaml_io.load(text), float)
    assert yaml_io.load(f"[{text}, 2]") == [pytest.approx(value), 2]


def test_ints_strings_and_bools_keep_their_types():
    assert yaml_io.load("12") == 12 and isinstance(yaml_io.load("12"), int)
    assert yaml_io.load("0x10") == 16 and yaml_io.load("true") is True
    assert yaml_io.load("1e") == "1e" and yaml_io.load("e3") == "e3" and yaml_io.load("mae") == "mae"


@pytest.mark.parametrize("text,value", FORMS.items())
def test_float_overrides(text, value):
    cfg = load_config("mae-tiny-digits", [f"train.min_lr={text.lstrip('-')}", "train.base_lr=1e-3"])
    assert cfg.train.base_lr == 1e-3 and cfg.train.min_lr == pytest.approx(abs(value))


def test_cli_accepts_exponent_lr(capsys):
    code, out, err = run(capsys, "pretrain", "--preset", "mae-tiny-digits", "--print-config", "train.base_lr=1e-3",
                         "lr=3e-4", "alpha_min=.5")
    assert code == 0, err
    assert "base_lr: 0.001" in out and "lr: 0.0003" in out and "alpha_min: 0.5" in out


def test_preset_and_grid_files(tmp_path):
    preset = tmp_path / "p.yaml"
    preset.write_text("base: mae-tiny-digits\ntrain:\n  base_lr: 3e-4\n  min_lr: 1E-6\nmodel:\n  alpha_min: .7\n")
    cfg = load_config(str(preset))
    assert (cfg.train.base_lr, cfg.train.min_lr, cfg.model.alpha_min) == (3e-4, 1e-6, 0.7)
    # a quoted string in a preset is coerced for float fields too
    preset.write_text("base: mae-tiny-digits\ntrain:\n  base_lr: '1e-3'\n")
    assert load_config(str(preset)).train.base_lr == 1e-3
    grid = tmp_path / "g.yaml"
    grid.write_text("name: g\npreset: mae-tiny-digits\nvariants:\n  - {name: a, overrides: [train.base_lr=1e-3]}\n"
                    "paper: {x: 1e-3}\n")
    g = load_grid(str(grid))
    assert g["paper"]["x"] == 1e-3
    assert load_config(g["preset"], g["variants"][0]["overrides"]).train.base_lr == 1e-3
