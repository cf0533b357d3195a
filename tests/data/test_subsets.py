"""Issue 30.1: every "N images" setting draws a seeded, class-balanced subset, not an ImageFolder's
first N (which are one or two classes, since the folder lists its files class by class)."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from helpers import assert_one_line_error, run
from resdecay.commands.ablate import plan_grid
from resdecay.data import DataConfig, build_dataset
from resdecay.data.subsets import balanced_indices, dataset_labels
from resdecay.eval.features import baselines as baselines
from resdecay.eval.features.baselines import default_baseline_cache, pixel_rows
from resdecay.eval.features.cache import FeatureCache
from resdecay.eval.features.source import cached_features
from resdecay.eval.metrics import FEATURES, registered
from resdecay.eval.online import OnlineEval
from resdecay.eval.protocol import FAST_RECIPE, MetricSettings
from resdecay.eval.sources import Evaluation
from resdecay.eval.suite import EvalSettings
from resdecay.models import build_model
from resdecay.train.config import load_config

CLASSES, PER_CLASS, SIDE = 4, 10, 8
COLOURS = [(230, 20, 20), (20, 230, 20), (20, 20, 230), (230, 230, 20)]


@pytest.fixture
def sorted_folder(tmp_path):
    """A class-sorted ImageFolder: 4 classes (one colour each, a little noise) x 10 train / 5 val PNGs."""
    rng = np.random.default_rng(0)
    for split, n in (("train", PER_CLASS), ("val", 5)):
        for c, colour in enumerate(COLOURS):
            folder = tmp_path / "folder" / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(n):
                px = np.clip(np.array(colour) + rng.integers(-20, 21, (SIDE, SIDE, 3)), 0, 255).astype(np.uint8)
                Image.fromarray(px).save(folder / f"{i:03d}.png")
    return tmp_path / "folder"


def counts(labels) -> list[int]:
    return np.bincount(np.asarray(labels), minlength=CLASSES).tolist()


def test_balanced_indices_are_even_seeded_nested_and_fill_from_larger_classes():
    labels = np.repeat(np.arange(4), [30, 30, 30, 3])  # sorted, class 3 small
    a = balanced_indices(labels, 12)
    assert np.array_equal(a, balanced_indices(torch.as_tensor(labels), 12))  # the same every time
    assert counts(labels[a]) == [3, 3, 3, 3] and np.all(np.diff(a) > 0)
    assert not np.array_equal(a, balanced_indices(labels, 12, seed=1))
    assert set(a) <= set(balanced_indices(labels, 40))  # a larger subset holds the smaller one
    assert counts(labels[balanced_indices(labels, 30)]) == [9, 9, 9, 3]  # class 3's missing share goes to the others
    assert np.array_equal(balanced_indices(labels, 500), np.arange(len(labels)))


def test_train_subset_trains_on_every_class_of_a_sorted_folder(sorted_folder):
    ds, _ = build_dataset(DataConfig(name="imagefolder", path=str(sorted_folder), train_subset=8), "train", SIDE)
    assert len(ds) == 8 and counts(dataset_labels(ds)) == [2, 2, 2, 2]  # the first 8 were all class 0
    again, _ = build_dataset(DataConfig(name="imagefolder", path=str(sorted_folder), train_subset=8), "train", SIDE)
    assert again.indices == ds.indices
    other, _ = build_dataset(DataConfig(name="imagefolder", path=str(sorted_folder), train_subset=8, subset_seed=3),
                             "train", SIDE)
    assert other.indices != ds.indices and counts(dataset_labels(other)) == [2, 2, 2, 2]


def test_train_subset_of_fashion_mnist_m_composites_the_chosen_images(fake_fmnist):
    cfg = DataConfig(name="fashion-mnist-m", path=str(fake_fmnist), canvas=32)
    whole, _ = build_dataset(cfg, "train", 32)
    part, _ = build_dataset(DataConfig(**{**cfg.__dict__, "train_subset": 20}), "train", 32)
    chosen = balanced_indices(whole.labels, 20)
    assert counts(part.labels) == [2] * 10 and torch.equal(part.labels, whole.labels[chosen])
    assert torch.equal(part.images, whole.images[chosen])  # image i is the same as in the whole split


def test_online_eval_bank_and_queries_cover_every_class(sorted_folder, capsys):
    cfg = load_config("mae-tiny-digits", ["data.name=imagefolder", f"data.path={sorted_folder}", "model.in_chans=3",
                                          "model.depth=2", "model.embed_dim=32", "model.num_heads=2",
                                          "model.decoder_embed_dim=32", "model.decoder_depth=1", "model.decoder_num_heads=2",
                                          "train.epochs=1", "train.online_eval_every=1", "train.online_eval_size=8"])
    ev = OnlineEval(cfg, 1, 8, torch.device("cpu"))
    assert counts(dataset_labels(ev.bank)) == [2, 2, 2, 2]  # the first 8 train images: 8 of class 0
    assert counts(dataset_labels(ev.queries)) == [2, 2, 2, 2]  # the first 8 val images: 5 of class 0, 3 of class 1
    card = ev.protocol
    assert card["bank"] == "8 of 40 train images, class-balanced, seed 0"
    assert card["queries"] == "8 of 20 test images, class-balanced, seed 0"
    assert "data.subset_seed=0" in card["subset"] and "the same images at every evaluation" in card["subset"]
    # data.normalize=dataset on a folder: ImageNet's statistics, and the card says so
    assert card["normalize"] == ("ImageNet's mean/std for any folder (data.normalize=dataset on an imagefolder): "
                                 "mean (0.485, 0.456, 0.406) std (0.229, 0.224, 0.225)")

    rows = []

    class Log:
        def write(self, row):
            rows.append(row)

    torch.manual_seed(0)
    ev(build_model(cfg.model).eval(), 0, 1, Log())
    assert rows[0]["online_protocol"]["bank"] == card["bank"] and capsys.readouterr().out.count("epoch 1: online") == 1


def test_eval_max_train_draws_every_class_and_keys_the_cache_by_the_draw(sorted_folder, tmp_path):
    data = DataConfig(name="imagefolder", path=str(sorted_folder))
    cfg = load_config("mae-tiny-digits", ["model.in_chans=3", "model.depth=2", "model.embed_dim=32", "model.num_heads=2",
                                          "model.decoder_embed_dim=32", "model.decoder_depth=1", "model.decoder_num_heads=2"])
    torch.manual_seed(0)
    model = build_model(cfg.model).eval()
    cache = FeatureCache.open(tmp_path / "cache")

    def evaluation(max_train):  # what the features source reads: the model, its data and the settings
        s = EvalSettings(evals=("knn",), metric_options={"knn": {"k": 2}}, progress=False, max_train=max_train)
        return Evaluation(Path("x"), "x", {}, cfg, model, data, s, [1], torch.device("cpu"), tmp_path / "report")

    feats, labels, card, hit = cached_features(evaluation(8), model, "x", "train", [1], cache)
    assert counts(labels) == [2, 2, 2, 2] and not hit  # --max-train 8 was 8 images of class 0
    assert card["images"] == 8 and card["subset"] == "8 of 40 train images, class-balanced, seed 0"
    assert card["normalize"].startswith("ImageNet's mean/std for any folder")
    assert cached_features(evaluation(8), model, "x", "train", [1], cache)[3]  # reused
    whole = cached_features(evaluation(None), model, "x", "train", [1], cache)[2]
    assert "subset" not in whole and whole["images"] == 40


def test_pixel_baseline_on_a_sorted_folder_sees_every_class_and_is_cached(sorted_folder, tmp_path, monkeypatch, capsys):
    """The raw-pixel kNN of the colour-coded classes is 1.0 on a balanced bank; on the first 8
    images (all class 0) it was 0.25, a number that measured nothing."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    argv = ["eval", "--baseline", "pixels", "--data", "imagefolder", "--data-path", str(sorted_folder), "--img-size",
            str(SIDE), "--max-train", "8", "--evals", "knn", "--k", "2", "--out", str(tmp_path / "out")]
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    report = json.loads((tmp_path / "out" / "pixels.json").read_text())
    knn = report["baselines"][0]
    assert knn["values"]["top1"] == 1.0 and knn["protocol"]["train"]["images"] == 8
    assert knn["protocol"]["train"]["subset"] == "8 of 40 train images, class-balanced, seed 0"
    assert "knn      pixels   top1 1.0000" in out and "pixel-baseline cache: new" in out
    assert report["cache"]["file"].startswith(str(default_baseline_cache()))

    def no_pixels(*a, **k):
        raise AssertionError("the cached rows were measured again")

    monkeypatch.setattr(baselines, "pixel_features", no_pixels)
    code, out, err = run(capsys, *argv)
    assert code == 0 and "pixel-baseline cache: hit" in out, err
    assert json.loads((tmp_path / "out" / "pixels.json").read_text())["baselines"] == report["baselines"]
    with pytest.raises(AssertionError, match="measured again"):  # another protocol is measured afresh
        run(capsys, *argv[:-4], "--k", "3", "--out", str(tmp_path / "out"))


def test_ablate_reads_the_pixel_cache_of_eval_baseline_pixels(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    plan = plan_grid("table3b-toy", out=str(tmp_path / "grid"), progress=False)
    assert plan.settings.pixel_cache == str(tmp_path / "xdg" / "resdecay" / "baselines") == str(default_baseline_cache())
    metrics = [m for m in registered(FEATURES) if m.name == "knn"]
    ms = MetricSettings(probe=FAST_RECIPE)
    rows, first = pixel_rows(DataConfig(name="digits"), 8, metrics, ms, 300, None, None, plan.settings.pixel_cache)
    again, second = pixel_rows(DataConfig(name="digits"), 8, metrics, ms, 300, None, None, plan.settings.pixel_cache)
    assert not first["hit"] and second["hit"] and rows == again and first["file"] == second["file"]


@pytest.mark.parametrize("argv,needle", [
    (["--baseline", "pixels"], "--data NAME"),
    (["--baseline", "pixels", "--data", "imagefolder", "--data-path", "."], "--img-size N"),
    (["--baseline", "pixels", "--data", "digits", "--layer", "all"], "drop --layer"),
    (["some.pt", "--baseline", "pixels", "--data", "digits"], "measures no checkpoint"),
    ([], "--baseline pixels --data NAME"),
])
def test_eval_baseline_pixels_bad_input_is_one_line(capsys, argv, needle):
    code, _, err = run(capsys, "eval", *argv)
    assert_one_line_error(code, err, needle)


def test_the_run_header_says_which_statistics_normalise_a_folder(sorted_folder):
    """data.normalize=dataset on an ImageFolder means ImageNet's mean/std: the run header's line says so."""
    from resdecay.train import distributed as dist_env
    from resdecay.train.setup import build_data
    cfg = load_config("mae-tiny-digits", ["data.name=imagefolder", f"data.path={sorted_folder}", "model.in_chans=3",
                                          f"model.img_size={SIDE}", "model.patch_size=4", "train.batch_size=4"])
    data = build_data(cfg, dist_env.setup("cpu"))
    assert data.normalization.startswith("ImageNet's mean/std for any folder") and "0.485" in data.normalization
