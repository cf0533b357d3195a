"""Paper figures: t-SNE, PCA patch maps, rank/accuracy curves and their correlation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from helpers import DIGITS_IMAGE, tiny_config
from resdecay.data import DataConfig, build_dataset
from resdecay.models.mae import MaskedAutoencoder
from resdecay.viz.figures import (
    balanced_indices,
    online_rows,
    pca_rgb_maps,
    plot_correlation,
    plot_pca_maps,
    plot_rank_and_accuracy,
    plot_tsne,
    rank_accuracy_correlation,
)


def _png(path) -> None:
    assert path.exists() and path.stat().st_size > 5000
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    return {
        "decayed alpha_min 0.6": MaskedAutoencoder(tiny_config("mae", **DIGITS_IMAGE)),
        "plain MAE": MaskedAutoencoder(tiny_config("mae", **DIGITS_IMAGE, alpha_min=1.0, skips=False, zero_init=False, encoder_norm=True)),
    }


@pytest.fixture(scope="module")
def digits():
    return build_dataset(DataConfig("digits"), "test", 8, augment=False)


def test_balanced_indices_are_first_per_class_and_checked():
    labels = [2, 0, 1, 0, 2, 1, 0, 3, 1, 2]
    assert balanced_indices(labels, classes=3, per_class=2) == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="fewer than per_class"):
        balanced_indices(labels, classes=4, per_class=2)  # class 3 has one image
    with pytest.raises(ValueError, match="fewer than the 5"):
        balanced_indices(labels, classes=5, per_class=1)


def test_tsne_embeds_a_balanced_subset_per_model(models, digits, tmp_path):
    ds, _ = digits
    path = tmp_path / "tsne.png"
    card = plot_tsne(models, ds, path, classes=10, per_class=20, seed=0)
    _png(path)
    assert card["figure"] == "t-SNE" and card["images"] == 200 and card["per_class"] == 20
    assert card["class_counts"] == {c: 20 for c in range(10)}
    assert card["points"] == {label: 200 for label in models}
    assert card["layer_index"] == {label: 3 for label in models}
    assert card["pool"] == "mean" and card["seed"] == 0 and 0 < card["perplexity"] < 200


def test_pca_rgb_maps_shape_range_and_variance():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randn(3, 16, 8, generator=g) @ torch.randn(8, 8, generator=g)
    maps, ev = pca_rgb_maps(tokens, grid=4)
    assert maps.shape == (3, 4, 4, 3)
    assert maps.min() >= 0.0 and maps.max() <= 1.0 and maps.max() > maps.min()
    assert ev.shape == (3,) and np.all(ev >= 0) and ev.sum() <= 1.0 + 1e-9
    assert np.all(np.diff(ev) <= 1e-12)  # leading components first
    # Tokens that vary along one direction only: the first component explains everything.
    line = torch.linspace(-1, 1, 32).view(2, 16, 1) * torch.randn(1, 1, 8, generator=g)
    _, ev = pca_rgb_maps(line, grid=4)
    assert ev[0] == pytest.approx(1.0, abs=1e-6)
    with pytest.raises(ValueError, match="4x4 grid"):
        pca_rgb_maps(torch.randn(1, 17, 8), grid=4)  # cls token left in


def test_pca_maps_figure_and_card(models, digits, tmp_path):
    ds, info = digits
    images = torch.stack([ds[i][0] for i in range(6)])
    path = tmp_path / "pca.png"
    card = plot_pca_maps(models, images, info.mean, info.std, path, layer=-1, seed=0)
    _png(path)
    assert card["images"] == 6 and card["tokens_per_model"] == 6 * 16 and card["layer_index"] == {m: 3 for m in models}
    assert set(card["explained_variance_ratio"]) == set(models)
    for ev in card["explained_variance_ratio"].values():
        assert len(ev) == 3 and all(v >= 0 for v in ev) and sum(ev) <= 1.0 + 1e-9


def test_online_rows_filter_sort_dedupe():
    rows = [
        {"step": 10, "loss": 1.0, "lr": 1e-4},
        {"step": 40, "epoch": 2.0, "online_knn_top1": 0.5},
        {"step": 20, "epoch": 1.0, "online_knn_top1": 0.3},
        {"step": 40, "epoch": 2.0, "online_knn_top1": 0.6},  # re-logged after a resume: wins
        {"step": 30, "loss": 0.9},
        {"epoch": 3.0, "online_knn_top1": 0.9},  # no step: dropped
    ]
    out = online_rows(rows)
    assert [r["step"] for r in out] == [20, 40]
    assert out[1]["online_knn_top1"] == 0.6


def _run(ranks, accs, probe=True):
    key = "online_probe_top1" if probe else "online_knn_top1"
    rows = [{"step": 0, "loss": 2.0}]
    for i, (r, a) in enumerate(zip(ranks, accs, strict=True)):
        rows.append({"step": 100 * (i + 1), "loss": 1.0 / (i + 1), "lr": 1e-4})
        rows.append({"step": 100 * (i + 1), "epoch": float(5 * (i + 1)), key: a, "online_rank_cls": r,
                     "online_rank_mean": r + 0.1})
    return rows


def test_rank_accuracy_correlation_signs_and_errors():
    up = rank_accuracy_correlation(_run([1.0, 1.5, 2.0, 2.5], [0.2, 0.4, 0.6, 0.8]))
    assert up["pearson_r"] == pytest.approx(1.0) and up["n"] == 4
    assert up["p_value"] is not None and up["p_value"] < 0.01
    down = rank_accuracy_correlation(_run([1.0, 1.5, 2.0, 2.5], [0.8, 0.6, 0.4, 0.2]))
    assert down["pearson_r"] == pytest.approx(-1.0)
    knn = rank_accuracy_correlation(_run([1.0, 2.0, 3.0], [0.1, 0.3, 0.5], probe=False), "online_knn_top1")
    assert knn["pearson_r"] == pytest.approx(1.0) and knn["n"] == 3
    with pytest.raises(ValueError, match="at least 3"):
        rank_accuracy_correlation(_run([1.0, 2.0], [0.1, 0.2]))
    with pytest.raises(ValueError, match="constant"):
        rank_accuracy_correlation(_run([1.0, 2.0, 3.0], [0.5, 0.5, 0.5]))


def test_rank_accuracy_and_correlation_figures(tmp_path):
    epochs = np.arange(1, 9)
    runs = {
        "alpha_min 0.6": _run(1.0 + 0.3 * np.log(epochs), 0.3 + 0.06 * np.log(epochs) * 2),
        "alpha_min 1.0 (plain)": _run(1.8 - 0.05 * epochs, 0.5 + 0.03 * np.sqrt(epochs), probe=False),
        "empty": [{"step": 1, "loss": 1.0}],
    }
    card = plot_rank_and_accuracy(runs, tmp_path / "fig4.png")
    _png(tmp_path / "fig4.png")
    assert card["accuracy_key_per_run"] == {"alpha_min 0.6": "online_probe_top1",
                                            "alpha_min 1.0 (plain)": "online_knn_top1", "empty": "online_probe_top1"}
    assert card["points"]["alpha_min 0.6"] == 16 and card["points"]["empty"] == 0

    stats = plot_correlation(runs, tmp_path / "fig5c.png")
    _png(tmp_path / "fig5c.png")
    assert stats["alpha_min 0.6"]["pearson_r"] == pytest.approx(1.0) and stats["alpha_min 0.6"]["n"] == 8
    assert stats["alpha_min 1.0 (plain)"]["pearson_r"] < -0.9
    assert stats["alpha_min 1.0 (plain)"]["accuracy_key"] == "online_knn_top1"
    assert stats["empty"]["pearson_r"] is None and stats["empty"]["n"] == 0

    with pytest.raises(ValueError, match="online evaluation"):
        plot_rank_and_accuracy({"empty": runs["empty"]}, tmp_path / "none.png")
