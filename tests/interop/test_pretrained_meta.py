"""A save_pretrained folder's config.json is checked against the metadata model.safetensors carries
(issue 30.4): a config.json from another save beside the weights is refused in one line, naming the
setting, instead of rebuilding the model config.json describes around weights trained for another."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from helpers import assert_one_line_error, run
from resdecay.errors import CheckpointError
from resdecay.interop import from_pretrained, save_pretrained
from resdecay.models import build_model, tiny_config


@pytest.fixture(autouse=True)
def _offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


def _saved(tmp_path, name: str, alpha_min: float):
    cfg = tiny_config("mae")
    cfg.alpha_min = alpha_min
    torch.manual_seed(0)
    return save_pretrained(build_model(cfg), tmp_path / name)


def test_a_config_json_from_another_save_is_refused_naming_the_setting(tmp_path, capsys):
    folder, other = _saved(tmp_path, "a", 0.6), _saved(tmp_path, "b", 0.9)
    model = from_pretrained(folder)  # as saved: loads
    config = model.resdecay_config
    assert config["model"]["alpha_min"] == 0.6 and float(model.alphas[-1, -1]) == pytest.approx(0.6)
    shutil.copy(other / "config.json", folder / "config.json")  # self-consistent, but not these weights' config
    with pytest.raises(CheckpointError) as info:
        from_pretrained(folder)
    text = str(info.value)
    assert "\n" not in text and "config.json says model.alpha_min = 0.9" in text
    assert "metadata of model.safetensors says 0.6" in text and "save_pretrained" in text
    # the command line that reads a folder says the same in one line (exit 2)
    code, _, err = run(capsys, "export", str(folder), "--to", "timm", "--out", str(tmp_path / "x.safetensors"))
    assert_one_line_error(code, err, "model.alpha_min = 0.9", "model.safetensors says 0.6")


def test_an_edited_alpha_section_alone_is_refused_too(tmp_path):
    folder = _saved(tmp_path, "a", 0.6)
    config = json.loads((folder / "config.json").read_text())
    config["alpha"]["schedule"] = "cosine"  # a setting config.json states but the rebuild does not read
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=r"config.json says alpha.schedule = \"cosine\" but .* says \"linear\""):
        from_pretrained(folder)


def test_weights_without_resdecay_metadata_are_checked_by_their_factors_only(tmp_path):
    from safetensors.torch import load_file, save_file

    folder = _saved(tmp_path, "a", 0.6)
    weights = folder / "model.safetensors"
    save_file(load_file(str(weights)), str(weights))  # the same tensors, no metadata (e.g. re-saved by another tool)
    model = from_pretrained(folder)
    config = model.resdecay_config
    assert config["model"]["alpha_min"] == 0.6 and float(model.alphas[-1, -1]) == pytest.approx(0.6)
