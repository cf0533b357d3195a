"""The diagnostics figure a reader can trust (issue 51 item 8): the direction the paper predicts in the panels that
have one, the knock-out kNN's 95% band from its query count, the caption (data, images, seed, step), the legend under
the grid rather than on a curve, block indices as integers and titles wrapped so that neighbours never overlap."""

from __future__ import annotations

import math

import pytest

from resdecay.viz import diagnostics_figures as df
from resdecay.viz import plots

REPORT = {
    "blocks": ["b0", "b1", "b2"], "alphas": [[1.0, 0.9], [0.8, 0.7], [0.6, 0.6]], "images": 300, "train_images": 500,
    "protocol": {"data": "digits", "subset_seed": 0},
    "paths": {"direct_projection": [0.5, 0.2, 0.1], "direct_projection_centred": [0.4, 0.1, 0.05]},
    "pixels": {"r2_pixels": [0.9, 0.8, 0.7, 0.6], "r2_high_freq": [0.5, 0.4, 0.3, 0.2]},
    "branches": {"ratio": [3, 2, 1, 1, 0.5, 0.5], "cosine": [0.1, 0.2, 0.3, 0.1, 0.2, 0.3]},
    "knockout": {"unit": "block", "change_pooled": [0.3, 0.2, 0.1], "knn_top1_intact": 0.8, "knn_top1": [0.5, 0.7, 0.8],
                 "knn_k": 20, "knn_queries": 256},
}


def test_panels_say_what_the_paper_predicts_and_band_the_knockout():
    panels = {t.split("\n")[0]: (t, band) for t, _, _, _, band in df._panels(REPORT)}
    for name in ("direct path's share of the stream", "pixel R² from the tokens (ridge)", "high-frequency pixel R²",
                 "||αx|| / ||f(x)|| per sub-block"):
        assert panels[name][0].endswith("(decay predicts: lower)")
    assert "predicts" not in panels["cos(αx, f(x)) per sub-block"][0]  # the paper makes no prediction there
    title, band = next(v for k, v in panels.items() if k.startswith("knock-out: kNN"))
    assert "95%, 256 queries" in title
    assert band[0] == pytest.approx(1.96 * math.sqrt((0.8 * 0.2 + 0.5 * 0.5) / 256))


def test_the_legend_sits_under_the_grid_and_the_caption_names_the_run(tmp_path, monkeypatch):
    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path: figures.append(fig) or path)
    note = df.eval_note({"diagnostics": REPORT, "step": 880})
    assert note.startswith("digits: 300 test images (500 train images") and "seed 0; step 880" in note
    df.plot_diagnostics({"plain": REPORT, "decayed with a long label": REPORT}, tmp_path / "d.png", note)
    (fig,) = figures
    axes = [ax for ax in fig.axes if ax.get_visible() and ax.axison]
    assert all(ax.get_legend() is None for ax in axes) and len(fig.legends) == 1  # off the curves
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["plain", "decayed with a long label"]
    assert any(t.get_text() == note for t in fig.texts)
    for ax in axes:
        assert all(len(line) <= 40 for line in ax.get_title().split("\n"))
    fig.canvas.draw()
    boxes = [ax.title.get_window_extent() for ax in axes]
    row = [b for b, ax in zip(boxes, axes, strict=True) if ax.get_position().y0 > 0.5]
    assert not any(a.overlaps(b) for i, a in enumerate(row) for b in row[i + 1:])  # neighbouring titles never overlap
