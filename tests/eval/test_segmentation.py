"""The segmentation protocol's math against references: Hungarian matching vs brute force, mIoU vs
torchmetrics' MulticlassJaccardIndex, the exact solver vs a dense eigendecomposition, the learned
solver vs the exact subspace (principal angles). Smallest sizes: seconds."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from scipy.linalg import subspace_angles

from resdecay.errors import UserError
from resdecay.eval.segmentation import segment as S


def _maps(seed: int, n: int = 3, k: int = 4, classes: int = 4, side: int = 12):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, classes, (n, side, side), generator=g)
    labels[:, 0, :3] = S.IGNORE  # some ignored pixels
    # clusters correlated with the classes, so matching is not arbitrary
    clusters = torch.where(torch.rand(n, side, side, generator=g) < 0.6, (labels % classes + 1) % k,
                           torch.randint(0, k, (n, side, side), generator=g))
    return clusters, labels


def _brute_force(counts: np.ndarray) -> tuple[int, tuple]:
    k, c = counts.shape
    best = max(itertools.permutations(range(c), k) if k <= c else
               (p for p in itertools.permutations(range(k), c)), key=lambda p: _gain(counts, p, k <= c))
    return _gain(counts, best, k <= c), best


def _gain(counts, perm, clusters_first):
    return sum(counts[i, j] for i, j in enumerate(perm)) if clusters_first else sum(counts[j, i] for i, j in enumerate(perm))


@pytest.mark.parametrize("seed,k,classes", [(0, 4, 4), (1, 3, 5), (2, 5, 3), (3, 4, 4)])
def test_hungarian_matches_brute_force(seed, k, classes):
    clusters, labels = _maps(seed, k=k, classes=classes)
    counts = S.cluster_class_counts(clusters, labels, k, classes)
    assert counts.sum() == int((labels != S.IGNORE).sum())
    mapping = S.hungarian(counts)
    got = sum(counts[i, j] for i, j in enumerate(mapping) if j >= 0)
    best, _ = _brute_force(counts)
    assert got == best
    assert len({j for j in mapping if j >= 0}) == min(k, classes)  # one-to-one


def _brute_force_miou(pred: torch.Tensor, labels: torch.Tensor, classes: int) -> float:
    valid = labels != S.IGNORE
    ious = []
    for c in range(classes):
        p, y = (pred == c) & valid, (labels == c) & valid
        union = (p | y).sum().item()
        ious.append((p & y).sum().item() / union if union else 0.0)
    return float(np.mean(ious))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_miou_matches_torchmetrics_and_brute_force(seed):
    from torchmetrics.classification import MulticlassJaccardIndex

    classes = 4
    clusters, labels = _maps(seed, k=classes, classes=classes)
    m = S.matched_scores(clusters, labels, classes, classes)["hungarian"]
    pred = torch.tensor(m["mapping"])[clusters]
    tm = MulticlassJaccardIndex(num_classes=classes, average="none", ignore_index=S.IGNORE)(pred, labels)
    assert m["miou"] == pytest.approx(tm.mean().item(), abs=1e-6)  # every class present: no absent-class rule
    assert m["miou"] == pytest.approx(_brute_force_miou(pred, labels, classes), abs=1e-12)
    valid = labels != S.IGNORE
    assert m["pixel_acc"] == pytest.approx((pred[valid] == labels[valid]).float().mean().item(), abs=1e-6)


def test_absent_class_counts_as_zero_and_unmatched_clusters_are_misses():
    labels = torch.tensor([[[0, 0, 1, 1]]])
    clusters = torch.tensor([[[0, 1, 2, 2]]])  # 3 clusters, 3 classes, class 2 never occurs
    s = S.matched_scores(clusters, labels, 3, 3)["hungarian"]
    # cluster 2 -> class 1 (2 px), cluster 0 or 1 -> class 0 (1 px), the third cluster -> class 2
    assert s["pixel_acc"] == pytest.approx(3 / 4)
    assert s["miou"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert s["miou_present"] == pytest.approx(s["miou"])  # class 2 has a false positive: its union is not empty
    two = S.matched_scores(torch.tensor([[[0, 0, 1, 1]]]), labels, 2, 3)["hungarian"]  # 2 clusters, class 2 never used
    assert two["miou"] == pytest.approx(2 / 3) and two["miou_present"] == pytest.approx(1.0)
    unmatched = S.scores(torch.tensor([[[-1, 0, 1, 1]]]), labels, 2)  # -1: a cluster no class was left for
    assert unmatched["pixel_acc"] == pytest.approx(3 / 4) and unmatched["iou"][0] == pytest.approx(0.5)


def _tokens(n: int = 12, grid: int = 3, dim: int = 6, seed: int = 0):
    """Tokens of three well-separated kinds, two kinds per image (top rows / bottom row)."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(3, dim, generator=g) * 3
    kinds = torch.zeros(n, grid, grid, dtype=torch.long)
    for i in range(n):
        kinds[i, :2], kinds[i, 2:] = i % 3, (i + 1) % 3
    x = centres[kinds.reshape(n, -1)] + 0.4 * torch.randn(n, grid * grid, dim, generator=g)
    return x, kinds


def test_graph_is_symmetric_sparse_and_thresholded():
    x, _ = _tokens()
    p = S.SegProtocol(intra=3, inter=4)
    w = S.batch_graph(x, p)
    assert abs(w - w.T).max() < 1e-12
    assert w.data.min() > p.min_weight / 2  # a kept one-sided weight is halved by symmetrisation
    assert w.diagonal().max() == 0
    t = x.shape[1]
    assert w.nnz <= 2 * w.shape[0] * (p.intra + p.inter)  # at most every node's kNN edges, both ways
    assert S.neighbour_counts(t, 40, S.SegProtocol()) == (t - 1, 50)  # intra scaled down on a small grid
    assert S.neighbour_counts(t, 3, S.SegProtocol()) == (t - 1, 2 * t)  # and inter in a small batch
    rw = S.random_walk(w)
    assert np.allclose(np.asarray(rw.sum(1)).ravel(), 1.0)


def test_exact_solver_matches_dense_eigh():
    x, _ = _tokens(n=20)
    w = S.dataset_graph(x, S.SegProtocol(intra=4, inter=6, batch_images=8, graph_rounds=3))
    vals, u = S.exact_eigenvectors(w, 5, dense_below=0)  # force the sparse eigsh path
    p_dense = S.random_walk(w).toarray()
    ev, evec = np.linalg.eig(p_dense)  # P's eigenvectors directly (a non-symmetric dense reference)
    order = np.argsort(-ev.real)[:5]
    assert np.allclose(vals, ev.real[order], atol=1e-8)
    assert np.allclose(vals[0], 1.0)
    angles = subspace_angles(u, evec[:, order].real)
    assert np.degrees(angles).max() < 1e-3
    again = S.exact_eigenvectors(w, 5, dense_below=0)[1]
    assert np.array_equal(u, again)  # fixed start vector and signs: deterministic


@pytest.mark.slow
def test_learned_solver_reaches_exact_subspace_and_is_deterministic():
    torch.set_num_threads(1)  # tiny matrices: thread hand-offs cost more than the arithmetic
    x, _ = _tokens(n=12, grid=3)
    p = S.SegProtocol(solver="learned", dims=3, intra=4, inter=8, batch_images=40, epochs=300)
    z = S.learned_embedding(x, (3, 3), p)
    assert torch.allclose(z.sum(1), torch.ones(len(z)), atol=1e-5)  # soft assignment per token
    _, u = S.exact_eigenvectors(S.dataset_graph(x, p), 3)
    angles = np.degrees(subspace_angles(torch.nn.functional.normalize(z.double(), dim=0).numpy(), u))
    assert angles.max() < 10, angles
    again = S.learned_embedding(x, (3, 3), p)
    assert torch.equal(z, again)
    other = S.learned_embedding(x, (3, 3), S.SegProtocol(**{**p.__dict__, "seed": 1}))
    assert not torch.equal(z, other)


@pytest.mark.parametrize("solver", [pytest.param(s, marks=pytest.mark.slow) if s == "learned" else s for s in S.SOLVERS])
def test_segment_recovers_planted_regions(solver):
    torch.set_num_threads(1)
    x, kinds = _tokens(n=12, grid=3)
    labels = kinds.repeat_interleave(2, 1).repeat_interleave(2, 2)  # 6x6 label maps, tokens of 2x2 pixels
    p = S.SegProtocol(solver=solver, dims=3, intra=4, inter=8, epochs=300)
    out = S.segment(x, (3, 3), labels, 3, p)
    assert out["values"]["miou"] > 0.95 and out["values"]["pixel_acc"] > 0.95
    assert out["clusters"].shape == labels.shape
    noise = S.segment(torch.randn_like(x), (3, 3), labels, 3, p)  # features that know nothing of the regions
    assert noise["values"]["miou"] < 0.6


def test_segment_reports_per_class_iou_by_name_and_averages_over_the_given_classes():
    x, kinds = _tokens(n=12, grid=3)
    labels = kinds.repeat_interleave(2, 1).repeat_interleave(2, 2)
    out = S.segment(x, (3, 3), labels, 3, S.SegProtocol(solver="kmeans"), names=("sky", "road", "car"))
    iou = out["values"]["iou"]
    assert list(iou) == ["sky", "road", "car"] and np.isclose(out["values"]["miou"], np.mean(list(iou.values())))
    unnamed = S.segment(x, (3, 3), labels, 4, S.SegProtocol(solver="kmeans"))  # a 4th class no pixel holds
    assert list(unnamed["values"]["iou"]) == ["0", "1", "2", "3"] and unnamed["values"]["iou"]["3"] == 0.0


def test_protocol_refuses_bad_settings():
    with pytest.raises(UserError, match="--seg-solver 'eigen' is unknown"):
        S.SegProtocol(solver="eigen").validate()
    with pytest.raises(UserError, match="--seg-k"):
        S.SegProtocol(k=1).validate()
    card = S.SegProtocol(solver="kmeans").card()
    assert "intra" not in card and card["n_init"] == 10


# ----------------------------------------------------------------------------- the metric in `resdecay eval`
def test_eval_reports_segmentation_with_protocol_card_and_baselines(tiny_fmnistm_checkpoint, tmp_path, capsys):
    import json

    from resdecay.cli import main

    out = tmp_path / "ev"
    rc = main(["eval", str(tiny_fmnistm_checkpoint), "--evals", "segmentation", "--seg-images", "12", "--seg-solver",
               "kmeans", "--no-progress", "--out", str(out)])
    assert rc in (0, None)
    printed = capsys.readouterr().out
    assert "segmentation" in printed and "kmeans solver, K=11 over 11 classes, 8x8 tokens" in printed
    report = json.loads(next(out.rglob("eval.json")).read_text())
    (row,) = report["results"]
    assert row["metric"] == "segmentation" and row["layer"] == 3 and row["feature"] == "tokens"
    card = row["protocol"]
    assert card["segmentation"]["solver"] == "kmeans" and card["segmentation"]["n_init"] == 10
    assert card["k"] == 11 and card["classes"] == 11 and card["token_grid"] == [8, 8] and card["tokens"] == 12 * 64
    assert card["test"]["images"] == 12 and card["test"]["resize"].startswith("none")
    assert 0 <= row["values"]["miou"] <= 1 and 0 <= row["values"]["pixel_acc"] <= 1
    assert {r["source"] for r in report["baselines"]} == {"pixels", "random-init"}
    pixels = next(r for r in report["baselines"] if r["source"] == "pixels")
    assert pixels["protocol"]["tokens"] == 12 * 64  # the same protocol on 4x4x3 pixel patches


@pytest.mark.parametrize("args,message", [
    (["--seg-solver", "eigen"], "--seg-solver 'eigen' is unknown; choose one of exact, learned, kmeans"),
    (["--seg-k", "5000", "--seg-images", "4"], "--seg-k 5000 is more clusters than the 256 tokens of 4 images"),
    (["--seg-k", "3"], "--seg-k 3 is fewer clusters than fashion-mnist-m's 11 classes"),
    (["--seg-data", "voc"], "--seg-data voc reads a folder: pass --seg-path DIR"),
    (["--layer", "all"], "segmentation measures one block"),
    (["--seg-ignore-index", "0"], "--seg-ignore-index 0 applies to label maps you supply (--seg-data folder or voc)"),
    (["--seg-data", "folder:/no/such/folder"],  # was "--seg-path ... is not a folder; pass the folder folder"
     "--seg-data folder:/no/such/folder is not a folder (missing); pass the folder holding your images/ and labels/"),
    (["--seg-data", "voc", "--seg-path", "/no/such/folder"], "--seg-path /no/such/folder is not a folder (missing); "
                                                             "pass the voc folder"),
    (["--seg-data", "folder:"], "--seg-data folder:: name the folder after the colon"),
])
def test_eval_refuses_bad_segmentation_settings_before_extracting(tiny_fmnistm_checkpoint, tmp_path, capsys, monkeypatch,
                                                                  args, message):
    from resdecay.cli import main
    from resdecay.eval.segmentation import source as segmentation_eval

    def no_extraction(*a, **k):
        raise AssertionError("tokens were extracted before the settings were checked")

    monkeypatch.setattr(segmentation_eval, "patch_tokens", no_extraction)
    rc = main(["eval", str(tiny_fmnistm_checkpoint), "--evals", "segmentation", "--no-progress", "--out", str(tmp_path / "e"),
               *args])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and message in err[0]
    assert not (tmp_path / "e").exists()


# ----------------------------------------------------------------------------- figures
def test_spectral_rgb_is_normalised_globally_and_skips_the_constant_eigenvector():
    from resdecay.viz.segmentation_figures import spectral_rgb

    x, _ = _tokens(n=12, grid=3)
    _, u = S.exact_eigenvectors(S.dataset_graph(x, S.SegProtocol(intra=4, inter=8)), 5)
    rgb = spectral_rgb(u, "exact", 12, (3, 3))
    assert rgb.shape == (12, 3, 3, 3)
    flat = rgb.reshape(-1, 3)
    assert np.allclose(flat.min(0), 0) and np.allclose(flat.max(0), 1)  # over all images at once
    per_image = rgb.reshape(12, -1, 3)
    assert (per_image.max(1) < 1 - 1e-9).any()  # ... so some image does not reach 1: no per-image stretch
    assert np.allclose(flat, (u[:, 1:4] - u[:, 1:4].min(0)) / np.ptp(u[:, 1:4], 0))  # eigenvectors 1..3


def test_figures_segmentation_draws_both_pngs(tiny_fmnistm_checkpoint, tmp_path, capsys):
    import json

    from resdecay.cli import main

    out = tmp_path / "fig"
    rc = main(["figures", str(tiny_fmnistm_checkpoint), "--segmentation", "--seg-solver", "kmeans", "--seg-images", "12",
               "--images", "4", "--out", str(out)])
    assert rc in (0, None)
    assert "segmentation mIoU" in capsys.readouterr().out
    for name in ("spectral_rgb.png", "segmentation.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    card = json.loads((out / "figures.json").read_text())["segmentation"]
    assert card["protocol"]["solver"] == "kmeans" and card["drawn"] == 4 and card["layer"] == 3
    assert card["data"]["images"] == 12 and len(card["values"]) == 1


def test_eval_on_your_own_folder_reports_per_class_iou_and_the_plugins(tiny_fmnistm_checkpoint, tmp_path, capsys,
                                                                      monkeypatch):
    """Issue 38 item 10: ``--seg-data folder:DIR`` (PNG and JPEG images, classes.txt, ignored pixels): mIoU is the
    mean over the user's 3 classes, eval.json and the printed table hold the per-class IoU by name, and eval.json
    records the --plugin that was loaded."""
    import json

    from helpers.seg_folders import write_seg_folder
    from resdecay.cli import main, plugins

    monkeypatch.setattr(plugins, "LOADED", [])  # this process's record of loaded plugins, fresh for the test
    write_seg_folder(tmp_path / "my-seg")
    plugin = tmp_path / "noop_plugin.py"
    plugin.write_text("NOTHING = 'registered'\n")
    out = tmp_path / "ev"
    rc = main(["--plugin", str(plugin), "eval", str(tiny_fmnistm_checkpoint), "--evals", "segmentation", "--seg-data",
               f"folder:{tmp_path / 'my-seg'}", "--seg-solver", "kmeans", "--no-progress", "--out", str(out)])
    assert rc in (0, None)
    printed = capsys.readouterr().out
    report = json.loads(next(out.rglob("eval.json")).read_text())
    assert report["plugins"] == [str(plugin.resolve())] and f"plugins loaded: {plugin.resolve()}" in printed
    (row,) = report["results"]
    iou = row["values"]["iou"]
    assert list(iou) == ["ground", "square", "disc"] and row["protocol"]["classes"] == 3 and row["protocol"]["k"] == 3
    assert np.isclose(row["values"]["miou"], np.mean(list(iou.values())))  # over the user's 3 classes, not 21 or 27
    assert row["protocol"]["test"]["class_names"] == ["ground", "square", "disc"] and row["protocol"]["test"]["images"] == 12
    assert "  iou: ground " in printed and ", square " in printed and ", disc " in printed
    assert {r["source"] for r in report["baselines"]} == {"pixels", "random-init"}
    assert all(list(r["values"]["iou"]) == ["ground", "square", "disc"] for r in report["baselines"])


def test_figures_show_a_class_balanced_draw_of_the_images(tiny_fmnistm_checkpoint, tmp_path, capsys):
    """Item 10: the figures show images drawn class-balanced from the evaluated ones, not the first of a listing
    (here the first 9 of 12 by name show one class, the last 3 another)."""
    import json

    from helpers.seg_folders import write_seg_folder
    from resdecay.cli import main

    write_seg_folder(tmp_path / "my-seg")
    rc = main(["figures", str(tiny_fmnistm_checkpoint), "--segmentation", "--seg-data", f"folder:{tmp_path / 'my-seg'}",
               "--seg-solver", "kmeans", "--seg-images", "12", "--images", "4", "--out", str(tmp_path / "fig")])
    assert rc in (0, None)
    card = json.loads((tmp_path / "fig" / "figures.json").read_text())["segmentation"]
    assert card["drawn"] == 4 and sum(i >= 9 for i in card["shown"]) >= 2
    assert list(next(iter(card["values"].values()))["iou"]) == ["ground", "square", "disc"]
