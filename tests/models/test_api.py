"""The notebook API of docs/python-api.md's example, run as written, and --version / --help examples."""

import re
from pathlib import Path

import pytest
import torch

import resdecay
from resdecay.cli import main

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "python-api.md"


def test_readme_notebook_example_runs(tmp_path, monkeypatch):
    """The fenced block after '## Notebook API' in docs/python-api.md, executed as it stands."""
    text = GUIDE.read_text()
    block = re.search(r"## Notebook API.*?```python\n(.*?)```", text, re.S).group(1)
    monkeypatch.chdir(tmp_path)
    scope: dict = {}
    exec(compile(block, "docs/python-api.md notebook example", "exec"), scope)
    feats = scope["feats"]
    assert sorted(feats) == [2, 3] and feats[3].shape == (360, 32)  # keyed by the resolved block index
    assert 0 <= scope["knn"] <= 1 and 0 <= scope["probe"]["top1"] <= 1 and scope["rank"] >= 0


def test_create_model_overrides_and_errors():
    m = resdecay.create_model("mae-tiny-digits", alpha_min=0.7, model__depth=4, model__decoder_depth=2)
    assert len(m.blocks) == 4 and m.cfg.alpha_min == 0.7
    with pytest.raises(resdecay.errors.UserError, match="not a setting"):
        resdecay.create_model("mae-tiny-digits", alpha_mn=0.7)
    with pytest.raises(resdecay.errors.UserError, match="out of range"):
        resdecay.extract_features(m, torch.randn(2, 1, 8, 8), layer=9)
    with pytest.raises(resdecay.errors.UserError, match="pooling 'max' is unknown"):
        resdecay.extract_features(m, torch.randn(2, 1, 8, 8), pooling="max")


def test_version_and_help_examples(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"resdecay {resdecay.__version__}"
    parser_help = {}
    for cmd in ("pretrain", "eval", "ablate", "demo", "alpha"):
        with pytest.raises(SystemExit):
            main([cmd, "--help"])
        parser_help[cmd] = capsys.readouterr().out
    for cmd, text in parser_help.items():
        assert "examples:" in text and f"resdecay {cmd}" in text.split("examples:")[1], cmd
