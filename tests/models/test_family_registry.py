"""Family registration: a family from a user's own file (docs/examples/extending/mixer.py) trains, resumes
and reloads through the unchanged trainer and CLI; the package finds its own families without an
import line per file; the trainer reads the model contract, not attribute names."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
import sys
from pathlib import Path

import pytest
import torch

import resdecay.models as models
from helpers import run
from resdecay.models import FAMILIES, build_model, is_diffusion, tiny_config
from resdecay.train import checkpoint as ckpt
from resdecay.train.stability import named_blocks

MIXER = Path(__file__).parent.parent.parent / "docs" / "examples" / "extending" / "mixer.py"  # docs/EXTENDING.md (b)
SRC = Path(models.__file__).parent.parent


@pytest.fixture
def registry_restored():
    """Families a test registers (and the plugin modules that registered them) are gone after it."""
    before, modules = dict(FAMILIES), set(sys.modules)
    yield
    FAMILIES.clear()
    FAMILIES.update(before)
    for name in set(sys.modules) - modules:
        if name.startswith("resdecay_plugin_"):
            del sys.modules[name]


def test_a_family_from_a_users_file_trains_resumes_and_reloads_through_the_cli(capsys, tmp_path, registry_restored):
    preset = tmp_path / "mixer.yaml"
    preset.write_text("model: {family: mixer, img_size: 8, in_chans: 1, embed_dim: 16, depth: 3, alpha_min: 0.6}\n"
                      "data: {name: digits}\n"
                      "train: {epochs: 1, warmup_epochs: 0, batch_size: 64, log_every: 5, ckpt_every: 10, threads: 1}\n")
    args = ["--plugin", str(MIXER), "pretrain", "--preset", str(preset), "--no-progress", f"train.out_dir={tmp_path / 'run'}"]
    code, out, err = run(capsys, *args)
    assert code == 0, err
    assert "mixer depth 3 | alpha_min 0.6" in out  # the header reads the config through the contract
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["steps"] == 22 and summary["skips"] is None and 0 < summary["alpha_eff"] < 1
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert all(len(r["block_rms"]) == 3 for r in rows)  # the stability monitor found its blocks
    model, cfg = ckpt.load_model(summary["checkpoint"])
    assert type(model).__name__ == "MaskedMixer" and cfg.model.alpha_min == 0.6
    code, out, err = run(capsys, *args, "train.epochs=2", "--resume", "auto")  # and it resumes
    assert code == 0 and "resumed from" in out and "done: 44 steps" in out, err


def test_every_module_under_models_is_imported_in_name_order():
    """A new family file needs no import line: the package imports every module it holds."""
    package = Path(models.__file__).parent
    files = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
    assert all(f"resdecay.models.{name}" in sys.modules for name in files)
    assert {"mae", "classifier", "resnet", "uvit", "sit"} <= set(FAMILIES)


def test_registry_answers_the_old_questions():
    assert is_diffusion("sit") and is_diffusion("uvit") and not is_diffusion("mae") and not is_diffusion("nope")
    assert models.TINY["mae"]["depth"] == 4 and set(models.TINY) == set(FAMILIES)
    assert tiny_config("mae") is not tiny_config("mae")  # a fresh config each time


def test_named_blocks_come_from_the_contract_members():
    names = [n for n, _ in named_blocks(build_model(tiny_config("uvit")))]
    assert names == [f"block {i}" for i in range(5)]  # no decoder: plain block names


def test_train_reads_no_model_attribute_by_name():
    """The trainer reads the model contract: no ``getattr(x, "name", ...)`` / ``hasattr(x, "name")``
    with a literal attribute name anywhere in train/ (generic loops over dataclass fields remain)."""
    found = []
    for path in sorted((SRC / "train").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "hasattr")
                    and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)):
                found.append(f"{path.name}:{node.lineno}")
    assert not found, found


def test_model_differences_count_a_field_added_since_the_checkpoint_as_its_default():
    """A checkpoint written before a family gained a setting (its default is what the old code built)
    resumes; a real difference is still refused."""
    now = dict(tiny_config("sit").__dict__)
    old = {k: v for k, v in now.items() if k != "class_dropout"}  # as if class_dropout came later
    assert ckpt.model_differences(old, now) == []
    assert ckpt.model_differences(old, {**now, "class_dropout": 0.2}) == ["model.class_dropout: checkpoint 0.1 vs run 0.2"]
    assert re.match(r"model\.alpha_min: checkpoint 0\.5 vs run 0\.8", ckpt.model_differences({**old, "alpha_min": 0.5}, now)[0])


def test_a_model_missing_a_contract_member_is_refused_when_built(registry_restored):
    from resdecay.errors import ConfigError
    from resdecay.models import MAEConfig, register_family

    class Incomplete(torch.nn.Module):  # blocks only: no decoder_blocks, num_blocks, alphas, ...
        def __init__(self, cfg):
            super().__init__()
            self.cfg, self.blocks = cfg, torch.nn.ModuleList()

    @dataclasses.dataclass
    class IncompleteConfig(MAEConfig):
        family: str = "incomplete"

    register_family("incomplete", config=IncompleteConfig, objective=lambda m, x, y: m(x), build=Incomplete)
    with pytest.raises(ConfigError, match=r"'incomplete': Incomplete lacks decoder_blocks, num_blocks, alphas, "
                                          r"forward_intermediates, forward_features, flops_per_sample; add them"):
        build_model(IncompleteConfig())
