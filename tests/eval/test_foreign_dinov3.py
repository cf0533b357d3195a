"""A decayified transformers DINOv3 ViT saved with save_pretrained is measured by ``resdecay eval --model FOLDER`` as
any encoder: labelled with its decay, probed, and its residual stream diagnosed (its RoPE is the model's own: the
runner calls the whole model, not the encoder stack ``base_model`` names)."""

from __future__ import annotations

import json

import pytest
import torch

import resdecay
from helpers import run

transformers = pytest.importorskip("transformers")


def test_a_decayified_dinov3_folder_is_measured_and_diagnosed(tmp_path, capsys):
    torch.manual_seed(0)
    model = transformers.DINOv3ViTModel(transformers.DINOv3ViTConfig(
        image_size=8, patch_size=2, num_channels=1, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, num_register_tokens=0))
    resdecay.decayify(model, alpha_min=0.6)
    model.save_pretrained(tmp_path / "dinov3")
    code, out, err = run(capsys, "eval", "--model", tmp_path / "dinov3", "--data", "digits", "--evals",
                         "knn,linear_sweep,diagnostics", "--max-train", 200, "--max-test", 60, "--no-progress",
                         "--no-baselines", "--metric-option", "linear_sweep.epochs=2", "--out", tmp_path / "out")
    assert code == 0, err
    report = json.loads(next((tmp_path / "out").rglob("eval.json")).read_text())
    assert "alpha_min 0.6" in report["label"]
    assert {r["metric"] for r in report["results"]} >= {"knn", "linear_sweep"}
    assert len(report["diagnostics"]["blocks"]) == 2 and (tmp_path / "out").rglob("diagnostics.png")
