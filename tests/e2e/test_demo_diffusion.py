"""``resdecay demo --diffusion`` end to end at its smallest size (issue 23.1: it crashed with
``NameError: plot_sample_grids`` after both models had trained, sampled and been scored, and no test ran it)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

# the CLI runner, the one-line error check and the autouse fixture that keeps proxy FID caches in tmp
from helpers import assert_one_line_error, run

pytestmark = pytest.mark.usefixtures("diffusion_proxy_cache")


def test_diffusion_demo_runs_end_to_end(capsys, tmp_path, monkeypatch):
    """Issue 23.1: the whole demo (train both, sample, proxy FID, probe grid, side-by-side PNG, results.json)
    at its smallest size: digits, 1 epoch on 256 images, 129 samples (the fewest a 128-d proxy FID accepts), a
    probe grid on 256 + 256 images, one thread; the U-ViTs at the tests' tiny width (32 wide, 3 blocks, not 96
    and 7: the demo's steps and outputs are checked, not its numbers)."""
    from resdecay.commands import demo_diffusion

    extra, *sizes = demo_diffusion.DEMO_DATA["digits"]
    monkeypatch.setitem(demo_diffusion.DEMO_DATA, "digits",
                        ([*extra, "model.embed_dim=32", "model.num_heads=2", "model.depth=3"], *sizes))
    torch.set_num_threads(1)
    out_dir = tmp_path / "demo"
    code, out, err = run(capsys, "demo", "--diffusion", "--data", "digits", "--epochs", 1, "--samples", 129,
                         "--max-images", 256, "--out", out_dir, "--no-progress")
    assert code == 0, err
    report = json.loads((out_dir / "results.json").read_text())
    assert report["demo"]["data"] == "digits" and len(report["results"]) == 2
    for label, r in report["results"].items():
        assert r["steps"] >= 1 and math.isfinite(r["final_loss"])
        assert r["fid"]["protocol"]["n_samples"] == 129 and 0 < r["fid"]["value"] < 1e4
        assert r["probe_grid"]["protocol"]["train_images"] == r["probe_grid"]["protocol"]["test_images"] == 256
        assert r["probe_grid"]["levels"] == [0.0, 0.1, 0.25, 0.5] and 0 < r["probe_grid"]["best"]["top1"] <= 1
        assert label in out
    grid = out_dir / "samples_side_by_side.png"
    assert str(grid) in report["figures"] and grid.stat().st_size > 1000
    for fig in report["figures"]:  # the side-by-side samples and each model's probe heat map
        assert Path(fig).stat().st_size > 1000, fig
    assert "proxy FID" in out and "samples_side_by_side.png" in out


@pytest.mark.parametrize("argv,needles", [
    (["--diffusion", "--samples", "100"], ["--samples 100 is too few", "--samples 129"]),
    (["--diffusion", "--data", "digits", "--max-images", "50"], ["--max-images 50 is fewer than one training batch",
                                                                  "--max-images 128 or more"]),
    (["--samples", "200"], ["--samples is an option of the diffusion demo", "--diffusion"]),
    (["--max-images", "200"], ["--max-images is an option of the diffusion demo"]),
    (["--diffusion", "--data", "fashion-mnist-m"], ["not a diffusion demo dataset", "digits"]),
])
def test_diffusion_demo_bad_input_is_one_line_before_training(capsys, tmp_path, argv, needles):
    """Refused in one line before anything trains (no run folder is created)."""
    code, _, err = run(capsys, "demo", *argv, "--out", tmp_path / "demo", "--no-progress")
    assert_one_line_error(code, err, *needles)
    assert not (tmp_path / "demo").exists()
