"""The diagnostics' picture: ``resdecay figures`` draws ``diagnostics.png`` for the checkpoints
overlaid and records each one's last-block numbers; the demo's mechanism table reads the same summary."""

from __future__ import annotations

import json
import math

import pytest

from helpers import run
from resdecay.commands.demo import mechanism_table
from resdecay.train.checkpoint import load_model
from resdecay.viz.diagnostics_figures import diagnose_and_plot, summary


@pytest.mark.slow
def test_figures_overlay_the_diagnostics_of_the_checkpoints(tiny_checkpoints, tmp_path, capsys):
    code, out, err = run(capsys, "figures", tiny_checkpoints["plain"], tiny_checkpoints["decayed"], "--per-class", "5",
                         "--out", tmp_path)
    assert code == 0, err
    assert "diagnostics.png" in out and (tmp_path / "diagnostics.png").stat().st_size > 20_000
    card = json.loads((tmp_path / "figures.json").read_text())["diagnostics"]
    assert len(card["last_block"]) == 2 and card["options"]["knockout_images"] == 256
    for numbers in card["last_block"].values():
        assert set(numbers) >= {"direct_share_last", "pixel_r2_last", "high_freq_r2_last"}
        assert 0 <= numbers["pixel_r2_embedding"] <= 1


@pytest.mark.slow
def test_the_summary_is_the_reports_last_block_and_the_decay_scales_the_direct_path(tiny_checkpoints, tmp_path):
    models = {}
    for name in ("plain", "decayed"):
        models[name], cfg = load_model(tiny_checkpoints[name])
    png, diagnosed = diagnose_and_plot(models, cfg.data, cfg.model.img_size, tmp_path / "d.png")
    assert png.is_file()
    for d in diagnosed.values():
        r = d["report"]
        assert d["summary"] == summary(r)
        assert d["summary"]["direct_share_last"] == r["paths"]["direct_projection"][-1]
        assert d["summary"]["high_freq_r2_embedding"] == r["pixels"]["r2_high_freq"][0]
        # the direct path's coefficient is the product of every add's alpha (1 for the plain MAE)
        alphas = [a for block in r["alphas"] for a in block]
        assert math.isclose(r["paths"]["alpha_product"][-1], math.prod(alphas), rel_tol=1e-9)
    assert diagnosed["plain"]["report"]["paths"]["alpha_product"][-1] == 1.0
    assert diagnosed["decayed"]["report"]["paths"]["alpha_product"][-1] < 1.0
    table = mechanism_table({name: {"diagnostics": d["summary"]} for name, d in diagnosed.items()})
    assert "direct path" in table and f"{diagnosed['plain']['summary']['pixel_r2_last']:.3f}" in table
