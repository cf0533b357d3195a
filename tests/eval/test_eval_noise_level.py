"""A diffusion checkpoint as an ``eval`` target (issue 50 item 5): its blocks' tokens at one noise level
(``--noise-level``) measured by every metric an encoder's are -- kNN, the probes, the swept heads, EP -- with the
level in every card and cache key, the same features as the diffusion probe grid's at level 0, and one line for
each input that cannot work."""

from __future__ import annotations

import json

import pytest
import torch

from helpers import assert_one_line_error, model_overrides, run
from helpers import train_online as train
from resdecay.data import build_dataset
from resdecay.eval.diffusion.encoder import NoisedEncoder, image_noise
from resdecay.eval.diffusion.probe import NoisedFeatures
from resdecay.eval.features.extract import extract_block_features
from resdecay.eval.features.knn import knn_accuracy
from resdecay.train.checkpoint import load_model
from resdecay.train.config import load_config

DIGITS = ["data.name=digits", *model_overrides("uvit", keys=("img_size", "patch_size", "embed_dim", "num_heads")),
          "train.epochs=2", "train.batch_size=64", "train.log_every=5", "train.warmup_epochs=0.2", "train.ema_decay=0.99"]
FAST = ["--metric-option", "ep.epochs=2", "--metric-option", "linear_sweep.epochs=5", "--no-progress"]


@pytest.fixture(scope="module")
def uvit(tmp_path_factory):
    root = tmp_path_factory.mktemp("uvit")
    cfg = load_config("uvit-tiny-fmnist", [*DIGITS, "model.depth=3", "alpha_min=0.7", f"train.out_dir={root}"])
    return train(cfg, progress=False)["checkpoint"]


def test_a_diffusion_checkpoint_is_measured_at_one_noise_level_like_the_probe_grid(uvit, tmp_path, capsys):
    code, out, err = run(capsys, "eval", uvit, "--noise-level", 0, "--evals", "knn,linear_sweep,ep", *FAST,
                         "--no-baselines", "--out", tmp_path)
    assert code == 0, err
    report = json.loads(next(tmp_path.rglob("eval.json")).read_text())
    assert report["label"].endswith("noise 0") and "noise 0" in out
    assert [r["metric"] for r in report["results"]] == ["knn", "ep", "linear_sweep"]
    for row in report["results"]:  # the level, the draw and the weights on every number
        assert row["protocol"]["train"]["noise"]["level"] == 0.0 and row["protocol"]["test"]["noise"]["weights"] == "EMA"
    # the kNN number is the one the probe grid's own features give at level 0 (the EMA weights, the null label)
    model, cfg = load_model(uvit, ema=True)
    feats = []
    for split in ("train", "test"):
        dataset, _ = build_dataset(cfg.data, split, cfg.model.img_size, augment=False)
        f, y = extract_block_features(NoisedFeatures(model, 0.0), dataset, [-1], progress=False)
        feats += [f[(-1, "mean")], y]
    knn = next(r for r in report["results"] if r["metric"] == "knn")
    assert knn["values"]["top1"] == pytest.approx(knn_accuracy(*feats), abs=1e-12)


def test_another_noise_level_is_other_features_never_a_cache_hit(uvit, tmp_path, capsys):
    for level in (0.0, 0.5):
        code, out, err = run(capsys, "eval", uvit, "--noise-level", level, "--evals", "knn", "--no-baselines",
                             "--no-progress", "--out", tmp_path / str(level), "--cache-dir", tmp_path / "cache")
        assert code == 0, err
        assert "train new, test new" in out
    knn = [json.loads(next((tmp_path / str(level)).rglob("eval.json")).read_text())["results"][0]["values"]["top1"]
           for level in (0.0, 0.5)]
    assert knn[0] != knn[1]  # half the diffusion time of noise changes what the blocks see


def test_each_image_gets_its_own_noise_whatever_its_batch():
    images = torch.randn(6, 1, 8, 8)
    whole = image_noise(images)
    assert torch.equal(whole[2:4], image_noise(images[2:4])) and torch.equal(whole[[5, 0]], image_noise(images[[5, 0]]))
    assert not torch.equal(whole[0], whole[1]) and not torch.equal(image_noise(images, seed=1), whole)
    assert abs(float(whole.mean())) < 0.2 and 0.8 < float(whole.std()) < 1.2  # N(0, I)


def test_the_random_init_baseline_is_the_same_architecture_at_the_same_level(uvit, tmp_path, capsys):
    code, out, err = run(capsys, "eval", uvit, "--noise-level", 0.1, "--evals", "knn", "--no-progress", "--out", tmp_path)
    assert code == 0, err
    report = json.loads(next(tmp_path.rglob("eval.json")).read_text())
    random_init = next(r for r in report["baselines"] if r["source"] == "random-init")
    assert random_init["protocol"]["train"]["noise"]["level"] == 0.1
    model, _ = load_model(uvit, ema=True)
    assert isinstance(NoisedEncoder(model, 0.1).forward_features(torch.zeros(2, 1, 8, 8)), torch.Tensor)


def test_bad_noise_levels_one_line_each(uvit, tiny_checkpoints, tmp_path, capsys):
    code, _, err = run(capsys, "eval", uvit, "--evals", "knn", "--out", tmp_path)
    assert_one_line_error(code, err, "diffusion model", "--noise-level", "eval-diffusion")
    code, _, err = run(capsys, "eval", uvit, "--noise-level", 1.5, "--evals", "knn", "--out", tmp_path)
    assert_one_line_error(code, err, "--noise-level must lie in [0, 1]")
    code, _, err = run(capsys, "eval", tiny_checkpoints["decayed"], "--noise-level", 0.1, "--evals", "knn", "--out", tmp_path)
    assert_one_line_error(code, err, "--noise-level applies to diffusion checkpoints", "drop --noise-level")
    code, _, err = run(capsys, "eval", "--model", "timm:vit_tiny_patch16_224", "--data", "digits", "--noise-level", 0.1,
                       "--out", tmp_path)
    assert_one_line_error(code, err, "--noise-level applies to resdecay diffusion checkpoints")
    assert not list(tmp_path.rglob("eval.json"))
